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
	sd            *fabricSide
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
func newConn(sd *fabricSide, p *peer, io linkIO, h hello, dialedByMe bool, local, remote string) *conn {
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
