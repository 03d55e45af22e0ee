// Package eventually waits, in tests, for state that sends no notice of its
// change (an object in an API server, a metrics endpoint, a process that
// has to exit): it checks a condition until it holds or a bound passes,
// then fails the test naming what it waited for, with the condition's last
// error.
//
// Where the code under test offers a notification (a channel, a watch),
// wait on that instead; where the only wait is time, use testing/synctest.
package eventually

import (
	"errors"
	"testing"
	"time"
)

// DefaultTimeout is how long Succeeds and Holds wait when given 0.
const DefaultTimeout = 30 * time.Second

// maxInterval bounds the pause between two checks, which starts at a
// millisecond and doubles.
const maxInterval = 50 * time.Millisecond

// Succeeds calls f until it returns nil. When timeout (0: DefaultTimeout,
// cut to leave a tenth of the test's own deadline) passes first, it fails t
// with what and f's last error.
func Succeeds(t testing.TB, what string, timeout time.Duration, f func() error) {
	t.Helper()
	if err := wait(t, timeout, f); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// Holds calls cond until it returns true, as Succeeds does.
func Holds(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	errNot := errors.New("not yet")
	if err := wait(t, timeout, func() error {
		if cond() {
			return nil
		}
		return errNot
	}); err != nil {
		t.Fatalf("waiting for %s: timed out", what)
	}
}

func wait(t testing.TB, timeout time.Duration, f func() error) error {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if d, ok := deadline(t); ok {
		timeout = min(timeout, time.Until(d)*9/10)
	}
	end := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(end) {
			return err
		}
		time.Sleep(pause)
		pause = min(2*pause, maxInterval)
	}
}

// deadline is the test's deadline (go test -timeout), when it has one.
func deadline(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return d.Deadline()
	}
	return time.Time{}, false
}
