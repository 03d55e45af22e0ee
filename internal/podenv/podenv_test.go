package podenv

import (
	"strings"
	"testing"
)

func TestParseDevices(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     []DeviceJetties
		err      string // a substring of the error; "" for none
	}{
		{name: "as the drivers write it", in: "udma0:64,udma1:32", want: []DeviceJetties{{"udma0", 64}, {"udma1", 32}}},
		{name: "bare names", in: " udma4, udma5", want: []DeviceJetties{{"udma4", 0}, {"udma5", 0}}},
		{name: "spaces and empty entries", in: " ,soft0:16 ,, ", want: []DeviceJetties{{"soft0", 16}}},
		{name: "empty", in: "", want: nil},
		{name: "largest jetty count", in: "udma0:4294967295", want: []DeviceJetties{{"udma0", MaxJetties}}},
		{name: "jetties above uint32", in: "udma0:4294967296", err: `jetties "4294967296" is not an integer in 1..4294967295`},
		{name: "zero jetties", in: "udma0:0", err: "not an integer in 1.."},
		{name: "negative jetties", in: "udma0:-1", err: "not an integer in 1.."},
		{name: "jetties not a number", in: "udma0:lots", err: `entry "udma0:lots"`},
		{name: "two colons", in: "udma0:1:2", err: `jetties "1:2"`},
		{name: "no name", in: ":64", err: "empty device name"},
		{name: "space inside a name", in: "udma 0:64", err: "holds a space"},
		{name: "name too long", in: strings.Repeat("u", MaxDeviceName+1) + ":1", err: "longer than 63 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseDevices(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), Devices) {
					t.Fatalf("ParseDevices(%q) = %v, %v; want an error naming %s and %q", c.in, got, err, Devices, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDevices(%q): %v", c.in, err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("ParseDevices(%q) = %v, want %v", c.in, got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("ParseDevices(%q) = %v, want %v", c.in, got, c.want)
				}
			}
		})
	}
}

func TestFormatDevicesParsesBack(t *testing.T) {
	list := []DeviceJetties{{"udma1", 48}, {"udma0", 16}, {"bonding_dev_0", MaxJetties}}
	v := FormatDevices(list)
	if v != "udma1:48,udma0:16,bonding_dev_0:4294967295" {
		t.Fatalf("FormatDevices = %q", v)
	}
	got, err := ParseDevices(v)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(list) {
		t.Fatalf("round trip: %v, want %v", got, list)
	}
	for i := range list {
		if got[i] != list[i] {
			t.Fatalf("round trip: %v, want %v", got, list)
		}
	}
}

func FuzzParseDevices(f *testing.F) {
	for _, s := range []string{"udma0:64,udma1:32", " udma4, udma5", ":", "a:1:2", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		list, err := ParseDevices(v)
		if err != nil {
			return
		}
		for _, d := range list {
			if d.Device == "" || len(d.Device) > MaxDeviceName || strings.ContainsAny(d.Device, ":, \t\n") || d.Jetties > MaxJetties {
				t.Fatalf("ParseDevices(%q) accepted %+v", v, d)
			}
		}
		// What parses formats back to what parses the same (bare names
		// excepted: they have no count to write).
		for _, d := range list {
			if d.Jetties == 0 {
				return
			}
		}
		again, err := ParseDevices(FormatDevices(list))
		if err != nil || len(again) != len(list) {
			t.Fatalf("ParseDevices(FormatDevices(%v)) = %v, %v", list, again, err)
		}
	})
}
