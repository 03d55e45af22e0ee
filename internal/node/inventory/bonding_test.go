package inventory_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/selection"
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

// bondingNode is a sysfs tree with one bonding device (no parent link)
// and its members, scanned by a builder of the default bonding policy
// whose debounce takes two scans and 3 s.
type bondingNode struct {
	t     *testing.T
	tr    *sysfstest.Tree
	bond  sysfstest.Device
	b     *inventory.Builder
	start time.Time
}

func newBondingNode(t *testing.T, bond string, members ...string) *bondingNode {
	n := &bondingNode{t: t, tr: sysfstest.New(t), bond: sysfstest.DefaultDevice(bond), start: time.Now()}
	n.bond.Bonding = true
	n.tr.Add(t, n.bond)
	for _, m := range members {
		n.tr.Add(t, sysfstest.DefaultDevice(m))
	}
	n.b = inventory.NewBuilder(inventory.Config{
		Budget:    budget.Default(),
		Selection: selection.Policy{Bonding: selection.BondingAuto},
		Debounce:  health.Debounce{Observations: 2, Hold: 3 * time.Second},
	})
	return n
}

// scan builds the snapshot of the tree at start+at, with the selection
// decisions.
func (n *bondingNode) scan(at time.Duration) (inventory.Snapshot, []selection.Decision) {
	n.t.Helper()
	devs, err := sysfs.Discover(n.tr.Options())
	if err != nil {
		n.t.Fatal(err)
	}
	snap, decisions, _ := n.b.Build(inventory.Scan{Devices: devs}, n.start.Add(at))
	return snap, decisions
}

// A bonding device that fails one read, or is gone for a while (its driver
// reloading), must not have its members advertised beside the jetties it
// still holds: that would count the same hardware two or three times, and
// the members, new to the plugin, would be committed healthy at once.
// They stay hidden until the bonding device is forgotten for good.
func TestBuildBondingGlitchKeepsMembersHidden(t *testing.T) {
	n := newBondingNode(t, "bonding_dev_0", "udma0", "udma1")
	// advertised is the names a scan at start+at advertises, its healthy
	// units and its decisions.
	advertised := func(at time.Duration) ([]string, uint32, []selection.Decision) {
		t.Helper()
		snap, decisions := n.scan(at)
		var names []string
		var units uint32
		for _, d := range snap.Devices {
			names = append(names, d.Name)
			if d.Healthy {
				units += d.Budget.Units
			}
		}
		return names, units, decisions
	}
	names, clean, _ := advertised(0)
	if strings.Join(names, ",") != "bonding_dev_0" || clean == 0 {
		t.Fatalf("clean scan advertises %v with %d healthy units, want only bonding_dev_0", names, clean)
	}
	wantOnlyBond := func(what string, at time.Duration) {
		t.Helper()
		names, units, decisions := advertised(at)
		if strings.Join(names, ",") != "bonding_dev_0" {
			t.Errorf("%s: advertises %v, want only bonding_dev_0", what, names)
		}
		if units > clean {
			t.Errorf("%s: %d healthy units, more than the %d of the clean scan", what, units, clean)
		}
		for _, d := range decisions {
			if d.Name != "bonding_dev_0" && (d.Selected || !strings.Contains(d.Why, "bonding")) {
				t.Errorf("%s: member %s selected %v (%q), want hidden for the bonding device", what, d.Name, d.Selected, d.Why)
			}
		}
	}

	orig, err := os.ReadFile(filepath.Join(n.tr.ClassPath(sysfs.ClassUbcore, "bonding_dev_0"), "max_jfc"))
	if err != nil {
		t.Fatal(err)
	}
	n.tr.WriteFile(t, "bonding_dev_0", "max_jfc", "garbage\n")
	wantOnlyBond("bonding device unreadable", time.Second)
	n.tr.WriteFile(t, "bonding_dev_0", "max_jfc", string(orig))
	wantOnlyBond("bonding device readable again", 2*time.Second)

	n.tr.Remove(t, "bonding_dev_0")
	wantOnlyBond("bonding device gone", 3*time.Second)
	n.tr.Add(t, n.bond)
	wantOnlyBond("bonding device back", 4*time.Second)

	// Gone for good: once its absence is committed (two scans, 3 s) the
	// bonding device is forgotten, and the members are advertised.
	n.tr.Remove(t, "bonding_dev_0")
	wantOnlyBond("bonding device gone again", 5*time.Second)
	_, _, _ = advertised(9 * time.Second) // absence committed: forgotten
	names, _, _ = advertised(10 * time.Second)
	if strings.Join(names, ",") != "udma0,udma1" {
		t.Errorf("bonding device gone for good: advertises %v, want its members udma0,udma1", names)
	}
}

// A remembered bonding device that reads cleanly as an ordinary device now
// (one classed bonding for having no parent, re-created with one) is no
// bonding device any more: every device is advertised at once, not after a
// debounce.
func TestBuildBondingDeviceNoLongerBonding(t *testing.T) {
	n := newBondingNode(t, "ubagg0", "udma0") // bonding for its missing parent link
	selected := func(at time.Duration) string {
		t.Helper()
		_, decisions := n.scan(at)
		var out []string
		for _, d := range decisions {
			if d.Selected {
				out = append(out, d.Name)
			}
		}
		return strings.Join(out, ",")
	}
	if got := selected(0); got != "ubagg0" {
		t.Fatalf("with the bonding device: selected %v, want only it", got)
	}
	n.tr.Remove(t, "ubagg0")
	n.tr.Add(t, sysfstest.DefaultDevice("ubagg0")) // a parent now: not bonding
	if got := selected(time.Second); got != "ubagg0,udma0" {
		t.Errorf("once it is no bonding device: selected %v, want every device", got)
	}
}
