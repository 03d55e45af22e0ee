package transport

import (
	"sync"
	"time"
)

// deadline turns a net.Conn deadline into a channel that is closed when the
// deadline passes, so waits can select on it. Setting a new deadline
// replaces the channel if the old one already fired.
type deadline struct {
	mu      sync.Mutex
	timer   *time.Timer
	expired chan struct{}
	stopped bool // the connection closed: set arms nothing any more
}

func newDeadline() *deadline {
	return &deadline{expired: make(chan struct{})}
}

// set arms the deadline; the zero time disarms it. After stop it does
// nothing: a SetDeadline racing Close must not leave a timer behind.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	if d.timer != nil && !d.timer.Stop() {
		// The old timer fired or is firing; its closeLocked may run after
		// us, so give it a channel of its own to close.
		d.expired = make(chan struct{})
	}
	d.timer = nil
	select {
	case <-d.expired:
		d.expired = make(chan struct{}) // fired before: start over
	default:
	}
	if t.IsZero() {
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		close(d.expired)
		return
	}
	ch := d.expired
	d.timer = time.AfterFunc(dur, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		select {
		case <-ch:
		default:
			close(ch)
		}
	})
}

// done is closed when the deadline passes.
func (d *deadline) done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.expired
}

// passed reports whether the deadline has passed.
func (d *deadline) passed() bool {
	select {
	case <-d.done():
		return true
	default:
		return false
	}
}

// stop releases the timer for good: the connection closed.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
}
