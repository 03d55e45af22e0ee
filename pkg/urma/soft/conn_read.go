package soft

import (
	"errors"
	"fmt"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func (c *conn) readLoop() {
	c.fail(c.readFrames())
	<-c.writerDone
	c.abandonWrites()
	// A poller may still drive the connection from a list it loaded before
	// fail dropped it: wait until it is out, and keep later ones out of the
	// rings that close unmaps.
	c.readMu.Lock()
	c.released = true
	c.readMu.Unlock()
	c.io.Close()
}

// readFrames decodes frames until the connection breaks or the peer breaks
// the protocol.
func (c *conn) readFrames() error {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	idler, _ := c.io.(interface{ Idle() error })
	for n := 1; ; n++ {
		// Answers go out when the reader is about to wait for more (from
		// this goroutine, if the stream has room), or every 32 frames of a
		// long burst (by the writer goroutine). Batched, they return as a
		// few ACK_RUNs and keep the sender batching.
		if c.src.Buffered() == 0 {
			if c.hasQueued() {
				c.kick()
			}
			if idler != nil {
				// Between frames the token is free for pollers.
				c.readMu.Unlock()
				err := idler.Idle()
				c.readMu.Lock()
				if err != nil {
					return err
				}
				continue
			}
		} else if n%32 == 0 && c.hasQueued() {
			c.ring()
		}
		if err := c.readFrame(); err != nil {
			return err
		}
	}
}

// pollerReadBudget is how long a Poll goes on reading the rings' frames
// once it has started: short messages are taken in batches, but after a
// large payload (a 1 MiB copy takes about 100 µs) the poller returns to its
// caller, which has a message to consume, and leaves the next frames to the
// reader goroutine, which then copies them meanwhile on another processor.
// The reader goroutine is awake, or woken, for whatever is in the ring: the
// writer wakes it for every sleep it announces, whoever reads the frames.
const pollerReadBudget = 20 * time.Microsecond

// drive is Poll taking what the connection's rings hold, in the polling
// goroutine, unless the reader goroutine is reading: every frame there is,
// a frame that is not yet whole included (its writer is copying the rest;
// a writer that stops for PeerTimeout, or trickles the rest past its
// framebound.For, fails the connection: see shmring.Stream).
// It also writes what waits to be written, which the writer goroutine may
// be slow to get to: a poller busy on every processor starves the wake-ups
// of goroutines that sleep in Go's poller.
func (c *conn) drive() {
	s := c.io.(*shmIO)
	if c.readMu.TryLock() {
		if c.released {
			c.readMu.Unlock()
			return // the rings are unmapped, and nothing is written any more
		}
		var err error
		if s.Buffered() > 0 {
			s.PollerReads = true
			start := time.Now()
			for s.Buffered() > 0 {
				if c.nextAwaitsOffer(s) {
					break
				}
				if err = c.readFrame(); err != nil {
					break
				}
				if time.Since(start) > s.pollerBudget {
					break
				}
			}
			s.PollerReads = false
		}
		c.readMu.Unlock()
		if err != nil {
			c.fail(err)
			return
		}
	}
	if c.hasQueued() {
		c.kick()
	}
}

// nextAwaitsOffer reports whether the next frame in the ring is a SEND of
// awaitOfferMin bytes or more for a JFR whose reader is about to offer
// (jfr.offerDue): a Poll leaves it where it is, and ends. A Poll cannot
// wait for the offer as the reader goroutine does (awaitOffer): the
// completions it has taken reach the transport only when it returns, and
// the reader to offer may be waiting for one of them. Read now instead,
// the message would land in its receive buffer and cost the reader a copy,
// and so would every one behind it: the reader would find them queued and
// not offer. Left, it is read by the next Poll that finds the offer made,
// or once the reader is no longer about to offer (offerWait), or by the
// reader goroutine. The frame is only looked at: a frame that breaks the
// protocol is readFrame's to report.
func (c *conn) nextAwaitsOffer(s *shmIO) bool {
	// Every frame a Poll reads is looked at first: the type and length
	// settle it for all but a large SEND.
	b := c.hdr[:]
	if !s.Peek(b[:5]) {
		return false
	}
	bodyLen, typ := be.Uint32(b[:4]), b[4]
	if checkFrame(typ, bodyLen, c.sd.dev.caps.MaxMsgSize) != nil {
		return false
	}
	var h sendHeader
	switch typ {
	case frameSend:
		if bodyLen-sendHdrLen < awaitOfferMin || !s.Peek(b[:4+sendHdrLen]) || decodeSendHeader(b[4:4+sendHdrLen], bodyLen, &h) != nil {
			return false
		}
	case frameSendRef:
		if !s.Peek(b[:4+bodyLen]) {
			return false
		}
		if _, err := decodeSendRef(b[4:4+bodyLen], c.sd.dev.caps.MaxMsgSize, &h, &c.refs); err != nil {
			return false
		}
	default:
		return false
	}
	if h.length < awaitOfferMin {
		return false
	}
	tj := c.sd.dev.jetty(h.dst)
	return tj != nil && tj.jfr.offerDue()
}

// readFrame reads and handles one frame. Lengths are checked before
// anything past the type byte is read, and no allocation depends on what
// the peer sends.
func (c *conn) readFrame() error {
	hdr := &c.hdr
	c.src.BeginFrame()
	if err := c.src.ReadFull(hdr[:5]); err != nil {
		return err
	}
	bodyLen, typ := be.Uint32(hdr[:4]), hdr[4]
	if err := checkFrame(typ, bodyLen, c.sd.dev.caps.MaxMsgSize); err != nil {
		return protocolError{err}
	}
	if typ == frameHello || typ == frameHelloAck {
		return protocolError{fmt.Errorf("handshake frame %d on an established connection", typ)}
	}
	fl := fixedLen(typ)
	if typ == frameSendRef {
		if _, ok := c.io.(*shmIO); !ok {
			return protocolError{errors.New("SEND_REF on a connection without shared memory")}
		}
		fl = bodyLen // the references too
	}
	if err := c.src.ReadFull(hdr[5 : 4+fl]); err != nil {
		return unexpected(err)
	}
	if err := c.handle(typ, hdr[4:4+fl], bodyLen); err != nil {
		return err
	}
	c.src.EndFrame()
	return nil
}

// cancelBlock asks the peer to drop the RNR block the SEND tagged tag, from
// jetty src to its jetty dst, left there. With bounded (the peer's RNR
// answer asked for it), a peer that makes this side queue more than
// maxCancels of them breaks the protocol; this side's own cancels, one per
// send of its own at most, are always queued.
func (c *conn) cancelBlock(src, dst uint32, tag uint64, bounded bool) error {
	var it txItem
	it.n = uint8(len(encodeCancel(it.ctl[:], &cancelFrame{src: src, dst: dst, tag: tag})))
	c.mu.Lock()
	switch {
	case c.dead:
		c.mu.Unlock()
		return nil
	case bounded && c.cancels >= c.sd.maxCancels:
		c.mu.Unlock()
		return protocolError{fmt.Errorf("peer sent more than %d RNR answers that no send waits for without reading the cancels", c.sd.maxCancels)}
	}
	c.q = append(c.q, it)
	c.cancels++
	c.mu.Unlock()
	c.ring()
	return nil
}

func (c *conn) handle(typ byte, body []byte, bodyLen uint32) error {
	d := c.sd.dev
	switch typ {
	case frameSend:
		return c.onSend(body, bodyLen)
	case frameSendRef:
		return c.onSendRef(body)
	case frameAck:
		a, err := decodeAck(body)
		if err != nil {
			return protocolError{err}
		}
		j := d.jetty(a.src)
		if (j == nil || !j.onAnswer(c.p, a.tag, a.status, a.rnrTimer)) && a.status == statusRNR {
			// The send's jetty closed or its slot completed before the
			// answer came: no retry will resume the block, so the receiver
			// must forget it or it holds it (and counts it towards
			// maxBlocked) for the connection's life.
			return c.cancelBlock(a.src, a.dst, a.tag, true)
		}
	case frameAckRun:
		a, err := decodeAckRun(body)
		if err != nil {
			return protocolError{err}
		}
		if j := d.jetty(a.src); j != nil {
			j.onSuccessRun(c.p, a.tag, a.count)
		}
	case frameCancel:
		cf, err := decodeCancel(body)
		if err != nil {
			return protocolError{err}
		}
		k := blockKey{uint32(cf.tag >> 32), cf.dst}
		if t, ok := c.blocked[k]; ok && t == cf.tag {
			delete(c.blocked, k)
		}
	case frameImportJetty:
		r, err := decodeImportJetty(body)
		if err != nil {
			return protocolError{err}
		}
		return c.answerImport(r.req, d.checkJettyImport(r.jetty, r.mode))
	case frameImportSeg:
		r, err := decodeImportSeg(body)
		if err != nil {
			return protocolError{err}
		}
		id := urma.SegmentID{EID: c.sd.eid, UASID: r.uasid, VA: r.va, Len: r.len, TokenID: r.tokenID}
		return c.answerImport(r.req, d.checkSegmentImport(id))
	case frameImportResp:
		req, code, err := decodeImportResp(body)
		if err != nil {
			return protocolError{err}
		}
		c.mu.Lock()
		ch := c.imports[req]
		delete(c.imports, req)
		c.mu.Unlock()
		if ch != nil {
			ch <- code
		}
	case framePing:
		if !zero(body[1:]) {
			return protocolError{errors.New("PING reserved bytes are not zero")}
		}
	}
	return nil
}

func (c *conn) answerImport(req uint32, code urma.Code) error {
	return c.owe(nil, 0, 0, req, code)
}

func (c *conn) answer(h *sendHeader, st urma.Status, rnrTimer uint8) error {
	return c.owe(h, st, rnrTimer, 0, 0)
}

// onSend places a message: into the target jetty's next posted receive,
// reading the payload straight into it; otherwise it discards the payload and
// answers why. After an RNR answer, later sends from the same sender jetty to
// the same target are discarded unanswered until the retried one (flagged
// resume) arrives; the sender rewinds and retransmits them, which keeps
// delivery in order.
func (c *conn) onSend(body []byte, bodyLen uint32) error {
	var h sendHeader
	if err := decodeSendHeader(body, bodyLen, &h); err != nil {
		return protocolError{err}
	}
	c.stream = streamPayload{src: c.src, n: h.length}
	return c.place(&h, &c.stream, false)
}

// onSendRef places a SEND_REF, whose payload the sender shared (pull.go):
// the bytes are copied once, from the sender's memory into the receive.
func (c *conn) onSendRef(body []byte) error {
	s := c.io.(*shmIO)
	var h sendHeader
	n, err := decodeSendRef(body, c.sd.dev.caps.MaxMsgSize, &h, &c.refs)
	if err != nil {
		return protocolError{err}
	}
	s.pull.mapMu.RLock() // an unmap waits until the copy is done
	defer s.pull.mapMu.RUnlock()
	defer c.pulled.release()
	err = s.pull.resolve(c.refs[:n], &c.pulled)
	c.pulled.s = s
	if errors.Is(err, errRetiredHandle) {
		return c.place(&h, &c.pulled, true)
	}
	if err != nil {
		return protocolError{err}
	}
	return c.place(&h, &c.pulled, false)
}

// payload is where a SEND's bytes come from: the stream, or the sender's
// memory.
type payload interface {
	read(dst []byte) error // the next bytes, into dst
	skip() error           // all of them, unread
}

// streamPayload is n payload bytes that follow a SEND frame's header.
type streamPayload struct {
	src frameSource
	n   uint32
}

func (p *streamPayload) read(dst []byte) error { return p.src.ReadPayload(dst) }

func (p *streamPayload) skip() error { return p.src.Discard(int(p.n)) }

// place puts a message into the target jetty's next posted receive, the
// payload copied straight into it; otherwise it skips the payload and
// answers why. After an RNR answer, later sends from the same sender jetty
// to the same target are skipped unanswered until the retried one (flagged
// resume) arrives; the sender rewinds and retransmits them, which keeps
// delivery in order. A refused message (a SEND_REF naming memory the peer
// no longer shares) is skipped and answered as for an unknown jetty.
func (c *conn) place(h *sendHeader, p payload, refused bool) error {
	key := blockKey{uint32(h.tag >> 32), h.dst}
	if len(c.blocked) > 0 {
		if t, ok := c.blocked[key]; ok {
			if h.flags&sendFlagResume == 0 || h.tag != t {
				return p.skip()
			}
			delete(c.blocked, key)
		}
	}
	tj := c.sd.dev.jetty(h.dst)
	if refused || tj == nil || !tj.jfr.accepts(urma.Token(h.token)) {
		if err := p.skip(); err != nil {
			return err
		}
		return c.answer(h, urma.StatusRemAccessAbort, 0)
	}
	if !c.sawUse {
		// The peer knows a token of this side's: a link in use.
		c.sawUse = true
		c.p.used.Store(true)
	}
	t := &c.ticket
	res, rnr := tj.jfr.take(t)
	switch res {
	case takeGone:
		if err := p.skip(); err != nil {
			return err
		}
		return c.answer(h, urma.StatusRemAccessAbort, 0)
	case takeRNR:
		if err := p.skip(); err != nil {
			return err
		}
		if len(c.blocked) >= maxBlocked {
			return protocolError{fmt.Errorf("more than %d RNR blocks", maxBlocked)}
		}
		if c.blocked == nil {
			c.blocked = make(map[blockKey]uint64)
		}
		c.blocked[key] = h.tag
		return c.answer(h, statusRNR, rnr)
	}
	meta := recvMeta{
		opcode: h.opcode, imm: h.imm, solicited: h.flags&sendFlagSolicited != 0, localID: tj.id.ID,
		remote: urma.JettyID{EID: c.peerEID, UASID: h.srcUASID, ID: h.src},
	}
	if t.size < uint64(h.length) {
		if err := p.skip(); err != nil {
			tj.jfr.putBack(t)
			return err
		}
		tj.jfr.finish(t, urma.StatusLocLen, 0, &meta)
		return c.answer(h, urma.StatusRemOperation, 0)
	}
	if !t.place.Offered() && h.length >= awaitOfferMin && c.mayAwaitOffer() {
		if c.hasQueued() {
			c.kick() // the answers owed go out before the wait
		}
		if c.offerTimer == nil {
			c.offerTimer = time.NewTimer(time.Hour)
			c.offerTimer.Stop()
		}
		t.place = tj.jfr.awaitOffer(t.userCtx, c.offerTimer)
	}
	if dst, ok := t.place.Claim(int(h.length), meta.remote); ok {
		// A reader waits for this message with room for it: copy it
		// there, not into the receive buffer it would copy it out of.
		err := p.read(dst)
		t.place.Settle(int(h.length), err == nil)
		if err != nil {
			tj.jfr.putBack(t)
			return err
		}
		tj.jfr.finish(t, urma.StatusSuccess, h.length, &meta)
		return c.answer(h, urma.StatusSuccess, 0)
	}
	left := h.length
	for i := 0; i < t.nsge && left > 0; i++ {
		b := t.sges[i].buf
		b = b[:min(uint32(len(b)), left)]
		if err := p.read(b); err != nil {
			tj.jfr.putBack(t)
			return err
		}
		left -= uint32(len(b))
	}
	tj.jfr.finish(t, urma.StatusSuccess, h.length, &meta)
	return c.answer(h, urma.StatusSuccess, 0)
}

// awaitOfferMin is the smallest message that waits for a reader's offer
// (jfr.awaitOffer). A wait costs a wake-up, which at 64 KiB cost more
// than the copy it saved (shm throughput 4-13% down, two alternating
// runs) and at 1 MiB less (13% up, three).
const awaitOfferMin = 512 << 10

// mayAwaitOffer reports whether place may wait for a reader's offer: not
// in a Poll, whose caller may be the very reader that would offer. Only
// shm has Polls that read frames; the socket fabric's frames are always
// read by its reader goroutine, which may wait. There, waiting saves the
// receiver's copy out of the receive buffer for half of 1 MiB messages
// (from an eighth): the copying API went from 0.57-0.70x TCP to
// 0.79-0.85x in alternating runs while the receiver was the bottleneck,
// and did not move while the sender was.
func (c *conn) mayAwaitOffer() bool {
	if s, ok := c.io.(*shmIO); ok {
		return !s.PollerReads
	}
	return true
}
