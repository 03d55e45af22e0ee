// Package selection decides which discovered URMA devices the device plugin
// advertises: include and exclude name patterns, drivers, transport types,
// and what to do with bonding devices.
//
// Bonding devices aggregate member devices; advertising both would count the
// same jetties twice. So by default (BondingAuto), as soon as any bonding
// device passes the other filters, only bonding devices are advertised. A
// bonding device with malformed sysfs files (Broken) does not count: a
// device whose parent link cannot be read looks like a bonding device, and
// must not hide every healthy device on the node.
package selection

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// BondingPolicy says how bonding devices and their members are treated.
type BondingPolicy string

// Bonding policies.
const (
	// BondingAuto advertises only bonding devices when any that is not
	// Broken exists, and all devices otherwise.
	BondingAuto BondingPolicy = "auto"
	// BondingOnly advertises only bonding devices (none if there are none).
	BondingOnly BondingPolicy = "only"
	// BondingNever never advertises bonding devices.
	BondingNever BondingPolicy = "never"
	// BondingAll advertises bonding devices and their members: members'
	// jetties are counted twice. For experiments only.
	BondingAll BondingPolicy = "all"
)

// Policy is the selection configuration. The zero value selects every
// device with BondingAuto.
type Policy struct {
	// Include lists glob patterns (path.Match syntax) a device name must
	// match one of; empty means every name.
	Include []string
	// Exclude lists glob patterns that remove a device even if included.
	Exclude []string
	// Drivers lists the driver names allowed; empty means any driver.
	Drivers []string
	// Transports lists the transport types allowed; empty means any.
	Transports []urma.TransportType
	// Bonding is the bonding policy; "" means BondingAuto.
	Bonding BondingPolicy
}

// Validate reports malformed patterns and unknown bonding policies.
func (p Policy) Validate() error {
	for _, list := range [][]string{p.Include, p.Exclude} {
		for _, pat := range list {
			if _, err := path.Match(pat, ""); err != nil {
				return fmt.Errorf("device pattern %q: %w", pat, err)
			}
		}
	}
	switch p.Bonding {
	case "", BondingAuto, BondingOnly, BondingNever, BondingAll:
	default:
		return fmt.Errorf("bonding policy %q: want one of auto, only, never, all", p.Bonding)
	}
	return nil
}

// Candidate is the part of a discovered device selection looks at.
type Candidate struct {
	Name      string
	Driver    string
	Transport urma.TransportType
	Bonding   bool
	// Broken says sysfs files of the device are malformed (it has
	// Problems, so it is unhealthy). A broken device may be classed as
	// bonding only because its device/ link cannot be read; under
	// BondingAuto it does not hide the other devices.
	Broken bool
}

// Decision is the verdict on one candidate.
type Decision struct {
	Name     string
	Selected bool
	// Why explains a device that is not selected; empty when selected.
	Why string
}

// Select decides for every candidate, in the order given. Patterns are
// assumed valid (see Validate); a malformed pattern matches nothing.
func (p Policy) Select(cands []Candidate) []Decision {
	return p.SelectRemembering(cands, false)
}

// SelectRemembering is Select for a caller with history: bondingAway says
// that a bonding device selected before is missing from cands or Broken
// now. Under BondingAuto its members stay hidden meanwhile: a bonding
// device that fails one read, or is gone for a moment while its driver
// reloads, must not have its members advertised beside the jetties it
// still holds, which would count them twice. The caller forgets the
// bonding device once it is gone for good.
func (p Policy) SelectRemembering(cands []Candidate, bondingAway bool) []Decision {
	out := make([]Decision, len(cands))
	anyBonding := false
	for i, c := range cands {
		out[i] = Decision{Name: c.Name, Why: p.filter(c)}
		if out[i].Why == "" && c.Bonding && !c.Broken {
			anyBonding = true
		}
	}
	for i, c := range cands {
		if out[i].Why != "" {
			continue
		}
		switch p.Bonding {
		case BondingOnly:
			if !c.Bonding {
				out[i].Why = "not a bonding device (bonding policy only)"
			}
		case BondingNever:
			if c.Bonding {
				out[i].Why = "bonding device (bonding policy never)"
			}
		case BondingAll:
		default:
			switch {
			case c.Bonding:
			case anyBonding:
				out[i].Why = "a bonding device exists; members are not advertised to avoid counting them twice (bonding policy auto)"
			case bondingAway:
				out[i].Why = "a bonding device advertised before is missing or unreadable now; members are not advertised until it is gone for good (bonding policy auto)"
			}
		}
		out[i].Selected = out[i].Why == ""
	}
	return out
}

func (p Policy) filter(c Candidate) string {
	if len(p.Include) > 0 && !matchAny(p.Include, c.Name) {
		return fmt.Sprintf("name matches no include pattern %v", p.Include)
	}
	if pat, ok := firstMatch(p.Exclude, c.Name); ok {
		return fmt.Sprintf("name matches exclude pattern %q", pat)
	}
	if len(p.Drivers) > 0 && !slices.Contains(p.Drivers, c.Driver) {
		return fmt.Sprintf("driver %q not in %v", c.Driver, p.Drivers)
	}
	if len(p.Transports) > 0 && !slices.Contains(p.Transports, c.Transport) {
		return fmt.Sprintf("transport %s not in %v", c.Transport, p.Transports)
	}
	return ""
}

func matchAny(patterns []string, name string) bool {
	_, ok := firstMatch(patterns, name)
	return ok
}

func firstMatch(patterns []string, name string) (string, bool) {
	for _, pat := range patterns {
		if ok, err := path.Match(pat, name); err == nil && ok {
			return pat, true
		}
	}
	return "", false
}

// ParseTransport accepts a transport type by name (UB, IB, IP, HNS_UB; any
// case) or by its number.
func ParseTransport(s string) (urma.TransportType, error) {
	s = strings.TrimSpace(s)
	for _, t := range []urma.TransportType{urma.TransportUB, urma.TransportIB, urma.TransportIP, urma.TransportHNSUB} {
		if strings.EqualFold(s, t.String()) {
			return t, nil
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("transport type %q: want UB, IB, IP, HNS_UB or a number", s)
	}
	return urma.TransportType(n), nil
}
