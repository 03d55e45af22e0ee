package sysfs_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// discover runs Discover on the tree and fails the test on error.
func discover(t *testing.T, tr *sysfstest.Tree) []sysfs.Device {
	t.Helper()
	devs, err := sysfs.Discover(tr.Options())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return devs
}

// discoverOne runs Discover and returns the named device, failing the test
// if it is not listed exactly once.
func discoverOne(t *testing.T, tr *sysfstest.Tree, name string) sysfs.Device {
	t.Helper()
	var found []sysfs.Device
	for _, d := range discover(t, tr) {
		if d.Name == name {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("Discover listed %s %d times, want once", name, len(found))
	}
	return found[0]
}

// names lists device names in order.
func names(devs []sysfs.Device) []string {
	var s []string
	for _, d := range devs {
		s = append(s, d.Name)
	}
	return s
}

// problemWith returns the first problem containing substr, or "".
func problemWith(d sysfs.Device, substr string) string {
	for _, p := range d.Problems {
		if strings.Contains(p, substr) {
			return p
		}
	}
	return ""
}

// wantProblem fails unless some problem contains every one of substrs.
func wantProblem(t *testing.T, d sysfs.Device, substrs ...string) {
	t.Helper()
	for _, p := range d.Problems {
		all := true
		for _, s := range substrs {
			all = all && strings.Contains(p, s)
		}
		if all {
			if d.Usable() {
				t.Fatalf("device with problem %q is Usable", p)
			}
			if !strings.Contains(d.Reason(), p) {
				t.Fatalf("Reason %q leaves out problem %q", d.Reason(), p)
			}
			return
		}
	}
	t.Fatalf("no problem contains all of %q; problems: %q", substrs, d.Problems)
}

// wantNoProblems fails if the device has any problem.
func wantNoProblems(t *testing.T, d sysfs.Device) {
	t.Helper()
	if len(d.Problems) != 0 {
		t.Fatalf("%s: unexpected problems %q", d.Name, d.Problems)
	}
}

func eid(t *testing.T, s string) urma.EID {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("bad test EID %q: %v", s, err)
	}
	return urma.EID(a.As16())
}

func intPtr(v int) *int { return &v }
