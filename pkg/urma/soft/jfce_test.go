package soft

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// eventJFCs opens n JFCs on one JFCE, each armed for its next record.
func eventJFCs(t *testing.T, n int) (*jfce, []*jfc) {
	t.Helper()
	p := newProvider(t, Options{Fabric: NewFabric()})
	ctx, err := p.Open("", 0)
	mustOK(t, err, "open")
	t.Cleanup(func() { _ = ctx.Close() })
	e, err := ctx.CreateJFCE()
	mustOK(t, err, "create JFCE")
	t.Cleanup(func() { _ = e.Close() })
	var qs []*jfc
	for range n {
		q, err := ctx.CreateJFC(urma.JFCConfig{Depth: 16, JFCE: e})
		mustOK(t, err, "create JFC")
		t.Cleanup(func() { _ = q.Close() })
		mustOK(t, q.Rearm(false), "arm")
		qs = append(qs, q.(*jfc))
	}
	return e.(*jfce), qs
}

// fire makes q's armed event happen: a record arrives.
func fire(q *jfc) { q.push(&urma.Completion{Status: urma.StatusSuccess, UserCtx: 1}, false) }

// readable reports whether the JFCE's descriptor polls readable now.
func readable(t *testing.T, e *jfce) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(e.Fd()), Events: unix.POLLIN}}
	var n int
	// Even a zero-timeout poll(2) fails with EINTR while a signal is pending.
	err := ignoringEINTR(func() (err error) {
		n, err = unix.Poll(fds, 0)
		return err
	})
	mustOK(t, err, "poll the JFCE descriptor")
	return n == 1 && fds[0].Revents&unix.POLLIN != 0
}

// The JFCE's descriptor is readable exactly while an event is pending: a
// JFC destroyed with its event pending takes the event with it, and the
// descriptor stays readable for the others' events until they are gone too.
func TestJFCEDescriptorFollowsPendingEvents(t *testing.T) {
	e, qs := eventJFCs(t, 2)
	fire(qs[0])
	fire(qs[1])
	if !readable(t, e) {
		t.Fatal("descriptor not readable with two events pending")
	}
	mustOK(t, qs[0].Close(), "close the first JFC")
	if !readable(t, e) {
		t.Fatal("descriptor not readable with the second JFC's event still pending")
	}
	mustOK(t, qs[1].Close(), "close the second JFC")
	if readable(t, e) {
		t.Fatal("descriptor readable with no event pending")
	}
}

// Wait hands out at most len(out) JFCs at a time, oldest first; the rest
// wait for the next Wait.
func TestJFCEWaitReturnsAtMostLenOut(t *testing.T) {
	e, qs := eventJFCs(t, 3)
	for _, q := range qs {
		fire(q)
	}
	out := make([]urma.JFC, 2)
	n, err := e.Wait(out, 0)
	mustOK(t, err, "wait")
	if n != 2 || out[0] != qs[0] || out[1] != qs[1] {
		t.Fatalf("first Wait: %d JFCs %v, want the first two", n, out[:n])
	}
	n, err = e.Wait(out, 0)
	mustOK(t, err, "wait")
	if n != 1 || out[0] != qs[2] {
		t.Fatalf("second Wait: %d JFCs %v, want the third", n, out[:n])
	}
	for _, q := range qs {
		q.Ack(1)
	}
}

// A Wait with a timeout sleeps until an event comes within it; one with a
// negative timeout sleeps until an event comes at all.
func TestJFCEWaitSleepsForAnEvent(t *testing.T) {
	for _, timeout := range []time.Duration{time.Hour, -1} {
		e, qs := eventJFCs(t, 1)
		got := make(chan int, 1)
		go func() {
			out := make([]urma.JFC, 1)
			n, err := e.Wait(out, timeout)
			if err != nil {
				t.Errorf("wait: %v", err)
			}
			got <- n
		}()
		eventually.Holds(t, "Wait to sleep", 0, func() bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.waiters == 1
		})
		fire(qs[0])
		if n := <-got; n != 1 {
			t.Fatalf("Wait(%v) returned %d JFCs, want the one that fired while it slept", timeout, n)
		}
		qs[0].Ack(1)
	}
}

// Closing a JFCE wakes a Wait blocked on it with ErrClosed and waits for it
// to leave, so that every descriptor the JFCE used, the waiter's included,
// is closed once Close returns. The cycle runs once first, so that what the
// runtime opens once (its poller) is in the baseline.
func TestJFCECloseWakesWaitAndReleasesDescriptors(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric()})
	ctx, err := p.Open("", 0)
	mustOK(t, err, "open")
	defer ctx.Close()
	cycle := func() {
		ue, err := ctx.CreateJFCE()
		mustOK(t, err, "create JFCE")
		e := ue.(*jfce)
		done := make(chan error, 1)
		go func() {
			_, err := e.Wait(make([]urma.JFC, 1), -1)
			done <- err
		}()
		eventually.Holds(t, "Wait to sleep", 0, func() bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.waiters != 0
		})
		mustOK(t, e.Close(), "close JFCE")
		if err := <-done; !errors.Is(err, urma.ErrClosed) {
			t.Fatalf("Wait on a closed JFCE: %v, want ErrClosed", err)
		}
	}
	cycle()
	fds := openFds(t)
	cycle()
	if n := openFds(t); n != fds {
		t.Fatalf("%d descriptors open after the JFCE closed, %d before it was made", n, fds)
	}
}
