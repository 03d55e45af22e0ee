package soft

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/framebound"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// stalledFrames are starts of frames a peer writes and then stops: the
// reader waits inside the header, or inside a SEND's payload.
func stalledFrames() []struct {
	name  string
	bytes []byte
} {
	var ping [4 + pingLen]byte
	send := encodeSendHeader(make([]byte, 4+sendHdrLen), &sendHeader{opcode: urma.OpSend, dst: 999, length: 4096})
	return []struct {
		name  string
		bytes []byte
	}{
		{"half a length prefix", encodePing(ping[:])[:2]},
		{"a SEND header and part of its payload", append(send, make([]byte, 100)...)},
	}
}

// A live peer that stops writing in the middle of a frame (stopped by a
// debugger, buggy, hostile) must not hold the connection's reader for
// good: whether a Poll (conn.drive) or the reader goroutine reads the
// frame, the wait for its rest fails after the connection's stall bound
// with an error that says so, not earlier, and idles rather than spins
// meanwhile: it blocks, and wakes up no more often than its sleeps or
// parks end (counted, so that whatever else uses the processor cannot
// count). The poller's connection fails; the reader goroutine's error is
// what readLoop fails it with.
func TestShmMidFrameStallFailsReader(t *testing.T) {
	const (
		stall = 200 * time.Millisecond
		tries = 3
	)
	p := newProvider(t, shmOpts(t))
	sd := p.devices[0].side
	for _, frame := range stalledFrames() {
		for _, poller := range []bool{true, false} {
			who := "reader goroutine"
			// The reader goroutine sleeps on its eventfd until the bound:
			// once, and a spare for a wake-up. A poller parks for shmring.PollPark
			// at a time, each park but the last lasting at least that. One
			// that spins wakes up far more often, or never blocks at all.
			most := uint64(2)
			if poller {
				who = "poller"
				most = uint64(stall/shmring.PollPark) + 1
			}
			t.Run(frame.name+", "+who, func(t *testing.T) {
				for try := 1; ; try++ {
					r := readStalledFrame(t, sd, stall, frame.bytes, nil, poller)
					got, elapsed := r.err, r.elapsed
					if !errors.Is(got, framebound.ErrStalled) || !strings.Contains(got.Error(), fmt.Sprintf("peer stalled mid-frame for %v", stall)) {
						t.Fatalf("the %s gave up with %v, want the peer stalled mid-frame for %v", who, got, stall)
					}
					if elapsed < stall {
						t.Errorf("the %s gave up after %v, before the bound %v", who, elapsed, stall)
					}
					r.checkPollerFailed(t)
					// A waiter descheduled for the whole bound before it
					// first blocked (a loaded machine) never blocks either:
					// only a spinner does that every time.
					if r.blocks == 0 && try < tries {
						continue
					}
					if r.blocks == 0 || r.blocks > most {
						t.Errorf("the %s blocked %d times in %v of waiting, want 1 to %d: it spins", who, r.blocks, elapsed, most)
					}
					return
				}
			})
		}
	}
}

// firstCompletion polls q until it yields a record and returns it: at
// once and all along if poll (an application whose Polls read the frames),
// else only once c died. A record still missing after bound (a hang, not
// a measurement) fails c, then the test, saying what never completed.
func firstCompletion(t *testing.T, q urma.JFC, c *conn, poll bool, bound time.Duration, what string) urma.Completion {
	t.Helper()
	completed := make(chan urma.Completion, 1)
	go func() {
		if !poll {
			<-c.done
		}
		cs := make([]urma.Completion, 1)
		for {
			if n, err := q.Poll(cs); err != nil || n == 1 {
				completed <- cs[0]
				return
			}
		}
	}()
	select {
	case got := <-completed:
		return got
	case <-time.After(bound):
		c.fail(errors.New("the test gave up"))
		<-completed
		t.Fatalf("%s never completed", what)
		return urma.Completion{}
	}
}

// stalledRead is how a read of a frame its peer stalled in ended.
type stalledRead struct {
	c       *conn
	poller  bool
	err     error         // the reader's error (a poller's: the connection's death cause)
	elapsed time.Duration // from the frame's first bytes
	// blocks is how often the reader blocked: the reader goroutine's
	// announced sleeps, a poller's parks.
	blocks uint64
}

// stallConn is a connection of sd over a fresh ring pair of ringSize, as
// the peer process's side of which the test writes into remote; local
// gives up on a frame's rest after stall without a byte.
func stallConn(t *testing.T, sd *fabricSide, ringSize int, stall time.Duration) (c *conn, local, remote *shmIO) {
	t.Helper()
	local, remote = shmPair(t, ringSize, -1)
	local.Stall = stall
	eid, err := ShmEID()
	mustOK(t, err, "EID")
	pr, err := sd.peer(eid)
	mustOK(t, err, "peer")
	return newConn(sd, pr, local, hello{session: 1, src: eid, maxMsg: 1 << 20}, false, "test", "test"), local, remote
}

// goReadFrames reads c's frames as a Poll does (conn.drive, which returns
// once it read what there was, or gave up) or as the reader goroutine does
// (readFrames, until the connection ends), and sends how that ended: a
// poller's error is the connection's death cause.
func goReadFrames(c *conn, poller bool) <-chan error {
	done := make(chan error, 1)
	go func() {
		if poller {
			c.drive()
			done <- c.deathCause()
		} else {
			done <- c.readFrames()
		}
	}()
	return done
}

// readStalledFrame writes start, the first bytes of a frame, into a fresh
// shm connection's ring (and, if feed is set, starts it as the fake peer
// that writes more), then reads the frame with a Poll (conn.drive) or the
// reader goroutine (readFrames) until that gives up. A read still waiting
// 20 s past stall fails the test: a hang, not a measurement.
func readStalledFrame(t *testing.T, sd *fabricSide, stall time.Duration, start []byte, feed func(remote *shmIO) error, poller bool) stalledRead {
	t.Helper()
	c, local, remote := stallConn(t, sd, MinShmRing, stall)
	mustOK(t, remote.write(start), "write the start of the frame")
	began := time.Now()
	if feed != nil {
		goFake(t, remote, func() error { return feed(remote) })
	}
	done := goReadFrames(c, poller)
	var err error
	select {
	case err = <-done:
	case <-time.After(stall + 20*time.Second):
		local.Shutdown() // out of the wait before the rings are unmapped
		<-done
		t.Fatalf("the read still waits for the rest of the frame (poller %v)", poller)
	}
	r := stalledRead{c: c, poller: poller, err: err, elapsed: time.Since(began), blocks: local.RestParks()}
	if !poller {
		r.blocks = local.Word(shmring.WordReaderSleeps).Load() / 2 // odd going to sleep, even awake
	}
	return r
}

// checkPollerFailed fails the test if a poller gave up on the frame but
// left its connection up.
func (r stalledRead) checkPollerFailed(t *testing.T) {
	t.Helper()
	if !r.poller {
		return
	}
	select {
	case <-r.c.done:
	default:
		t.Error("the poller gave up but left the connection up")
	}
}

// grantImport reads the frames the device writes into its ring until an
// IMPORT_JETTY, and grants it.
func grantImport(f *shmIO) error {
	for {
		if err := f.Idle(); err != nil {
			return err
		}
		var hdr [5]byte
		if err := f.ReadFull(hdr[:]); err != nil {
			return err
		}
		n := int(be.Uint32(hdr[:4]))
		if hdr[4] != frameImportJetty {
			if err := f.Discard(n - 1); err != nil {
				return err
			}
			continue
		}
		body := make([]byte, n)
		body[0] = hdr[4]
		if err := f.ReadFull(body[1:]); err != nil {
			return err
		}
		r, err := decodeImportJetty(body)
		if err != nil {
			return err
		}
		var rb [4 + importRespLen]byte
		return f.write(encodeImportResp(rb[:], r.req, urma.CodeSuccess))
	}
}

// A peer process that stops in the middle of a frame it writes to a
// device fails the connection once Options.PeerTimeout passes: the sends
// outstanding to it complete with ACK_TIMEOUT, whether the device's
// reader goroutine took the frame (the peer woke it) or an application's
// Poll did (the peer left it to the pollers), and the log says why.
func TestShmStalledPeerFailsOutstandingSends(t *testing.T) {
	const peerTO = 250 * time.Millisecond
	cases := []struct {
		name string
		// write writes the start of the frame into the fake peer's ring.
		write func(t *testing.T, f *shmIO, p []byte)
		// poll: the application Polls all along; else only once the
		// connection is dead.
		poll bool
	}{
		{"the peer wakes the reader goroutine", func(t *testing.T, f *shmIO, p []byte) {
			mustOK(t, f.write(p), "write the start of the frame")
		}, false},
		{"the peer leaves the frame to a Poll", func(t *testing.T, f *shmIO, p []byte) {
			eventually.Holds(t, "the device's reader to sleep", 0, func() bool { return f.PeerWord(shmring.WordReaderSleeps)&1 == 1 })
			f.WriteUnannounced(p)
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			opts := shmOpts(t)
			opts.PeerTimeout = peerTO
			p, sink := loggedProvider(t, opts)
			a := newSide(t, p, urma.JettyConfig{}, 64)
			f, fake := fakeShmPeer(t, p.devices[0].side)
			granted := make(chan error, 1)
			go func() { granted <- grantImport(f) }()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			target, err := a.ctx.ImportJetty(ctx, urma.JettyID{EID: fake, ID: 5}, urma.RC, 7)
			if err != nil {
				f.Shutdown()
				<-granted
				t.Fatalf("import from the fake peer: %v", err)
			}
			defer target.Close()
			mustOK(t, <-granted, "grant the import")
			conn := p.conns()[0]
			mustOK(t, a.send(target, 1, 0, 64, 0), "send") // never answered

			a.postRecv(2, 0, 4096)
			frame := encodeSendHeader(make([]byte, 4+sendHdrLen), &sendHeader{
				opcode: urma.OpSend, src: 5, dst: a.jetty.ID().ID, token: 7, tag: 1, length: 4096})
			start := time.Now()
			c.write(t, f, append(frame, make([]byte, 100)...))
			got := firstCompletion(t, a.sjfc, conn, c.poll, peerTO+20*time.Second, "the send to the stalled peer")
			elapsed := time.Since(start)
			if got.Status != urma.StatusAckTimeout || got.UserCtx != 1 {
				t.Errorf("send to the stalled peer: %+v, want ACK_TIMEOUT", got)
			}
			if elapsed < peerTO {
				t.Errorf("the connection failed %v after the peer stalled, before PeerTimeout %v", elapsed, peerTO)
			}
			if err := conn.deathCause(); !errors.Is(err, framebound.ErrStalled) {
				t.Errorf("the connection died of %v, want the peer stalled mid-frame", err)
			}
			want := fmt.Sprintf("peer stalled mid-frame for %v", peerTO)
			eventually.Holds(t, "the device to log why it closed the connection", 0, func() bool { return sink.Contains(want) })
		})
	}
}

// trickle writes p into f's ring a byte at a time, one every gap, until it
// is all written or f is shut down: a peer that never stops for as long as
// the stall bound, yet takes for ever over a frame. put writes one piece
// (nil: f.write, which wakes a reader that sleeps).
func trickle(f *shmIO, p []byte, gap time.Duration, put func([]byte) error) error {
	if put == nil {
		put = f.write
	}
	for i := range p {
		time.Sleep(gap) // the trickle under test, not a synchronisation
		if err := put(p[i : i+1]); err != nil {
			return err
		}
	}
	return nil
}

// trickledFrames is a SEND to jetty dst of a 4 KiB payload, and where in it
// a trickling peer stops writing at once and starts trickling: inside the
// header, or inside the payload.
func trickledFrames(dst, token uint32) (frame []byte, starts []struct {
	name string
	n    int
}) {
	hdr := encodeSendHeader(make([]byte, 4+sendHdrLen), &sendHeader{
		opcode: urma.OpSend, src: 5, dst: dst, token: token, tag: 1, length: 4096})
	return append(hdr, make([]byte, 4096)...), []struct {
		name string
		n    int
	}{
		{"trickled from inside the header", 2},
		{"trickled from inside the payload", len(hdr) + 100},
	}
}

// A live peer that trickles a frame, a byte at a time with gaps well under
// the stall bound (so that no single wait times out), must not hold the
// connection's reader for good either: the waits for the frame's rest add
// up, and once they pass the frame's bound (framebound.For: the stall bound
// and next to nothing for the few bytes that came) the reader, a Poll or
// the reader goroutine, fails with an error that says the peer stalled
// mid-frame, wherever in the frame the trickle starts.
func TestShmTricklingPeerFailsReader(t *testing.T) {
	const (
		stall = 200 * time.Millisecond
		gap   = stall / 10
	)
	p := newProvider(t, shmOpts(t))
	sd := p.devices[0].side
	frame, starts := trickledFrames(999, 0)
	for _, at := range starts {
		for _, poller := range []bool{true, false} {
			who := "reader goroutine"
			if poller {
				who = "poller"
			}
			t.Run(at.name+", "+who, func(t *testing.T) {
				r := readStalledFrame(t, sd, stall, frame[:at.n], func(remote *shmIO) error { return trickle(remote, frame[at.n:], gap, nil) }, poller)
				got, elapsed := r.err, r.elapsed
				if !errors.Is(got, framebound.ErrStalled) || !strings.Contains(got.Error(), "peer stalled mid-frame: waited") {
					t.Fatalf("the %s gave up with %v, want the peer stalled mid-frame, past the frame's bound", who, got)
				}
				if elapsed < stall {
					t.Errorf("the %s gave up after %v, before the bound %v", who, elapsed, stall)
				}
				r.checkPollerFailed(t)
			})
		}
	}
}

// A peer process that trickles a frame it writes to a device, never
// stopping for PeerTimeout, fails the connection as one that stops does,
// once the frame's bound passes: the sends outstanding to it complete with
// ACK_TIMEOUT, whether the device's reader goroutine reads the frame (the
// peer wakes it) or an application's Poll does (the peer leaves it to the
// pollers), and the log says why.
func TestShmTricklingPeerFailsOutstandingSends(t *testing.T) {
	const (
		peerTO = 200 * time.Millisecond
		gap    = peerTO / 10
	)
	cases := []struct {
		name string
		// poll: the peer leaves the frame to a Poll, which the application
		// runs all along; else it wakes the reader goroutine, and the
		// application Polls once the connection is dead.
		poll bool
	}{
		{"the peer wakes the reader goroutine", false},
		{"the peer leaves the frame to a Poll", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			opts := shmOpts(t)
			opts.PeerTimeout = peerTO
			ft := newFakeTarget(t, opts, urma.JettyConfig{})
			f := ft.f
			mustOK(t, ft.a.send(ft.target, 1, 0, 64, 0), "send") // never answered
			ft.a.postRecv(2, 0, 4096)
			frame, starts := trickledFrames(ft.a.jetty.ID().ID, 7)
			first := starts[1].n // inside the payload, being copied into the receive
			put := f.write
			if c.poll {
				eventually.Holds(t, "the device's reader to sleep", 0, func() bool { return f.PeerWord(shmring.WordReaderSleeps)&1 == 1 })
				put = func(p []byte) error {
					if f.Closed() {
						return shmring.ErrClosed
					}
					f.WriteUnannounced(p)
					return nil
				}
			}
			start := time.Now()
			mustOK(t, put(frame[:first]), "write the start of the frame")
			goFake(t, f, func() error { return trickle(f, frame[first:], gap, put) })
			got := firstCompletion(t, ft.a.sjfc, ft.conn, c.poll, peerTO+10*time.Second, "the send to the trickling peer")
			elapsed := time.Since(start)
			if got.Status != urma.StatusAckTimeout || got.UserCtx != 1 {
				t.Errorf("send to the trickling peer: %+v, want ACK_TIMEOUT", got)
			}
			if elapsed < peerTO {
				t.Errorf("the connection failed %v after the peer started trickling, before PeerTimeout %v", elapsed, peerTO)
			}
			if err := ft.conn.deathCause(); !errors.Is(err, framebound.ErrStalled) {
				t.Errorf("the connection died of %v, want the peer stalled mid-frame", err)
			}
			eventually.Holds(t, "the device to log why it closed the connection", 0, func() bool {
				return ft.sink.Contains("peer stalled mid-frame: waited")
			})
		})
	}
}

// A slow but healthy peer writing a large frame, in pieces with pauses
// between them, takes longer in all than the stall bound, and its reader
// waits longer in all than the stall bound too: the frame's bound grows
// with what arrives (framebound.For), so the frame is read whole and the
// connection stays up, whether a Poll or the reader goroutine reads it.
func TestShmSlowLargeFrameIsNotFailed(t *testing.T) {
	const (
		stall  = 100 * time.Millisecond
		gap    = stall / 8
		piece  = 256 << 10 // earns stall/4 of waiting, twice the gap
		pieces = 16
	)
	p := newProvider(t, shmOpts(t))
	sd := p.devices[0].side
	hdr := encodeSendHeader(make([]byte, 4+sendHdrLen), &sendHeader{opcode: urma.OpSend, dst: 999, length: piece * pieces})
	frameLen := uint64(len(hdr) + piece*pieces)
	for _, poller := range []bool{true, false} {
		who := "reader goroutine"
		if poller {
			who = "poller"
		}
		t.Run(who, func(t *testing.T) {
			c, local, remote := stallConn(t, sd, 1<<20, stall)
			mustOK(t, remote.write(hdr), "write the frame's header")
			start := time.Now()
			goFake(t, remote, func() error {
				payload := make([]byte, piece)
				for range pieces {
					time.Sleep(gap) // the slow peer under test, not a synchronisation
					if err := remote.write(payload); err != nil {
						return err
					}
				}
				return nil
			})
			done := goReadFrames(c, poller)
			if poller {
				// A Poll returns once it has read the frame.
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("the poller failed the connection: %v", err)
					}
				case <-time.After(20 * time.Second): // a hang, not a measurement
					local.Shutdown()
					<-done
					t.Fatal("the poller still reads the frame")
				}
			} else {
				// The reader goroutine reads on: shut it down once it has
				// read the frame, or see why it stopped before.
				eventually.Holds(t, "the reader goroutine to read the frame", 0, func() bool {
					return localRx(local) == frameLen || len(done) > 0
				})
				local.Shutdown()
				if err := <-done; !errors.Is(err, shmring.ErrClosed) {
					t.Fatalf("the reader goroutine gave up with %v, want it to read the frame whole", err)
				}
			}
			if elapsed := time.Since(start); elapsed <= stall {
				t.Fatalf("the frame took %v, no longer than the stall bound %v: nothing tested", elapsed, stall)
			}
			if got := localRx(local); got != frameLen {
				t.Errorf("read %d bytes of the %d-byte frame", got, frameLen)
			}
		})
	}
}
