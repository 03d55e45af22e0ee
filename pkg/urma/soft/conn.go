package soft

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// Bounds that keep a hostile peer from making this side allocate without end.
const (
	maxBlocked = 1 << 14 // RNR blocks a connection may hold
	// maxAnswers bounds the answers owed to a peer that sends without
	// reading them. Answers to one sender jetty's stream coalesce into one
	// ACK_RUN, so an honest peer stays far below it whatever it sends.
	maxAnswers = 1 << 20
	// maxCancels bounds the CANCELs queued and not yet taken by the
	// writer. This side cancels a block only for an RNR answer no send
	// waits for, and the peer holds at most maxBlocked blocks, so an
	// honest peer stays within it; one that sends such answers without
	// reading would otherwise grow the queue without end.
	maxCancels = 2 * maxBlocked
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

// brokeProtocol reports whether err is the peer's violation: of the frame
// protocol, or of the rules of the shm rings (shmring.FaultError).
func brokeProtocol(err error) bool {
	var pe protocolError
	var fe shmring.FaultError
	return errors.As(err, &pe) || errors.As(err, &fe)
}

var errConnDead = errors.New("connection closed")

// linkIO is the byte stream under a connection, one each way: a TCP socket
// (socket fabric) or a pair of shared-memory rings (shm fabric).
type linkIO interface {
	frameSource
	// Writev writes as much of iov as it takes now and returns the rest;
	// with wait false it never blocks and reports unix.EAGAIN when full.
	Writev(iov []unix.Iovec, wait bool) ([]unix.Iovec, error)
	// Shutdown wakes the reader and the writer out of blocking calls and
	// makes every later call fail.
	Shutdown()
	// Close releases the stream once the reader and writer are out.
	Close()
	// Counters are the bytes read and written so far, for the watchdog.
	Counters() (rx, tx *atomic.Uint64)
}

// conn is the one connection between this device and a peer device. A
// reader goroutine decodes frames and copies payloads straight into posted
// receive buffers; it never waits for the writer: the answers it owes go
// into a queue that coalesces a stream's ACKs, and the writer sends them
// ahead of queued sends. Whoever holds the write lock writes: a posting
// goroutine or the reader while the stream has room, the writer goroutine
// when it has not. Each batch is gathered straight from registered memory.
type conn struct {
	sd            *sockDevice
	p             *peer
	io            linkIO
	local, remote string // addresses, for logs and tests
	peerEID       urma.EID
	session       uint64
	peerMax       uint64 // the peer's MaxMsgSize
	dialedByMe    bool
	rx, tx        *atomic.Uint64 // bytes read and written, for the watchdog
	gen           uint64         // its generation among the peer's connections (peer.gen)
	proc          procKey        // the process that dialed it in (shm), for Options.MaxConnsPerProcess
	seq           uint64         // the order it was adopted in, for eviction; under sd.mu

	mu       sync.Mutex
	q, spare []txItem
	cancels  int // CANCELs in q (maxCancels)
	answers  answerQueue
	dead     bool
	err      error
	imports  map[uint32]chan urma.Code
	nextReq  uint32

	doorbell   chan struct{}
	done       chan struct{} // closed when the connection dies
	writerDone chan struct{} // closed when the writer goroutine returns

	// Write side, guarded by wmu: whoever holds it writes.
	wmu     sync.Mutex
	batch   []txItem     // frames being written
	next    int          // first frame of batch not yet encoded
	iovBuf  []unix.Iovec // storage for iov
	iov     []unix.Iovec // encoded bytes not yet written
	started []int        // frames of batch whose payload is in iov
	ansOut  answerQueue  // answers being written
	ansBuf  []byte       // their encoding
	refBuf  []byte       // SEND_REF frames of the batch being written (shm)
	sendRef []payloadRef

	// readMu is the reader's token: the reader goroutine holds it while it
	// reads, and a poller that drives the rings (shm) takes it when free.
	readMu sync.Mutex
	// Reader goroutine (or a poller holding readMu) only.
	src     frameSource
	hdr     [maxFrameHdr]byte // the frame being read
	stream  streamPayload     // a SEND's payload, read from the stream
	pulled  refPayload        // a SEND_REF's payload, in the peer's memory
	refs    [MaxSGE]payloadRef
	blocked map[blockKey]uint64
	ticket  recvTicket
	// sawUse says a send of the peer's passed a token check on this
	// connection, so peer.used is set already.
	sawUse bool
	// offerTimer bounds a message's wait for a reader's offer (awaitOffer);
	// made on first use, stopped between waits.
	offerTimer *time.Timer
	// released says the stream is closed (shm: its rings unmapped); set by
	// the reader goroutine, last, under readMu.
	released bool

	// Watchdog goroutine only. Socket: the bytes read and written at the
	// last tick. Shm: the peer's control words at the last tick, and when
	// the quiet spell that idleTicks counts was first seen.
	lastRx, lastTx                 uint64
	peerTail, peerHead, peerPulled uint64
	idleTicks                      int
	quietSince                     time.Time
	// Socket: the frame the reader was in at a tick (sockReader.frame),
	// when a tick first saw it, and the bytes read then (watchFrame).
	frameSeen  uint64
	frameSince time.Time
	frameRx    uint64
}

// newConn wraps an established stream.
func newConn(sd *sockDevice, p *peer, io linkIO, h hello, dialedByMe bool, local, remote string) *conn {
	rx, tx := io.Counters()
	return &conn{
		sd: sd, p: p, io: io, src: io, rx: rx, tx: tx, local: local, remote: remote,
		peerEID: p.eid, session: h.session, peerMax: h.maxMsg, dialedByMe: dialedByMe,
		answers:    newAnswerQueue(),
		ansOut:     newAnswerQueue(),
		imports:    make(map[uint32]chan urma.Code),
		doorbell:   make(chan struct{}, 1),
		done:       make(chan struct{}),
		writerDone: make(chan struct{}),
	}
}

// enqueue queues a frame; the caller then kicks (writes it directly) or
// rings (wakes the writer goroutine).
func (c *conn) enqueue(it *txItem) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return errConnDead
	}
	c.q = append(c.q, *it)
	return nil
}

// owe queues an answer for the peer; it never waits. A peer that makes
// this side owe more than maxAnswers sends without reading and breaks the
// protocol. h is nil for an import answer.
func (c *conn) owe(h *sendHeader, st urma.Status, rnrTimer uint8, req uint32, code urma.Code) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return errConnDead
	}
	if h != nil {
		c.answers.ack(h, st, rnrTimer)
	} else {
		c.answers.importResp(req, code)
	}
	if len(c.answers.list) > c.sd.maxAnswers {
		return protocolError{fmt.Errorf("peer sent more than %d messages without reading the answers", c.sd.maxAnswers)}
	}
	return nil
}

// hasQueued reports whether anything waits for the writer.
func (c *conn) hasQueued() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.q) > 0 || len(c.answers.list) > 0
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
	c.mu.Unlock()
	close(c.done)
	// Wake the reader and writer out of their blocking calls; the reader
	// closes the stream once both are out.
	c.io.Shutdown()
	p, sd := c.p, c.sd
	if brokeProtocol(err) {
		sd.log().Error(err, "closing connection: peer broke the protocol", "peer", p.eid.String())
	} else {
		sd.log().Info("connection closed", "peer", p.eid.String(), "reason", fmt.Sprint(err))
	}
	if sd.connDying != nil {
		sd.connDying(c)
	}
	// Fail the sends this connection carried, and only those: not the
	// ones out on a connection that replaced it, nor any posted once the
	// peer is free to redial. p.conn is still this dead connection unless
	// it was replaced, so that a send posted meanwhile fails too (enqueue
	// refuses it, and transmit fails this connection's oldest send, as
	// peerDown does).
	sd.dev.forEachJetty(func(j *jetty) { j.peerDown(p, c.gen) })
	p.mu.Lock()
	if p.conn == c {
		p.conn = nil
	}
	p.mu.Unlock()
	sd.mu.Lock()
	sd.dropConnLocked(c)
	sd.mu.Unlock()
}

func (c *conn) writeLoop() {
	defer close(c.writerDone)
	// On shared memory the writer waits for room without the write lock,
	// so that a poller can write meanwhile (see drive).
	waiter, _ := c.io.(interface{ WaitWritable() error })
	for {
		select {
		case <-c.doorbell:
		case <-c.done:
			return
		}
		for {
			c.wmu.Lock()
			stuck, err := c.drain(waiter == nil)
			c.wmu.Unlock()
			if err == nil && stuck {
				err = waiter.WaitWritable()
			}
			if err != nil {
				c.fail(fmt.Errorf("write: %w", err))
				return
			}
			if !stuck {
				break
			}
		}
	}
}

// kick writes what is queued from the calling goroutine, without blocking:
// it saves the writer goroutine's wakeup on the common path. Whatever it
// cannot write (lock taken, stream full) it leaves to the writer goroutine.
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
	if stuck || c.hasQueued() {
		c.ring()
	}
}

// drain writes queued frames until nothing is queued; c.wmu is held. Owed
// answers go first, and again between every chunk of a long batch, so a
// peer's sends complete while ours stream. Sends are encoded into iovecs
// (headers from the items, payloads straight from registered memory). A
// send's slot stays marked as being written until its bytes are in the
// stream. Without wait it returns stuck when the stream is full, leaving
// its progress in c.batch/c.iov for the next holder.
func (c *conn) drain(wait bool) (stuck bool, err error) {
	for {
		if len(c.iov) > 0 {
			c.iov, err = c.io.Writev(c.iov, wait)
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
		// At a frame boundary: answers first.
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			return false, errConnDead
		}
		if len(c.answers.list) > 0 {
			c.answers, c.ansOut = c.ansOut, c.answers
			c.mu.Unlock()
			c.ansBuf = c.ansOut.encode(c.ansBuf[:0])
			c.ansOut.reset()
			c.iovBuf = appendIov(c.iovBuf[:0], c.ansBuf)
			c.iov = c.iovBuf
			continue
		}
		if c.next < len(c.batch) {
			c.mu.Unlock()
			c.encode()
			continue
		}
		if c.batch != nil {
			clear(c.batch)
			c.spare = c.batch[:0]
			c.batch, c.next = nil, 0
		}
		if len(c.q) == 0 {
			c.mu.Unlock()
			return false, nil
		}
		c.batch, c.q, c.spare = c.q, c.spare[:0], nil
		c.cancels = 0
		c.mu.Unlock()
	}
}

// encode turns the next frames of c.batch into iovecs, up to half the
// kernel's iovec limit.
func (c *conn) encode() {
	iov := c.iovBuf[:0]
	c.refBuf = c.refBuf[:0]
	for ; c.next < len(c.batch) && len(iov) < iovMax/2; c.next++ {
		it := &c.batch[c.next]
		if it.j == nil {
			iov = appendIov(iov, it.ctl[:it.n])
			continue
		}
		var h sendHeader
		payload, inline, ok := it.j.beginWrite(it.seq, it.tx, c.peerMax, &h)
		if !ok {
			continue
		}
		if frame := c.encodeRef(&h, payload); frame != nil {
			iov = appendIov(iov, frame)
			c.started = append(c.started, c.next)
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

// encodeRef encodes the SEND h as a SEND_REF when its payload lies in
// segments the peer maps (shm fabric, pull.go); nil when it must be copied.
// The frames of one encode call live in c.refBuf until written.
func (c *conn) encodeRef(h *sendHeader, payload []sgeRef) []byte {
	s, ok := c.io.(*shmIO)
	if !ok || h.length < pullMin {
		return nil
	}
	refs, ok := s.refsFor(payload, c.sendRef[:0])
	c.sendRef = refs[:0]
	if !ok {
		return nil
	}
	const most = 4 + sendHdrLen + MaxSGE*sendRefLen
	if c.refBuf == nil {
		c.refBuf = make([]byte, 0, iovMax/2*most) // never grows: iovecs point into it
	}
	if cap(c.refBuf)-len(c.refBuf) < most {
		return nil
	}
	at := len(c.refBuf)
	frame := encodeSendRef(c.refBuf[at:at+most], h, refs)
	c.refBuf = c.refBuf[:at+len(frame)]
	s.pulls.Add(1)
	return frame
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

// errPeerNotReading and errPeerNotAnswering say that a live peer left what
// this side wrote unread, or the sends it read unanswered, for PeerTimeout
// (sockDevice.watchShm).
var (
	errPeerNotReading   = errors.New("peer stopped reading")
	errPeerNotAnswering = errors.New("peer stopped answering")
)

// waitsOnPeer says why this side waits on a quiet shm peer (the watchdog,
// watchShm), nil when it does not: the peer left bytes unread while this
// side has more to write, or it owes answers to sends or imports that it
// read (errPeerNotAnswering) or left unread (errPeerNotReading). When the
// turn is this side's (bytes of the peer's to read, frames not yet written
// into a ring the peer has emptied), a slow reader or writer here is not
// the peer's stall. A peer stopped in the middle of a frame is left to the
// reader's own bound (shmring.Stream waits for a frame's rest), which names it. The sends awaited are
// looked up before what waits to be written: a send transmitted before the
// lookup is queued by then, so it is either still to write (this side's
// turn) or written.
func (c *conn) waitsOnPeer(w shmring.Words, awaited func() map[*peer]bool) error {
	if w.ToRead > 0 || w.MidFrame {
		return nil
	}
	owed := awaited()[c.p]
	c.mu.Lock()
	owed = owed || len(c.imports) > 0
	writing := len(c.q) > 0 || len(c.answers.list) > 0
	c.mu.Unlock()
	if !writing {
		if c.wmu.TryLock() {
			writing = len(c.iov) > 0 || c.next < len(c.batch)
			c.wmu.Unlock()
		} else {
			writing = true // someone writes right now
		}
	}
	switch {
	case w.Unread && (writing || owed):
		return errPeerNotReading
	case writing:
		return nil
	case owed:
		return errPeerNotAnswering
	}
	return nil
}

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
func (p *streamPayload) skip() error           { return p.src.Discard(int(p.n)) }

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

// answerQueue is what a connection owes its peer, in order: ACKs, with the
// SUCCESS answers to consecutive SENDs of one sender jetty merged into one
// run, and import answers.
type answerQueue struct {
	list []answer
	runs map[uint32]int // sender jetty instance -> its open run in list
}

type answer struct {
	typ      byte // frameAck, frameAckRun or frameImportResp
	status   urma.Status
	rnrTimer uint8
	src, dst uint32
	tag      uint64
	count    uint32 // frameAckRun
	req      uint32 // frameImportResp
	code     urma.Code
}

func newAnswerQueue() answerQueue { return answerQueue{runs: make(map[uint32]int)} }

func (q *answerQueue) reset() {
	clear(q.list)
	q.list = q.list[:0]
	clear(q.runs)
}

// ack owes the answer st to the SEND h. A SUCCESS that follows the open
// run of its sender jetty extends it; any other answer closes the run, so
// the sender sees its answers in order.
func (q *answerQueue) ack(h *sendHeader, st urma.Status, rnrTimer uint8) {
	inst := uint32(h.tag >> 32)
	if st == urma.StatusSuccess {
		if i, ok := q.runs[inst]; ok {
			a := &q.list[i]
			if a.src == h.src && uint32(a.tag)+a.count == uint32(h.tag) && a.count < maxAckRun {
				a.typ = frameAckRun
				a.count++
				return
			}
		}
		q.runs[inst] = len(q.list)
		q.list = append(q.list, answer{typ: frameAck, status: st, src: h.src, dst: h.dst, tag: h.tag, count: 1})
		return
	}
	delete(q.runs, inst)
	q.list = append(q.list, answer{typ: frameAck, status: st, rnrTimer: rnrTimer, src: h.src, dst: h.dst, tag: h.tag, count: 1})
}

func (q *answerQueue) importResp(req uint32, code urma.Code) {
	q.list = append(q.list, answer{typ: frameImportResp, req: req, code: code})
}

// encode appends the frames of every answer to b.
func (q *answerQueue) encode(b []byte) []byte {
	var f [4 + maxCtlFrame]byte
	for i := range q.list {
		a := &q.list[i]
		switch a.typ {
		case frameAck:
			b = append(b, encodeAck(f[:], &ackFrame{status: a.status, rnrTimer: a.rnrTimer, src: a.src, dst: a.dst, tag: a.tag})...)
		case frameAckRun:
			b = append(b, encodeAckRun(f[:], &ackRunFrame{src: a.src, dst: a.dst, tag: a.tag, count: a.count})...)
		case frameImportResp:
			b = append(b, encodeImportResp(f[:], a.req, a.code)...)
		}
	}
	return b
}
