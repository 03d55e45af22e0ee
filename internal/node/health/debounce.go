// Package health debounces device health so that a flapping port does not
// make kubelet's allocatable count jump up and down.
//
// A verdict about a device (healthy or not, with a reason) replaces the
// committed one only once it has been observed in Observations consecutive
// scans spanning at least Hold. This works in both directions: a device that
// recovers becomes healthy again without restarting anything. The first
// verdict on a device is committed at once, so a plugin starts with the truth.
// Time is passed in, never read, so tests need no sleeps.
package health

import (
	"fmt"
	"time"
)

// Debounce configures how long a new verdict must persist.
type Debounce struct {
	// Observations is how many consecutive scans must agree; values below 1
	// mean 1 (no debounce by count).
	Observations int
	// Hold is the least time between the first and the last of those scans.
	Hold time.Duration
}

// Validate rejects negative values, which are surely typos.
func (d Debounce) Validate() error {
	if d.Observations < 0 {
		return fmt.Errorf("health debounce: observations %d is negative", d.Observations)
	}
	if d.Hold < 0 {
		return fmt.Errorf("health debounce: hold %s is negative", d.Hold)
	}
	return nil
}

// Verdict is a device's health at one scan.
type Verdict struct {
	Healthy bool
	// Reason says why a device is unhealthy; empty when healthy.
	Reason string
}

type track struct {
	committed    Verdict
	pending      bool // a verdict of the other health is being observed
	pendingCount int
	pendingSince time.Time
	pendingWhy   string
}

// Tracker remembers the committed verdict of each device. It is not safe
// for concurrent use; one scan loop owns it.
type Tracker struct {
	cfg    Debounce
	tracks map[string]*track
}

// NewTracker returns an empty tracker.
func NewTracker(cfg Debounce) *Tracker {
	if cfg.Observations < 1 {
		cfg.Observations = 1
	}
	return &Tracker{cfg: cfg, tracks: map[string]*track{}}
}

// Observe records one scan's verdict on a device and returns the committed
// verdict after it. When a change is pending but its Hold has not yet
// elapsed, recheck is the time at which another scan could commit it (zero
// otherwise), so the caller can schedule one instead of waiting for a poll.
func (t *Tracker) Observe(name string, v Verdict, now time.Time) (committed Verdict, recheck time.Time) {
	tr, ok := t.tracks[name]
	if !ok {
		t.tracks[name] = &track{committed: v}
		return v, time.Time{}
	}
	if v.Healthy == tr.committed.Healthy {
		// Same health: any pending flip was a blip. A new reason for the
		// same unhealthy state is news, not a flip, so it is taken at once.
		tr.pending = false
		tr.committed = v
		return tr.committed, time.Time{}
	}
	if !tr.pending {
		tr.pending, tr.pendingCount, tr.pendingSince = true, 0, now
	}
	tr.pendingCount++
	tr.pendingWhy = v.Reason
	held := now.Sub(tr.pendingSince)
	if tr.pendingCount >= t.cfg.Observations && held >= t.cfg.Hold {
		tr.committed = Verdict{Healthy: v.Healthy, Reason: tr.pendingWhy}
		tr.pending = false
		return tr.committed, time.Time{}
	}
	if held < t.cfg.Hold {
		recheck = tr.pendingSince.Add(t.cfg.Hold)
	}
	return tr.committed, recheck
}

// Pending reports whether a flip is being observed for the device.
func (t *Tracker) Pending(name string) bool {
	tr, ok := t.tracks[name]
	return ok && tr.pending
}

// Forget drops a device, e.g. once it is gone for good.
func (t *Tracker) Forget(name string) { delete(t.tracks, name) }
