package eventually

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf instead of stopping the
// test, so the failure itself can be checked.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	for _, a := range args {
		if s, ok := a.(string); ok {
			r.failed += " " + s
		}
		if e, ok := a.(error); ok {
			r.failed += " " + e.Error()
		}
	}
}

func TestSucceedsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	r := &recorder{TB: t}
	Succeeds(r, "the third call", time.Minute, func() error {
		if calls.Add(1) < 3 {
			return errors.New("too early")
		}
		return nil
	})
	if r.failed != "" || calls.Load() != 3 {
		t.Fatalf("failed %q after %d calls; want success on the third", r.failed, calls.Load())
	}
}

func TestSucceedsFailsWithTheLastError(t *testing.T) {
	r := &recorder{TB: t}
	n := 0
	Succeeds(r, "the impossible", 20*time.Millisecond, func() error {
		n++
		return errors.New("attempt " + strings.Repeat("I", n))
	})
	if !strings.Contains(r.failed, "the impossible") || !strings.Contains(r.failed, "attempt "+strings.Repeat("I", n)) {
		t.Fatalf("failure %q: want it to name what was awaited and the last error (attempt %d)", r.failed, n)
	}
}

func TestHolds(t *testing.T) {
	r := &recorder{TB: t}
	Holds(r, "never", 10*time.Millisecond, func() bool { return false })
	if !strings.Contains(r.failed, "never") {
		t.Fatalf("failure %q: want it to name what was awaited", r.failed)
	}
	r = &recorder{TB: t}
	Holds(r, "at once", 0, func() bool { return true })
	if r.failed != "" {
		t.Fatalf("a condition that holds failed: %q", r.failed)
	}
}
