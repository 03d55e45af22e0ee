package inventory_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/deviceplugin/budget"
	"github.com/openeuler/urma-k8s/pkg/deviceplugin/health"
	"github.com/openeuler/urma-k8s/pkg/deviceplugin/inventory"
	"github.com/openeuler/urma-k8s/pkg/deviceplugin/selection"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// A device whose device/ parent link cannot be resolved has no parent, so
// sysfs classes it as bonding. Under the default bonding policy (auto) that
// used to hide every healthy device on the node as a "member": one
// malformed device zeroed the node's jetties.
func TestBuildBrokenParentLinkKeepsHealthyDevicesAdvertised(t *testing.T) {
	tests := []struct {
		name    string
		target  string // what udma1's device link points to
		problem string
	}{
		{"dangling link", "../../gone/0000:01:00.0", "device: symbolic link to"},
		{"symlink loop", "device", "device: stat:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, sysfstest.DefaultDevice("udma0"))
			tr.Add(t, sysfstest.DefaultDevice("udma1"))
			link := filepath.Join(tr.ClassPath(sysfs.ClassUbcore, "udma1"), "device")
			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(tc.target, link); err != nil {
				t.Fatal(err)
			}
			devs, err := sysfs.Discover(tr.Options())
			if err != nil {
				t.Fatal(err)
			}

			b := inventory.NewBuilder(inventory.Config{
				Budget:    budget.Default(),
				Selection: selection.Policy{Bonding: selection.BondingAuto},
				Debounce:  health.Debounce{Observations: 1},
			})
			snap, decisions, _ := b.Build(inventory.Scan{Devices: devs}, time.Now())
			for _, d := range decisions {
				if !d.Selected {
					t.Errorf("%s not selected: %s", d.Name, d.Why)
				}
			}
			if d, ok := snap.Lookup("udma0"); !ok || !d.Healthy || d.Budget.Units == 0 {
				t.Errorf("healthy udma0 not advertised beside udma1 with a broken device link: %+v (found %v)", d, ok)
			}
			if d, ok := snap.Lookup("udma1"); !ok || d.Healthy || !strings.Contains(d.Reason, tc.problem) {
				t.Errorf("udma1 = healthy %v reason %q (found %v), want unhealthy naming %q", d.Healthy, d.Reason, ok, tc.problem)
			}
		})
	}
}
