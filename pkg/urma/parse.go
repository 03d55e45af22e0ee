package urma

import (
	"fmt"
	"strconv"
	"strings"
)

// asciiSpace is what the kernel and people put around a number: the trailing
// newline of a sysfs attribute, or stray blanks in a config file.
const asciiSpace = " \t\n\r\v\f"

// maxQuoted bounds how much of a bad input an error message repeats, so a
// hostile multi-kilobyte value cannot flood a log line.
const maxQuoted = 64

// quote renders s for an error message, cut to maxQuoted bytes.
func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// ParseUint parses an unsigned number the way the kernel prints it in sysfs
// and liburma reads it back: decimal, or hexadecimal after 0x or 0X, with
// surrounding ASCII whitespace (the trailing newline) ignored. bitSize is 8,
// 16, 32 or 64; a value that does not fit is an error, never truncated.
//
// liburma reads numbers with strtoul(base 0). Where that would guess, this
// refuses instead, so a number is never silently different from what a person
// meant: a leading zero (octal to strtoul, decimal to a person), a sign,
// digit separators and Go's 0b/0o prefixes are all errors.
func ParseUint(s string, bitSize int) (uint64, error) {
	return parseUintToken(strings.Trim(s, asciiSpace), bitSize)
}

// parseUintToken is ParseUint without the whitespace trimming.
func parseUintToken(t string, bitSize int) (uint64, error) {
	switch bitSize {
	case 8, 16, 32, 64:
	default:
		return 0, fmt.Errorf("parse number %s: bit size %d is not 8, 16, 32 or 64", quote(t), bitSize)
	}
	if t == "" {
		return 0, fmt.Errorf("parse number: empty")
	}
	if t[0] == '-' {
		return 0, fmt.Errorf("parse number %s: negative", quote(t))
	}
	digits, base := t, 10
	if len(t) >= 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X') {
		digits, base = t[2:], 16
		if digits == "" {
			return 0, fmt.Errorf("parse number %s: no digits after 0x", quote(t))
		}
	} else if len(t) >= 2 && t[0] == '0' && isDigit(t[1], 10) {
		return 0, fmt.Errorf("parse number %s: leading zero (octal or decimal?) is ambiguous", quote(t))
	}
	for i := 0; i < len(digits); i++ {
		if !isDigit(digits[i], base) {
			return 0, fmt.Errorf("parse number %s: not a decimal or 0x-hex number", quote(t))
		}
	}
	v, err := strconv.ParseUint(digits, base, bitSize)
	if err != nil {
		// Only the range can fail here: the digits were checked above.
		return 0, fmt.Errorf("parse number %s: exceeds the %d-bit maximum %d", quote(t), bitSize, ^uint64(0)>>(64-bitSize))
	}
	return v, nil
}

func isDigit(c byte, base int) bool {
	switch {
	case '0' <= c && c <= '9':
		return true
	case base == 16 && ('a' <= c && c <= 'f' || 'A' <= c && c <= 'F'):
		return true
	}
	return false
}

// ParseRange parses an inclusive id range written min-max, the form of
// ubcore's reserved_jetty_id attribute ("%u-%u"). Each bound follows
// ParseUint's rules for 32 bits; min greater than max is an error.
func ParseRange(s string) (Range, error) {
	t := strings.Trim(s, asciiSpace)
	lo, hi, ok := strings.Cut(t, "-")
	if !ok {
		return Range{}, fmt.Errorf("parse range %s: want min-max", quote(t))
	}
	minV, err := parseUintToken(lo, 32)
	if err != nil {
		return Range{}, fmt.Errorf("parse range %s: min: %w", quote(t), err)
	}
	maxV, err := parseUintToken(hi, 32)
	if err != nil {
		return Range{}, fmt.Errorf("parse range %s: max: %w", quote(t), err)
	}
	if minV > maxV {
		return Range{}, fmt.Errorf("parse range %s: min %d is greater than max %d", quote(t), minV, maxV)
	}
	return Range{Min: uint32(minV), Max: uint32(maxV)}, nil
}
