package watch

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/openeuler/urma-k8s/pkg/deviceplugin/budget"
	"github.com/openeuler/urma-k8s/pkg/deviceplugin/health"
	"github.com/openeuler/urma-k8s/pkg/deviceplugin/inventory"
	"github.com/openeuler/urma-k8s/pkg/deviceplugin/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

const deadline = 10 * time.Second

// waitFor blocks until the inventory's snapshot satisfies cond, following
// its changed channel, or fails the test at the deadline.
func waitFor(t *testing.T, inv *inventory.Inventory, what string, cond func(*inventory.Snapshot) bool) *inventory.Snapshot {
	t.Helper()
	timeout := time.After(deadline)
	for {
		snap, changed := inv.Current()
		if cond(snap) {
			return snap
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("timed out waiting for %s; last snapshot: %+v", what, snap)
		}
	}
}

func device(name string) func(*inventory.Snapshot) (*inventory.Device, bool) {
	return func(s *inventory.Snapshot) (*inventory.Device, bool) { return s.Lookup(name) }
}

func healthy(name string, want bool) func(*inventory.Snapshot) bool {
	return func(s *inventory.Snapshot) bool {
		d, ok := device(name)(s)
		return ok && d.Healthy == want
	}
}

func absent(name string) func(*inventory.Snapshot) bool {
	return func(s *inventory.Snapshot) bool { _, ok := s.Lookup(name); return !ok }
}

type harness struct {
	inv     *inventory.Inventory
	metrics *metrics.Metrics
}

// start runs a watcher until the test ends.
func start(t *testing.T, src Source, cfg Config, debounce int) *harness {
	t.Helper()
	icfg := inventory.Config{Budget: budget.Default(), Debounce: health.Debounce{Observations: debounce}}
	h := &harness{inv: inventory.New(icfg.Budget.JettiesPerUnit), metrics: metrics.New()}
	w := New(cfg, src, inventory.NewBuilder(icfg), h.inv, testr.New(t), h.metrics)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v, want nil on cancel", err)
		}
	})
	return h
}

func TestHotPlugSeenByFsnotifyAlone(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	// Polling once an hour: only fsnotify can bring the changes in time.
	h := start(t, SysfsSource{Opts: tree.Options()}, Config{PollInterval: time.Hour, Settle: 5 * time.Millisecond}, 1)
	waitFor(t, h.inv, "udma0 healthy", healthy("udma0", true))

	tree.Add(t, sysfstest.DefaultDevice("udma1"))
	waitFor(t, h.inv, "hot-plugged udma1", healthy("udma1", true))

	tree.SetPortState(t, "udma1", 0, urma.PortDown)
	snap := waitFor(t, h.inv, "udma1 unhealthy after its port went down", healthy("udma1", false))
	if d, _ := snap.Lookup("udma1"); !strings.Contains(d.Reason, "port0 DOWN") {
		t.Errorf("reason %q does not name the port state", d.Reason)
	}
	tree.SetPortState(t, "udma1", 0, urma.PortActiveDefer)
	waitFor(t, h.inv, "udma1 recovered (ACTIVE_DEFER counts)", healthy("udma1", true))

	tree.Remove(t, "udma1")
	waitFor(t, h.inv, "udma1 removed", absent("udma1"))
	if _, ok := func() (*inventory.Device, bool) { s, _ := h.inv.Current(); return s.Lookup("udma0") }(); !ok {
		t.Fatal("udma0 vanished with udma1")
	}
}

// pollOnly hides the watch paths so only the polling interval drives scans.
type pollOnly struct{ Source }

func (pollOnly) WatchPaths(inventory.Scan) []string { return nil }

func TestPollingFindsDriverLoadedLater(t *testing.T) {
	tree := sysfstest.New(t)
	h := start(t, pollOnly{SysfsSource{Opts: tree.Options()}}, Config{PollInterval: 5 * time.Millisecond}, 2)
	snap := waitFor(t, h.inv, "first scan", func(s *inventory.Snapshot) bool { return len(s.Missing) > 0 })
	if len(snap.Devices) != 0 || !strings.Contains(strings.Join(snap.Missing, ";"), "driver not loaded") {
		t.Fatalf("empty host: %+v", snap)
	}

	d := sysfstest.DefaultDevice("udma0")
	d.NoDevNode = true
	tree.Add(t, d)
	snap = waitFor(t, h.inv, "udma0 listed without its node", healthy("udma0", false))
	if dev, _ := snap.Lookup("udma0"); !strings.Contains(dev.Reason, "device node") {
		t.Errorf("reason %q does not say the device node is missing", dev.Reason)
	}
	tree.AddDevNode(t, "uburma/udma0")
	waitFor(t, h.inv, "udma0 healthy once its node exists (debounced)", func(s *inventory.Snapshot) bool {
		return healthy("udma0", true)(s) && len(s.Missing) == 0
	})
}

func TestMalformedFilesMakeDeviceUnhealthy(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	h := start(t, SysfsSource{Opts: tree.Options()}, Config{PollInterval: 5 * time.Millisecond}, 1)
	waitFor(t, h.inv, "udma0 healthy", healthy("udma0", true))

	tree.WriteFile(t, "udma0", "max_jetty", "lots\n")
	snap := waitFor(t, h.inv, "udma0 unhealthy", healthy("udma0", false))
	d, _ := snap.Lookup("udma0")
	if !strings.Contains(d.Reason, "max_jetty") || d.Budget.Units != 63 {
		t.Fatalf("udma0 = %+v, want reason naming max_jetty and its 63 units kept (IDs vanish only with the device)", d)
	}
	tree.WriteFile(t, "udma0", "max_jetty", "1024\n")
	waitFor(t, h.inv, "udma0 healthy again", healthy("udma0", true))
}

func TestBondingDevicesReplaceMembers(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	tree.Add(t, sysfstest.DefaultDevice("udma1"))
	h := start(t, SysfsSource{Opts: tree.Options()}, Config{PollInterval: 5 * time.Millisecond}, 1)
	waitFor(t, h.inv, "members", healthy("udma1", true))

	b := sysfstest.DefaultDevice("bonding_dev_0")
	b.Bonding = true
	tree.Add(t, b)
	snap := waitFor(t, h.inv, "only the bonding device", func(s *inventory.Snapshot) bool {
		return len(s.Devices) == 1 && s.Devices[0].Name == "bonding_dev_0"
	})
	if snap.Devices[0].NUMANode != -1 {
		t.Errorf("bonding device NUMA %d, want -1", snap.Devices[0].NUMANode)
	}
}

// flaky succeeds once, then fails until told otherwise.
type flaky struct {
	Source
	mu    sync.Mutex
	calls int
	fail  bool
}

func (f *flaky) Scan() (inventory.Scan, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail {
		return inventory.Scan{}, errors.New("listing the class directory: permission denied")
	}
	return f.Source.Scan()
}

func (f *flaky) set(fail bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = fail
	return f.calls
}

func (f *flaky) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func TestFailedScanKeepsDevices(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	src := &flaky{Source: pollOnly{SysfsSource{Opts: tree.Options()}}}
	h := start(t, src, Config{PollInterval: 2 * time.Millisecond}, 1)
	before := waitFor(t, h.inv, "udma0", healthy("udma0", true))

	n := src.set(true)
	end := time.Now().Add(deadline)
	for src.count() < n+5 {
		if time.Now().After(end) {
			t.Fatal("scans stopped after a failure")
		}
		runtime.Gosched()
	}
	after, _ := h.inv.Current()
	if after.Generation != before.Generation {
		t.Fatalf("failed scans changed the snapshot: %+v", after)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	tree := sysfstest.New(t)
	base := runtime.NumGoroutine()
	inv := inventory.New(16)
	w := New(Config{PollInterval: time.Millisecond}, SysfsSource{Opts: tree.Options()},
		inventory.NewBuilder(inventory.Config{Budget: budget.Default()}), inv, testr.New(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	waitFor(t, inv, "a scan", func(s *inventory.Snapshot) bool { return s.Generation > 0 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(deadline):
		t.Fatal("Run did not return after cancel")
	}
	end := time.Now().Add(deadline)
	for runtime.NumGoroutine() > base {
		if time.Now().After(end) {
			t.Fatalf("goroutines: %d, want <= %d", runtime.NumGoroutine(), base)
		}
		runtime.Gosched()
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c  Config
		ok bool
	}{
		{Config{PollInterval: time.Second}, true},
		{Config{}, false},
		{Config{PollInterval: time.Second, Settle: -1}, false},
	} {
		if err := tc.c.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v", tc.c, err)
		}
	}
}
