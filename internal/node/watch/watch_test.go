package watch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// waitBound is how long a test waits for an event before failing: 10 s,
// or an eighth of what is left before the test binary's own deadline when
// that is shorter. Under `make mutation` gremlins gives each run a few
// times the package's normal test time and counts a run it has to kill as
// TIMED OUT, neither killed nor lived; a mutant that stops an event from
// happening must fail the wait well before that. Nothing asserts speed: a
// passing run sees its events in milliseconds.
func waitBound(t *testing.T) time.Duration {
	bound := 10 * time.Second
	if d, ok := t.Deadline(); ok {
		bound = min(bound, time.Until(d)/8)
	}
	return bound
}

// waitFor blocks until the inventory's snapshot satisfies cond, following
// its changed channel, or fails the test after waitBound.
func waitFor(t *testing.T, inv *inventory.Inventory, what string, cond func(*inventory.Snapshot) bool) *inventory.Snapshot {
	t.Helper()
	timeout := time.After(waitBound(t))
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

func reason(name, sub string) func(*inventory.Snapshot) bool {
	return func(s *inventory.Snapshot) bool {
		d, ok := device(name)(s)
		return ok && strings.Contains(d.Reason, sub)
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
	end := time.Now().Add(waitBound(t))
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
	case <-time.After(waitBound(t)):
		t.Fatal("Run did not return after cancel")
	}
	end := time.Now().Add(waitBound(t))
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

// A watch path that does not exist at the first scan (here /dev/uburma,
// before the driver creates it) is watched once it appears: a device node
// created in it later is seen by fsnotify alone.
func TestDirectoryCreatedLaterIsWatched(t *testing.T) {
	tree := sysfstest.New(t)
	d := sysfstest.DefaultDevice("udma0")
	d.NoDevNode = true
	tree.Add(t, d)
	nodeDir := filepath.Join(tree.DevRoot, "uburma")
	if _, err := os.Stat(nodeDir); !os.IsNotExist(err) {
		t.Fatalf("%s before the test creates it: %v", nodeDir, err)
	}
	// Polling once an hour: only fsnotify can bring the changes in time.
	h := start(t, SysfsSource{Opts: tree.Options()}, Config{PollInterval: time.Hour, Settle: 5 * time.Millisecond}, 1)
	waitFor(t, h.inv, "udma0 unhealthy without its node", healthy("udma0", false))
	// Any later snapshot comes from a later scan, so the first scan's
	// watches, which found no node directory, are in place by then.
	tree.SetPortState(t, "udma0", 0, urma.PortDown)
	waitFor(t, h.inv, "udma0's port down", reason("udma0", "port0 DOWN"))
	tree.SetPortState(t, "udma0", 0, urma.PortActive)
	waitFor(t, h.inv, "udma0 waiting for its node again", reason("udma0", "device node"))

	if err := os.Mkdir(nodeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	waitFor(t, h.inv, "the node directory no longer missing", func(s *inventory.Snapshot) bool { return len(s.Missing) == 0 })
	tree.AddDevNode(t, "uburma/udma0")
	waitFor(t, h.inv, "udma0 healthy once its node exists", healthy("udma0", true))
}

// A watched directory that is removed and created again (a driver reload
// takes /dev/uburma and the class directory away and brings them back)
// loses its inotify watch with the old directory; the new one must be
// watched again, or device nodes created in it are seen only at the next
// poll.
func TestDirectoryRecreatedIsWatchedAgain(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	nodeDir := filepath.Join(tree.DevRoot, "uburma")
	// Polling once an hour: only fsnotify can bring the changes in time.
	h := start(t, SysfsSource{Opts: tree.Options()}, Config{PollInterval: time.Hour, Settle: 5 * time.Millisecond}, 1)
	waitFor(t, h.inv, "udma0 healthy", healthy("udma0", true))
	// Any later snapshot comes from a later scan, so the first scan's
	// watches are in place by then.
	tree.SetPortState(t, "udma0", 0, urma.PortDown)
	waitFor(t, h.inv, "udma0's port down", reason("udma0", "port0 DOWN"))
	tree.SetPortState(t, "udma0", 0, urma.PortActive)
	waitFor(t, h.inv, "udma0 healthy again", healthy("udma0", true))

	if err := os.RemoveAll(nodeDir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, h.inv, "the node directory missing", func(s *inventory.Snapshot) bool { return len(s.Missing) > 0 })
	if err := os.Mkdir(nodeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	waitFor(t, h.inv, "the node directory back", func(s *inventory.Snapshot) bool {
		return len(s.Missing) == 0 && reason("udma0", "device node")(s)
	})
	tree.AddDevNode(t, "uburma/udma0")
	waitFor(t, h.inv, "udma0 healthy once its node exists in the new directory", healthy("udma0", true))
}

// counting serves scans of nothing, numbered on scans, and watches one
// directory. Only the watcher's goroutine scans.
type counting struct {
	dir   string
	scans chan int
	n     int
}

func (c *counting) Scan() (inventory.Scan, error) {
	c.n++
	c.scans <- c.n
	return inventory.Scan{}, nil
}

func (c *counting) WatchPaths(inventory.Scan) []string { return []string{c.dir} }

// A scan that adds a watch looks once more after the settle time: a change
// between the scan and the new watch raised no event and would otherwise
// wait for the next poll. (Polling once an hour, and nothing changes in
// the directory: only that settle scan can come.)
func TestNewWatchIsFollowedByOneMoreScan(t *testing.T) {
	src := &counting{dir: t.TempDir(), scans: make(chan int, 16)}
	start(t, src, Config{PollInterval: time.Hour, Settle: time.Millisecond}, 1)
	for want := 1; want <= 2; want++ {
		select {
		case n := <-src.scans:
			if n != want {
				t.Fatalf("scan %d, want %d", n, want)
			}
		case <-time.After(waitBound(t)):
			t.Fatalf("no scan %d: a scan that added a watch was not followed by another", want)
		}
	}
}
