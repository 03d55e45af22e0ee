package transport

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// TestListenerBacklogBound: a Listener whose application does not call
// Accept holds at most Config.AcceptBacklog connections (handshakes in
// progress plus completed ones), each with a jetty and its receive buffers
// in URMA mode; further clients wait in the kernel's listen backlog, so
// their handshakes do not even start. An Accept frees a place and the next
// client gets through; Close ends the accept loop waiting for a place.
func TestListenerBacklogBound(t *testing.T) {
	checkNoLeaks(t)
	const backlog = 2
	pa, pb := fabricPair(t)
	scfg := cfgWith(pa, smallFlags())
	scfg.AcceptBacklog = backlog
	ln, d := listenAndDialer(t, scfg, cfgWith(pb, smallFlags()))
	dial := func(timeout time.Duration) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := d.DialContext(ctx, ln.Addr().String())
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
		return c, err
	}

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

	// An Accept frees a place: the clients given up on are taken and
	// dropped, then a new one gets through.
	first, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	next, err := dial(time.Minute)
	if err != nil {
		t.Fatalf("a client after an Accept freed a place: %v", err)
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

	// Full again, the accept loop waits for a place; Close ends it (and
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
			waitFor(t, "the listener to hold the connection", 10*time.Second, func() bool { return len(ln.conns) == 1 })

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
