package sysfs_test

import (
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// fuzzFiles are the files FuzzDiscoverFile writes into; the first
// len(capFields) are the capability files, which have an exact oracle.
func fuzzFiles() []string {
	var files []string
	for _, f := range capFields {
		files = append(files, f.file)
	}
	return append(files,
		"ubdev", "driver_name", "transport_type", "guid", "reserved_jetty_id",
		"port0/state", "port0/max_mtu", "port0/active_speed",
		"eids/eid0", "eids/eid1", "device/vendor", "device/device", "device/numa_node",
	)
}

// FuzzDiscoverFile writes arbitrary bytes into one file of a healthy fake
// device and runs Discover: it must never fail or panic, must list the
// device once, and a capability file must either land exactly in its field
// or be reported as a Problem with the field left zero.
func FuzzDiscoverFile(f *testing.F) {
	files := fuzzFiles()
	// One seed per file, rotating through the shapes of trouble, keeps the
	// seed run (which plain go test executes) quick.
	seeds := []string{"", "0", "1024\n", "0x10\n", "-1\n", "garbage", "4294967296\n", "0-15\n", "fe80::1\n", "\xff\x00", "16-15"}
	for i := range files {
		f.Add(uint8(i), []byte(seeds[i%len(seeds)]))
	}
	f.Fuzz(func(t *testing.T, which uint8, content []byte) {
		file := files[int(which)%len(files)]
		tr := sysfstest.New(t)
		tr.Add(t, sysfstest.DefaultDevice("udma0"))
		tr.WriteFile(t, "udma0", file, string(content))

		devs, err := sysfs.Discover(tr.Options())
		if err != nil {
			t.Fatalf("Discover failed on a bad %s: %v", file, err)
		}
		if len(devs) != 1 || devs[0].Name != "udma0" {
			t.Fatalf("Discover listed %q, want [udma0]", names(devs))
		}
		d := devs[0]
		for _, p := range d.Problems {
			if len(p) > 400 {
				t.Fatalf("unbounded problem text (%d bytes) for %s", len(p), file)
			}
		}
		if d.Usable() != (d.Reason() == "") {
			t.Fatalf("Usable %v disagrees with Reason %q", d.Usable(), d.Reason())
		}
		if len(d.Problems) > 0 && d.Usable() {
			t.Fatalf("usable with problems %q", d.Problems)
		}
		for _, e := range d.EIDs {
			if e.EID.IsZero() {
				t.Fatalf("an empty EID slot was listed: %+v", d.EIDs)
			}
		}
		for _, p := range d.Ports {
			if p.State > urma.PortActiveDefer {
				t.Fatalf("port state %d out of range accepted", p.State)
			}
		}

		idx := int(which) % len(files)
		if idx >= len(capFields) {
			return
		}
		cf := capFields[idx]
		got := cf.get(&d)
		want, perr := urma.ParseUint(string(content), cf.bits)
		if perr != nil || len(content) > sysfs.MaxAttrSize {
			if got != 0 {
				t.Fatalf("%s = %q: field holds %d, want 0 with a problem", file, content, got)
			}
			if problemWith(d, cf.file+": ") == "" {
				t.Fatalf("%s = %q: no problem names the file; problems %q", file, content, d.Problems)
			}
			return
		}
		if got != want {
			t.Fatalf("%s = %q: field holds %d, want %d", file, content, got, want)
		}
		if p := problemWith(d, cf.file+": "); p != "" && !strings.HasPrefix(p, "port_count: ") {
			t.Fatalf("%s = %q parsed fine yet has problem %q", file, content, p)
		}
	})
}
