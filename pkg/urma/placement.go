package urma

import (
	"runtime"
	"sync/atomic"
)

// Placement lets the next message of one posted receive land in memory a
// reader is waiting to fill, instead of the receive's own buffer: the copy
// out of the receive buffer, which a reader into memory the provider never
// saw would make next, is then not needed. It is what TCP did for a reader
// already waiting in recv (the "prequeue" direct copy). Hardware has nothing
// like it: only providers that move the bytes in software offer it (see
// soft's JFR), and a consumer finds out by a type assertion on its JFR.
//
// The consumer arms it for the receive it expects next and offers it to the
// JFR. The provider binds it to the next receive a message takes: if that
// is the armed receive and the message is not empty and fits, the provider
// claims it and copies the message into the reader's memory; otherwise it
// misses. Either way the receive completes as usual (with the message's
// length), so the consumer's completion accounting does not change; a
// claim is settled (placed or failed) before the provider completes the
// receive.
//
// Before the reader returns, and so gives up its memory, it must Withdraw
// or, if that fails, Wait: the provider may be copying into it until then.
//
// A consumer that serves one peer restricts the placement to that peer's
// jetty (From): a message from any other passes it by, so a reader's memory
// only ever holds its peer's bytes, and the consumer, which drops a foreign
// message on its completion, never has to take one back from a reader.
type Placement struct {
	dst []byte // read by a provider only once it claimed p
	// from and fromSet restrict p to one source jetty; set before p is
	// first offered, read by providers after (the offer orders them).
	from    JettyID
	fromSet bool
	// userCtx and size are the arming's, atomic because a provider binding
	// an old arming may read them while the reader arms anew.
	userCtx atomic.Uint64
	size    atomic.Int64
	n       int
	// state is the arming's generation (high 32 bits) and its stage: a
	// provider acting on an old arming finds the generation moved on.
	state atomic.Uint64
	done  chan struct{} // one token per claim, sent when it is settled
}

// Placement stages.
const (
	placeIdle uint64 = iota
	placeArmed
	placeClaimed
	placePlaced
	placeFailed
	placeMissed
)

// waitSpins bounds the yields of a Wait for a claim before it sleeps.
const waitSpins = 1000

// NewPlacement returns an idle placement, reusable by one reader at a time.
func NewPlacement() *Placement { return &Placement{done: make(chan struct{}, 1)} }

func (p *Placement) stage() uint64 { return p.state.Load() & 0xff }

// From restricts p to messages from the jetty src: a message from any other
// passes p by. Jetties are compared by EID and id; the uasid, which
// hardware leaves unfilled in completions, is not compared. Call it before
// p is first offered.
func (p *Placement) From(src JettyID) { p.from, p.fromSet = src, true }

// admits reports whether a message from src may be placed in p.
func (p *Placement) admits(src JettyID) bool {
	return !p.fromSet || (src.ID == p.from.ID && src.EID == p.from.EID)
}

// Arm readies p for the message that lands in the receive posted with
// userCtx, to be copied into dst. p must not be offered: new, withdrawn or
// waited for.
func (p *Placement) Arm(dst []byte, userCtx uint64) {
	p.dst, p.n = dst, 0
	p.userCtx.Store(userCtx)
	p.size.Store(int64(len(dst)))
	gen := p.state.Load()>>32 + 1
	p.state.Store(gen<<32 | placeArmed)
}

// Withdraw takes p back before any provider claimed it, and reports whether
// it did. After a false, the provider has claimed p or passed it by: Wait.
func (p *Placement) Withdraw() bool {
	s := p.state.Load()
	return s&0xff == placeArmed && p.state.CompareAndSwap(s, s&^0xff) // idle
}

// Wait waits until a claim is settled and returns the bytes placed in the
// reader's memory, with true if the message was placed; false when the
// provider passed p by (the message landed in the receive buffer) or could
// not finish the copy (the message did not arrive whole). p keeps its
// outcome (Placed) until it is armed again: the consumer's completion
// handler may look after the reader took the message.
func (p *Placement) Wait() (int, bool) {
	st := p.stage()
	// A claimed message is being copied: that takes microseconds, less
	// than parking the goroutine and being woken costs, so yield first.
	for i := 0; i < waitSpins && st == placeClaimed; i++ {
		runtime.Gosched()
		st = p.stage()
	}
	if st == placeClaimed || st == placePlaced || st == placeFailed {
		<-p.done
		st = p.stage()
	}
	if st != placePlaced {
		return 0, false
	}
	return p.n, true
}

// Armed reports whether p is still offered: no provider claimed it or
// passed it by.
func (p *Placement) Armed() bool { return p.stage() == placeArmed }

// Settled reports whether a claim of p is settled: a message was placed
// there, or its copy broke off. A reader that finds it settled does not
// wait in Wait. (A p passed by is not: its message is in the receive
// buffer, for the reader to find there.)
func (p *Placement) Settled() bool {
	st := p.stage()
	return st == placePlaced || st == placeFailed
}

// Pending reports whether p may yet take a message: armed (to be
// offered, or offered), or claimed by one, or placed and not yet armed
// again. A p a message passed by, or its reader took back, is not: its
// reader offers again only once it found that message elsewhere.
func (p *Placement) Pending() bool {
	st := p.stage()
	return st == placeArmed || st == placeClaimed || st == placePlaced
}

// Idle tells the provider that p's reader waits without an offer (its
// slice is too small to offer, say): p is no longer Pending, so no message
// waits for an offer from it. Only an outcome is dropped; a p that is
// offered or claimed is left as it is, and reports false.
func (p *Placement) Idle() bool {
	s := p.state.Load()
	switch s & 0xff {
	case placePlaced, placeFailed, placeMissed:
		return p.state.CompareAndSwap(s, s&^0xff)
	}
	return false
}

// Placed reports whether a message was placed in p's current arming: the
// consumer's completion handler takes its receive as read by the reader.
func (p *Placement) Placed() bool { return p.stage() == placePlaced }

// Bind is the provider's, when a message takes the receive posted with
// userCtx, with the lock held under which p was offered: it returns the
// ticket through which that message claims p, or misses p and returns a
// ticket that claims nothing when p is armed for another receive.
func (p *Placement) Bind(userCtx uint64) PlacementTicket {
	s := p.state.Load()
	if s&0xff != placeArmed {
		return PlacementTicket{}
	}
	if p.userCtx.Load() != userCtx {
		p.state.CompareAndSwap(s, s&^0xff|placeMissed)
		return PlacementTicket{}
	}
	return PlacementTicket{p: p, gen: s >> 32, size: int(p.size.Load())}
}

// PlacementTicket is one message's hold on a Placement (provider side). The
// zero ticket claims nothing.
type PlacementTicket struct {
	p    *Placement
	gen  uint64
	size int
}

// Offered reports whether the ticket holds an offer, claimed or not.
func (t PlacementTicket) Offered() bool { return t.p != nil }

// Claim takes the placement for a message of length bytes from the jetty
// src and returns where to copy it; the caller must Settle. It misses, and
// returns false, when the message is empty or does not fit, comes from a
// jetty the placement does not admit (From), or the reader withdrew.
func (t PlacementTicket) Claim(length int, src JettyID) ([]byte, bool) {
	if t.p == nil {
		return nil, false
	}
	armed := t.gen<<32 | placeArmed
	if length <= 0 || length > t.size || !t.p.admits(src) {
		t.p.state.CompareAndSwap(armed, t.gen<<32|placeMissed)
		return nil, false
	}
	if !t.p.state.CompareAndSwap(armed, t.gen<<32|placeClaimed) {
		return nil, false
	}
	return t.p.dst[:length], true
}

// Miss passes the placement by: the message did not use it.
func (t PlacementTicket) Miss() {
	if t.p != nil {
		t.p.state.CompareAndSwap(t.gen<<32|placeArmed, t.gen<<32|placeMissed)
	}
}

// Settle ends a claim, with the message placed (copied whole, n bytes) or
// not.
func (t PlacementTicket) Settle(n int, placed bool) {
	if placed {
		t.p.n = n
		t.p.state.Store(t.gen<<32 | placePlaced)
	} else {
		t.p.state.Store(t.gen<<32 | placeFailed)
	}
	t.p.done <- struct{}{}
}
