// Package budget computes how many jetties a device offers to pods and names
// the unit IDs the device plugin advertises for them.
//
// The rule: a device's budget is max_jetty, minus its reserved jetty range,
// minus a host reserve. It is advertised in units of JettiesPerUnit jetties,
// one kubelet device ID per unit, at most MaxUnitsPerDevice per device, so
// that a node never sends kubelet more than a few thousand IDs (kubelet's
// ListAndWatch message is limited to 4 MiB). Jetties that do not fill a whole
// unit, or lie beyond the cap, are not advertised.
package budget

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Defaults. 16 jetties per unit keeps a typical brpc client (8 prepared
// jetties plus a few connections) at one or two units; 1024 units per device
// keeps a node with four devices at 4096 IDs.
const (
	DefaultJettiesPerUnit    = nodefacts.DefaultJettiesPerUnit
	DefaultMaxUnitsPerDevice = 1024
)

// Config is the budget rule's parameters; the same values must be used on
// every node, because a pod's request of k units means k*JettiesPerUnit
// jetties wherever it lands.
type Config struct {
	// JettiesPerUnit is N, the jetties one advertised unit stands for.
	JettiesPerUnit uint32
	// HostReserve is the number of jetties per device kept for host
	// processes and never advertised.
	HostReserve uint32
	// MaxUnitsPerDevice caps the units (kubelet device IDs) per device.
	MaxUnitsPerDevice uint32
}

// Default returns the default rule.
func Default() Config {
	return Config{JettiesPerUnit: DefaultJettiesPerUnit, MaxUnitsPerDevice: DefaultMaxUnitsPerDevice}
}

// Validate rejects parameters that would advertise nothing sensible.
func (c Config) Validate() error {
	if c.JettiesPerUnit == 0 {
		return fmt.Errorf("budget: jetties per unit must be at least 1")
	}
	if c.MaxUnitsPerDevice == 0 {
		return fmt.Errorf("budget: max units per device must be at least 1")
	}
	return nil
}

// Budget is what one device offers.
type Budget struct {
	// Available is max_jetty minus the reserved range minus the host reserve:
	// the jetties pods could use before rounding to units and capping.
	Available uint32 `json:"-"`
	// Jetties is what is advertised: Units * JettiesPerUnit.
	Jetties uint32 `json:"jetties"`
	// Units is the number of device IDs advertised.
	Units uint32 `json:"units"`
	// Capped reports that MaxUnitsPerDevice cut the budget.
	Capped bool `json:"-"`
}

// For computes the budget of a device with the given max_jetty and reserved
// jetty range. Nothing underflows: a reserve larger than the device leaves 0.
func (c Config) For(maxJetty uint32, reserved urma.Range) Budget {
	avail := int64(maxJetty) - int64(reserved.Len()) - int64(c.HostReserve)
	if avail < 0 {
		avail = 0
	}
	b := Budget{Available: uint32(avail)}
	if c.JettiesPerUnit == 0 {
		return b
	}
	units := uint32(avail) / c.JettiesPerUnit
	if units > c.MaxUnitsPerDevice {
		units = c.MaxUnitsPerDevice
		b.Capped = true
	}
	b.Units = units
	b.Jetties = units * c.JettiesPerUnit
	return b
}

// Explain says in words how a budget came about, for logs and the
// "budget shows 0" troubleshooting path.
func (c Config) Explain(maxJetty uint32, reserved urma.Range) string {
	b := c.For(maxJetty, reserved)
	s := fmt.Sprintf("max_jetty %d - reserved %d (%d-%d) - host reserve %d = %d available; /%d per unit = %d units",
		maxJetty, reserved.Len(), reserved.Min, reserved.Max, c.HostReserve, b.Available, c.JettiesPerUnit, b.Available/max(c.JettiesPerUnit, 1))
	if b.Capped {
		s += fmt.Sprintf(", capped at %d", c.MaxUnitsPerDevice)
	}
	return s
}

// UnitID names unit k of a device, e.g. "udma0-17".
func UnitID(device string, k uint32) string {
	return device + "-" + strconv.FormatUint(uint64(k), 10)
}

// ParseUnitID splits a unit ID into the device name and the unit index. The
// index follows the last '-', so device names may contain dashes.
func ParseUnitID(id string) (device string, k uint32, err error) {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || i == len(id)-1 {
		return "", 0, fmt.Errorf("unit ID %q is not <device>-<index>", id)
	}
	n, err := strconv.ParseUint(id[i+1:], 10, 32)
	if err != nil || (len(id[i+1:]) > 1 && id[i+1] == '0') {
		return "", 0, fmt.Errorf("unit ID %q: index %q is not a decimal number", id, id[i+1:])
	}
	return id[:i], uint32(n), nil
}
