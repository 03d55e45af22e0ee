package soft

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Bounds that keep a hostile peer from making this side allocate without end.
const (
	maxBlocked   = 1 << 14 // RNR blocks a connection may hold
	maxCtlQueued = 1 << 14 // answers queued before the reader waits for the writer
)

// txItem is one frame waiting for the writer: a jetty's send, named by slot
// and transmission so a stale one is skipped, or a complete control frame.
type txItem struct {
	j   *jetty
	seq uint64
	tx  uint32
	n   uint8
	ctl [maxCtlFrame]byte
}

// blockKey names the sends an RNR block holds back: one sender jetty
// instance to one target jetty.
type blockKey struct{ instance, dst uint32 }

// protocolError is a peer's violation of the frame protocol.
type protocolError struct{ error }

var errConnDead = errors.New("connection closed")

// conn is the one TCP connection between this device and a peer device. A
// reader goroutine decodes frames and reads payloads straight into posted
// receive buffers; a writer goroutine drains the queue with one writev(2) per
// batch, header and payload of every frame gathered from where they lie.
type conn struct {
	sd            *sockDevice
	p             *peer
	fd            int // blocking socket; the reader closes it last
	br            *bufio.Reader
	local, remote string // addresses, for logs and tests
	peerEID       urma.EID
	session       uint64
	peerMax       uint64 // the peer's MaxMsgSize
	dialedByMe    bool
	rx            *atomic.Uint64 // bytes read, for the watchdog
	tx            atomic.Uint64  // bytes written

	mu        sync.Mutex
	space     *sync.Cond // the reader waits here while too many answers are queued
	q, spare  []txItem
	ctlQueued int
	dead      bool
	err       error
	imports   map[uint32]chan urma.Code
	nextReq   uint32

	doorbell   chan struct{}
	done       chan struct{} // closed when the connection dies
	writerDone chan struct{} // closed when the writer goroutine returns

	// Write side, guarded by wmu: whoever holds it writes. Posting
	// goroutines and the reader write directly when it is free and the
	// socket has room; the writer goroutine takes over when it is not.
	wmu     sync.Mutex
	batch   []txItem     // frames being written
	next    int          // first frame of batch not yet encoded
	iovBuf  []unix.Iovec // storage for iov
	iov     []unix.Iovec // encoded bytes not yet written
	started []int        // frames of batch whose payload is in iov

	// Reader goroutine only.
	blocked map[blockKey]uint64
	ticket  recvTicket

	// Watchdog goroutine only.
	lastRx, lastTx uint64
	idleTicks      int
}

// newConn wraps an established connection: fd for writing (and shutting
// down), rd for reading.
func newConn(sd *sockDevice, p *peer, fd int, rd io.Reader, rx *atomic.Uint64, h hello, dialedByMe bool, local, remote string) *conn {
	c := &conn{
		sd: sd, p: p, fd: fd, br: bufio.NewReaderSize(rd, ioBufSize), rx: rx, local: local, remote: remote,
		peerEID: p.eid, session: h.session, peerMax: h.maxMsg, dialedByMe: dialedByMe,
		imports:    make(map[uint32]chan urma.Code),
		doorbell:   make(chan struct{}, 1),
		done:       make(chan struct{}),
		writerDone: make(chan struct{}),
	}
	c.space = sync.NewCond(&c.mu)
	return c
}

// enqueue queues a frame; the caller then kicks (writes it directly) or
// rings (wakes the writer goroutine). The reader (fromReader) waits while
// too many answers are queued, so a peer that sends but does not read stalls
// itself instead of growing this queue.
func (c *conn) enqueue(it *txItem, fromReader bool) error {
	c.mu.Lock()
	if fromReader && c.ctlQueued >= maxCtlQueued {
		c.mu.Unlock()
		c.ring() // the writer drains the queue, blocking if it must
		c.mu.Lock()
	}
	for fromReader && c.ctlQueued >= maxCtlQueued && !c.dead {
		c.space.Wait()
	}
	if c.dead {
		c.mu.Unlock()
		return errConnDead
	}
	c.q = append(c.q, *it)
	if it.j == nil {
		c.ctlQueued++
	}
	c.mu.Unlock()
	return nil
}

// ringIfQueued wakes the writer if anything waits.
func (c *conn) ringIfQueued() {
	c.mu.Lock()
	more := len(c.q) > 0
	c.mu.Unlock()
	if more {
		c.ring()
	}
}

func (c *conn) ring() {
	select {
	case c.doorbell <- struct{}{}:
	default:
	}
}

func (c *conn) deathCause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail closes the connection once: imports waiting on it fail, and every
// send outstanding to the peer completes with ACK_TIMEOUT.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.dead = true
	c.err = err
	c.space.Broadcast()
	c.mu.Unlock()
	close(c.done)
	// Wake the reader and writer out of their blocking calls; the reader
	// closes the descriptor once both are out.
	_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
	p, sd := c.p, c.sd
	p.mu.Lock()
	if p.conn == c {
		p.conn = nil
	}
	p.mu.Unlock()
	sd.mu.Lock()
	delete(sd.conns, c)
	sd.mu.Unlock()
	var pe protocolError
	if errors.As(err, &pe) {
		sd.log().Error(err, "closing connection: peer broke the protocol", "peer", p.eid.String())
	} else {
		sd.log().Info("connection closed", "peer", p.eid.String(), "reason", fmt.Sprint(err))
	}
	sd.dev.forEachJetty(func(j *jetty) { j.peerDown(p) })
}

func (c *conn) writeLoop() {
	defer close(c.writerDone)
	for {
		select {
		case <-c.doorbell:
		case <-c.done:
			return
		}
		c.wmu.Lock()
		_, err := c.drain(true)
		c.wmu.Unlock()
		if err != nil {
			c.fail(fmt.Errorf("write: %w", err))
			return
		}
	}
}

// kick writes what is queued from the calling goroutine, without blocking:
// it saves the writer goroutine's wakeup on the common path. Whatever it
// cannot write (lock taken, socket full) it leaves to the writer goroutine.
// The caller holds no jetty lock.
func (c *conn) kick() {
	if !c.wmu.TryLock() {
		c.ring()
		return
	}
	stuck, err := c.drain(false)
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("write: %w", err))
		return
	}
	if stuck {
		c.ring()
		return
	}
	c.ringIfQueued()
}

// drain writes queued frames until the queue is empty; c.wmu is held. Each
// batch is encoded into iovecs (headers and control frames from the items,
// payloads straight from registered memory) and written with sendmsg. A
// send's slot stays marked as being written until its bytes are in the
// kernel. Without wait it returns stuck when the socket is full, leaving its
// progress in c.batch/c.iov for the next holder.
func (c *conn) drain(wait bool) (stuck bool, err error) {
	for {
		if len(c.iov) > 0 {
			c.iov, err = sendIov(c.fd, c.iov, wait, &c.tx)
			if errors.Is(err, unix.EAGAIN) && !wait {
				return true, nil
			}
			if err != nil {
				return false, err
			}
			if len(c.iov) > 0 {
				continue
			}
			clear(c.iovBuf[:cap(c.iovBuf)]) // drop the pointers into registered memory
			c.endWrites()
		}
		if c.next < len(c.batch) {
			c.encode()
			continue
		}
		if c.batch != nil {
			clear(c.batch)
			c.mu.Lock()
			c.spare = c.batch[:0]
			c.mu.Unlock()
			c.batch, c.next = nil, 0
		}
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			return false, errConnDead
		}
		if len(c.q) == 0 {
			c.mu.Unlock()
			return false, nil
		}
		c.batch, c.q, c.spare = c.q, c.spare[:0], nil
		c.ctlQueued = 0
		c.space.Broadcast()
		c.mu.Unlock()
	}
}

// encode turns the next frames of c.batch into iovecs, up to half the
// kernel's iovec limit.
func (c *conn) encode() {
	iov := c.iovBuf[:0]
	for ; c.next < len(c.batch) && len(iov) < iovMax/2; c.next++ {
		it := &c.batch[c.next]
		if it.j == nil {
			iov = appendIov(iov, it.ctl[:it.n])
			continue
		}
		var h sendHeader
		payload, inline, ok := it.j.beginWrite(it.seq, it.tx, &h)
		if !ok {
			continue
		}
		if uint64(h.length) > c.peerMax {
			it.j.endWrite(it.seq)
			it.j.onAnswer(h.tag, urma.StatusLocLen, 0)
			continue
		}
		iov = appendIov(iov, encodeSendHeader(it.ctl[:], &h))
		iov = appendIov(iov, inline)
		for k := range payload {
			iov = appendIov(iov, payload[k].buf)
		}
		c.started = append(c.started, c.next)
	}
	c.iovBuf, c.iov = iov, iov
	if len(iov) == 0 {
		c.endWrites()
	}
}

// endWrites releases the slots whose frames are written (or abandoned).
func (c *conn) endWrites() {
	for _, i := range c.started {
		c.batch[i].j.endWrite(c.batch[i].seq)
	}
	c.started = c.started[:0]
}

// abandonWrites releases slots still marked as being written when the
// connection dies.
func (c *conn) abandonWrites() {
	c.wmu.Lock()
	c.endWrites()
	c.iov = nil
	clear(c.iovBuf[:cap(c.iovBuf)])
	c.wmu.Unlock()
}

func (c *conn) readLoop() {
	c.fail(c.readFrames())
	<-c.writerDone
	c.abandonWrites()
	_ = unix.Close(c.fd)
}

// readFrames decodes frames until the connection breaks or the peer breaks
// the protocol. Lengths are checked before anything past the type byte is
// read, and no allocation depends on what the peer sends.
func (c *conn) readFrames() error {
	var hdr [4 + maxCtlFrame]byte
	maxMsg := c.sd.dev.caps.MaxMsgSize
	for n := 1; ; n++ {
		// Answers go out when the reader is about to wait for more, or
		// every 32 frames of a long burst. The writer goroutine sends them:
		// answers written at once would return one by one and pace the
		// sender into one frame per write; batched, they keep it batching.
		if c.br.Buffered() == 0 || n%32 == 0 {
			c.ringIfQueued()
		}
		if _, err := io.ReadFull(c.br, hdr[:5]); err != nil {
			return err
		}
		bodyLen, typ := be.Uint32(hdr[:4]), hdr[4]
		if err := checkFrame(typ, bodyLen, maxMsg); err != nil {
			return protocolError{err}
		}
		if typ == frameHello || typ == frameHelloAck {
			return protocolError{fmt.Errorf("handshake frame %d on an established connection", typ)}
		}
		fl := fixedLen(typ)
		if _, err := io.ReadFull(c.br, hdr[5:4+fl]); err != nil {
			return err
		}
		if err := c.handle(typ, hdr[4:4+fl], bodyLen); err != nil {
			return err
		}
	}
}

func (c *conn) handle(typ byte, body []byte, bodyLen uint32) error {
	d := c.sd.dev
	switch typ {
	case frameSend:
		return c.onSend(body, bodyLen)
	case frameAck:
		a, err := decodeAck(body)
		if err != nil {
			return protocolError{err}
		}
		if j := d.jetty(a.src); j != nil {
			j.onAnswer(a.tag, a.status, a.rnrTimer)
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
	var it txItem
	it.n = uint8(len(encodeImportResp(it.ctl[:], req, code)))
	return c.enqueue(&it, true)
}

func (c *conn) answer(h *sendHeader, st urma.Status, rnrTimer uint8) error {
	var it txItem
	it.n = uint8(len(encodeAck(it.ctl[:], &ackFrame{status: st, rnrTimer: rnrTimer, src: h.src, dst: h.dst, tag: h.tag})))
	return c.enqueue(&it, true)
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
	key := blockKey{uint32(h.tag >> 32), h.dst}
	if len(c.blocked) > 0 {
		if t, ok := c.blocked[key]; ok {
			if h.flags&sendFlagResume == 0 || h.tag != t {
				return c.discard(h.length)
			}
			delete(c.blocked, key)
		}
	}
	tj := c.sd.dev.jetty(h.dst)
	if tj == nil || !tj.jfr.accepts(urma.Token(h.token)) {
		if err := c.discard(h.length); err != nil {
			return err
		}
		return c.answer(&h, urma.StatusRemAccessAbort, 0)
	}
	t := &c.ticket
	res, rnr := tj.jfr.take(t)
	switch res {
	case takeGone:
		if err := c.discard(h.length); err != nil {
			return err
		}
		return c.answer(&h, urma.StatusRemAccessAbort, 0)
	case takeRNR:
		if err := c.discard(h.length); err != nil {
			return err
		}
		if len(c.blocked) >= maxBlocked {
			return protocolError{fmt.Errorf("more than %d RNR blocks", maxBlocked)}
		}
		if c.blocked == nil {
			c.blocked = make(map[blockKey]uint64)
		}
		c.blocked[key] = h.tag
		return c.answer(&h, statusRNR, rnr)
	}
	meta := recvMeta{
		opcode: h.opcode, imm: h.imm, solicited: h.flags&sendFlagSolicited != 0, localID: tj.id.ID,
		remote: urma.JettyID{EID: c.peerEID, UASID: h.srcUASID, ID: h.src},
	}
	if t.size < uint64(h.length) {
		if err := c.discard(h.length); err != nil {
			tj.jfr.putBack(t)
			return err
		}
		tj.jfr.finish(t, urma.StatusLocLen, 0, &meta)
		return c.answer(&h, urma.StatusRemOperation, 0)
	}
	left := h.length
	for i := 0; i < t.nsge && left > 0; i++ {
		b := t.sges[i].buf
		b = b[:min(uint32(len(b)), left)]
		if _, err := io.ReadFull(c.br, b); err != nil {
			tj.jfr.putBack(t)
			return err
		}
		left -= uint32(len(b))
	}
	tj.jfr.finish(t, urma.StatusSuccess, h.length, &meta)
	return c.answer(&h, urma.StatusSuccess, 0)
}

func (c *conn) discard(n uint32) error {
	_, err := c.br.Discard(int(n))
	return err
}
