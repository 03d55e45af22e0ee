package soft

import (
	"math/bits"
	"sync"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// statusRNR is the internal answer "receiver not ready": no receive posted.
const statusRNR urma.Status = 0xff

// rnrForever is the RNRRetry value that retries without end.
const rnrForever = urma.RNRRetryForever

type slotState uint8

const (
	slotFree     slotState = iota
	slotQueued             // posted, waiting to be transmitted (or retransmitted)
	slotInflight           // transmitted, waiting for the receiver's answer
	slotFailed             // failed on this side, its completion held for the older sends
	slotDone               // completed; freed once the writer no longer reads it
)

// sqSlot is one posted send. Slots live in a ring sized at creation, so
// posting allocates nothing.
type sqSlot struct {
	seq      uint64
	state    slotState
	opcode   urma.Opcode
	flags    urma.SendFlags
	userCtx  uint64
	imm      uint64
	target   *remoteJetty
	length   uint32
	nsge     int
	sges     []sgeRef // view into jetty.flat, cap maxSGE
	inline   []byte   // view into jetty.inlineBuf, cap maxInline
	isInline bool
	localErr urma.Status // fails with this status when reached (set at post, or when too long for the peer)
	retries  uint8
	resume   bool   // retransmission after RNR: unblocks the receiver
	rnrBlock bool   // the receiver holds an RNR block for this slot
	writing  bool   // the socket writer is reading the payload
	tx       uint32 // transmissions so far; a queued frame names the one it carries
	// gen is the peer connection generation that carries the last
	// transmission (peer.gen), 0 before the first: only that connection's
	// death fails the send.
	gen uint64
	// An answer that arrived while the writer still read the payload waits
	// here, so a completion always means the slot and its memory are free
	// (a completion for other reasons waits in jetty.held).
	deferred  bool
	defStatus urma.Status
	defRNR    uint8
}

// heldRecord is a send completion record not yet pushed. A send that
// completes while its frame is still being written (flushed, or its
// connection lost) keeps its SGEs until the write ends, and its record
// waits with them: once a record is polled, the segments its send used can
// be unregistered. The records behind it wait too, to keep their order.
type heldRecord struct {
	c    urma.Completion
	seq  uint64 // the slot being written, when wait
	wait bool
}

// jetty is a send queue sharing a JFR.
//
// Sends go out in posting order. A send that meets "receiver not ready" stalls
// the queue until its retry timer fires; on the socket fabric the sends behind
// it to the same receiver are rewound, since the receiver discards them until
// the retried one arrives. Any send error moves the jetty to ERROR and flushes
// the rest, as hardware does; SetError adds the FLUSH_ERR_DONE record.
//
// Completions come in post order, as hardware delivers them. A send that
// fails on this side (a bad SGE, a message too long for this device or the
// peer) while older sends are still out is held (slotFailed): nothing
// behind it is transmitted, and once every older send has succeeded it
// completes with its error and the jetty enters ERROR. An older send that
// fails instead enters ERROR first, which flushes the held send as any
// other behind it: the oldest error is the jetty's one. Only answers from
// different targets of an RM jetty may come out of post order: a target
// that waits for a receive (RNR) holds back only the sends to it, and
// peers fail apart. A connection's death fails only the sends it carried;
// those still out on a connection the peer replaced fail once a send goes
// out on the new one, so that no answer there completes ahead of them.
type jetty struct {
	ctx       *devContext
	dev       *device
	id        urma.JettyID
	instance  uint32 // unique per device: tells a re-created jetty's traffic from its predecessor's
	mode      urma.TransportMode
	sendJFC   *jfc
	jfr       *jfr
	rnrRetry  uint8
	depth     uint32
	maxSGE    uint32
	maxInline uint32

	mu               sync.Mutex
	slots            []sqSlot
	mask             uint64
	flat             []sgeRef
	inlineBuf        []byte
	head, next, tail uint64 // oldest unfreed, next to transmit, next to post
	state            urma.JettyState
	closed           bool
	flushDone        bool
	stalled          bool   // waiting for the RNR retry timer
	failing          bool   // a send failed on this side and is held ...
	failAt           uint64 // ... this one: nothing from it on is transmitted
	timer            *time.Timer
	bound            *remoteJetty // RC: the one target
	writing          int          // slots the socket writer is reading now
	written          *sync.Cond   // signalled when writing drops to zero
	kickConn         *conn        // connection to write to once j.mu is released
	// held are the completion records that wait for a writer, in order
	// (see heldRecord); empty unless the jetty is entering ERROR.
	held []heldRecord
	// peerGen is the connection generation of the last transmission to
	// each peer: a change says sends may be out on a replaced connection.
	// A peer's record goes once no send of this jetty is out to it and its
	// connection ended (dropPeerGen), so that it holds no peer gone.
	peerGen map[*peer]uint64
}

var _ urma.Jetty = (*jetty)(nil)

func newJetty(c *devContext, cfg urma.JettyConfig) (*jetty, error) {
	const op = "create_jetty"
	q, ok := cfg.SendJFC.(*jfc)
	if !ok || q == nil || q.ctx != c {
		return nil, urma.Errorf(op, urma.CodeInval, "send JFC is missing or was not created by this context")
	}
	r, ok := cfg.JFR.(*jfr)
	if !ok || r == nil || r.ctx != c {
		return nil, urma.Errorf(op, urma.CodeInval, "JFR is missing or was not created by this context")
	}
	if err := cfg.Check(c.dev.caps, r.mode); err != nil {
		return nil, err
	}
	maxSGE := max(cfg.MaxSGE, 1)
	ringSize := uint64(1) << bits.Len32(cfg.SQDepth-1) // a power of two, so sequence numbers wrap cleanly
	j := &jetty{
		ctx: c, dev: c.dev, mode: cfg.Mode, sendJFC: q, jfr: r,
		rnrRetry: cfg.RNRRetry, depth: cfg.SQDepth, maxSGE: maxSGE, maxInline: cfg.MaxInline,
		slots: make([]sqSlot, ringSize), mask: ringSize - 1,
		flat: make([]sgeRef, ringSize*uint64(maxSGE)),
	}
	if cfg.MaxInline > 0 {
		j.inlineBuf = make([]byte, ringSize*uint64(cfg.MaxInline))
	}
	for i := range j.slots {
		s := &j.slots[i]
		s.sges = j.flat[uint64(i)*uint64(maxSGE) : uint64(i+1)*uint64(maxSGE)]
		if cfg.MaxInline > 0 {
			s.inline = j.inlineBuf[uint64(i)*uint64(cfg.MaxInline) : uint64(i+1)*uint64(cfg.MaxInline)]
		}
	}
	j.written = sync.NewCond(&j.mu)
	j.timer = time.AfterFunc(time.Hour, j.onTimer)
	j.timer.Stop()
	if err := q.attach(op); err != nil {
		return nil, err
	}
	if err := r.attach(); err != nil {
		q.detach()
		return nil, err
	}
	id, err := c.dev.allocJetty(j, func(id uint32) {
		j.instance = c.dev.instances.Add(1)
		j.id = urma.JettyID{EID: c.eid, UASID: c.uasid, ID: id}
	})
	if err != nil {
		r.detach()
		q.detach()
		return nil, err
	}
	if err := c.adopt(j, op); err != nil {
		c.dev.freeJetty(id)
		r.detach()
		q.detach()
		return nil, err
	}
	return j, nil
}

func (j *jetty) Kind() string { return "jetty" }

// ID names the jetty.
func (j *jetty) ID() urma.JettyID { return j.id }

// State is READY or ERROR.
func (j *jetty) State() urma.JettyState {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.state
}

func (j *jetty) slot(seq uint64) *sqSlot { return &j.slots[seq&j.mask] }

// PostSend posts one send. Structural mistakes fail the call (ErrInval), a
// full queue fails with ErrAgain; a bad SGE (LOC_ACCESS) or an oversize
// message (LOC_LEN) is accepted and completes with that status in its turn.
// An RC jetty binds to the target of its first send and ignores wr.Target
// from then on, as udma does (udma_u_jfs.c:960-963 takes an RC SQ's bound
// target jetty, never the work request's).
func (j *jetty) PostSend(wr *urma.SendWR) error {
	if err := wr.CheckPost(j.maxSGE); err != nil {
		return err
	}
	j.mu.Lock()
	t := j.bound
	var err error
	if t == nil {
		t, err = j.checkTarget(wr.Target)
	}
	if err == nil {
		err = j.postLocked(wr, t)
	}
	c := j.kickConn
	j.kickConn = nil
	j.mu.Unlock()
	if c != nil {
		c.kick() // write the frame from here: no writer wakeup on the common path
	}
	return err
}

// checkTarget validates the target of a send on an RM jetty or an RC
// jetty's first send; j.mu is held.
func (j *jetty) checkTarget(target urma.RemoteJetty) (*remoteJetty, error) {
	const op = "post_jetty_send_wr"
	t, ok := target.(*remoteJetty)
	switch {
	case !ok || t == nil || t.ctx != j.ctx:
		return nil, urma.Errorf(op, urma.CodeInval, "target was not imported by this jetty's context")
	case t.closed.Load():
		return nil, errClosed(op, "target jetty")
	case t.mode != j.mode:
		return nil, urma.Errorf(op, urma.CodeInval, "target imported as %s, jetty is %s", t.mode, j.mode)
	}
	return t, nil
}

func (j *jetty) postLocked(wr *urma.SendWR, t *remoteJetty) error {
	const op = "post_jetty_send_wr"
	switch {
	case j.closed:
		return errClosed(op, "jetty")
	case j.state != urma.JettyReady:
		return urma.Errorf(op, urma.CodeInval, "jetty %d is in ERROR", j.id.ID)
	case j.tail-j.head >= uint64(j.depth):
		return urma.Errorf(op, urma.CodeAgain, "jetty %d send queue is full (depth %d)", j.id.ID, j.depth)
	}
	if j.mode == urma.RC && j.bound == nil {
		// urma_bind_jetty at the first send: from now on the import
		// cannot be unimported (udma_u_jetty.c:459-463) until the jetty
		// is closed.
		if !t.bind() {
			return errClosed(op, "target jetty")
		}
		j.bound = t
	}
	s := j.slot(j.tail)
	var length uint64
	for i := range wr.SGEs {
		length += uint64(wr.SGEs[i].Len)
	}
	inline := wr.Flags&urma.SendInline != 0
	if inline && length > uint64(j.maxInline) {
		return urma.Errorf(op, urma.CodeInval, "%d bytes inline, the jetty takes at most %d", length, j.maxInline)
	}
	s.seq, s.state = j.tail, slotQueued
	s.opcode, s.flags, s.userCtx, s.imm, s.target = wr.Opcode, wr.Flags, wr.UserCtx, wr.Imm, t
	s.retries, s.resume, s.rnrBlock, s.writing, s.deferred, s.localErr, s.gen = 0, false, false, false, false, 0, 0
	s.length, s.nsge, s.isInline = uint32(min(length, 1<<32-1)), 0, false
	for i := range wr.SGEs {
		ref, ok := resolveSGE(j.ctx, &wr.SGEs[i])
		if !ok {
			s.localErr = urma.StatusLocAccess
			break
		}
		s.sges[i] = ref
		s.nsge++
	}
	switch {
	case s.localErr != 0:
	case length > j.dev.caps.MaxMsgSize:
		s.localErr = urma.StatusLocLen
	case inline:
		scatterInline(s.inline, s.sges[:s.nsge])
		s.isInline = true
	}
	if s.localErr != 0 || s.isInline {
		// Nothing will read the caller's memory again.
		releaseSGEs(s.sges[:s.nsge])
		s.nsge = 0
	}
	j.tail++
	if !j.stalled {
		j.pump()
	}
	return nil
}

// scatterInline copies the SGEs' bytes into the slot's inline buffer.
func scatterInline(dst []byte, src []sgeRef) {
	for i := range src {
		dst = dst[copy(dst, src[i].buf):]
	}
}

// pump transmits queued sends in order until the queue stalls or fails; j.mu
// is held.
func (j *jetty) pump() {
	for j.next < j.sendable() && !j.stalled && j.state == urma.JettyReady {
		s := j.slot(j.next)
		j.next++
		if s.state == slotQueued {
			j.transmit(s)
		}
	}
}

// sendable is one past the last send pump may transmit: a held failure
// stops the queue; j.mu is held.
func (j *jetty) sendable() uint64 {
	if j.failing {
		return j.failAt
	}
	return j.tail
}

// transmit sends one slot: in place for a local target, by queueing a frame
// on the peer's connection for a remote one.
func (j *jetty) transmit(s *sqSlot) {
	s.state = slotInflight
	if s.localErr != 0 {
		j.failLocal(s, s.localErr)
		return
	}
	s.tx++
	if s.target.dev != nil {
		st, rnr := j.deliverLocal(s)
		j.result(s, st, rnr)
		return
	}
	p := s.target.peer
	c, gen, st := p.send(j, s.seq, s.tx, s.length)
	s.gen = gen
	switch st {
	case urma.StatusSuccess:
	case urma.StatusLocLen:
		j.failLocal(s, st)
		return
	default:
		// The connection is dead, as peerDown will find: an older send
		// may still be out on it, and it, not s, is the one that failed,
		// so that completions keep post order.
		j.failPeer(p, gen)
		return
	}
	if last := j.peerGen[p]; last != gen {
		if j.peerGen == nil {
			j.peerGen = make(map[*peer]uint64)
		}
		j.peerGen[p] = gen
		if last != 0 && j.failReplaced(p, gen, s.seq) {
			return // s is flushed: its frame is skipped
		}
	}
	switch {
	case c == nil:
	case j.tail-j.head > 1 || (j.kickConn != nil && j.kickConn != c):
		// Sends are streaming: the writer goroutine batches them into
		// few large writes, which beats a syscall per send.
		c.ring()
	default:
		// A lone send (request/response): write it from the posting
		// goroutine once j.mu is released, saving the writer's wakeup.
		j.kickConn = c
	}
}

// deliverLocal places s into its target's next posted receive, copying once
// from the sender's memory into the receive buffer; j.mu is held, which keeps
// this jetty's messages in order.
func (j *jetty) deliverLocal(s *sqSlot) (urma.Status, uint8) {
	t := s.target
	if t.dev.closed.Load() {
		return urma.StatusAckTimeout, 0
	}
	tj := t.dev.jetty(t.id.ID)
	if tj == nil || !tj.jfr.accepts(t.token) {
		return urma.StatusRemAccessAbort, 0
	}
	var tk recvTicket
	res, rnr := tj.jfr.take(&tk)
	switch res {
	case takeGone:
		return urma.StatusRemAccessAbort, 0
	case takeRNR:
		return statusRNR, rnr
	}
	meta := recvMeta{opcode: s.opcode, imm: s.imm, solicited: s.flags&urma.SendSolicitedEnable != 0, localID: tj.id.ID, remote: j.id}
	if tk.size < uint64(s.length) {
		tj.jfr.finish(&tk, urma.StatusLocLen, 0, &meta)
		return urma.StatusRemOperation, 0
	}
	dst := tk.sges[:tk.nsge]
	if s.isInline {
		scatter(dst, s.inline[:s.length])
	} else {
		gather(dst, s.sges[:s.nsge])
	}
	tj.jfr.finish(&tk, urma.StatusSuccess, s.length, &meta)
	return urma.StatusSuccess, 0
}

// gather copies the src pieces into the dst pieces, both in order.
func gather(dst, src []sgeRef) {
	di, doff := 0, 0
	for i := range src {
		b := src[i].buf
		for len(b) > 0 && di < len(dst) {
			c := copy(dst[di].buf[doff:], b)
			b = b[c:]
			doff += c
			if doff == len(dst[di].buf) {
				di, doff = di+1, 0
			}
		}
	}
}

// result applies the receiver's answer to an inflight slot; j.mu is held.
func (j *jetty) result(s *sqSlot, st urma.Status, rnrTimer uint8) {
	switch st {
	case urma.StatusSuccess:
		s.rnrBlock = false
		j.finish(s, st)
		if j.failing {
			j.completeHeld()
		}
	case statusRNR:
		remote := s.target.peer != nil
		s.rnrBlock = remote
		if j.rnrRetry != rnrForever && s.retries >= j.rnrRetry {
			j.finish(s, urma.StatusRNRRetryCntExc)
			j.enterError()
			return
		}
		if s.retries < 255 { // retrying forever must not wrap the count
			s.retries++
		}
		s.state = slotQueued
		s.resume = remote
		if remote {
			// The receiver discards everything behind s until s comes back.
			for seq := s.seq + 1; seq < j.tail; seq++ {
				o := j.slot(seq)
				if o.state == slotInflight && o.target.sameTarget(s.target) {
					o.state = slotQueued
				}
			}
		}
		j.next = min(j.next, s.seq)
		j.stalled = true
		j.timer.Reset(rnrDelay(rnrTimer, s.retries))
	default:
		j.finish(s, st)
		j.enterError()
	}
}

// failLocal fails s, which this side found it cannot carry, with st. The
// error waits for the older sends (see jetty). Newer sends already out, to
// other peers, are taken back: their answers no longer count and their
// frames not yet written are skipped. j.mu is held.
func (j *jetty) failLocal(s *sqSlot, st urma.Status) {
	s.localErr, s.state = st, slotFailed
	if !j.failing || s.seq < j.failAt {
		j.failing, j.failAt = true, s.seq
	}
	for seq := s.seq + 1; seq < j.tail; seq++ {
		if o := j.slot(seq); o.state == slotInflight {
			o.state = slotQueued
		}
	}
	j.completeHeld()
}

// completeHeld completes the held failure once no older send is out, and
// enters ERROR; j.mu is held.
func (j *jetty) completeHeld() {
	for seq := j.head; seq < j.failAt; seq++ {
		if j.slot(seq).state != slotDone {
			return
		}
	}
	s := j.slot(j.failAt)
	j.failing = false
	j.finish(s, s.localErr)
	j.enterError()
}

// rnrDelay is the wait before RNR retry number retry (1-based). The
// receiver's min_rnr_timer t (0..31) sets the base, 10µs << t/2 (times 1.5
// for odd t): 10µs at 0, about 0.5s at 31. Retries back off exponentially
// from the base up to max(base, 10ms), so "retry forever" does not spin.
func rnrDelay(t uint8, retry uint8) time.Duration {
	base := 10 * time.Microsecond << (t >> 1)
	if t&1 == 1 {
		base += base / 2
	}
	limit := max(base, 10*time.Millisecond)
	d := base << min(int(retry)-1, 16)
	return min(d, limit)
}

func (j *jetty) onTimer() {
	j.mu.Lock()
	if !j.closed && j.state == urma.JettyReady && j.stalled {
		j.stalled = false
		j.pump()
	}
	c := j.kickConn
	j.kickConn = nil
	j.mu.Unlock()
	if c != nil {
		c.kick()
	}
}

// finish completes a slot: its SGE references go, then a record when it
// failed or asked for one, then the slot is freed in order; j.mu is held.
// The references go first, and whatever slot is at the head, since a poller
// may see the record at once and unregister the segments; a slot whose
// frame is being written keeps them, and its record waits (heldRecord).
func (j *jetty) finish(s *sqSlot, st urma.Status) {
	j.dropBlock(s)
	s.state = slotDone
	if !s.writing {
		releaseSGEs(s.sges[:s.nsge])
		s.nsge = 0
	}
	if st != urma.StatusSuccess || s.flags&urma.SendCompleteEnable != 0 {
		c := urma.Completion{ // no opcode: liburma fills it for receives only (urma_types.h:1154)
			Status:   st,
			UserCtx:  s.userCtx,
			LocalID:  j.id.ID,
			RemoteID: s.target.id,
		}
		if st == urma.StatusSuccess {
			c.CompletionLen = s.length
		}
		j.complete(&c, s)
	}
	j.reap()
}

// complete pushes a record of this jetty's, or holds it while s (nil for
// none) is being written or older records are held; j.mu is held.
func (j *jetty) complete(c *urma.Completion, s *sqSlot) {
	wait := s != nil && s.writing
	if !wait && len(j.held) == 0 {
		j.sendJFC.push(c, false)
		return
	}
	h := heldRecord{c: *c, wait: wait}
	if wait {
		h.seq = s.seq
	}
	j.held = append(j.held, h)
}

// pushHeld pushes the held records, in order, up to the first whose slot
// is still being written; j.mu is held.
func (j *jetty) pushHeld() {
	n := 0
	for ; n < len(j.held); n++ {
		h := &j.held[n]
		if s := j.slot(h.seq); h.wait && s.seq == h.seq && s.writing {
			break // not reaped while written, so s is still h's slot
		}
		j.sendJFC.push(&h.c, false)
	}
	if n == len(j.held) {
		j.held = nil // ERROR is final: no more will be held
		return
	}
	j.held = j.held[:copy(j.held, j.held[n:])]
}

// dropBlock tells the receiver to forget the RNR block s left behind.
func (j *jetty) dropBlock(s *sqSlot) {
	if s.rnrBlock {
		s.rnrBlock = false
		s.target.peer.cancel(j, s.seq, s.target.id.ID)
	}
}

// reap frees completed slots from the head; j.mu is held.
func (j *jetty) reap() {
	for j.head < j.tail {
		s := j.slot(j.head)
		if s.state != slotDone || s.writing {
			break
		}
		releaseSGEs(s.sges[:s.nsge])
		s.nsge, s.target, s.state = 0, nil, slotFree
		j.head++
	}
	j.next = max(j.next, j.head)
}

// enterError moves the jetty to ERROR and flushes every outstanding send
// with WR_FLUSH_ERR, in order; j.mu is held.
func (j *jetty) enterError() {
	if j.state == urma.JettyError {
		return
	}
	j.state = urma.JettyError
	j.stalled, j.failing = false, false
	j.timer.Stop()
	j.peerGen = nil // ERROR is final: nothing is transmitted any more
	for seq := j.head; seq < j.tail; seq++ {
		if s := j.slot(seq); s.outstanding() {
			j.finish(s, urma.StatusWRFlushErr)
		}
	}
}

// outstanding reports whether s is posted and not yet completed.
func (s *sqSlot) outstanding() bool {
	return s.state == slotQueued || s.state == slotInflight || s.state == slotFailed
}

// SetError moves the jetty to ERROR: outstanding sends complete with
// WR_FLUSH_ERR, then one WR_FLUSH_ERR_DONE record follows. Only the first
// call produces the record. The JFR is a separate object, possibly shared,
// so its posted receives stay posted.
func (j *jetty) SetError() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return errClosed("modify_jetty", "jetty")
	}
	if j.flushDone {
		return nil
	}
	j.enterError()
	j.flushDone = true
	j.complete(&urma.Completion{Status: urma.StatusWRFlushErrDone, LocalID: j.id.ID}, nil) // after the flushed ones, held or not
	return nil
}

// Close destroys the jetty. Outstanding sends are dropped without
// completions, as on hardware; move it to ERROR and wait for FLUSH_ERR_DONE
// first to get them back. A send whose bytes are being handed to the kernel
// is let finish (at most until the connection's peer timeout), so that once
// Close returns no segment is referenced by this jetty.
func (j *jetty) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	j.state = urma.JettyError
	j.stalled, j.failing = false, false
	j.timer.Stop()
	j.peerGen = nil
	for seq := j.head; seq < j.tail; seq++ {
		if s := j.slot(seq); s.outstanding() {
			j.dropBlock(s)
			s.state = slotDone
		}
	}
	j.reap()
	for j.writing > 0 {
		j.written.Wait()
	}
	bound := j.bound
	j.bound = nil
	j.mu.Unlock()
	if bound != nil {
		bound.unbind() // urma_unbind_jetty, before urma_delete_jetty
	}
	j.dev.freeJetty(j.id.ID)
	j.jfr.detach()
	j.sendJFC.detach()
	j.ctx.release(j)
	return nil
}

func (j *jetty) ForceClose() { _ = j.Close() }

var _ urma.RemoteJetty = (*remoteJetty)(nil)
