package soft

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// refWatch records, as each send record of a JFC becomes visible to Poll,
// how many references the segment of that send (by UserCtx) still had:
// once a record can be polled, the segments its send used must be free to
// unregister.
type refWatch struct {
	segs map[uint64]*segment

	mu   sync.Mutex
	seen map[uint64]int64
}

func watchRefs(t *testing.T, q urma.JFC, segs map[uint64]urma.Segment) *refWatch {
	t.Helper()
	w := &refWatch{segs: make(map[uint64]*segment), seen: make(map[uint64]int64)}
	for ctx, s := range segs {
		w.segs[ctx] = s.(*segment)
	}
	hook := func(c urma.Completion) { // under the JFC's lock, on the pushing goroutine
		if s := w.segs[c.UserCtx]; s != nil && !c.Recv {
			w.mu.Lock()
			w.seen[c.UserCtx] = s.refs.Load()
			w.mu.Unlock()
		}
	}
	jq := q.(*jfc)
	jq.afterPush.Store(&hook)
	t.Cleanup(func() { jq.afterPush.Store(nil) })
	return w
}

// wantFree fails the test unless the records of sends ctxs showed, each
// when its segment had no references left.
func (w *refWatch) wantFree(t *testing.T, ctxs ...uint64) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ctx := range ctxs {
		n, ok := w.seen[ctx]
		switch {
		case !ok:
			t.Errorf("no record of send %d was pushed", ctx)
		case n != 0:
			t.Errorf("the record of send %d showed while its segment still had %d references", ctx, n)
		}
	}
}

// A send's record shows only once its SGEs' references are gone, on every
// fabric and both ways a shm SEND goes (copy, reference): a poller that
// takes the record and unregisters the segment at once must not get
// ErrBusy (TestShmUnmapWaitsForRoom did, about once in 80 runs).
func TestSendRecordShowsAfterItsReferencesGo(t *testing.T) {
	fabrics := []struct {
		name  string
		opts  func(t *testing.T) Options
		byRef bool // the second send goes by reference
	}{
		{"inproc", func(*testing.T) Options { return Options{Fabric: NewFabric()} }, false},
		{"socket", func(*testing.T) Options { return socketOpts() }, false},
		{"shm", func(t *testing.T) Options { return shmOpts(t) }, true},
	}
	for _, f := range fabrics {
		t.Run(f.name, func(t *testing.T) {
			noLeaks(t)
			opts := f.opts(t) // one fabric for both: inproc's is in opts
			pa, pb := newProvider(t, opts), newProvider(t, opts)
			a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
			b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
			target := a.importJetty(b)
			seg, _ := shareableSegment(t, a, urma.AccessRead)
			w := watchRefs(t, a.sjfc, map[uint64]urma.Segment{1: seg, 2: seg})
			send := func(ctx uint64) {
				t.Helper()
				b.postRecv(ctx, 0, 64<<10)
				mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: ctx,
					SGEs: []urma.SGE{{Segment: seg, Len: 64 << 10}}}), "send")
				if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.UserCtx != ctx || c.Status != urma.StatusSuccess {
					t.Fatalf("send %d completed with %+v", ctx, c)
				}
				pollN(t, b.rjfc, 1, 10*time.Second)
			}
			send(1)
			if f.byRef {
				eventually.Holds(t, "the share to be ready", 0, func() bool { return pa.readyShares() == 1 })
			}
			send(2)
			if f.byRef && pa.pulls() == 0 {
				t.Fatal("the second send was copied, not sent by reference")
			}
			w.wantFree(t, 1, 2)
			mustOK(t, seg.Close(), "unregister the segment once its sends completed")
		})
	}
}

// On an RM jetty a send to one target may complete before an older one to
// another: its segment is free to unregister then, though the older send
// still holds the head of the queue.
func TestOutOfOrderRecordFreesItsSegment(t *testing.T) {
	noLeaks(t)
	opts := socketOpts()
	opts.PeerTimeout = time.Minute // the fake peers send no PINGs
	p := newProvider(t, opts)
	a := newSide(t, p, urma.JettyConfig{Mode: urma.RM, RNRRetry: 7}, 64)
	slow, quick := newFakePeer(t), newFakePeer(t)
	release := make(chan struct{})
	released := sync.OnceFunc(func() { close(release) })
	t.Cleanup(released)
	slowDone, quickDone := make(chan struct{}), make(chan struct{})
	answer := func(release <-chan struct{}) func(net.Conn, *bufio.Reader) {
		return func(nc net.Conn, br *bufio.Reader) {
			if h, err := readSend(br); err == nil {
				<-release
				ackSend(nc, h)
			}
			_, _ = io.Copy(io.Discard, br) // read until the provider hangs up
		}
	}
	now := make(chan struct{})
	close(now)
	slow.serve(slowDone, answer(release))
	quick.serve(quickDone, answer(now))
	toSlow, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: slow.eid, ID: 5}, urma.RM, 9)
	mustOK(t, err, "import from the slow peer")
	defer toSlow.Close()
	toQuick, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: quick.eid, ID: 6}, urma.RM, 9)
	mustOK(t, err, "import from the quick peer")
	defer toQuick.Close()
	seg1, _ := shareableSegment(t, a, urma.AccessLocalOnly)
	seg2, _ := shareableSegment(t, a, urma.AccessLocalOnly)
	w := watchRefs(t, a.sjfc, map[uint64]urma.Segment{1: seg1, 2: seg2})
	for i, s := range []struct {
		to  urma.RemoteJetty
		seg urma.Segment
	}{{toSlow, seg1}, {toQuick, seg2}} {
		mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: s.to, UserCtx: uint64(i + 1),
			SGEs: []urma.SGE{{Segment: s.seg, Len: 100}}}), "send")
	}

	wantInOrder(t, pollN(t, a.sjfc, 1, 10*time.Second), []urma.Completion{{UserCtx: 2, Status: urma.StatusSuccess}})
	w.wantFree(t, 2)
	mustOK(t, seg2.Close(), "unregister the segment of the send that completed")
	released()
	wantInOrder(t, pollN(t, a.sjfc, 1, 10*time.Second), []urma.Completion{{UserCtx: 1, Status: urma.StatusSuccess}})
	w.wantFree(t, 1)
	mustOK(t, seg1.Close(), "unregister the segment of the older send")
	toSlow.Close()
	toQuick.Close()
	p.Close()
	<-slowDone
	<-quickDone
}

// A send that completes while its frame is still being written (the jetty
// is flushed, or its connection lost) keeps its segment until the writer
// lets go of it, and so does its record, with the records behind it: the
// segment of a send whose record was polled can be unregistered.
func TestRecordOfSendBeingWrittenWaitsForTheWriter(t *testing.T) {
	const size = 8 << 20 // much more than the sockets hold: the writer stays in the frame
	cases := []struct {
		name string
		// end completes the send; then the writer is let go of the frame.
		end func(t *testing.T, j urma.Jetty, nc net.Conn)
		// peerReads: the peer reads the frame's payload after end, which
		// lets the writer go; else the connection's end does.
		peerReads bool
		want      []urma.Completion
	}{
		{"SetError", func(t *testing.T, j urma.Jetty, _ net.Conn) { mustOK(t, j.SetError(), "set error") }, true,
			[]urma.Completion{{UserCtx: 1, Status: urma.StatusWRFlushErr}, {Status: urma.StatusWRFlushErrDone}}},
		// The connection's death fails the send before its writer lets go.
		{"connection lost", func(t *testing.T, _ urma.Jetty, nc net.Conn) { mustOK(t, nc.Close(), "hang up") }, false,
			[]urma.Completion{{UserCtx: 1, Status: urma.StatusAckTimeout}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			opts := socketOpts()
			opts.PeerTimeout = time.Minute // the fake peer sends no PINGs
			p := newProvider(t, opts)
			a := newSide(t, p, urma.JettyConfig{RNRRetry: 7}, 64)
			f := smallBufferFakePeer(t)
			f.maxMsg = size
			type accepted struct {
				nc net.Conn
				br *bufio.Reader
			}
			acc := make(chan accepted, 1)
			go func() {
				nc, br := f.accept()
				acc <- accepted{nc, br}
			}()
			target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
			mustOK(t, err, "import from the fake peer")
			defer target.Close()
			peer := <-acc
			if peer.nc == nil {
				t.Fatal("the fake peer took no connection")
			}
			defer peer.nc.Close()
			mem, err := urma.AllocMemory(size)
			mustOK(t, err, "alloc")
			defer mem.Free()
			seg, err := a.ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
			mustOK(t, err, "register")
			defer seg.Close()
			w := watchRefs(t, a.sjfc, map[uint64]urma.Segment{1: seg})
			mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 1,
				SGEs: []urma.SGE{{Segment: seg, Len: size}}}), "send")
			var hb [4 + sendHdrLen]byte
			_, err = io.ReadFull(peer.br, hb[:])
			mustOK(t, err, "read the SEND's header")
			j := a.jetty.(*jetty)
			j.mu.Lock()
			writing := j.slot(0).writing
			j.mu.Unlock()
			if !writing {
				t.Fatal("the send's frame is written whole, though the peer reads none of its payload")
			}

			c.end(t, a.jetty, peer.nc)
			if c.peerReads {
				buf := make([]urma.Completion, 4)
				n, err := a.sjfc.Poll(buf)
				mustOK(t, err, "poll")
				if n != 0 {
					t.Fatalf("records %+v show while the send's frame is still being written", buf[:n])
				}
				var h sendHeader
				mustOK(t, decodeSendHeader(hb[4:], be.Uint32(hb[:4]), &h), "decode the SEND's header")
				_, err = peer.br.Discard(int(h.length))
				mustOK(t, err, "read the payload")
			}
			wantInOrder(t, pollN(t, a.sjfc, len(c.want), 10*time.Second), c.want)
			w.wantFree(t, 1)
			mustOK(t, seg.Close(), "unregister the segment once the send's record was polled")
		})
	}
}
