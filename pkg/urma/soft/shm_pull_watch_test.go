package soft

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A receiver copying a large one-copy SEND (SEND_REF) out of the sender's
// memory moves no ring word meanwhile. While the copy progresses, however
// slowly, it is busy, not stopped: the sender's watchdog must not fail the
// connection. A receiver that stops in the middle of the copy is stopped:
// the send completes with ACK_TIMEOUT. The receiver's pull is paced by the
// sender's watchdog passes (a test hook, no sleeps): two passes per chunk,
// for 8 chunks, about four PeerTimeouts.
func TestShmSlowPullIsNotFailed(t *testing.T) {
	for _, stops := range []bool{false, true} {
		name := "the pull progresses"
		if stops {
			name = "the pull stops"
		}
		t.Run(name, func(t *testing.T) { testShmSlowPull(t, stops) })
	}
}

func testShmSlowPull(t *testing.T, stops bool) {
	noLeaks(t)
	const peerTO = 250 * time.Millisecond
	const size = 8 * pullChunk
	// The sender's memory, shared with the receiver, and the receiver's
	// buffer. Freed last, once the providers are closed: the receiver may
	// still be copying when the test ends.
	mem, err := urma.AllocMemory(size)
	mustOK(t, err, "alloc")
	t.Cleanup(func() { _ = mem.Free() })
	rmem, err := urma.AllocMemory(size)
	mustOK(t, err, "alloc")
	t.Cleanup(func() { _ = rmem.Free() })
	opts := shmOpts(t)
	opts.PeerTimeout = peerTO
	opts.Devices = []DeviceSpec{{Caps: urma.DeviceCaps{MaxMsgSize: size}}}
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	seg, err := a.ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessRead, TokenPolicy: urma.TokenPlainText, Token: 99})
	mustOK(t, err, "register the sender's segment")
	t.Cleanup(func() { _ = seg.Close() })
	rseg, err := b.ctx.RegisterSegment(rmem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	mustOK(t, err, "register the receiver's segment")
	t.Cleanup(func() { _ = rseg.Close() })
	send := func(ctx uint64, n uint32) {
		t.Helper()
		mustOK(t, b.jfr.PostRecv(&urma.RecvWR{UserCtx: ctx, SGEs: []urma.SGE{{Segment: rseg, Len: n}}}), "post receive")
		mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: ctx,
			SGEs: []urma.SGE{{Segment: seg, Len: n}}}), "send")
	}

	// The first send goes by copy while the receiver maps the segment.
	send(1, pullMin)
	if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("first send: %+v", c)
	}
	pollN(t, b.rjfc, 1, 10*time.Second)
	eventually.Holds(t, "the receiver to map the segment", 0, func() bool { return pa.readyShares() == 1 })

	ca, cb := pa.conns()[0], pb.conns()[0]
	passed := make(chan struct{}, 1)
	f := func() {
		select {
		case passed <- struct{}{}:
		default:
		}
	}
	sda := pa.devices[0].side
	sda.afterWatch.Store(&f)
	defer sda.afterWatch.Store(nil)
	var chunks atomic.Int64
	hook := func() { // the receiver's reader goroutine
		passes := 2
		if chunks.Add(1) == size/pullChunk/2 && stops {
			passes = 1 << 30 // until the sender gives up
		}
		for range passes {
			select {
			case <-passed:
			case <-ca.done:
				return
			case <-time.After(20 * time.Second): // a hang, not a measurement
				t.Errorf("the sender's watchdog did not pass")
				return
			}
		}
	}
	sb := cb.io.(*shmIO)
	sb.afterPullChunk.Store(&hook)
	defer sb.afterPullChunk.Store(nil)

	sa := ca.io.(*shmIO)
	before := sa.pulls.Load()
	send(2, size)
	c := pollN(t, a.sjfc, 1, 60*time.Second)[0]
	if got := sa.pulls.Load() - before; got != 1 {
		t.Errorf("%d sends by reference, want 1", got)
	}
	if stops {
		if c.Status != urma.StatusAckTimeout || !errors.Is(ca.deathCause(), errPeerNotAnswering) {
			t.Errorf("the send to a receiver stopped in its pull completed with %v, the connection died of %v; want ACK_TIMEOUT, %v",
				c.Status, ca.deathCause(), errPeerNotAnswering)
		}
		return
	}
	if c.Status != urma.StatusSuccess {
		t.Errorf("the large send completed with %v (%v), want SUCCESS", c.Status, ca.deathCause())
	}
	alive(t, ca)
	if r := pollN(t, b.rjfc, 1, 10*time.Second)[0]; r.Status != urma.StatusSuccess || r.CompletionLen != size {
		t.Errorf("receive %+v, want %d bytes", r, size)
	}
	if n := chunks.Load(); n != size/pullChunk {
		t.Errorf("the pull took %d chunks, want %d", n, size/pullChunk)
	}
}
