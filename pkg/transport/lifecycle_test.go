package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// TestReleaseRacesClose: a received buffer released while its connection
// closes goes back to the pool whichever comes first; its slot is never
// lost (issue 9, item 2). The first case releases it at the worst moment,
// just after the JFR is destroyed; the second lets the two race freely,
// many times.
func TestReleaseRacesClose(t *testing.T) {
	checkNoLeaks(t)
	iterations := 300
	if testing.Short() {
		iterations = 30
	}
	for _, tc := range []struct {
		name         string
		iterations   int
		atJFRDestroy bool
	}{
		{"release as the JFR is destroyed", 1, true},
		{"release racing close", iterations, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			fp := newFaultProvider(pa)
			f := smallFlags()
			f.PreparedJettyCnt = 0 // nothing but the connection holds pool buffers
			ln, d := listenAndDialer(t, cfgWith(fp, f), cfgWith(pb, f))
			msg := make([]byte, f.ZerocopyMinSize) // handed over in its receive buffer
			for i := 0; i < tc.iterations; i++ {
				p := dialAccept(t, ln, d)
				if p.server.Mode() != ModeURMA {
					t.Fatal(p.server.FallbackReason())
				}
				if _, err := p.client.Write(msg); err != nil {
					t.Fatal(err)
				}
				b, err := p.server.(ZeroCopyConn).ReadBuffer()
				if err != nil {
					t.Fatal(err)
				}
				if b.recv == nil {
					t.Fatal("the message was copied, not handed over in its receive buffer")
				}
				if tc.atJFRDestroy {
					fp.f.set(func(c *faultConfig) { c.onJFRClose = b.Release })
					_ = p.server.Close()
					fp.f.set(func(c *faultConfig) { c.onJFRClose = nil })
				} else {
					var wg sync.WaitGroup
					wg.Add(2)
					go func() { defer wg.Done(); b.Release() }()
					go func() { defer wg.Done(); _ = p.server.Close() }()
					wg.Wait()
				}
				_ = p.client.Close()
				if _, inUse := ln.e.pool.stats(); inUse != 0 {
					t.Fatalf("iteration %d: %d server buffers still out after the connection closed and its buffer was released", i, inUse)
				}
			}
		})
	}
}

// TestWriteBufferRacesRelease: a buffer passed to WriteBuffer while another
// goroutine releases it is taken back exactly once: either the write sends
// it or the release returns it, and the pool never holds it twice (issue 9,
// item 6).
func TestWriteBufferRacesRelease(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	go func() { _, _ = io.Copy(io.Discard, p.server) }()
	zc := p.client.(ZeroCopyConn)
	iterations := 2000
	if testing.Short() {
		iterations = 200
	}
	for i := 0; i < iterations; i++ {
		b, err := zc.AllocBuffer()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); b.Release() }()
		_ = zc.WriteBuffer(b, 1) // fails when the release won
		<-done
	}
	pool := p.client.(*urmaConn).pool
	if err := pool.check(); err != nil {
		t.Fatal(err)
	}
}

// TestBufferOutlivesTransport: buffers the application still holds, from
// ReadBuffer and AllocBuffer, stay usable after their connection, the
// Dialer and the Listener are all closed: the registered memory is unmapped
// only once the last of them is released, and a write of one fails cleanly
// (issue 9, item 1; before, touching one faulted the process).
func TestBufferOutlivesTransport(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	f := smallFlags()
	ln, d := listenAndDialer(t, cfgWith(pa, f), cfgWith(pb, f))
	p := dialAccept(t, ln, d)
	if p.server.Mode() != ModeURMA {
		t.Fatal(p.server.FallbackReason())
	}
	msg := bytes.Repeat([]byte("m"), f.ZerocopyMinSize)
	if _, err := p.client.Write(msg); err != nil {
		t.Fatal(err)
	}
	received, err := p.server.(ZeroCopyConn).ReadBuffer()
	if err != nil {
		t.Fatal(err)
	}
	if received.recv == nil {
		t.Fatal("the message was copied, not handed over in its receive buffer")
	}
	allocated, err := p.client.(ZeroCopyConn).AllocBuffer()
	if err != nil {
		t.Fatal(err)
	}
	serverMem, clientMem := ln.e.pool.mem, d.e.pool.mem
	_ = p.client.Close()
	_ = p.server.Close()
	_ = d.Close()
	_ = ln.Close()
	// The last reference may be the bring-up goroutine's, which drops it
	// just after the engine is up: wait for the teardown wherever it runs.
	for _, e := range []*engine{d.e, ln.e} {
		select {
		case <-e.released:
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s's engine was not torn down", e.role)
		}
	}

	// Both buffers are still mapped: read and write them.
	if !bytes.Equal(received.Bytes(), msg) {
		t.Error("the received buffer changed after close")
	}
	copy(allocated.Data(), "still here")
	if string(allocated.Data()[:10]) != "still here" {
		t.Error("the allocated buffer does not keep what was written to it")
	}
	if received.Len() == 0 || clientMem.Bytes() == nil || serverMem.Bytes() == nil {
		t.Fatal("a pool was unmapped while the application held one of its buffers")
	}
	if b, err := p.client.(ZeroCopyConn).AllocBuffer(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("AllocBuffer after close: %v, %v; want net.ErrClosed", b, err)
	}
	// Writing the allocated buffer fails and takes it back: the client's
	// last buffer, so its pool goes.
	if err := p.client.(ZeroCopyConn).WriteBuffer(allocated, 10); err == nil {
		t.Error("WriteBuffer on a closed connection succeeded")
	}
	if clientMem.Bytes() != nil {
		t.Error("the client's pool is still mapped after its last buffer came back")
	}
	received.Release()
	received.Release() // a second release after close is a no-op too
	if serverMem.Bytes() != nil {
		t.Error("the server's pool is still mapped after its last buffer was released")
	}
}

// TestWriteAfterCloseSaysClosed: a write on a closed connection reports
// net.ErrClosed even when its write deadline has passed too, as Read does
// and as Go's own connections do; with the connection open the deadline
// is what it reports.
func TestWriteAfterCloseSaysClosed(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	if p.client.Mode() != ModeURMA {
		t.Fatalf("client in %s mode (%s), want URMA", p.client.Mode(), p.client.FallbackReason())
	}
	if err := p.client.SetWriteDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past its deadline on an open connection: %v, want os.ErrDeadlineExceeded", err)
	}
	_ = p.client.Close()
	_ = p.server.Close()
	if _, err := p.client.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close, past its deadline: %v, want net.ErrClosed", err)
	}
}

// TestWriteDuringCloseFailsAtOnce: Close waits for the sends posted
// before it, holding the write lock, up to CloseTimeout; a Write or
// WriteBuffer that starts meanwhile fails with net.ErrClosed at once
// instead of waiting for Close to give the lock up.
func TestWriteDuringCloseFailsAtOnce(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	fp := newFaultProvider(pb)
	ccfg := cfgWith(fp, smallFlags())
	ccfg.CloseTimeout = 20 * time.Second // Close holds on until the test lets it go
	p := connect(t, cfgWith(pa, smallFlags()), ccfg)
	if p.client.Mode() != ModeURMA {
		t.Fatalf("client in %s mode (%s), want URMA", p.client.Mode(), p.client.FallbackReason())
	}
	buf, err := p.client.(ZeroCopyConn).AllocBuffer()
	if err != nil {
		t.Fatal(err)
	}
	// The client's completions are no longer taken: its next send stays
	// outstanding, and Close waits for it until CloseTimeout.
	fp.f.set(func(c *faultConfig) { c.muteEvents = true })
	if _, err := p.client.Write([]byte("outstanding")); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = p.client.Close()
	}()
	eventually.Holds(t, "Close to begin", 10*time.Second, func() bool { return p.client.Debug().State == stateClosing.String() })
	_, werr := p.client.Write([]byte("late"))
	bwerr := p.client.(ZeroCopyConn).WriteBuffer(buf, 1)
	uc := p.client.(*urmaConn)
	if uc.writeMu.TryLock() {
		uc.writeMu.Unlock()
		t.Error("the writes returned only once Close gave up the write lock")
	}
	if !errors.Is(werr, net.ErrClosed) || !errors.Is(bwerr, net.ErrClosed) {
		t.Errorf("Write and WriteBuffer during Close: %v and %v, want net.ErrClosed", werr, bwerr)
	}
	// Let Close go: take the completions the muted events held back.
	fp.f.set(func(c *faultConfig) { c.muteEvents = false })
	eventually.Holds(t, "Close to return", 10*time.Second, func() bool {
		uc.poll()
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
	_ = p.server.Close()
}

// TestFailureIsNotEOF: when one side's data plane fails (its completion
// queue, or a post), it aborts the TCP connection, and the other side's
// pending Read ends with an error that says the peer aborted, never io.EOF
// (issue 9, item 3). A clean Close, in contrast, is io.EOF.
func TestFailureIsNotEOF(t *testing.T) {
	checkNoLeaks(t)
	injected := urma.Errorf("injected", urma.CodeFail, "by the test")
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, p pair, fp *faultProvider)
	}{
		{"completion queue fails", func(_ *testing.T, p pair, fp *faultProvider) {
			fp.f.set(func(c *faultConfig) { c.poll = injected })
			_, _ = p.client.Write([]byte("x")) // an event for the server to poll
		}},
		{"post fails", func(t *testing.T, p pair, fp *faultProvider) {
			fp.f.set(func(c *faultConfig) { c.postSend = injected })
			if _, err := p.server.Write([]byte("x")); !errors.Is(err, urma.ErrFail) {
				t.Errorf("write with a failing post: %v, want the injected error", err)
			}
		}},
		{"clean close", func(_ *testing.T, p pair, _ *faultProvider) { _ = p.server.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			fp := newFaultProvider(pa)
			p := connect(t, cfgWith(fp, smallFlags()), cfgWith(pb, smallFlags()))
			exchange(t, p.client, p.server, "alive")
			started, errc := readUntilError(p.client)
			<-started
			tc.breakIt(t, p, fp)
			var err error
			select {
			case err = <-errc:
			case <-time.After(deathBound):
				t.Fatalf("the client's read still blocked %s after the server failed", deathBound)
			}
			if tc.name == "clean close" {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("read after the server's Close: %v, want io.EOF", err)
				}
				return
			}
			if !errors.Is(err, errPeerAborted) || errors.Is(err, io.EOF) {
				t.Fatalf("read after the server failed: %v; want the peer-aborted error, not io.EOF", err)
			}
			if _, err := p.server.Read(make([]byte, 1)); !errors.Is(err, injected) {
				t.Errorf("the failed side's own read: %v, want the injected error", err)
			}
		})
	}
}

// TestReleaseOfABufferNotHandedOut: Release of a buffer that names the
// connection but is not a receive buffer it handed to the application (a
// slot out of range, another buffer in the slot, a receive still posted)
// changes nothing: no repost, no credit, no panic, and the connection
// goes on.
func TestReleaseOfABufferNotHandedOut(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	uc := p.server.(*urmaConn)
	// One receive buffer is the application's.
	if _, err := p.client.Write(make([]byte, smallFlags().ZerocopyMinSize)); err != nil {
		t.Fatal(err)
	}
	held, err := uc.ReadBuffer()
	if err != nil {
		t.Fatal(err)
	}
	if held.recv == nil {
		t.Fatal("the message was copied, not handed over in its receive buffer")
	}
	posted := uc.rx[(held.slot+1)%int32(len(uc.rx))]
	for _, tc := range []struct {
		name string
		buf  *Buffer
	}{
		{"slot -1", &Buffer{recv: uc, slot: -1}},
		{"slot past the last", &Buffer{recv: uc, slot: int32(len(uc.rx))}},
		{"another buffer in the application slot", &Buffer{recv: uc, slot: held.slot}},
		{"a receive still posted", posted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.buf
			uc.mu.Lock()
			before, credits := append([]rxState(nil), uc.rxState...), uc.pendingCredits
			uc.mu.Unlock()
			b.held.Store(true)
			b.Release()
			uc.mu.Lock()
			after, creditsAfter := append([]rxState(nil), uc.rxState...), uc.pendingCredits
			same := slices.Equal(before, after) && credits == creditsAfter
			uc.mu.Unlock()
			if !same {
				t.Fatalf("receive slots %v and %d pending credits became %v and %d", before, credits, after, creditsAfter)
			}
			exchange(t, p.client, p.server, "still connected")
		})
	}
	held.Release()
}

// deadlineSpy is a client's TCP connection that reports whether a read
// after the handshake's last write (its ACK) ran under a deadline. When the
// handshake clears its deadline, it gives such a read a moment to start
// first, so that a watcher started too early is caught in the act.
type deadlineSpy struct {
	net.Conn
	mu        sync.Mutex
	deadline  time.Time
	acked     bool          // the handshake wrote its last bytes
	lateRead  chan struct{} // closed when a read starts after the ACK
	underLine bool          // that read ran under the handshake's deadline
}

func (s *deadlineSpy) Write(p []byte) (int, error) {
	if bytes.Equal(p, handshake.AppendAck(nil, true)) { // the client's last handshake write
		s.mu.Lock()
		s.acked = true
		s.mu.Unlock()
	}
	return s.Conn.Write(p)
}

func (s *deadlineSpy) Read(p []byte) (int, error) {
	s.mu.Lock()
	if s.acked {
		select {
		case <-s.lateRead:
		default:
			s.underLine = !s.deadline.IsZero()
			close(s.lateRead)
		}
	}
	s.mu.Unlock()
	return s.Conn.Read(p)
}

func (s *deadlineSpy) SetDeadline(t time.Time) error {
	if t.IsZero() {
		select {
		case <-s.lateRead:
		case <-time.After(200 * time.Millisecond): // a correct handshake has no such read
		}
	}
	s.mu.Lock()
	s.deadline = t
	s.mu.Unlock()
	return s.Conn.SetDeadline(t)
}

// The TCP watcher of a URMA connection reads only once the handshake has
// cleared its deadline: a read started before could end with that deadline
// and fail a connection that is up.
func TestWatcherStartsAfterTheHandshakeDeadline(t *testing.T) {
	pa, pb := fabricPair(t)
	ln, d := listenAndDialer(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	tcp, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if !d.e.ref() {
		t.Fatal("dialer closed")
	}
	defer d.e.unref()
	d.e.start(netip.MustParseAddr("127.0.0.1"))
	spy := &deadlineSpy{Conn: tcp, lateRead: make(chan struct{})}
	c, err := clientHandshake(context.Background(), d.e, spy, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() != ModeURMA {
		t.Fatalf("mode %s (%s), want urma", c.Mode(), c.FallbackReason())
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	select {
	case <-spy.lateRead: // the watcher's read
	case <-time.After(10 * time.Second):
		t.Fatal("no watcher read the TCP connection")
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	if spy.underLine {
		t.Fatal("the watcher read the TCP connection under the handshake's deadline")
	}
}

// TestCloseBoundedByCloseTimeout: Close waits for the sends posted before
// it, and for the close marker after them, within CloseTimeout in all,
// not CloseTimeout per wait, even when the peer never takes a message
// (no receive posted: RNR, retried forever). The send it gave up on still
// comes back to the pool, through its flushed completion.
func TestCloseBoundedByCloseTimeout(t *testing.T) {
	checkNoLeaks(t)
	// Long enough that the bound's slack (3/4 of it) dwarfs everything
	// else Close does; the old behaviour, a wait per step, took twice it.
	const closeTimeout = 2 * time.Second
	const bound = closeTimeout * 7 / 4
	for _, tc := range []struct {
		name  string
		marks bool // the peer expects the close marker: a second wait
	}{
		{"our peer, which expects a close marker", true},
		{"brpc peer, no close marker", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			scfg := cfgWith(pa, smallFlags())
			scfg.NoToken = true // the raw peer presents no token
			scfg.CloseTimeout = closeTimeout
			ln, err := ListenTransport("tcp", "127.0.0.1:0", scfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ln.Close() })
			r := newRawQueuesPosting(t, pb, 0)
			r.ours, r.marks = tc.marks, tc.marks
			r.dial(ln.Addr().String())
			nc, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			c, ok := nc.(*urmaConn)
			if !ok {
				t.Fatalf("mode %s (%s), want URMA", nc.(Conn).Mode(), nc.(Conn).FallbackReason())
			}
			if c.peerMarks != tc.marks {
				t.Fatalf("the peer's close-marker flag is %v, want %v", c.peerMarks, tc.marks)
			}
			if _, err := c.Write([]byte("never taken")); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_ = c.Close()
			elapsed := time.Since(start)
			if elapsed < closeTimeout {
				t.Errorf("Close returned after %s, before CloseTimeout (%s): it did not wait for the outstanding send", elapsed, closeTimeout)
			}
			if elapsed >= bound {
				t.Errorf("Close took %s with CloseTimeout %s; want it bounded by CloseTimeout (under %s)", elapsed, closeTimeout, bound)
			}
			if _, inUse := c.pool.stats(); inUse != 0 {
				t.Errorf("%d pool buffers still out after Close; the unsent one must come back through its flushed completion", inUse)
			}
			if err := c.pool.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// connKind makes one kind of connection for the net.Conn contract tests.
type connKind struct {
	name string
	conn func(*testing.T) net.Conn
}

// connKinds are a plain *net.TCPConn (the reference), a URMA connection and
// a TCP fallback; each closes with the test.
func connKinds() []connKind {
	return []connKind{
		{"plain TCP", func(t *testing.T) net.Conn {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}},
		{"urma", func(t *testing.T) net.Conn {
			pa, pb := fabricPair(t)
			return connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags())).client
		}},
		{"tcp fallback", func(t *testing.T) net.Conn {
			pa, pb := fabricPair(t)
			scfg := cfgWith(pa, smallFlags())
			scfg.DisableURMA = true
			return connect(t, scfg, cfgWith(pb, smallFlags())).client
		}},
	}
}

// TestSecondCloseSaysClosed: a second Close fails with net.ErrClosed in
// both modes, as *net.TCPConn's does (the first row, the reference).
func TestSecondCloseSaysClosed(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range connKinds() {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.conn(t)
			if err := c.Close(); err != nil {
				t.Fatalf("first Close: %v", err)
			}
			if err := c.Close(); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("second Close: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestSetDeadlineAfterCloseSaysClosed: SetDeadline, SetReadDeadline and
// SetWriteDeadline after Close fail with net.ErrClosed in a *net.OpError
// in both modes, as *net.TCPConn's do (the first rows, the reference), and
// arm no timer for a connection that is gone.
func TestSetDeadlineAfterCloseSaysClosed(t *testing.T) {
	checkNoLeaks(t)
	conns := connKinds()
	setters := []struct {
		name string
		set  func(net.Conn, time.Time) error
	}{
		{"SetDeadline", net.Conn.SetDeadline},
		{"SetReadDeadline", net.Conn.SetReadDeadline},
		{"SetWriteDeadline", net.Conn.SetWriteDeadline},
	}
	for _, cc := range conns {
		for _, st := range setters {
			t.Run(cc.name+"/"+st.name, func(t *testing.T) {
				c := cc.conn(t)
				if err := c.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				err := st.set(c, time.Now().Add(time.Hour))
				var oe *net.OpError
				if !errors.Is(err, net.ErrClosed) || !errors.As(err, &oe) || oe.Op != "set" {
					t.Fatalf("%s after Close: %v (%T), want net.ErrClosed in a *net.OpError (Op set)", st.name, err, err)
				}
				for _, d := range deadlinesOf(c) {
					if d.armed() {
						t.Errorf("%s after Close armed a deadline timer", st.name)
					}
				}
			})
		}
	}
}

// TestDeadlineSetAfterStopArmsNothing: a SetDeadline that checked the
// connection open just before Close stopped its deadlines arms nothing
// when it gets to them.
func TestDeadlineSetAfterStopArmsNothing(t *testing.T) {
	d := newDeadline()
	d.set(time.Now().Add(time.Hour))
	d.stop()
	if d.armed() {
		t.Fatal("stop left the timer armed")
	}
	d.set(time.Now().Add(time.Hour))
	if d.armed() {
		t.Fatal("set after stop armed a timer")
	}
}

// deadlinesOf is the transport's read and write deadlines of c, none for a
// plain net.Conn.
func deadlinesOf(c net.Conn) []*deadline {
	switch c := c.(type) {
	case *urmaConn:
		return []*deadline{c.rdl, c.wdl}
	case *tcpConn:
		return []*deadline{c.rdl, c.wdl}
	}
	return nil
}

// armed reports whether a timer is set to fire the deadline.
func (d *deadline) armed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.timer != nil
}
