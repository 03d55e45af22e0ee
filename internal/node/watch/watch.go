// Package watch runs the discovery loop: it scans on a polling interval and
// whenever fsnotify reports a change under the watched directories, builds a
// debounced snapshot and publishes it to the inventory. Devices hot-plugged
// or removed appear and disappear without a restart; a failed scan keeps the
// previous set rather than advertising a transient empty one.
package watch

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/internal/node/selection"
)

// Config tunes the loop.
type Config struct {
	// PollInterval is the time between scans without events; the backstop
	// for sysfs, which raises no inotify events for most changes.
	PollInterval time.Duration
	// Settle coalesces a burst of fsnotify events into one scan.
	Settle time.Duration
}

// Defaults.
const (
	DefaultPollInterval = 5 * time.Second
	DefaultSettle       = 100 * time.Millisecond
)

// AddFlags registers the polling interval flag.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.PollInterval, "poll-interval", c.PollInterval, "rescan devices this often (fsnotify triggers extra scans)")
}

// Validate rejects a non-positive polling interval.
func (c Config) Validate() error {
	if c.PollInterval <= 0 {
		return fmt.Errorf("watch: poll interval %s must be positive", c.PollInterval)
	}
	if c.Settle < 0 {
		return fmt.Errorf("watch: settle delay %s is negative", c.Settle)
	}
	return nil
}

// Watcher owns the scan loop.
type Watcher struct {
	cfg     Config
	src     Source
	builder *inventory.Builder
	inv     *inventory.Inventory
	log     logr.Logger
	metrics *metrics.Metrics
	now     func() time.Time

	problems map[string]string // device -> joined problems last logged
	missing  string            // joined Missing last logged
	empty    bool              // "no devices" last logged
}

// New returns a watcher; metrics may be nil.
func New(cfg Config, src Source, builder *inventory.Builder, inv *inventory.Inventory, log logr.Logger, m *metrics.Metrics) *Watcher {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	return &Watcher{
		cfg: cfg, src: src, builder: builder, inv: inv, log: log, metrics: m, now: time.Now,
		problems: map[string]string{},
	}
}

// Run scans at once and then until ctx is done. It returns nil on
// cancellation; nothing else stops it.
func (w *Watcher) Run(ctx context.Context) error {
	fsw, err := fsnotify.NewWatcher()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if err != nil {
		w.log.Error(err, "fsnotify unavailable; relying on polling alone", "pollInterval", w.cfg.PollInterval)
	} else {
		defer fsw.Close()
		events, errs = fsw.Events, fsw.Errors
	}

	poll := time.NewTicker(w.cfg.PollInterval)
	defer poll.Stop()
	settle := newTimer()
	defer settle.Stop()
	recheck := newTimer()
	defer recheck.Stop()

	scan := func() {
		last, next := w.scanOnce()
		if fsw != nil && w.rewatch(fsw, w.src.WatchPaths(last)) && !settle.armed {
			// A change between the scan and the new watches would go
			// unnoticed until the next poll: look once more.
			settle.Reset(w.cfg.Settle)
		}
		if !next.IsZero() {
			recheck.Reset(max(next.Sub(w.now()), 0))
		}
	}
	scan()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
			scan()
		case <-settle.C:
			settle.armed = false
			scan()
		case <-recheck.C:
			scan()
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			w.log.V(2).Info("filesystem event", "path", ev.Name, "op", ev.Op.String())
			if !settle.armed {
				settle.Reset(w.cfg.Settle)
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// Typically an overflowed event queue: scan to catch up.
			w.log.Error(err, "fsnotify error; rescanning")
			scan()
		}
	}
}

// scanOnce runs one scan, publishes the result and returns the scan (for
// the watch list) and when to scan again to settle a pending health change.
func (w *Watcher) scanOnce() (inventory.Scan, time.Time) {
	scan, err := w.src.Scan()
	if err != nil {
		w.metrics.ObserveScan(nil, err)
		w.log.Error(err, "discovery scan failed; keeping the previous device set")
		return inventory.Scan{}, time.Time{}
	}
	problems := map[string]int{}
	for i := range scan.Devices {
		d := &scan.Devices[i]
		problems[d.Name] = len(d.Problems)
		joined := strings.Join(d.Problems, "; ")
		if joined != w.problems[d.Name] {
			if joined != "" {
				w.log.Info("device has malformed sysfs files; it is unhealthy", "device", d.Name, "problems", d.Problems)
			}
			w.problems[d.Name] = joined
		}
	}
	for name := range w.problems {
		if _, ok := problems[name]; !ok {
			delete(w.problems, name)
		}
	}
	w.metrics.ObserveScan(problems, nil)

	snap, decisions, next := w.builder.Build(scan, w.now())
	prev, _ := w.inv.Current()
	if w.inv.Publish(snap) {
		cur, _ := w.inv.Current()
		w.logChanges(prev, cur, decisions)
		w.metrics.ObserveSnapshot(cur)
	}
	w.logWaiting(snap)
	return scan, next
}

func (w *Watcher) logWaiting(snap inventory.Snapshot) {
	missing := strings.Join(snap.Missing, "; ")
	empty := len(snap.Devices) == 0
	if missing == w.missing && empty == w.empty {
		return
	}
	w.missing, w.empty = missing, empty
	switch {
	case empty:
		w.log.Info("no URMA device to advertise yet; advertising none and watching for devices", "waitingFor", snap.Missing)
	case missing != "":
		w.log.Info("discovery is waiting for", "waitingFor", snap.Missing)
	}
}

func (w *Watcher) logChanges(prev, cur *inventory.Snapshot, decisions []selection.Decision) {
	for _, d := range cur.Devices {
		old, ok := prev.Lookup(d.Name)
		switch {
		case !ok:
			w.log.Info("device advertised", "device", d.Name, "healthy", d.Healthy, "reason", d.Reason,
				"units", d.Budget.Units, "jetties", d.Budget.Jetties, "numaNode", d.NUMANode, "software", d.Software)
			if d.Budget.Capped {
				w.log.Info("device budget capped by --max-units-per-device; raise --jetties-per-unit to advertise more jetties",
					"device", d.Name, "available", d.Budget.Available, "advertised", d.Budget.Jetties)
			}
		case old.Healthy != d.Healthy:
			w.log.Info("device health changed", "device", d.Name, "healthy", d.Healthy, "reason", d.Reason)
		case old.Reason != d.Reason && !d.Healthy:
			w.log.Info("device still unhealthy, new reason", "device", d.Name, "reason", d.Reason)
		case old.Budget != d.Budget:
			w.log.Info("device budget changed", "device", d.Name, "units", d.Budget.Units, "jetties", d.Budget.Jetties)
		}
		if ok && !old.Vanished && d.Vanished {
			w.log.Info("device no longer discovered; removing it once the absence persists", "device", d.Name)
		}
	}
	for _, d := range prev.Devices {
		if _, ok := cur.Lookup(d.Name); !ok {
			w.log.Info("device removed", "device", d.Name)
		}
	}
	for _, dec := range decisions {
		if !dec.Selected {
			if _, was := prev.Lookup(dec.Name); was || prev.Generation == 0 {
				w.log.V(1).Info("device not advertised", "device", dec.Name, "why", dec.Why)
			}
		}
	}
}

// rewatch makes the watch set equal to the existing paths among want and
// reports whether it added any. What is watched comes from fsnotify, not
// from a record of what was added: a watched directory that is deleted
// loses its watch, and one created again at the same path (a driver
// reload recreating /dev/uburma or the class directory) must be added anew.
func (w *Watcher) rewatch(fsw *fsnotify.Watcher, want []string) bool {
	watched := map[string]bool{}
	for _, p := range fsw.WatchList() {
		watched[p] = true
	}
	added := false
	keep := map[string]bool{}
	for _, p := range want {
		if keep[p] {
			continue
		}
		keep[p] = true
		if watched[p] {
			continue
		}
		if err := fsw.Add(p); err == nil {
			added = true
		}
	}
	for p := range watched {
		if !keep[p] {
			_ = fsw.Remove(p) // fails harmlessly when the path is gone
		}
	}
	return added
}

// timer is a stopped-at-birth timer that remembers whether it is armed.
type timer struct {
	*time.Timer
	C     <-chan time.Time
	armed bool
}

func newTimer() *timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	tm := &timer{Timer: t}
	tm.C = t.C
	return tm
}

func (t *timer) Reset(d time.Duration) {
	t.Timer.Reset(d)
	t.armed = true
}
