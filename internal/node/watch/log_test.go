package watch

import (
	"testing"

	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// scanner is a watcher over a fake sysfs tree whose scans the test runs one
// at a time (no Run loop), with health committed at once.
func scanner(t *testing.T, tree *sysfstest.Tree, logs *logtest.Lines) *Watcher {
	t.Helper()
	icfg := inventory.Config{Budget: budget.Default(), Debounce: health.Debounce{Observations: 1}}
	return New(Config{}, SysfsSource{Opts: tree.Options()}, inventory.NewBuilder(icfg),
		inventory.New(icfg.Budget.JettiesPerUnit), logs.Logger(t), nil)
}

// Each state worth a log line is said once when it starts, not on every
// poll: an idle node must not repeat itself every five seconds.
func TestScanLogsEachChangeOnce(t *testing.T) {
	tree := sysfstest.New(t)
	logs := &logtest.Lines{}
	w := scanner(t, tree, logs)
	if w.cfg.PollInterval != DefaultPollInterval {
		t.Fatalf("poll interval %v from an empty Config, want the default %v", w.cfg.PollInterval, DefaultPollInterval)
	}
	steps := []struct {
		name   string
		change func()
		want   map[string]int // message -> lines so far
	}{
		{"no device", func() {}, map[string]int{"no URMA device to advertise yet": 1}},
		{"still none", func() {}, map[string]int{"no URMA device to advertise yet": 1}},
		{"a device with a malformed file", func() {
			tree.Add(t, sysfstest.DefaultDevice("udma0"))
			tree.WriteFile(t, "udma0", "max_jetty", "lots\n")
		}, map[string]int{"device has malformed sysfs files": 1}},
		{"still malformed", func() {}, map[string]int{"device has malformed sysfs files": 1}},
		{"repaired", func() { tree.WriteFile(t, "udma0", "max_jetty", "1024\n") }, map[string]int{"device has malformed sysfs files": 1}},
		{"gone again", func() { tree.Remove(t, "udma0") }, map[string]int{"no URMA device to advertise yet": 2}},
	}
	for _, s := range steps {
		s.change()
		w.scanOnce()
		for msg, want := range s.want {
			if got := logs.Count(msg); got != want {
				t.Errorf("after %s: %d lines %q, want %d", s.name, got, msg, want)
			}
		}
	}
}

// The first scan says why each device it does not advertise is left out;
// later scans only about devices that were advertised before.
func TestFirstScanNamesDevicesNotAdvertised(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	bond := sysfstest.DefaultDevice("bonding_dev_0")
	bond.Bonding = true
	tree.Add(t, bond)
	logs := &logtest.Lines{}
	w := scanner(t, tree, logs)
	w.scanOnce()
	if got := logs.Count(`"device not advertised" "device"="udma0"`); got != 1 {
		t.Fatalf("first scan: %d 'device not advertised' lines for udma0, want 1:\n%s", got, logs.String())
	}
	// A change (bonding_dev_0 goes down) publishes a new snapshot; udma0
	// was never advertised, so nothing more is said about it.
	tree.SetPortState(t, "bonding_dev_0", 0, urma.PortDown)
	w.scanOnce()
	if got := logs.Count(`"device not advertised" "device"="udma0"`); got != 1 {
		t.Errorf("after a change: %d lines for udma0, want still 1", got)
	}
	if got := logs.Count(`"device health changed"`); got != 1 {
		t.Errorf("%d 'device health changed' lines, want 1 (the second scan published nothing new?)", got)
	}
}
