package soft

import (
	"bytes"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A placement offered to a JFR takes the next message straight into the
// reader's memory when the message lands in the receive it was armed for
// and fits; otherwise the message lands in the receive buffer as always.
// The receive completes the same way in both cases. Both cross-process
// fabrics, and on shm both a SEND by copy (through the ring) and one by
// reference (pulled from the sender's memory).
func TestPlacement(t *testing.T) {
	const size = 48 << 10
	tests := []struct {
		name       string
		dst        int    // the reader's slice
		msg        int    // bytes sent
		armFor     uint64 // the receive the placement names (the head is 1)
		withdraw   bool   // the reader takes the offer back before the message
		wantPlaced bool
	}{
		{name: "fits", dst: size, msg: size, armFor: 1, wantPlaced: true},
		{name: "room to spare", dst: 2 * size, msg: size, armFor: 1, wantPlaced: true},
		{name: "too large for the slice", dst: size - 1, msg: size, armFor: 1},
		{name: "another receive", dst: size, msg: size, armFor: 2},
		{name: "withdrawn", dst: size, msg: size, armFor: 1, withdraw: true},
		{name: "empty message", dst: size, msg: 0, armFor: 1},
	}
	fabrics := []struct {
		name      string
		opts      func(t *testing.T) Options
		shareable bool // send from memory the peer maps (SEND_REF)
	}{
		{name: "socket", opts: func(*testing.T) Options { return socketOpts() }},
		{name: "shm by copy", opts: func(t *testing.T) Options { return shmOpts(t) }},
		{name: "shm by reference", opts: func(t *testing.T) Options { return shmOpts(t) }, shareable: true},
	}
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			noLeaks(t)
			opts := fb.opts(t)
			a, b, target := senderReceiver(t, opts)
			seg, mem := a.seg, a.mem
			if fb.shareable {
				seg, mem = shareableSegment(t, a, urma.AccessRead|urma.AccessWrite)
			}
			place := urma.NewPlacement()
			for i, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					src := mem.Bytes()[:tc.msg]
					for k := range src {
						src[k] = byte(i*31 + k*7 + 1)
					}
					recvBuf := b.mem.Bytes()[:2*size]
					clear(recvBuf)
					b.postRecv(1, 0, size)
					b.postRecv(2, size, size)
					dst := make([]byte, tc.dst)
					place.Arm(dst, tc.armFor)
					if !b.jfr.(*jfr).OfferPlacement(place) {
						t.Fatal("the JFR refused the offer")
					}
					if tc.withdraw && !place.Withdraw() {
						t.Fatal("withdraw failed before any message")
					}
					mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 1,
						SGEs: []urma.SGE{{Segment: seg, Len: uint32(tc.msg)}}}), "send")
					if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
						t.Fatalf("send: %+v", c)
					}
					c := pollN(t, b.rjfc, 1, 10*time.Second)[0]
					if c.Status != urma.StatusSuccess || c.UserCtx != 1 || c.CompletionLen != uint32(tc.msg) {
						t.Fatalf("receive completion %+v, want SUCCESS for receive 1 with %d bytes", c, tc.msg)
					}
					var n int
					var placed bool
					if !tc.withdraw && !place.Withdraw() {
						n, placed = waitPlacement(t, place)
					}
					if placed != tc.wantPlaced {
						t.Fatalf("placed %v, want %v", placed, tc.wantPlaced)
					}
					landed, untouched := recvBuf[:tc.msg], dst[:min(tc.msg, len(dst))]
					if placed {
						if n != tc.msg {
							t.Fatalf("placed %d bytes, want %d", n, tc.msg)
						}
						landed, untouched = dst[:tc.msg], recvBuf[:tc.msg]
					}
					if !bytes.Equal(landed, src) {
						t.Fatal("the message is not where it should have landed")
					}
					if tc.msg > 0 && bytes.Equal(untouched, src[:len(untouched)]) {
						t.Fatal("the message landed in both places")
					}
					// Receive 2 is still posted, and takes the next message
					// into its buffer: the offer was used up.
					mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 2,
						SGEs: []urma.SGE{{Segment: seg, Len: 16}}}), "second send")
					pollN(t, a.sjfc, 1, 10*time.Second)
					if c := pollN(t, b.rjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess || c.UserCtx != 2 || c.CompletionLen != 16 {
						t.Fatalf("second receive %+v, want SUCCESS for receive 2 with 16 bytes", c)
					}
					if !bytes.Equal(recvBuf[size:size+16], mem.Bytes()[:16]) {
						t.Fatal("the second message is not in receive 2's buffer")
					}
				})
			}
		})
	}
}

// senderReceiver is a side on each of two providers made with opts, and
// the sender a's import of the receiver b's jetty.
func senderReceiver(t *testing.T, opts Options) (a, b *side, target urma.RemoteJetty) {
	t.Helper()
	a = newSide(t, newProvider(t, opts), urma.JettyConfig{RNRRetry: 7}, 64)
	b = newSide(t, newProvider(t, opts), urma.JettyConfig{RNRRetry: 7}, 64)
	return a, b, a.importJetty(b)
}

// lastOfferPlaced makes r's reader one that keeps up: its last offer,
// just now, took a message, and it has not offered again.
func lastOfferPlaced(t *testing.T, r *jfr) {
	t.Helper()
	last := urma.NewPlacement()
	last.Arm(make([]byte, 1), 42)
	tk := last.Bind(42)
	if _, ok := tk.Claim(1, urma.JettyID{}); !ok {
		t.Fatal("could not claim the last offer")
	}
	tk.Settle(1, true)
	r.lastOffered.Store(last)
	r.lastOffer.Store(time.Now().UnixNano())
}

// waitPlacement is p.Wait, bounded: a claim the provider never settles
// fails the test instead of hanging it.
func waitPlacement(t *testing.T, p *urma.Placement) (int, bool) {
	t.Helper()
	type result struct {
		n  int
		ok bool
	}
	done := make(chan result, 1)
	go func() {
		n, ok := p.Wait()
		done <- result{n, ok}
	}()
	select {
	case r := <-done:
		return r.n, r.ok
	case <-time.After(10 * time.Second):
		t.Fatal("the provider claimed the placement and never settled it")
		return 0, false
	}
}

// A closed JFR takes no offer: the reader must not wait for a message that
// cannot come through it.
func TestPlacementClosedJFR(t *testing.T) {
	p := newProvider(t, socketOpts())
	s := newSide(t, p, urma.JettyConfig{}, 16)
	r := s.jfr.(*jfr)
	r.destroy()
	if r.OfferPlacement(urma.NewPlacement()) {
		t.Fatal("a destroyed JFR took a placement")
	}
}

// A large message that takes its receive without an offer waits a moment
// for one when its reader offered lately, on shm and on the socket fabric:
// a reader that keeps up is about to offer again, and the message then
// lands in its memory. Without a recent offer it does not wait; a wait
// with no offer ends, and the message lands in the receive buffer.
func TestPlacementAwaitsOffer(t *testing.T) {
	const size = awaitOfferMin
	tests := []struct {
		name       string
		socket     bool
		recent     bool          // the reader offered lately
		wait       time.Duration // the JFR's offerWait
		offer      bool          // the reader offers while the message waits
		wantWait   bool
		wantPlaced bool
	}{
		{name: "offer comes", recent: true, wait: 5 * time.Second, offer: true, wantWait: true, wantPlaced: true},
		{name: "no offer in time", recent: true, wait: 20 * time.Millisecond, wantWait: true},
		{name: "no recent offer", wait: 5 * time.Second},
		{name: "socket fabric, offer comes", socket: true, recent: true, wait: 5 * time.Second, offer: true, wantWait: true, wantPlaced: true},
		{name: "socket fabric, no offer in time", socket: true, recent: true, wait: 20 * time.Millisecond, wantWait: true},
		{name: "socket fabric, no recent offer", socket: true, wait: 5 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			opts := shmOpts(t)
			if tc.socket {
				opts = socketOpts()
			}
			a, b, target := senderReceiver(t, opts)
			seg, mem := a.seg, a.mem
			if !tc.socket {
				seg, mem = shareableSegment(t, a, urma.AccessRead|urma.AccessWrite)
			}
			src := mem.Bytes()[:size]
			for k := range src {
				src[k] = byte(k*13 + 5)
			}
			r := b.jfr.(*jfr)
			waiting := make(chan struct{}, 1)
			r.mu.Lock()
			r.offerWait = tc.wait
			r.onAwait = func() { waiting <- struct{}{} }
			r.mu.Unlock()
			if tc.recent {
				lastOfferPlaced(t, r)
			}
			b.postRecv(1, 0, size)
			mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 1,
				SGEs: []urma.SGE{{Segment: seg, Len: size}}}), "send")
			waited := false
			if tc.wantWait {
				select {
				case <-waiting:
					waited = true
				case <-time.After(10 * time.Second):
					t.Fatal("the message never waited for an offer")
				}
			}
			place := urma.NewPlacement()
			dst := make([]byte, size)
			if tc.offer {
				place.Arm(dst, 1)
				if !r.OfferPlacement(place) {
					t.Fatal("offer refused")
				}
			}
			// The sender's completion first: until then no Poll of the
			// receiver reads the frame (a Poll does not wait for offers),
			// its reader goroutine does.
			pollN(t, a.sjfc, 1, 10*time.Second)
			c := pollN(t, b.rjfc, 1, 10*time.Second)[0]
			if c.Status != urma.StatusSuccess || c.CompletionLen != size {
				t.Fatalf("receive %+v", c)
			}
			select {
			case <-waiting:
				waited = true
			default:
			}
			if waited != tc.wantWait {
				t.Fatalf("the message waited for an offer: %v, want %v", waited, tc.wantWait)
			}
			placed := false
			if tc.offer && !place.Withdraw() {
				_, placed = waitPlacement(t, place)
			}
			if placed != tc.wantPlaced {
				t.Fatalf("placed %v, want %v", placed, tc.wantPlaced)
			}
			landed := b.mem.Bytes()[:size]
			if placed {
				landed = dst
			}
			if !bytes.Equal(landed, src) {
				t.Fatal("the message is not where it should have landed")
			}
		})
	}
}

// A message that passes its reader's offer by (here an empty one, as the
// transport's credit messages are) leaves the reader without an offer
// until it has found that message: the large message behind it must not
// wait for an offer that cannot come before its wait ends.
func TestPlacementPassedByOfferIsNotAwaited(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	a, b, target := senderReceiver(t, opts)
	seg, _ := shareableSegment(t, a, urma.AccessRead|urma.AccessWrite)
	r := b.jfr.(*jfr)
	waited := make(chan struct{}, 2)
	r.mu.Lock()
	r.offerWait = 5 * time.Second
	r.onAwait = func() { waited <- struct{}{} }
	r.mu.Unlock()
	b.postRecv(1, 0, 64)
	b.postRecv(2, 64, awaitOfferMin)
	offer := urma.NewPlacement()
	offer.Arm(make([]byte, awaitOfferMin), 1)
	if !r.OfferPlacement(offer) {
		t.Fatal("offer refused")
	}
	for i, n := range []uint32{0, awaitOfferMin} {
		mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i + 1),
			SGEs: []urma.SGE{{Segment: seg, Len: n}}}), "send")
	}
	start := time.Now()
	pollN(t, a.sjfc, 2, 10*time.Second) // first: the receiver's reader goroutine reads the frames, no Poll
	cs := pollN(t, b.rjfc, 2, 10*time.Second)
	if cs[0].UserCtx != 1 || cs[0].CompletionLen != 0 || cs[1].UserCtx != 2 || cs[1].CompletionLen != awaitOfferMin {
		t.Fatalf("receives %+v", cs)
	}
	if _, placed := waitPlacement(t, offer); placed {
		t.Fatal("the empty message was placed")
	}
	select {
	case <-waited:
		t.Fatalf("the large message waited for an offer after the last one was passed by (%v)", time.Since(start))
	default:
	}
}

// A Poll that finds a large SEND for a JFR whose reader is about to offer
// (its last offer took a message and it has offered none since) leaves
// the frame in the ring: read then, the message would land in the receive
// buffer and cost the reader a copy. Once the reader offers, the next
// Poll places it. A small message, a reader that offered too long ago, or
// one whose offer is out already does not hold the frame.
func TestPollLeavesMessageForOffer(t *testing.T) {
	tests := []struct {
		name     string
		size     int
		recent   bool // the reader's last offer took a message lately
		offerOut bool // the reader's next offer is out already
		byRef    bool // a SEND_REF (whose reference names nothing: the frame is only looked at)
		wantHeld bool
	}{
		{name: "reader about to offer", size: awaitOfferMin, recent: true, wantHeld: true},
		{name: "reader about to offer, by reference", size: awaitOfferMin, recent: true, byRef: true, wantHeld: true},
		{name: "small message by reference", size: awaitOfferMin - 1, recent: true, byRef: true},
		{name: "small message", size: awaitOfferMin - 1, recent: true},
		{name: "no recent offer", size: awaitOfferMin},
		{name: "offer out", size: awaitOfferMin, recent: true, offerOut: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			p := newProvider(t, shmOpts(t))
			b := newSide(t, p, urma.JettyConfig{}, 64)
			sd := p.devices[0].side
			local, remote := shmPair(t, 1<<20, -1)
			eid, err := ShmEID()
			mustOK(t, err, "EID")
			pr, err := sd.peer(eid)
			mustOK(t, err, "peer")
			c := newConn(sd, pr, local, hello{session: 1, src: eid, maxMsg: 1 << 20}, false, "test", "test")

			r := b.jfr.(*jfr)
			r.mu.Lock()
			r.offerWait = 5 * time.Second
			r.mu.Unlock()
			if tc.recent {
				lastOfferPlaced(t, r)
			}
			b.postRecv(1, 0, tc.size)
			payload := make([]byte, tc.size)
			for k := range payload {
				payload[k] = byte(k*11 + 3)
			}
			h := sendHeader{opcode: urma.OpSend, src: 1, dst: b.jetty.ID().ID, token: 7, tag: 1<<32 | 1, length: uint32(tc.size)}
			var hdr [maxFrameHdr]byte
			frame := append(encodeSendHeader(hdr[:], &h), payload...)
			if tc.byRef {
				frame = encodeSendRef(hdr[:], &h, []payloadRef{{handle: 1, length: uint32(tc.size)}})
			}
			mustOK(t, remote.write(frame), "write the SEND")

			place, dst := urma.NewPlacement(), make([]byte, tc.size)
			offer := func() {
				place.Arm(dst, 1)
				if !r.OfferPlacement(place) {
					t.Fatal("offer refused")
				}
			}
			if tc.offerOut {
				offer()
			}
			c.drive()
			if held := local.Buffered() == len(frame); held != tc.wantHeld {
				t.Fatalf("the Poll left the frame in the ring: %v, want %v (%d of %d bytes left)", held, tc.wantHeld, local.Buffered(), len(frame))
			}
			if tc.byRef {
				return // its reference names nothing: only the hold is tested
			}
			if tc.wantHeld {
				cs := make([]urma.Completion, 1)
				n, err := b.rjfc.Poll(cs)
				mustOK(t, err, "poll")
				if n != 0 {
					t.Fatalf("a receive completed while its frame was left: %+v", cs[0])
				}
				offer()
				c.drive()
				if n := local.Buffered(); n != 0 {
					t.Fatalf("the Poll after the offer left %d bytes in the ring", n)
				}
			}
			cp := pollN(t, b.rjfc, 1, 10*time.Second)[0]
			if cp.Status != urma.StatusSuccess || cp.CompletionLen != uint32(tc.size) {
				t.Fatalf("receive %+v", cp)
			}
			placed := false
			if !place.Withdraw() {
				_, placed = waitPlacement(t, place)
			}
			wantPlaced := tc.wantHeld || tc.offerOut
			if placed != wantPlaced {
				t.Fatalf("placed %v, want %v", placed, wantPlaced)
			}
			landed := b.mem.Bytes()[:tc.size]
			if placed {
				landed = dst
			}
			if !bytes.Equal(landed, payload) {
				t.Fatal("the message is not where it should have landed")
			}
		})
	}
}
