package soft

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// recvSlot is one posted receive.
type recvSlot struct {
	userCtx uint64
	size    uint64   // total bytes the SGEs hold
	sges    []sgeRef // view into jfr.flat, len = number of SGEs
}

// recvTicket is a receive taken off the queue for one message. It is a copy,
// so the ring slot can be reused while the message is still being written.
type recvTicket struct {
	userCtx uint64
	size    uint64
	nsge    int
	sges    [MaxSGE]sgeRef
	place   urma.PlacementTicket // a waiting reader's memory, if offered
}

// takeResult says what a message found at a JFR.
type takeResult uint8

const (
	takeOK   takeResult = iota
	takeRNR             // no receive posted: receiver not ready
	takeGone            // the JFR is destroyed
)

// jfr is a receive queue: a ring of Depth posted receives. Receives being
// filled (taken but not yet completed) still count against the depth, so a
// receive whose message broke off can always be put back at the head.
type jfr struct {
	ctx    *devContext
	id     urma.JettyID
	mode   urma.TransportMode
	depth  uint32
	maxSGE uint32
	jfc    *jfc
	minRNR uint8
	policy urma.TokenPolicy
	token  urma.Token

	mu         sync.Mutex
	ring       []recvSlot
	flat       []sgeRef
	head, n    int
	inProgress int
	closed     bool
	users      int             // jetties sharing this JFR
	drained    *sync.Cond      // signalled when inProgress drops to zero
	placement  *urma.Placement // offered for the next message taken
	// lastOffer is when a reader last offered a placement (UnixNano), and
	// lastOffered that placement; offered wakes a message waiting for the
	// next offer (awaitOffer), for up to offerWait.
	lastOffer   atomic.Int64
	lastOffered atomic.Pointer[urma.Placement]
	offered     chan struct{}
	offerWait   time.Duration
	onAwait     func() // tests: a message starts waiting for an offer
}

var _ urma.JFR = (*jfr)(nil)

func newJFR(c *devContext, cfg urma.JFRConfig) (*jfr, error) {
	const op = "create_jfr"
	if err := cfg.Check(c.dev.caps); err != nil {
		return nil, err
	}
	maxSGE := max(cfg.MaxSGE, 1)
	q, ok := cfg.JFC.(*jfc)
	if !ok || q == nil || q.ctx != c {
		return nil, urma.Errorf(op, urma.CodeInval, "JFC is missing or was not created by this context")
	}
	r := &jfr{
		ctx: c, mode: cfg.Mode, depth: cfg.Depth, maxSGE: maxSGE, jfc: q, minRNR: cfg.MinRNRTimer,
		policy: cfg.TokenPolicy, token: cfg.Token,
		ring: make([]recvSlot, cfg.Depth),
		flat: make([]sgeRef, int(cfg.Depth)*int(maxSGE)),
	}
	r.drained = sync.NewCond(&r.mu)
	r.offered, r.offerWait = make(chan struct{}, 1), offerWait
	if err := q.attach(op); err != nil {
		return nil, err
	}
	id, err := c.dev.allocJFR(r)
	if err != nil {
		q.detach()
		return nil, err
	}
	r.id = urma.JettyID{EID: c.eid, UASID: c.uasid, ID: id}
	if err := c.adopt(r, op); err != nil {
		c.dev.freeJFR(id)
		q.detach()
		return nil, err
	}
	return r, nil
}

func (r *jfr) Kind() string { return "JFR" }

// ID names the JFR.
func (r *jfr) ID() urma.JettyID { return r.id }

// PostRecv posts one receive. Past the depth it fails with ErrAgain. An SGE
// that is foreign, unregistered or out of bounds does not fail the call: the
// receive completes at once with LOC_ACCESS, as the hardware check would.
func (r *jfr) PostRecv(wr *urma.RecvWR) error {
	const op = "post_jfr_wr"
	if err := wr.CheckPost(r.maxSGE); err != nil {
		return err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errClosed(op, "JFR")
	}
	if r.n+r.inProgress >= int(r.depth) {
		r.mu.Unlock()
		return urma.Errorf(op, urma.CodeAgain, "JFR %d is full (depth %d)", r.id.ID, r.depth)
	}
	idx := (r.head + r.n) % len(r.ring)
	slot := &r.ring[idx]
	base := idx * int(r.maxSGE)
	refs := r.flat[base : base+len(wr.SGEs)]
	var size uint64
	for i := range wr.SGEs {
		ref, ok := resolveSGE(r.ctx, &wr.SGEs[i])
		if !ok {
			releaseSGEs(refs[:i])
			r.mu.Unlock()
			r.jfc.push(&urma.Completion{
				Status: urma.StatusLocAccess, Opcode: urma.CROpSend, Recv: true,
				UserCtx: wr.UserCtx, LocalID: r.id.ID,
			}, false)
			return nil
		}
		refs[i] = ref
		size += uint64(len(ref.buf))
	}
	*slot = recvSlot{userCtx: wr.UserCtx, size: size, sges: refs}
	r.n++
	r.mu.Unlock()
	return nil
}

// OfferPlacement offers a waiting reader's memory to the next message this
// JFR takes (urma.Placement); false when the JFR is closed. It replaces an
// offer no message took yet.
func (r *jfr) OfferPlacement(p *urma.Placement) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.placement = p
	r.lastOffer.Store(time.Now().UnixNano())
	r.lastOffered.Store(p)
	select {
	case r.offered <- struct{}{}:
	default: // a wake-up is pending already
	}
	return true
}

// offerWait is how long a large message taken without an offer waits for
// one (awaitOffer): more than a reader that keeps up takes between two
// messages (copying one out, its caller's work, the next Read), little
// beside the copy of the messages it is for.
const offerWait = time.Millisecond

// awaitOffer waits up to offerWait for a reader's offer for the receive
// posted with userCtx, which a message took without one, if a reader
// offered within the last offerWait and that offer is still pending (a
// message it took, or none yet): that reader keeps up with its sender and
// is about to offer again. After an offer a message passed by (it was for
// another receive, or empty, or too long) or its reader took back, the
// reader offers again only once it found that message: no wait. Read into
// the receive buffer instead, the
// message would cost that reader a copy of its own, and so would the ones
// behind it: the reader would find them queued and not offer. The bytes
// stay where they are meanwhile (in the sender's memory), as a TCP
// receiver leaves them in the kernel until its reader asks. tm is the
// caller's stopped timer, reused so that a wait does not allocate.
func (r *jfr) awaitOffer(userCtx uint64, tm *time.Timer) urma.PlacementTicket {
	if !r.readerKeepsUp() {
		return urma.PlacementTicket{}
	}
	if r.onAwait != nil {
		r.onAwait()
	}
	tm.Reset(r.offerWait)
	defer tm.Stop()
	for {
		if tk, ok := r.takeOffer(userCtx); ok {
			return tk
		}
		select {
		case <-r.offered: // maybe a wake-up for an offer already taken: look
		case <-tm.C:
			tk, _ := r.takeOffer(userCtx)
			return tk
		}
	}
}

// readerKeepsUp reports whether a reader offered within the last offerWait
// and that offer is still pending (urma.Placement.Pending): the reader is
// about to offer again.
func (r *jfr) readerKeepsUp() bool {
	last := r.lastOffered.Load()
	return last != nil && last.Pending() && time.Now().UnixNano()-r.lastOffer.Load() <= int64(r.offerWait)
}

// offerDue reports whether a reader keeps up (readerKeepsUp) and has no
// offer out: the next message is worth leaving unread until it offers
// (conn.nextAwaitsOffer).
func (r *jfr) offerDue() bool {
	if !r.readerKeepsUp() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.placement == nil
}

// takeOffer binds the offer there is, if any, to the message that took
// the receive posted with userCtx.
func (r *jfr) takeOffer(userCtx uint64) (urma.PlacementTicket, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.placement
	if p == nil {
		return urma.PlacementTicket{}, false
	}
	r.placement = nil
	return p.Bind(userCtx), true
}

// accepts reports whether a message carrying token may use this JFR. The
// target checks the token on every packet (URMA User Guide §9.1.2, "URMA
// User Guide.md":2293); under TokenNone no token value travels and nothing
// is checked (User Guide:2318).
func (r *jfr) accepts(token urma.Token) bool {
	return r.policy == urma.TokenNone || token == r.token
}

// take hands the oldest posted receive to a message, into t.
func (r *jfr) take(t *recvTicket) (takeResult, uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return takeGone, 0
	}
	if r.n == 0 {
		return takeRNR, r.minRNR
	}
	slot := &r.ring[r.head]
	t.userCtx, t.size, t.nsge = slot.userCtx, slot.size, len(slot.sges)
	t.place = urma.PlacementTicket{}
	if r.placement != nil {
		t.place = r.placement.Bind(slot.userCtx)
		r.placement = nil
	}
	copy(t.sges[:], slot.sges)
	clear(slot.sges)
	*slot = recvSlot{}
	r.head = (r.head + 1) % len(r.ring)
	r.n--
	r.inProgress++
	return takeOK, 0
}

// recvMeta describes a message for its receive completion.
type recvMeta struct {
	opcode    urma.Opcode // send opcode of the message
	imm       uint64
	solicited bool
	localID   uint32 // the jetty the message was sent to
	remote    urma.JettyID
}

// finish completes a taken receive with status and length, and drops its
// references.
func (r *jfr) finish(t *recvTicket, status urma.Status, length uint32, m *recvMeta) {
	t.place.Miss()
	releaseSGEs(t.sges[:t.nsge])
	r.mu.Lock()
	if r.inProgress--; r.inProgress == 0 {
		r.drained.Broadcast()
	}
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return
	}
	c := urma.Completion{
		Status:        status,
		Opcode:        urma.CROpSend,
		Recv:          true,
		UserCtx:       t.userCtx,
		CompletionLen: length,
		LocalID:       m.localID,
		RemoteID:      m.remote,
	}
	if m.opcode == urma.OpSendWithImm {
		c.Opcode = urma.CROpSendWithImm
		c.Imm = m.imm
	}
	if status != urma.StatusSuccess {
		c.CompletionLen = 0
	}
	r.jfc.push(&c, m.solicited)
}

// putBack returns a taken receive to the head of the queue: its message
// broke off before arriving whole.
func (r *jfr) putBack(t *recvTicket) {
	t.place.Miss()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inProgress--; r.inProgress == 0 {
		r.drained.Broadcast()
	}
	if r.closed {
		releaseSGEs(t.sges[:t.nsge])
		return
	}
	r.head = (r.head - 1 + len(r.ring)) % len(r.ring)
	base := r.head * int(r.maxSGE)
	refs := r.flat[base : base+t.nsge]
	copy(refs, t.sges[:t.nsge])
	r.ring[r.head] = recvSlot{userCtx: t.userCtx, size: t.size, sges: refs}
	r.n++
}

// Close destroys the JFR, dropping posted receives without completions (the
// JFR is a separate, possibly shared, object: a jetty's SetError does not
// flush it). It fails with ErrBusy while jetties use it. A message being
// written into a receive buffer is let finish (at most until the
// connection's peer timeout), so that once Close returns no segment is
// referenced by this JFR.
func (r *jfr) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	if r.users > 0 {
		n := r.users
		r.mu.Unlock()
		return urma.Errorf("delete_jfr", urma.CodeBusy, "%d jetties still use JFR %d", n, r.id.ID)
	}
	r.mu.Unlock()
	r.destroy()
	return nil
}

func (r *jfr) ForceClose() { r.destroy() }

func (r *jfr) destroy() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.placement = nil // its reader withdraws it
	for i := 0; i < r.n; i++ {
		slot := &r.ring[(r.head+i)%len(r.ring)]
		releaseSGEs(slot.sges)
		*slot = recvSlot{}
	}
	r.n = 0
	for r.inProgress > 0 {
		r.drained.Wait()
	}
	r.mu.Unlock()
	r.ctx.dev.freeJFR(r.id.ID)
	r.jfc.detach()
	r.ctx.release(r)
}

// attach counts a jetty that shares this JFR.
func (r *jfr) attach() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errClosed("create_jetty", "JFR")
	}
	r.users++
	return nil
}

func (r *jfr) detach() {
	r.mu.Lock()
	r.users--
	r.mu.Unlock()
}
