package transport

import "github.com/openeuler/urma-k8s/pkg/urma"

// placingJFR is a JFR that can copy a message straight into a waiting
// reader's slice (urma.Placement): the software provider's, whose copy of
// each message is its own work, not the hardware's.
type placingJFR interface {
	OfferPlacement(p *urma.Placement) bool
}

// directPlacement is how a Read waiting for a message takes it without a
// copy of its own (urma_read_direct): it offers its slice for the receive
// the next message lands in, and the provider copies the message there
// instead of into the receive buffer, which Read would copy out of. For
// the copying API that is one copy of each byte fewer on the receiving
// side, the one the zero-copy API (ReadBuffer) saves.
//
// The receives complete in the order they were posted, so the next message
// lands in the oldest posted receive whose completion has not been
// handled: posted tracks that order. An offer names that receive, and the
// provider places only the message that takes it; any other message passes
// the offer by. The completion of a placed receive comes as usual; the
// handler reposts the receive instead of queueing it, whether it comes
// before or after the reader took the message.
type directPlacement struct {
	jfr placingJFR // nil: the JFR cannot place, or urma_read_direct is off
	p   *urma.Placement
	min int // smallest Read that offers its slice

	// Under the connection's mu.
	posted      []int32 // ring of posted receive slots, in post order
	postedHead  int
	postedLen   int
	broken      bool  // completions came out of post order: placing stops
	slot        int32 // the receive an offer is for, until the reader and the handler are both done with it; -1 when none
	armed       bool  // the reader has not settled the offer
	handled     bool  // the completion of slot came while armed
	placedReads uint64

	// afterWait, when set (tests), runs between the reader's Wait and its
	// taking of the connection's lock: where a completion handler may come
	// in between.
	afterWait func()
}

func newDirectPlacement(jfr urma.JFR, on bool, minSize, rq int) directPlacement {
	d := directPlacement{slot: -1, min: max(minSize, 1)}
	if pj, ok := jfr.(placingJFR); ok && on {
		d.jfr, d.p, d.posted = pj, urma.NewPlacement(), make([]int32, rq)
	}
	return d
}

// notePostedLocked records a receive posted; c.mu is held.
func (c *urmaConn) notePostedLocked(slot int32) {
	d := &c.direct
	if d.jfr == nil || d.broken {
		return
	}
	if d.postedLen == len(d.posted) {
		d.broken = true // more posted than the connection has slots: not ours to track
		return
	}
	d.posted[(d.postedHead+d.postedLen)%len(d.posted)] = slot
	d.postedLen++
}

// noteCompletedLocked records the completion of a receive; c.mu is held.
func (c *urmaConn) noteCompletedLocked(slot int32) {
	d := &c.direct
	if d.jfr == nil || d.broken {
		return
	}
	if d.postedLen == 0 || d.posted[d.postedHead] != slot {
		// Not the order we posted in: an offer could name the wrong
		// receive, so none is made any more.
		d.broken = true
		c.log.V(1).Info("receive completions out of post order; reading without placement", "slot", slot)
		return
	}
	d.postedHead = (d.postedHead + 1) % len(d.posted)
	d.postedLen--
}

// offerLocked offers p for the next message, if it can; c.mu is held and
// nothing is queued to read.
func (c *urmaConn) offerLocked(p []byte) {
	d := &c.direct
	if d.jfr == nil || d.armed {
		return
	}
	if d.broken || len(p) < d.min {
		c.waitUnofferedLocked()
		return
	}
	if d.slot >= 0 || d.postedLen == 0 {
		return
	}
	slot := d.posted[d.postedHead]
	d.p.Arm(p, uint64(slot)+1)
	if !d.jfr.OfferPlacement(d.p) {
		d.p.Withdraw()
		return
	}
	d.slot, d.armed = slot, true
}

// waitUnofferedLocked tells the provider that the reader waits without an
// offer; c.mu is held. Otherwise the provider, which saw the last offer
// taken and expects the next, holds a large message up to a millisecond
// for it.
func (c *urmaConn) waitUnofferedLocked() {
	if d := &c.direct; d.jfr != nil && !d.armed {
		d.p.Idle()
	}
}

// settlePlacement takes the offer back from the provider before the read
// returns, and reports the bytes placed in the reader's slice, if a
// message was.
func (c *urmaConn) settlePlacement() (int, bool) {
	d := &c.direct
	if d.p.Withdraw() {
		c.mu.Lock()
		d.armed, d.slot = false, -1
		c.mu.Unlock()
		return 0, false
	}
	n, ok := d.p.Wait() // claimed: the copy ends, whole or not
	if d.afterWait != nil {
		d.afterWait()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d.armed = false
	if !ok || d.handled {
		// Nothing placed (the message is in the receive buffer, or did not
		// arrive whole), or the handler already reposted the receive.
		d.slot, d.handled = -1, false
	}
	if ok {
		d.placedReads++
	}
	return n, ok
}

// placedLocked reports, for a completed receive, whether its message was
// placed in a reader's slice, and if so reposts it; c.mu is held.
func (c *urmaConn) placedLocked(slot int32) (bool, error) {
	d := &c.direct
	if d.slot != slot {
		return false, nil
	}
	if d.armed {
		if d.handled || !d.p.Placed() {
			// Passed by (the message is in the buffer), or the receive
			// was reposted after its placed message and took another.
			return false, nil
		}
		d.handled = true
	} else {
		d.slot = -1 // the reader took the message already
	}
	c.msgsReceived.Add(1)
	c.counters.MessagesReceived.Inc()
	return true, c.consumeLocked(slot)
}

// offerStands reports whether a Read's offer may stay out while it waits
// on: no provider claimed it or passed it by, no message is queued (one
// that took its receive before the offer was made), and nothing ends the
// read (a close, an error, the deadline).
func (c *urmaConn) offerStands() bool {
	if !c.direct.p.Armed() || c.isClosed() || c.rdl.passed() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rxLen == 0 && c.readErrLocked() == nil
}

// placementLanded reports whether a message was placed in the offered
// slice, or its copy broke off: the reader has something to settle. A
// message that passed the offer by is found in the receive queue.
func (c *urmaConn) placementLanded() bool {
	return c.direct.armed && c.direct.p.Settled()
}
