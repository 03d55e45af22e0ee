package urma

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
)

// EID is a 128-bit URMA endpoint identifier, stored in network byte order.
type EID [16]byte

// IsZero reports an empty EID slot: upper and lower 64 bits both zero.
func (e EID) IsZero() bool {
	return binary.BigEndian.Uint64(e[:8]) == 0 && binary.BigEndian.Uint64(e[8:]) == 0
}

// String formats the EID as IPv6 text, the form sysfs and liburma print.
func (e EID) String() string {
	return netip.AddrFrom16(e).String()
}

// MarshalText implements encoding.TextMarshaler so EIDs print as text in JSON.
func (e EID) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseEID's rules.
func (e *EID) UnmarshalText(b []byte) error {
	v, err := ParseEID(string(b))
	if err != nil {
		return err
	}
	*e = v
	return nil
}

// ParseEID parses an EID the way liburma's urma_str_to_eid does: IPv6 text, an
// IPv4 dotted quad, or a plain 32-bit number in decimal or 0x hex (ParseUint's
// rules); the last two map to the IPv4-mapped form ::ffff:a.b.c.d.
func ParseEID(s string) (EID, error) {
	s = strings.Trim(s, asciiSpace)
	if s == "" {
		return EID{}, fmt.Errorf("parse EID: empty string")
	}
	if strings.Contains(s, ":") {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return EID{}, fmt.Errorf("parse EID %s: not an IPv6 address", quote(s))
		}
		return EID(a.As16()), nil
	}
	if strings.Contains(s, ".") {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return EID{}, fmt.Errorf("parse EID %s: not an IPv4 address", quote(s))
		}
		return EID(netip.AddrFrom16(netip.AddrFrom4(a.As4()).As16()).As16()), nil
	}
	// ParseUint, not strconv's base 0: that would also take 0b/0o prefixes,
	// digit separators and leading-zero octal, which liburma reads
	// differently or not at all.
	n, err := ParseUint(s, 32)
	if err != nil {
		return EID{}, fmt.Errorf("parse EID %s: not IPv6, IPv4 or a 32-bit number: %w", quote(s), err)
	}
	var v4 [4]byte
	binary.BigEndian.PutUint32(v4[:], uint32(n))
	return EID(netip.AddrFrom4(v4).As16()), nil
}
