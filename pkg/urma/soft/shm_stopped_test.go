package soft

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// fakeTarget is a device, a side on it, and that side's import of jetty 5
// of a fake shm peer (fakeShmPeer), which the test drives by hand.
type fakeTarget struct {
	p      *Provider
	sink   *logtest.Lines
	a      *side
	f      *shmIO
	target urma.RemoteJetty
	conn   *conn
}

// newFakeTarget connects a fake shm peer to a device made with opts and
// imports the peer's jetty 5, which the fake grants.
func newFakeTarget(t *testing.T, opts Options, jc urma.JettyConfig) *fakeTarget {
	t.Helper()
	if jc.Mode == 0 {
		jc.Mode = urma.RC
	}
	ft := &fakeTarget{}
	ft.p, ft.sink = loggedProvider(t, opts)
	ft.a = newSide(t, ft.p, jc, 64)
	var fake urma.EID
	ft.f, fake = fakeShmPeer(t, ft.p.devices[0].side)
	granted := make(chan error, 1)
	go func() { granted <- grantImport(ft.f) }()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var err error
	ft.target, err = ft.a.ctx.ImportJetty(ctx, urma.JettyID{EID: fake, ID: 5}, jc.Mode, 7)
	if err != nil {
		ft.f.Shutdown()
		<-granted
		t.Fatalf("import from the fake peer: %v", err)
	}
	t.Cleanup(func() { _ = ft.target.Close() })
	mustOK(t, <-granted, "grant the import")
	ft.conn = ft.p.conns()[0]
	return ft
}

// readFakeFrame reads the next frame the device wrote into the fake
// peer's ring, sleeping until one comes: its type and, for a SEND, its
// header (the payload is read and dropped).
func readFakeFrame(f *shmIO) (typ byte, h sendHeader, err error) {
	if err = f.Idle(); err != nil {
		return 0, h, err
	}
	var hdr [4 + sendHdrLen]byte
	if err = f.ReadFull(hdr[:5]); err != nil {
		return 0, h, err
	}
	n, typ := be.Uint32(hdr[:4]), hdr[4]
	if typ != frameSend {
		return typ, h, f.Discard(int(n) - 1)
	}
	if err = f.ReadFull(hdr[5:]); err != nil {
		return typ, h, err
	}
	if err = decodeSendHeader(hdr[4:], n, &h); err != nil {
		return typ, h, err
	}
	return typ, h, f.Discard(int(h.length))
}

// goFake runs the fake peer's part of a test in a goroutine, which the
// test's end stops (it shuts the fake's rings down) and waits for; what it
// returns comes on the channel.
func goFake(t *testing.T, f *shmIO, run func() error) <-chan error {
	done := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		done <- run()
	}()
	t.Cleanup(func() {
		f.Shutdown()
		wg.Wait()
	})
	return done
}

// fakeAnswer writes the fake peer's answer st to the SEND h.
func fakeAnswer(f *shmIO, h *sendHeader, st urma.Status, rnrTimer uint8) error {
	var b [4 + ackLen]byte
	return f.write(encodeAck(b[:], &ackFrame{status: st, rnrTimer: rnrTimer, src: h.src, dst: h.dst, tag: h.tag}))
}

// checkStopped checks the completions of sends 1..n to a peer that
// stopped after answering the first ok with SUCCESS: the next completes
// with ACK_TIMEOUT and the rest are flushed, in post order, no earlier than
// PeerTimeout after start; the connection died of want and the log says so.
func checkStopped(t *testing.T, ft *fakeTarget, start time.Time, n, ok int, peerTO time.Duration, want error) {
	t.Helper()
	got := pollN(t, ft.a.sjfc, n, peerTO+20*time.Second) // a hang, not a measurement
	elapsed := time.Since(start)
	for i, c := range got {
		st := urma.StatusWRFlushErr
		switch {
		case i < ok:
			st = urma.StatusSuccess
		case i == ok:
			st = urma.StatusAckTimeout
		}
		if c.Status != st || c.UserCtx != uint64(i+1) {
			t.Errorf("completion %d: %v of send %d, want %v of send %d", i, c.Status, c.UserCtx, st, i+1)
		}
	}
	if elapsed < peerTO {
		t.Errorf("the connection failed %v after the sends, before PeerTimeout %v", elapsed, peerTO)
	}
	if err := ft.conn.deathCause(); !errors.Is(err, want) {
		t.Errorf("the connection died of %v, want %v", err, want)
	}
	line := fmt.Sprintf("%v for %v", want, peerTO)
	eventually.Holds(t, "the device to log why it closed the connection", 0, func() bool { return ft.sink.Contains(line) })
}

// A live shm peer that reads the sends but stops answering them (stopped
// between frames by SIGSTOP or a debugger, hung, buggy) is a silent peer
// as on the socket fabric, and as on hardware, where an unanswered send
// completes with ACK_TIMEOUT once its retries are spent: PeerTimeout
// after the peer last did anything, the connection fails, the oldest send
// still waiting completes with ACK_TIMEOUT and the rest are flushed, in
// post order. What it answered before it stopped completes normally.
func TestShmPeerStopsAnswering(t *testing.T) {
	const peerTO = 250 * time.Millisecond
	const sends = 4
	cases := []struct {
		name     string
		answered int // sends the peer answers before it stops answering
	}{
		{"it answers none", 0},
		{"it answers two, then none", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			opts := shmOpts(t)
			opts.PeerTimeout = peerTO
			ft := newFakeTarget(t, opts, urma.JettyConfig{})
			goFake(t, ft.f, func() error {
				answered := 0
				for {
					typ, h, err := readFakeFrame(ft.f)
					if err == nil && typ == frameSend && answered < c.answered {
						answered++
						err = fakeAnswer(ft.f, &h, urma.StatusSuccess, 0)
					}
					if err != nil {
						return err
					}
				}
			})
			start := time.Now()
			for i := range sends {
				mustOK(t, ft.a.send(ft.target, uint64(i+1), 0, 64, 0), "send")
			}
			checkStopped(t, ft, start, sends, c.answered, peerTO, errPeerNotAnswering)
		})
	}
}

// A live shm peer that stops reading (SIGSTOP, a debugger, a hung
// process) leaves the device's writer waiting for room in a full ring:
// PeerTimeout after the peer last read a byte, the connection fails, the
// send being written completes with ACK_TIMEOUT and the one behind it is
// flushed, and closing the jetty, which waits for the send being written,
// returns.
func TestShmPeerStopsReading(t *testing.T) {
	const peerTO = 250 * time.Millisecond
	cases := []struct {
		name  string
		read  int  // bytes the peer reads before it stops
		close bool // the application closes the jetty rather than polling
	}{
		{"it never reads, the application polls", 0, false},
		{"it reads part of the frame then stops, the application polls", 16 << 10, false},
		{"it never reads, the application closes the jetty", 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			opts := shmOpts(t)
			opts.PeerTimeout = peerTO
			opts.ShmRingSize = MinShmRing
			ft := newFakeTarget(t, opts, urma.JettyConfig{})
			start := time.Now()
			// Four rings' worth: the device's writer fills the ring and
			// waits for room.
			mustOK(t, ft.a.send(ft.target, 1, 0, 4*MinShmRing, 0), "send")
			mustOK(t, ft.a.send(ft.target, 2, 0, 64, 0), "send")
			if c.read > 0 {
				mustOK(t, ft.f.Idle(), "wait for the frame")
				mustOK(t, ft.f.Discard(c.read), "read part of it")
			}
			if !c.close {
				checkStopped(t, ft, start, 2, 0, peerTO, errPeerNotReading)
				return
			}
			closed := make(chan error, 1)
			go func() { closed <- ft.a.jetty.Close() }()
			select {
			case err := <-closed:
				mustOK(t, err, "close the jetty")
			case <-time.After(peerTO + 20*time.Second): // a hang, not a measurement
				ft.conn.fail(errors.New("the test gave up"))
				<-closed
				t.Fatal("closing the jetty waits for good for the send being written")
			}
			if elapsed := time.Since(start); elapsed < peerTO {
				t.Errorf("the connection failed %v after the send, before PeerTimeout %v", elapsed, peerTO)
			}
			if err := ft.conn.deathCause(); !errors.Is(err, errPeerNotReading) {
				t.Errorf("the connection died of %v, want %v", err, errPeerNotReading)
			}
		})
	}
}

// pace runs pass after each of the device's next n watchdog passes, so
// that between any two passes the fake peer did what pass does (nil:
// nothing). pass runs on the watchdog's goroutine: it reports with
// t.Errorf.
func pace(t *testing.T, ft *fakeTarget, n int, pass func()) {
	t.Helper()
	done := make(chan struct{})
	k := 0 // the watchdog's goroutine only
	f := func() {
		if k == n {
			return
		}
		if pass != nil {
			pass()
		}
		if k++; k == n {
			close(done)
		}
	}
	sd := ft.p.devices[0].side
	sd.afterWatch.Store(&f)
	defer sd.afterWatch.Store(nil)
	select {
	case <-done:
	case <-time.After(time.Duration(n)*sd.peerTO + 20*time.Second): // a hang, not a measurement
		t.Fatalf("the watchdog did not pass %d times", n)
	}
}

// A peer that is busy but makes progress, however slowly, is never
// failed: one that reads a little of a large frame at each of the
// watchdog's passes, or answers one send at each, for three
// PeerTimeouts; one that answers "not ready" again and again while the
// sender waits longer than PeerTimeout to retry (RNR may last forever); an
// idle one; and a stopped one that left only the answers to its own sends
// unread, since nothing of this side waits on it.
func TestShmBusyPeerIsNotFailed(t *testing.T) {
	const peerTO = 250 * time.Millisecond
	const passes = 13 // three PeerTimeouts of ticks between the first and the last
	cases := []struct {
		name string
		jc   urma.JettyConfig
		// run drives the device and the fake peer; it returns the
		// statuses the device's sends must complete with, in post order.
		run func(t *testing.T, ft *fakeTarget) []urma.Status
	}{
		{"it reads a little of a large frame at a time", urma.JettyConfig{}, func(t *testing.T, ft *fakeTarget) []urma.Status {
			mustOK(t, ft.a.send(ft.target, 1, 0, 4*MinShmRing, 0), "send")
			mustOK(t, ft.f.Idle(), "wait for the frame")
			var hb [4 + sendHdrLen]byte
			mustOK(t, ft.f.ReadFull(hb[:]), "read the SEND's header")
			var h sendHeader
			mustOK(t, decodeSendHeader(hb[4:], be.Uint32(hb[:4]), &h), "decode the SEND's header")
			left := int(h.length)
			pace(t, ft, passes, func() {
				// The device's writer refills the ring as soon as it is
				// read, so the bytes are there at every pass.
				k := min(left, 4<<10)
				if err := ft.f.Discard(k); err != nil {
					t.Errorf("read a little: %v", err)
				}
				left -= k
			})
			mustOK(t, ft.f.Discard(left), "read the rest")
			mustOK(t, fakeAnswer(ft.f, &h, urma.StatusSuccess, 0), "answer")
			return []urma.Status{urma.StatusSuccess}
		}},
		{"it answers one send at a time", urma.JettyConfig{}, func(t *testing.T, ft *fakeTarget) []urma.Status {
			const sends = passes - 1
			hdrs := make(chan sendHeader, sends)
			goFake(t, ft.f, func() error {
				for n := 0; n < sends; {
					typ, h, err := readFakeFrame(ft.f)
					if err != nil {
						return err
					}
					if typ == frameSend {
						hdrs <- h
						n++
					}
				}
				return nil
			})
			for i := range sends {
				mustOK(t, ft.a.send(ft.target, uint64(i+1), 0, 64, 0), "send")
			}
			pace(t, ft, passes, func() {
				select {
				case h := <-hdrs:
					if err := fakeAnswer(ft.f, &h, urma.StatusSuccess, 0); err != nil {
						t.Errorf("answer: %v", err)
					}
				default:
				}
			})
			want := make([]urma.Status, sends)
			for i := range want {
				want[i] = urma.StatusSuccess
			}
			return want
		}},
		{"it answers not ready while the sender waits longer than PeerTimeout", urma.JettyConfig{RNRRetry: rnrForever}, func(t *testing.T, ft *fakeTarget) []urma.Status {
			const rounds, timer = 2, 30
			if d := rnrDelay(timer, 1); d <= peerTO {
				t.Fatalf("the RNR delay %v does not exceed PeerTimeout %v", d, peerTO)
			}
			answered := goFake(t, ft.f, func() error {
				for n := 0; n <= rounds; {
					typ, h, err := readFakeFrame(ft.f)
					if err == nil && typ == frameSend {
						st, rnr := urma.StatusSuccess, uint8(0)
						if n < rounds {
							st, rnr = statusRNR, timer
						}
						n++
						err = fakeAnswer(ft.f, &h, st, rnr)
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
			start := time.Now()
			mustOK(t, ft.a.send(ft.target, 1, 0, 64, 0), "send")
			select {
			case err := <-answered:
				mustOK(t, err, "answer not ready, then SUCCESS")
			case <-ft.conn.done:
				t.Fatalf("the connection died: %v", ft.conn.deathCause())
			}
			if el := time.Since(start); el < rounds*rnrDelay(timer, 1) {
				t.Fatalf("the send was answered after %v, before its RNR retries", el)
			}
			return []urma.Status{urma.StatusSuccess}
		}},
		{"it is idle", urma.JettyConfig{}, func(t *testing.T, ft *fakeTarget) []urma.Status {
			pace(t, ft, passes, nil)
			return nil
		}},
		{"it sends, then stops without reading the answer", urma.JettyConfig{}, func(t *testing.T, ft *fakeTarget) []urma.Status {
			ft.a.postRecv(1, 0, 64)
			frame := encodeSendHeader(make([]byte, 4+sendHdrLen), &sendHeader{
				opcode: urma.OpSend, src: 5, dst: ft.a.jetty.ID().ID, token: 7, tag: 1, length: 64})
			mustOK(t, ft.f.write(append(frame, make([]byte, 64)...)), "send to the device")
			mustOK(t, ft.f.Idle(), "wait for the device's answer")
			pace(t, ft, passes, nil)
			return nil
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			opts := shmOpts(t)
			opts.PeerTimeout = peerTO
			opts.ShmRingSize = MinShmRing
			ft := newFakeTarget(t, opts, c.jc)
			want := c.run(t, ft)
			got := pollN(t, ft.a.sjfc, len(want), 20*time.Second)
			for i, st := range want {
				if got[i].Status != st {
					t.Errorf("send %d completed with %v, want %v", i+1, got[i].Status, st)
				}
			}
			alive(t, ft.conn)
		})
	}
}
