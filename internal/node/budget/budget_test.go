package budget

import (
	"fmt"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func TestFor(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		maxJetty uint32
		reserved urma.Range
		want     Budget
	}{
		{"plain", Config{JettiesPerUnit: 16, MaxUnitsPerDevice: 1024}, 1024, urma.Range{Min: 1, Max: 0}, Budget{Available: 1024, Jetties: 1024, Units: 64}},
		{"reserved range", Config{JettiesPerUnit: 16, MaxUnitsPerDevice: 1024}, 1024, urma.Range{Min: 0, Max: 63}, Budget{Available: 960, Jetties: 960, Units: 60}},
		{"host reserve", Config{JettiesPerUnit: 16, HostReserve: 100, MaxUnitsPerDevice: 1024}, 1024, urma.Range{Min: 0, Max: 63}, Budget{Available: 860, Jetties: 848, Units: 53}},
		{"partial unit dropped", Config{JettiesPerUnit: 16, MaxUnitsPerDevice: 1024}, 31, urma.Range{Min: 1}, Budget{Available: 31, Jetties: 16, Units: 1}},
		{"reserve exceeds device", Config{JettiesPerUnit: 16, HostReserve: 10, MaxUnitsPerDevice: 1024}, 100, urma.Range{Min: 0, Max: 95}, Budget{}},
		{"zero max jetty", Config{JettiesPerUnit: 16, MaxUnitsPerDevice: 1024}, 0, urma.Range{Min: 0, Max: 0}, Budget{}},
		{"capped", Config{JettiesPerUnit: 16, MaxUnitsPerDevice: 1024}, 1 << 20, urma.Range{Min: 1}, Budget{Available: 1 << 20, Jetties: 16384, Units: 1024, Capped: true}},
		{"exactly at cap", Config{JettiesPerUnit: 1, MaxUnitsPerDevice: 10}, 10, urma.Range{Min: 1}, Budget{Available: 10, Jetties: 10, Units: 10}},
		{"max uint32 no overflow", Config{JettiesPerUnit: 1 << 16, MaxUnitsPerDevice: 1 << 20}, ^uint32(0), urma.Range{Min: 1}, Budget{Available: ^uint32(0), Jetties: 65535 << 16, Units: 65535}},
		{"zero unit size advertises nothing", Config{MaxUnitsPerDevice: 10}, 100, urma.Range{Min: 1}, Budget{Available: 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.For(tt.maxJetty, tt.reserved); got != tt.want {
				t.Errorf("For(%d, %v) = %+v, want %+v", tt.maxJetty, tt.reserved, got, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Errorf("default config invalid: %v", err)
	}
	for _, c := range []Config{{MaxUnitsPerDevice: 1}, {JettiesPerUnit: 1}} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
}

func TestExplain(t *testing.T) {
	c := Config{JettiesPerUnit: 16, HostReserve: 100, MaxUnitsPerDevice: 2}
	s := c.Explain(1024, urma.Range{Min: 0, Max: 63})
	for _, want := range []string{"max_jetty 1024", "reserved 64 (0-63)", "host reserve 100", "860 available", "53 units", "capped at 2"} {
		if !strings.Contains(s, want) {
			t.Errorf("Explain = %q, missing %q", s, want)
		}
	}
}

func TestUnitIDRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		dev string
		k   uint32
	}{{"udma0", 17}, {"bonding_dev_0", 0}, {"my-dev", 4294967295}, {"soft3", 9}} {
		id := UnitID(tc.dev, tc.k)
		dev, k, err := ParseUnitID(id)
		if err != nil || dev != tc.dev || k != tc.k {
			t.Errorf("ParseUnitID(%q) = %q, %d, %v; want %q, %d", id, dev, k, err, tc.dev, tc.k)
		}
	}
	if UnitID("udma0", 17) != "udma0-17" {
		t.Errorf("UnitID format changed: %q", UnitID("udma0", 17))
	}
}

func TestParseUnitIDErrors(t *testing.T) {
	// Each error names the ID and the part that is wrong.
	const notDeviceIndex = "is not <device>-<index>"
	for _, tc := range []struct{ id, want string }{
		{"", notDeviceIndex},
		{"udma0", notDeviceIndex},
		{"-1", notDeviceIndex},
		{"udma0-", notDeviceIndex},
		{"udma0-x", `index "x" is not a decimal number`},
		{"udma0-01", `index "01" is not a decimal number`},
		{"udma0-4294967296", `index "4294967296" is not a decimal number`},
		{"udma0-+1", `index "+1" is not a decimal number`},
	} {
		if dev, k, err := ParseUnitID(tc.id); err == nil {
			t.Errorf("ParseUnitID(%q) = %q, %d, nil; want an error", tc.id, dev, k)
		} else if !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.id)) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseUnitID(%q): error %q, want it to name the ID and say %q", tc.id, err, tc.want)
		}
	}
}

func FuzzParseUnitID(f *testing.F) {
	for _, s := range []string{"udma0-17", "a-b-0", "-", "x-00", "bonding_dev_0-3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		dev, k, err := ParseUnitID(id)
		if err != nil {
			return
		}
		if got := UnitID(dev, k); got != id {
			t.Fatalf("UnitID(ParseUnitID(%q)) = %q", id, got)
		}
	})
}
