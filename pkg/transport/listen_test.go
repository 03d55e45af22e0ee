package transport

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// TestListenerBacklogBound: a Listener whose application does not call
// Accept holds at most Config.AcceptBacklog connections with a jetty and
// its receive buffers (handshakes past the hello plus completed ones);
// further clients get no answer (their handshakes wait for a seat, or for
// the kernel's listen backlog to be taken). An Accept frees a seat and the
// next client gets through; Close ends the accept loop waiting for a seat.
func TestListenerBacklogBound(t *testing.T) {
	checkNoLeaks(t)
	const backlog = 2
	pa, pb := fabricPair(t)
	scfg := cfgWith(pa, smallFlags())
	scfg.AcceptBacklog = backlog
	ln, d := listenAndDialer(t, scfg, cfgWith(pb, smallFlags()))
	dial := func(timeout time.Duration) (net.Conn, error) { return dialWithin(t, d, ln.Addr().String(), timeout) }

	// The first clients fill the backlog: their handshakes complete
	// (Dial returns once the server's hello came) although nobody accepts.
	for i := range backlog {
		c, err := dial(time.Minute)
		if err != nil {
			t.Fatalf("client %d within the backlog: %v", i, err)
		}
		if m := c.(Conn).Mode(); m != ModeURMA {
			t.Fatalf("client %d: mode %s (%s), want URMA", i, m, c.(Conn).FallbackReason())
		}
	}
	// The next ones are left in the kernel's backlog: the server never
	// answers their hellos, so their dials end with their own deadline
	// (long enough for a handshake that the listener did take on).
	const over = 3
	results := make(chan error, over)
	for range over {
		go func() {
			c, err := dial(2 * time.Second)
			if err == nil {
				err = errors.New("the handshake completed")
				_ = c.Close()
			}
			results <- err
		}()
	}
	for range over {
		// The dial's deadline is its TCP connection's too: either may say so.
		if err := <-results; !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
			t.Errorf("a client beyond the backlog of %d: %v; want its dial to time out unanswered", backlog, err)
		}
	}
	if _, inUse := ln.e.pool.stats(); inUse != backlog*ln.e.rqSize {
		t.Errorf("the listener holds %d receive buffers, want %d: the receive queues of %d connections", inUse, backlog*ln.e.rqSize, backlog)
	}

	// An Accept frees a seat: the clients given up on are taken and
	// dropped, then a new one gets through.
	first, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	next, err := dial(time.Minute)
	if err != nil {
		t.Fatalf("a client after an Accept freed a seat: %v", err)
	}
	for _, want := range []string{"the second client", "the client after the Accept"} {
		c, err := ln.Accept()
		if err != nil {
			t.Fatalf("accept %s: %v", want, err)
		}
		defer c.Close()
		if want == "the client after the Accept" && c.RemoteAddr().String() != next.LocalAddr().String() {
			t.Errorf("accepted %s, want %s from %s", c.RemoteAddr(), want, next.LocalAddr())
		}
	}

	// Full again, the accept loop waits for a seat; Close ends it (and
	// checkNoLeaks that nothing is left running).
	for range backlog {
		if _, err := dial(time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := ln.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// TestListenerCloseAbortsUnaccepted: Listener.Close ends the connections
// nobody accepted at once, with a reset, as the kernel resets those in a
// closed listener's queue: it does not wait for their peers, which the
// graceful Close of a connection does for up to CloseTimeout (here a
// minute) when the peer takes no message, and their resources come back.
func TestListenerCloseAbortsUnaccepted(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range []struct {
		name string
		// connect makes a client whose connection the listener completes
		// and holds unaccepted; it returns the client's TCP connection.
		connect func(t *testing.T, peer urma.Provider, addr string) net.Conn
	}{
		{"URMA, a peer that never takes a message", func(t *testing.T, peer urma.Provider, addr string) net.Conn {
			// No receive posted: the close marker would be retried
			// (RNR) until CloseTimeout.
			r := newRawQueuesPosting(t, peer, 0)
			r.ours, r.marks = true, true
			r.dial(addr)
			return r.tcp
		}},
		{"TCP fallback", func(t *testing.T, _ urma.Provider, addr string) net.Conn {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			if _, err := c.Write([]byte(syncBytes)); err != nil {
				t.Fatal(err)
			}
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			scfg := cfgWith(pa, smallFlags())
			scfg.NoToken = true // the raw peer presents no token
			scfg.CloseTimeout = time.Minute
			ln := listenLoopback(t, scfg)
			client := tc.connect(t, pb, ln.Addr().String())
			// The handshake completes on the server after the client's
			// last byte; nothing signals it but the queue.
			eventually.Holds(t, "the listener to hold the connection", 10*time.Second, func() bool { return len(ln.conns) == 1 })

			pool := ln.e.pool // the engine lets go of it when it goes
			closed := make(chan error, 1)
			go func() { closed <- ln.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("close: %v", err)
				}
			case <-time.After(scfg.CloseTimeout / 2):
				t.Fatalf("Listener.Close still runs after %s: it waits for the peer of a connection nobody accepted", scfg.CloseTimeout/2)
			}
			if _, err := client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("the client read %v after Listener.Close, want a reset (ECONNRESET)", err)
			}
			if _, inUse := pool.stats(); inUse != 0 {
				t.Errorf("%d pool buffers still out after Listener.Close", inUse)
			}
			if err := pool.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestSilentClientsHoldNoSeat: clients that stay silent (a plain TCP
// client that waits for the server to speak, here for the whole
// HandshakeTimeout) or stall in their hello hold a handshake, not a seat
// of Config.AcceptBacklog, which only connections with a jetty or waiting
// for Accept take. As many of them as leave one handshake free, far more
// than the backlog, do not keep an honest client from being served on
// URMA and accepted at once; one more fills the handshakes in progress
// (handshakesPerSeat times the backlog), and the next client is left in
// the kernel's listen backlog. Before, the first AcceptBacklog silent
// clients kept every other client waiting.
func TestSilentClientsHoldNoSeat(t *testing.T) {
	checkNoLeaks(t)
	const backlog = 2
	const handshakes = handshakesPerSeat * backlog
	pa, pb := fabricPair(t)
	scfg := cfgWith(pa, smallFlags())
	scfg.AcceptBacklog = backlog
	scfg.FirstBytesTimeout = -1 // silent clients wait the whole handshake
	scfg.HandshakeTimeout = time.Minute
	ln, d := listenAndDialer(t, scfg, cfgWith(pb, smallFlags()))
	stall := func(i int) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if i%2 == 1 { // the other half stop after their magic
			if _, err := c.Write([]byte(handshake.MagicV2)); err != nil {
				t.Fatal(err)
			}
		}
	}
	dial := func(timeout time.Duration) (net.Conn, error) { return dialWithin(t, d, ln.Addr().String(), timeout) }

	// The kernel's listen backlog hands clients over in the order they
	// connected: the listener takes the stalling ones first.
	for i := range handshakes - 1 {
		stall(i)
	}
	c, err := dial(10 * time.Second)
	if err != nil {
		t.Fatalf("an honest client after %d stalling ones (AcceptBacklog %d): %v", handshakes-1, backlog, err)
	}
	if m := c.(Conn).Mode(); m != ModeURMA {
		t.Errorf("the honest client: mode %s (%s), want URMA", m, c.(Conn).FallbackReason())
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.RemoteAddr().String() != c.LocalAddr().String() {
		t.Errorf("accepted %s, want the honest client %s", a.RemoteAddr(), c.LocalAddr())
	}

	// One more fills the handshakes: the next client gets no answer.
	stall(handshakes)
	if c, err := dial(2 * time.Second); err == nil {
		_ = c.Close()
		t.Errorf("a client was served beyond %d handshakes in progress", handshakes)
	} else if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Errorf("a client beyond %d handshakes in progress: %v; want its dial to time out unanswered", handshakes, err)
	}
}

// TestNoSeatFallsBack: a client whose handshake finds every seat of
// Config.AcceptBacklog held (here by a connection nobody accepted) is not
// left unanswered: at three quarters of HandshakeTimeout the server sends
// its fallback hello, both sides go on as TCP, and the connection waits
// for a seat before Accept returns it.
func TestNoSeatFallsBack(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	scfg := cfgWith(pa, smallFlags())
	scfg.AcceptBacklog = 1
	scfg.HandshakeTimeout = 2 * time.Second
	ccfg := cfgWith(pb, smallFlags())
	ccfg.HandshakeTimeout = scfg.HandshakeTimeout
	ln, d := listenAndDialer(t, scfg, ccfg)
	dial := func() Conn {
		c, err := d.DialContext(t.Context(), ln.Addr().String())
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c.(Conn)
	}
	first := dial()
	if first.Mode() != ModeURMA {
		t.Fatalf("the first client: mode %s (%s), want URMA", first.Mode(), first.FallbackReason())
	}
	second := dial()
	if second.Mode() != ModeTCP || !strings.HasPrefix(second.FallbackReason(), string(ReasonPeerDeclined)+":") {
		t.Fatalf("the client that found no seat: mode %s, fallback %q; want TCP, %s", second.Mode(), second.FallbackReason(), ReasonPeerDeclined)
	}
	for _, want := range []Conn{first, second} {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.RemoteAddr().String() != want.LocalAddr().String() {
			t.Fatalf("accepted %s, want %s", c.RemoteAddr(), want.LocalAddr())
		}
		if want == second {
			if why := c.(Conn).FallbackReason(); !strings.HasPrefix(why, string(ReasonResources)+":") || !strings.Contains(why, "no place among the listener's") {
				t.Errorf("server fallback %q; want %s saying it found no seat", why, ReasonResources)
			}
			exchange(t, second, c, "after waiting for a seat")
		}
	}
}

// dialWithin dials addr with d, giving up after timeout; a connection made
// closes with the test.
func dialWithin(t *testing.T, d *Dialer, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := d.DialContext(ctx, addr)
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// TestFailedHandshakeGivesItsSeatBack: a handshake that took a seat of
// the AcceptBacklog (its jetty set up, its hello sent) and then failed (no
// ACK within the server's urma_ack_timeout) gives the seat back, so the
// next client is served on URMA and accepted. Kept, the seat was lost for
// good: with a backlog of one, no client was accepted on URMA again.
func TestFailedHandshakeGivesItsSeatBack(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	scfg := cfgWith(pa, smallFlags())
	scfg.AcceptBacklog = 1
	scfg.AckTimeout = time.Second
	ln := listenLoopback(t, scfg)

	// A client that stalls importing the server's jetty, bounded only by
	// its context, which the test cancels once the server gave up on it.
	cp := newFaultProvider(pb)
	cp.f.set(func(c *faultConfig) { c.stallImport = true })
	ccfg := cfgWith(cp, smallFlags())
	ccfg.HandshakeTimeout = time.Hour
	ccfg.AckTimeout = -1
	stalled, err := NewDialer(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	ctx, cancel := context.WithCancel(context.Background())
	dialed := dialAsync(ctx, stalled, ln.Addr().String())
	eventually.Holds(t, "the server to hold a seat for the stalled client", stallBound, func() bool { return len(ln.seats) == 1 })
	eventually.Holds(t, "the failed handshake to give its seat back", stallBound, func() bool { return len(ln.seats) == 0 })
	cancel()
	(<-dialed).closeIfDialed() // cancelled, or a fallback onto the connection the server dropped

	d, err := NewDialer(cfgWith(pb, smallFlags()))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := dialWithin(t, d, ln.Addr().String(), stallBound)
	if err != nil {
		t.Fatal(err)
	}
	if m := c.(Conn).Mode(); m != ModeURMA {
		t.Fatalf("the next client: mode %s (%s), want URMA", m, c.(Conn).FallbackReason())
	}
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	exchange(t, c, sc, "after the failed handshake")
}
