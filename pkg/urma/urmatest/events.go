package urmatest

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func init() {
	register("JFCEFiresOnlyWhenArmed", testJFCEArmed)
	register("JFCESolicitedOnly", testJFCESolicited)
	register("JFCEWaitBlocksAndCloses", testJFCEWait)
}

// readable reports whether fd is readable now (zero-timeout poll).
func readable(t testing.TB, fd int) bool {
	t.Helper()
	return pollFd(t, fd, 0)
}

// pollFd waits up to ms milliseconds for fd to become readable.
func pollFd(t testing.TB, fd int, ms int) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		must(t, err, "poll JFCE fd")
		return n == 1 && fds[0].Revents&unix.POLLIN != 0
	}
}

// The JFCE fd becomes readable when, and only when, an armed JFC receives a
// completion; completions that land before the rearm do not fire and are
// found by polling again, as liburma's wait, ack, rearm, poll loop expects.
func testJFCEArmed(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{Events: true})
	target := a.importFrom(b, b.cfg.Token)
	fd := b.jfce.Fd()
	if fd < 0 {
		t.Fatalf("JFCE fd %d", fd)
	}
	if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || flags&unix.O_NONBLOCK == 0 {
		t.Errorf("JFCE fd is not non-blocking (flags %#x, err %v)", flags, err)
	}
	if readable(t, fd) {
		t.Fatal("new JFCE fd is readable")
	}
	for i := 0; i < 4; i++ {
		b.postRecv(uint64(i), i*64, 64)
	}
	roundTrip := func(userCtx uint64) {
		t.Helper()
		a.send(target, userCtx, 0, 64)
		// The sender's completion follows the receiver's: once it is in,
		// the receive completion has landed.
		wait(t, a.sendJFC, 1, waitTimeout)
	}

	// Unarmed: a completion lands, the fd stays quiet.
	roundTrip(10)
	if readable(t, b.jfce.Fd()) {
		t.Fatal("fd readable after a completion on an unarmed JFC")
	}
	// Armed after the completion landed: still quiet; the second poll finds it.
	must(t, b.recvJFC.Rearm(false), "rearm")
	if readable(t, fd) {
		t.Fatal("fd readable for a completion that landed before the rearm")
	}
	if c := wait(t, b.recvJFC, 1, waitTimeout)[0]; c.UserCtx != 0 {
		t.Fatalf("second poll found %+v, want receive 0", c)
	}
	// Armed and a completion lands: readable.
	roundTrip(11)
	if !pollFd(t, fd, int(waitTimeout/time.Millisecond)) {
		t.Fatal("fd not readable after a completion on an armed JFC")
	}
	out := make([]urma.JFC, 4)
	n, err := b.jfce.Wait(out, 0)
	must(t, err, "wait JFCE")
	if n != 1 || out[0] != b.recvJFC {
		t.Fatalf("wait returned %d JFCs %v, want the receive JFC once", n, out[:n])
	}
	b.recvJFC.Ack(1)
	if readable(t, fd) {
		t.Fatal("fd still readable after the event was taken")
	}
	// One event per arm: another completion without rearming stays quiet.
	roundTrip(12)
	if readable(t, fd) {
		t.Fatal("fd readable for a second completion without a rearm")
	}
	if n, err := b.jfce.Wait(out, 0); err != nil || n != 0 {
		t.Fatalf("wait without an event returned %d, %v", n, err)
	}
	wait(t, b.recvJFC, 2, waitTimeout)
}

// Armed for solicited completions only, the JFC fires for a solicited
// receive and not for an ordinary one.
func testJFCESolicited(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{Events: true})
	target := a.importFrom(b, b.cfg.Token)
	fd := b.jfce.Fd()
	b.postRecv(1, 0, 64)
	b.postRecv(2, 64, 64)
	must(t, b.recvJFC.Rearm(true), "rearm solicited only")
	a.send(target, 1, 0, 64)
	wait(t, a.sendJFC, 1, waitTimeout)
	if readable(t, fd) {
		t.Fatal("fd readable for an unsolicited receive while armed for solicited only")
	}
	wr := a.sendWR(target, 2, 0, 64)
	wr.Flags |= urma.SendSolicitedEnable
	must(t, a.jetty.PostSend(wr), "post solicited send")
	if !pollFd(t, fd, int(waitTimeout/time.Millisecond)) {
		t.Fatal("fd not readable after a solicited receive")
	}
	out := make([]urma.JFC, 1)
	if n, err := b.jfce.Wait(out, 0); err != nil || n != 1 || out[0] != b.recvJFC {
		t.Fatalf("wait returned %d, %v", n, err)
	}
	b.recvJFC.Ack(1)
	cs := wait(t, b.recvJFC, 2, waitTimeout)
	if cs[0].UserCtx != 1 || cs[1].UserCtx != 2 {
		t.Fatalf("receives %+v, want 1 then 2", cs)
	}
}

// Wait blocks until an event or its timeout, and a Wait blocked with no
// timeout returns when the JFCE is closed.
func testJFCEWait(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{Events: true})
	target := a.importFrom(b, b.cfg.Token)
	out := make([]urma.JFC, 2)
	n, err := b.jfce.Wait(out, 20*time.Millisecond)
	if err != nil || n != 0 {
		t.Fatalf("wait with nothing armed returned %d, %v; want 0 after the timeout", n, err)
	}
	_, err = b.jfce.Wait(nil, 0)
	wantErr(t, err, urma.ErrInval, "wait with an empty output slice")
	must(t, b.recvJFC.Rearm(false), "rearm")
	got := make(chan int, 1)
	go func() {
		n, err := b.jfce.Wait(out, -1)
		if err != nil {
			n = -1
		}
		got <- n
	}()
	b.postRecv(1, 0, 64)
	a.send(target, 1, 0, 64)
	select {
	case n := <-got:
		if n != 1 {
			t.Fatalf("blocking wait returned %d", n)
		}
	case <-time.After(waitTimeout):
		t.Fatal("blocking wait did not return after a completion")
	}
	b.recvJFC.Ack(1)
	wait(t, b.recvJFC, 1, waitTimeout)

	// A spare JFCE with nothing attached: close releases a blocked Wait.
	spare, err := b.ctx.CreateJFCE()
	must(t, err, "create JFCE")
	done := make(chan error, 1)
	go func() {
		_, err := spare.Wait(make([]urma.JFC, 1), -1)
		done <- err
	}()
	// Close must wake a Wait already blocked, not only refuse a later one:
	// give the Wait the time to block (it must not return meanwhile; an
	// absence, so it can only wait a while) before closing under it.
	select {
	case err := <-done:
		t.Fatalf("Wait with no timeout returned (%v) with nothing armed and the JFCE open", err)
	case <-time.After(100 * time.Millisecond):
	}
	// Close waits for the waiter to leave: run it aside, so that a
	// provider that does not wake the waiter fails here, not hangs.
	closed := make(chan error, 1)
	go func() { closed <- spare.Close() }()
	select {
	case err := <-done:
		wantErr(t, err, urma.ErrClosed, "wait on a closed JFCE")
	case <-time.After(waitTimeout):
		t.Fatal("Wait did not return when its JFCE closed")
	}
	must(t, <-closed, "close JFCE")
}
