package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// connState is where a URMA connection is in its life.
type connState int

const (
	stateHandshake connState = iota
	stateEstablished
	stateClosed
)

// rxState is where one of a connection's receive buffers is.
type rxState uint8

const (
	rxPosted   rxState = iota // posted to the JFR
	rxQueued                  // holds a message not yet read
	rxApp                     // handed to the application by ReadBuffer
	rxReturned                // back in the pool (after teardown)
)

// urmaConn is a connection whose bytes move over URMA: SENDs from the
// registered pool into the peer's posted receives, credits returned as empty
// SEND_WITH_IMMs, the TCP connection kept only to notice the peer's end.
//
// Locks: readMu serializes readers, writeMu writers; mu guards the windows,
// the receive queue and the state; pollMu serializes completion handling.
// Order: readMu/writeMu -> mu; pollMu -> mu. Provider calls never call back,
// so they may be made under any of them.
type urmaConn struct {
	e       *engine
	res     *jettyRes
	pool    *bufferPool
	tcp     net.Conn
	role    string
	log     logr.Logger
	version int

	// Fixed once the peer's hello is applied.
	remoteJetty urma.RemoteJetty
	remoteSeg   urma.RemoteSegment
	remoteID    urma.JettyID
	peerBufSize int
	chunk       int // most bytes per SEND: min(our, the peer's buffer size)
	windowCap   int // both windows: min(sq, peer rq) - 3
	threshold   int // credits held back before returning them

	rx []*Buffer // receive buffers, by slot (the receive's user_ctx - 1)

	mu             sync.Mutex
	state          connState
	rxState        []rxState
	rxq            []int32 // ring of slots holding unread messages
	rxHead, rxLen  int
	sqWindow       int // sends we may post
	remoteRQWindow int // receives the peer has posted for us
	creditWRs      int // of the reserved credit WRs, free
	pendingCredits int // receives reposted, not yet returned to the peer
	peerGone       bool
	err            error // the connection is broken both ways
	sendErr        error // our sends fail; reads go on until the peer's EOF
	escalate       *time.Timer
	torn           bool
	stopped        bool
	creditWR       urma.SendWR
	recvWR         urma.RecvWR
	recvSGE        [1]urma.SGE

	stopCh    chan struct{} // closed when writing can no longer succeed
	closedCh  chan struct{} // closed by Close
	readable  chan struct{}
	writable  chan struct{}
	flushDone chan struct{}
	flushOnce sync.Once

	readMu, writeMu sync.Mutex
	rdl, wdl        *deadline
	sendWR          urma.SendWR // writeMu
	sendSGE         [1]urma.SGE

	pollMu     sync.Mutex
	cqes       []urma.Completion
	pollOff    bool
	pollerIdx  int
	evFile     *os.File
	evJFCs     [1]urma.JFC
	evDone     chan struct{}
	watchDone  chan struct{}
	started    bool // completion machinery and watcher running
	engineHeld bool

	closeOnce sync.Once

	bytesSent, bytesReceived atomic.Uint64
	msgsSent, msgsReceived   atomic.Uint64
	stalls                   atomic.Uint64
	counters                 metrics.DataCounters
}

var (
	_ Conn         = (*urmaConn)(nil)
	_ ZeroCopyConn = (*urmaConn)(nil)
)

// newURMAConn takes what a connection needs from the engine (a reference,
// a jetty, its receive buffers) and posts the receives. On failure it gives
// everything back and says why the connection must use TCP.
func newURMAConn(e *engine, tcp net.Conn, role string) (*urmaConn, *fallback) {
	if !e.ref() {
		return nil, fallbackf(ReasonResources, "the transport is shutting down")
	}
	res, fb := e.jetties.acquire()
	if fb != nil {
		e.unref()
		return nil, fb
	}
	rq := e.rqSize
	c := &urmaConn{
		e: e, res: res, pool: e.pool, tcp: tcp, role: role, engineHeld: true,
		log:      e.log.WithValues("local", tcp.LocalAddr().String(), "remote", tcp.RemoteAddr().String()),
		rx:       make([]*Buffer, rq),
		rxState:  make([]rxState, rq),
		rxq:      make([]int32, rq),
		stopCh:   make(chan struct{}),
		closedCh: make(chan struct{}),
		readable: make(chan struct{}, 1), writable: make(chan struct{}, 1),
		flushDone: make(chan struct{}),
		rdl:       newDeadline(), wdl: newDeadline(),
		cqes:   make([]urma.Completion, e.s.flags.CQEPollOnce),
		evDone: make(chan struct{}), watchDone: make(chan struct{}),
		counters: e.metrics.Data(metrics.ModeURMA),
	}
	if !c.pool.tryGetN(rq, c.rx) {
		free, _ := c.pool.stats()
		e.jetties.release(res)
		e.unref()
		return nil, fallbackf(ReasonResources, "buffer pool has %d free buffers, a connection needs %d for its receive queue (raise urma_buffer_count)", free, rq)
	}
	c.mu.Lock()
	var err error
	for i, b := range c.rx {
		b.recv, b.slot = c, int32(i)
		if err == nil {
			err = c.postRecvLocked(int32(i))
		}
	}
	c.mu.Unlock()
	if err != nil {
		c.releaseResources()
		return nil, fallbackf(ReasonResources, "post receive: %v", err)
	}
	return c, nil
}

// localHello describes our side for the peer.
func (c *urmaConn) localHello() handshake.Hello {
	id := c.res.jetty.ID()
	seg := c.e.helloSeg.ID()
	return handshake.Hello{
		BufferSize:    uint32(c.e.bufSize),
		RecvBufferCnt: uint32(c.e.rqSize - 1),
		JettyID:       id.ID,
		EID:           id.EID,
		UASID:         id.UASID,
		TPType:        handshake.TPCTP,
		SegEID:        seg.EID,
		SegUASID:      seg.UASID,
		SegVA:         seg.VA,
		SegLen:        seg.Len,
		SegTokenID:    seg.TokenID,
		Token:         uint32(c.e.token),
		HasToken:      !c.e.s.noToken,
		SQSize:        uint32(c.e.sqSize),
	}
}

// applyPeer sizes the windows from the peer's hello and imports its segment,
// then its jetty: in that order, or the first SEND fails on hardware.
func (c *urmaConn) applyPeer(ctx context.Context, h handshake.Hello) *fallback {
	peerRQ := int(h.RecvBufferCnt) + 1
	c.windowCap = min(c.e.sqSize, peerRQ) - creditWRs
	// Our receive window as the peer computes it; the peer's SQ depth is
	// only known from our extension, else assume the smallest legal one.
	peerWindow := min(c.e.rqSize-creditWRs, minPeerWindow)
	if h.SQSize != 0 {
		peerWindow = min(c.e.rqSize, int(h.SQSize)) - creditWRs
	}
	c.threshold = max(peerWindow, 1) / 2
	c.peerBufSize = int(h.BufferSize)
	c.chunk = min(c.e.bufSize, c.peerBufSize)
	c.sqWindow, c.remoteRQWindow, c.creditWRs = c.windowCap, c.windowCap, creditWRs

	token := urma.Token(0)
	if h.HasToken {
		token = urma.Token(h.Token)
	}
	seg, err := c.e.uctx.ImportSegment(urma.SegmentID{
		EID: h.SegEID, UASID: h.SegUASID, VA: h.SegVA, Len: h.SegLen, TokenID: h.SegTokenID,
	}, token)
	if err != nil {
		return fallbackf(ReasonImportFailed, "import the peer's segment: %v", err)
	}
	c.remoteSeg = seg
	c.remoteID = urma.JettyID{EID: h.EID, UASID: h.UASID, ID: h.JettyID}
	rj, err := c.e.uctx.ImportJetty(ctx, c.remoteID, urma.RM, token)
	if err != nil {
		return fallbackf(ReasonImportFailed, "import the peer's jetty %s/%d: %v", h.EID, h.JettyID, err)
	}
	c.remoteJetty = rj
	return nil
}

// establish starts the data plane: completion handling and the TCP watcher.
func (c *urmaConn) establish(version int) error {
	c.version = version
	if c.e.pollers != nil {
		c.pollerIdx = c.e.pollers.add(c)
		close(c.evDone)
	} else if err := c.startEvents(); err != nil {
		return err
	}
	c.started = true
	c.mu.Lock()
	c.state = stateEstablished
	c.mu.Unlock()
	go c.watchTCP()
	c.e.metrics.ConnOpened(metrics.ModeURMA, c.role)
	return nil
}

// startEvents puts the JFCE's fd into Go's poller. The fd is duplicated so
// that closing the *os.File (which stops the event loop) leaves the
// provider's fd alone.
func (c *urmaConn) startEvents() error {
	fd := c.res.jfce.Fd()
	if fd < 0 {
		return errors.New("completion channel has no file descriptor")
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("duplicate completion channel fd: %w", err)
	}
	f := os.NewFile(uintptr(dup), "urma-jfce")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("completion channel fd: %w", err)
	}
	if err := c.res.jfc.Rearm(false); err != nil {
		_ = f.Close()
		return fmt.Errorf("arm completion queue: %w", err)
	}
	c.evFile = f
	go c.eventLoop(rc)
	return nil
}

// eventLoop waits for completion events: wait, ack, poll, rearm, poll again
// (a completion can land between the poll and the rearm).
func (c *urmaConn) eventLoop(rc syscall.RawConn) {
	defer close(c.evDone)
	c.poll()
	var n int
	var werr error
	// One closure for the loop's life: a fresh one per wait would allocate.
	ready := func(uintptr) bool {
		n, werr = c.res.jfce.Wait(c.evJFCs[:], 0)
		return n > 0 || werr != nil
	}
	for {
		err := rc.Read(ready)
		if err != nil {
			return // the file was closed: teardown
		}
		if werr != nil {
			c.fail(fmt.Errorf("wait for completion events: %w", werr))
			return
		}
		c.res.jfc.Ack(uint32(n))
		c.poll()
		if err := c.res.jfc.Rearm(false); err != nil {
			c.fail(fmt.Errorf("rearm completion queue: %w", err))
			return
		}
		c.poll()
	}
}

// poll drains the completion queue and handles every record; it returns how
// many it handled.
func (c *urmaConn) poll() int {
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	if c.pollOff {
		return 0
	}
	total := 0
	for {
		n, err := c.res.jfc.Poll(c.cqes)
		if err != nil {
			c.pollOff = true
			c.fail(fmt.Errorf("poll completion queue: %w", err))
			return total
		}
		if n > 0 {
			c.handleBatch(c.cqes[:n])
		}
		total += n
		if n < len(c.cqes) {
			return total
		}
	}
}

// handleBatch applies completion records; pollMu is held.
func (c *urmaConn) handleBatch(cs []urma.Completion) {
	var perr, serr error
	readable, writable := false, false
	c.mu.Lock()
	for i := range cs {
		r, w, err := c.handleLocked(&cs[i])
		readable = readable || r
		writable = writable || w
		if err == nil {
			continue
		}
		// A type assertion, not errors.As: handleLocked returns
		// sendFailure unwrapped, and errors.As would allocate per record.
		if sf, ok := err.(sendFailure); ok { //nolint:errorlint // unwrapped by construction; errors.As would allocate
			if serr == nil {
				serr = sf.err
			}
		} else if perr == nil {
			perr = err
		}
	}
	c.mu.Unlock()
	if perr != nil {
		c.fail(perr)
	} else if serr != nil {
		c.failSend(serr)
	}
	if readable {
		notify(c.readable)
	}
	if writable {
		notify(c.writable)
	}
}

// handleLocked applies one completion record; c.mu is held. It reports
// whether readers or writers should look again, and any error that breaks
// the connection.
func (c *urmaConn) handleLocked(cr *urma.Completion) (readable, writable bool, err error) {
	if cr.Status != urma.StatusSuccess {
		return c.handleErrorLocked(cr)
	}
	if !cr.Recv {
		if cr.UserCtx == 0 { // a credit message went out
			if c.creditWRs >= creditWRs {
				return false, false, protocolErr("credit send completion beyond the %d reserved work requests", creditWRs)
			}
			c.creditWRs++
			c.maybeCreditLocked()
			return false, true, nil
		}
		idx := cr.UserCtx - 1
		if idx >= uint64(len(c.pool.bufs)) {
			return false, false, fmt.Errorf("send completion names buffer %d of %d", idx, len(c.pool.bufs))
		}
		c.pool.put(&c.pool.bufs[idx])
		if c.sqWindow >= c.windowCap {
			return false, false, protocolErr("send completion beyond the window of %d", c.windowCap)
		}
		c.sqWindow++
		return false, true, nil
	}

	slot := int(cr.UserCtx) - 1
	if slot < 0 || slot >= len(c.rx) || c.rxState[slot] != rxPosted {
		return false, false, fmt.Errorf("receive completion names slot %d, not a posted receive", slot)
	}
	if cr.Opcode == urma.CROpSendWithImm && cr.Imm > 0 {
		if cr.Imm > uint64(c.windowCap) || c.remoteRQWindow+int(cr.Imm) > c.windowCap {
			return false, false, protocolErr("peer returned %d credits with the remote receive window at %d of %d", cr.Imm, c.remoteRQWindow, c.windowCap)
		}
		c.remoteRQWindow += int(cr.Imm)
		writable = true
	} else if cr.CompletionLen == 0 {
		return false, false, protocolErr("zero-length message without a credit")
	}
	if int(cr.CompletionLen) > c.e.bufSize {
		return false, false, protocolErr("message of %d bytes exceeds the %d-byte receive buffer", cr.CompletionLen, c.e.bufSize)
	}
	if cr.CompletionLen == 0 {
		// A credit message used one of the reserved receives: repost it at
		// once; it is not a credit to return.
		if err := c.postRecvLocked(int32(slot)); err != nil {
			return false, writable, fmt.Errorf("repost receive: %w", err)
		}
		return false, writable, nil
	}
	b := c.rx[slot]
	b.off, b.n = 0, int(cr.CompletionLen)
	c.rxState[slot] = rxQueued
	c.rxq[(c.rxHead+c.rxLen)%len(c.rxq)] = int32(slot)
	c.rxLen++
	c.msgsReceived.Add(1)
	c.counters.MessagesReceived.Inc()
	return true, writable, nil
}

// sendFailure is a failed send completion: the peer's jetty is gone or
// unreachable. It breaks our sending direction only (see failSend).
type sendFailure struct{ err error }

func (s sendFailure) Error() string { return s.err.Error() }

// handleErrorLocked handles a failed completion: expected flushes while
// closing; a failed send breaks the sending direction (sendFailure); a
// failed receive breaks the connection.
func (c *urmaConn) handleErrorLocked(cr *urma.Completion) (bool, bool, error) {
	if !cr.Recv && cr.UserCtx != 0 && cr.Status != urma.StatusWRFlushErrDone {
		if idx := cr.UserCtx - 1; idx < uint64(len(c.pool.bufs)) {
			c.pool.put(&c.pool.bufs[idx])
		}
		if c.sqWindow < c.windowCap {
			c.sqWindow++
		}
	}
	if !cr.Recv && cr.UserCtx == 0 && cr.Status == urma.StatusWRFlushErr && c.creditWRs < creditWRs {
		c.creditWRs++
	}
	switch cr.Status {
	case urma.StatusWRFlushErrDone:
		c.flushOnce.Do(func() { close(c.flushDone) })
		return false, true, nil
	case urma.StatusWRFlushErr:
		if c.state == stateClosed {
			return false, true, nil
		}
	}
	if cr.Recv {
		return true, true, fmt.Errorf("URMA receive completed with status %s", cr.Status)
	}
	return true, true, sendFailure{fmt.Errorf("URMA send completed with status %s", cr.Status)}
}

// postRecvLocked (re)posts receive slot; c.mu is held.
func (c *urmaConn) postRecvLocked(slot int32) error {
	b := c.rx[slot]
	c.recvSGE[0] = c.pool.sge(b, 0, c.pool.size)
	c.recvWR = urma.RecvWR{UserCtx: uint64(slot) + 1, SGEs: c.recvSGE[:]}
	if err := c.res.jfr.PostRecv(&c.recvWR); err != nil {
		return err
	}
	c.rxState[slot] = rxPosted
	return nil
}

// consumeLocked reposts a slot the reader is done with and counts a credit
// to return; c.mu is held.
func (c *urmaConn) consumeLocked(slot int32) error {
	if err := c.postRecvLocked(slot); err != nil {
		return fmt.Errorf("repost receive: %w", err)
	}
	c.pendingCredits++
	c.maybeCreditLocked()
	return nil
}

// maybeCreditLocked returns the pending credits once they pass the
// threshold and a reserved credit WR is free; c.mu is held.
func (c *urmaConn) maybeCreditLocked() {
	if c.pendingCredits <= c.threshold || c.creditWRs == 0 || c.state == stateHandshake || c.stopped {
		return
	}
	n := c.pendingCredits
	c.creditWR = urma.SendWR{
		Opcode: urma.OpSendWithImm, Flags: urma.SendCompleteEnable | urma.SendSolicitedEnable,
		Target: c.remoteJetty, Imm: uint64(n),
	}
	if err := c.res.jetty.PostSend(&c.creditWR); err != nil {
		// The jetty is failing; the completion or the TCP watcher will say why.
		c.log.V(1).Info("posting credits failed", "credits", n, "error", err.Error())
		return
	}
	c.pendingCredits = 0
	c.creditWRs--
}

// recycleRecv takes back a receive buffer the application Released.
func (c *urmaConn) recycleRecv(b *Buffer) {
	slot := int(b.slot)
	c.mu.Lock()
	if slot < 0 || slot >= len(c.rx) || c.rx[slot] != b || c.rxState[slot] != rxApp {
		c.mu.Unlock()
		return
	}
	if c.torn {
		c.rxState[slot] = rxReturned
		c.mu.Unlock()
		c.pool.put(b)
		return
	}
	err := c.consumeLocked(int32(slot))
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
	}
}

// watchTCP waits for the peer's end on the TCP connection, which carries no
// data once URMA is up.
func (c *urmaConn) watchTCP() {
	defer close(c.watchDone)
	var b [1]byte
	n, err := c.tcp.Read(b[:])
	if n > 0 {
		c.fail(protocolErr("the peer sent data on the TCP connection after URMA was established"))
		return
	}
	c.mu.Lock()
	closing := c.state == stateClosed
	c.mu.Unlock()
	if closing {
		return
	}
	// Take the receives that completed before the peer closed, so that the
	// reader sees every byte before io.EOF.
	c.poll()
	c.mu.Lock()
	c.peerGone = true
	c.stopLocked()
	c.stopEscalationLocked()
	c.mu.Unlock()
	if err != nil && !errors.Is(err, io.EOF) {
		c.log.V(1).Info("TCP connection broke", "error", err.Error())
	}
	notify(c.readable)
	notify(c.writable)
}

// stopLocked closes stopCh once; c.mu is held.
func (c *urmaConn) stopLocked() {
	if !c.stopped {
		c.stopped = true
		close(c.stopCh)
	}
}

// fail breaks the connection with err (the first error wins) and closes the
// TCP connection so the peer notices.
func (c *urmaConn) fail(err error) {
	c.mu.Lock()
	if c.err != nil || c.state == stateClosed {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.stopLocked()
	c.stopEscalationLocked()
	c.mu.Unlock()
	if errors.Is(err, ErrProtocol) {
		c.e.metrics.ProtocolError()
	}
	c.log.Info("URMA connection failed", "error", err.Error())
	_ = c.tcp.Close()
	notify(c.readable)
	notify(c.writable)
}

// sendFailGrace is how long a connection whose sends fail waits for the
// peer's EOF before it counts as broken. A peer that closes gracefully
// closes its TCP connection before it destroys its jetty, so a credit sent
// in that instant fails although the session is ending cleanly.
const sendFailGrace = 2 * time.Second

// failSend breaks the sending direction: writes fail with err at once;
// reads go on, and end with io.EOF if the peer's TCP connection ends within
// sendFailGrace, else with err.
func (c *urmaConn) failSend(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.sendErr != nil || c.peerGone || c.state == stateClosed {
		return
	}
	c.sendErr = err
	c.stopLocked()
	c.escalate = time.AfterFunc(sendFailGrace, func() { c.fail(err) })
	notify(c.writable)
}

// stopEscalationLocked cancels failSend's timer; c.mu is held.
func (c *urmaConn) stopEscalationLocked() {
	if c.escalate != nil {
		c.escalate.Stop()
		c.escalate = nil
	}
}

// notify wakes the waiter on ch, if any, without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// readErrLocked is why a read with nothing buffered cannot wait; nil when it
// can. c.mu is held.
func (c *urmaConn) readErrLocked() error {
	switch {
	case c.err != nil:
		return c.err
	case c.peerGone:
		return io.EOF
	}
	return nil
}

// writeErrLocked is why a write cannot proceed; c.mu is held.
func (c *urmaConn) writeErrLocked() error {
	switch {
	case c.state == stateClosed:
		return errConnClosed
	case c.err != nil:
		return c.err
	case c.peerGone:
		return errPeerClosed
	case c.sendErr != nil:
		return c.sendErr
	}
	return nil
}

// Read reads from the received messages, waiting within the read deadline.
func (c *urmaConn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		c.mu.Lock()
		closed := c.state == stateClosed
		c.mu.Unlock()
		if closed {
			return 0, c.opErr("read", errConnClosed)
		}
		if c.rdl.passed() {
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		c.mu.Lock()
		if c.rxLen == 0 {
			err := c.readErrLocked()
			c.mu.Unlock()
			if errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			if err != nil {
				return 0, c.opErr("read", err)
			}
			if len(p) == 0 {
				return 0, nil
			}
			select {
			case <-c.readable:
			case <-c.closedCh:
			case <-c.rdl.done():
			}
			continue
		}
		head, avail := c.rxHead, c.rxLen
		c.mu.Unlock()
		// The writer side of the ring only appends beyond head+avail, and
		// only this reader consumes, so the messages can be copied unlocked.
		n, used := 0, 0
		for used < avail && n < len(p) {
			b := c.rx[c.rxq[(head+used)%len(c.rxq)]]
			k := copy(p[n:], b.data[b.off:b.n])
			n += k
			b.off += k
			if b.off < b.n {
				break
			}
			used++
		}
		var err error
		c.mu.Lock()
		for i := 0; i < used && err == nil; i++ {
			slot := c.rxq[c.rxHead]
			c.rxHead = (c.rxHead + 1) % len(c.rxq)
			c.rxLen--
			err = c.consumeLocked(slot)
		}
		c.mu.Unlock()
		if err != nil {
			c.fail(err)
		}
		c.countReceived(n)
		return n, nil
	}
}

// ReadBuffer returns the next received message, or the rest of one.
func (c *urmaConn) ReadBuffer() (*Buffer, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		c.mu.Lock()
		closed := c.state == stateClosed
		c.mu.Unlock()
		if closed {
			return nil, c.opErr("read", errConnClosed)
		}
		if c.rdl.passed() {
			return nil, c.opErr("read", os.ErrDeadlineExceeded)
		}
		c.mu.Lock()
		if c.rxLen > 0 {
			break // with c.mu held
		}
		err := c.readErrLocked()
		c.mu.Unlock()
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		if err != nil {
			return nil, c.opErr("read", err)
		}
		select {
		case <-c.readable:
		case <-c.closedCh:
		case <-c.rdl.done():
		}
	}
	slot := c.rxq[c.rxHead]
	b := c.rx[slot]
	f := c.e.s.flags
	if f.RecvZerocopy && b.n-b.off >= f.ZerocopyMinSize {
		c.rxHead = (c.rxHead + 1) % len(c.rxq)
		c.rxLen--
		c.rxState[slot] = rxApp
		c.mu.Unlock()
		b.held.Store(true)
		c.countReceived(b.n - b.off)
		return b, nil
	}
	c.mu.Unlock()
	// Small message (or zero-copy off): copy it out so the receive can be
	// reposted at once.
	nb, err := c.pool.get(c.closedCh, c.rdl.done(), c.e.s.failWhenPoolDry)
	if err != nil {
		return nil, c.opErr("read", err)
	}
	nb.n = copy(nb.data, b.data[b.off:b.n])
	c.mu.Lock()
	c.rxHead = (c.rxHead + 1) % len(c.rxq)
	c.rxLen--
	err = c.consumeLocked(slot)
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
	}
	c.countReceived(nb.n)
	return nb, nil
}

func (c *urmaConn) countReceived(n int) {
	if n > 0 {
		c.bytesReceived.Add(uint64(n))
		c.counters.BytesReceived.Add(float64(n))
	}
}

// reserveWindow takes one slot of both windows, waiting within the write
// deadline while either is empty.
func (c *urmaConn) reserveWindow() error {
	stalled := false
	for {
		if c.wdl.passed() {
			return os.ErrDeadlineExceeded
		}
		c.mu.Lock()
		if err := c.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return err
		}
		if c.sqWindow > 0 && c.remoteRQWindow > 0 {
			c.sqWindow--
			c.remoteRQWindow--
			c.mu.Unlock()
			return nil
		}
		if !stalled {
			stalled = true
			c.stalls.Add(1)
			if c.remoteRQWindow == 0 {
				c.counters.StallRemoteRQ.Inc()
			} else {
				c.counters.StallSQ.Inc()
			}
		}
		c.mu.Unlock()
		select {
		case <-c.writable:
		case <-c.stopCh:
		case <-c.wdl.done():
		}
	}
}

func (c *urmaConn) unreserveWindow() {
	c.mu.Lock()
	c.sqWindow++
	c.remoteRQWindow++
	c.mu.Unlock()
	notify(c.writable)
}

// takeBuffer takes a pool buffer for a send.
func (c *urmaConn) takeBuffer() (*Buffer, error) {
	b, err := c.pool.get(c.stopCh, c.wdl.done(), c.e.s.failWhenPoolDry)
	if err == nil {
		return b, nil
	}
	if errors.Is(err, errConnClosed) {
		// stopCh closed: say why.
		c.mu.Lock()
		if werr := c.writeErrLocked(); werr != nil {
			err = werr
		}
		c.mu.Unlock()
	}
	if errors.Is(err, ErrPoolExhausted) || errors.Is(err, os.ErrDeadlineExceeded) {
		c.counters.StallPool.Inc()
	}
	return nil, err
}

// postData posts n bytes of b as one SEND; writeMu is held and a window
// slot reserved. The buffer belongs to the provider until its completion.
func (c *urmaConn) postData(b *Buffer, n int) error {
	c.sendSGE[0] = c.pool.sge(b, 0, n)
	c.sendWR = urma.SendWR{
		Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: c.remoteJetty,
		UserCtx: uint64(b.idx) + 1, SGEs: c.sendSGE[:],
	}
	b.held.Store(false)
	if err := c.res.jetty.PostSend(&c.sendWR); err != nil {
		c.pool.put(b)
		c.unreserveWindow()
		err = fmt.Errorf("post send: %w", err)
		c.fail(err)
		return err
	}
	c.bytesSent.Add(uint64(n))
	c.msgsSent.Add(1)
	c.counters.BytesSent.Add(float64(n))
	c.counters.MessagesSent.Inc()
	return nil
}

// Write sends p as messages of at most one buffer each, waiting within the
// write deadline while a window or the pool is empty.
func (c *urmaConn) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if len(p) == 0 {
		c.mu.Lock()
		err := c.writeErrLocked()
		c.mu.Unlock()
		if err == nil && c.wdl.passed() {
			err = os.ErrDeadlineExceeded
		}
		if err != nil {
			return 0, c.opErr("write", err)
		}
		return 0, nil
	}
	n := 0
	for n < len(p) {
		if err := c.reserveWindow(); err != nil {
			return n, c.opErr("write", err)
		}
		b, err := c.takeBuffer()
		if err != nil {
			c.unreserveWindow()
			return n, c.opErr("write", err)
		}
		k := copy(b.data[:c.chunk], p[n:])
		if err := c.postData(b, k); err != nil {
			return n, c.opErr("write", err)
		}
		n += k
	}
	return n, nil
}

// AllocBuffer takes a pool buffer to fill and WriteBuffer.
func (c *urmaConn) AllocBuffer() (*Buffer, error) {
	b, err := c.takeBuffer()
	if err != nil {
		return nil, c.opErr("write", err)
	}
	return b, nil
}

// WriteBuffer sends the first n bytes of b as one message, without copying.
func (c *urmaConn) WriteBuffer(b *Buffer, n int) error {
	if err := checkWriteBuffer(b, n); err != nil {
		if b != nil && b.recv == nil {
			b.Release()
		}
		return c.opErr("write", err)
	}
	if b.pool != c.pool {
		b.Release()
		return c.opErr("write", errors.New("write buffer: the buffer belongs to another transport's pool"))
	}
	if n > c.chunk {
		b.Release()
		return c.opErr("write", fmt.Errorf("write buffer: %d bytes exceed the largest message of %d (the peer's buffer size)", n, c.chunk))
	}
	if n == 0 {
		b.Release()
		return nil
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.reserveWindow(); err != nil {
		b.Release()
		return c.opErr("write", err)
	}
	if err := c.postData(b, n); err != nil {
		return c.opErr("write", err)
	}
	return nil
}

// MaxMessage is the most bytes one WriteBuffer may send.
func (c *urmaConn) MaxMessage() int { return c.chunk }

// Close ends the connection gracefully: sends already posted complete (so
// the peer reads every byte written before Close, within CloseTimeout), then
// the TCP connection closes, which is the peer's io.EOF. Blocked reads and
// writes return at once.
func (c *urmaConn) Close() error {
	first := false
	c.closeOnce.Do(func() { first = true })
	if !first {
		return c.opErr("close", errConnClosed)
	}
	c.mu.Lock()
	c.state = stateClosed
	close(c.closedCh)
	c.stopLocked()
	c.stopEscalationLocked()
	c.mu.Unlock()
	notify(c.readable)
	notify(c.writable)

	c.writeMu.Lock() // no write is half-posted
	c.waitSendsDone()
	c.writeMu.Unlock()
	err := c.tcp.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil // fail() closed it already
	}
	<-c.watchDone
	c.teardown()
	c.rdl.stop()
	c.wdl.stop()
	c.e.metrics.ConnClosed(metrics.ModeURMA, c.role)
	return err
}

// waitSendsDone waits until every posted send, data or credit, completed,
// the connection broke, or CloseTimeout passed.
func (c *urmaConn) waitSendsDone() {
	timer := time.NewTimer(c.e.s.closeTimeout)
	defer timer.Stop()
	for {
		c.mu.Lock()
		outstanding := (c.windowCap - c.sqWindow) + (creditWRs - c.creditWRs)
		done := outstanding == 0 || c.err != nil || c.sendErr != nil || c.peerGone
		c.mu.Unlock()
		if done {
			return
		}
		select {
		case <-c.writable:
		case <-timer.C:
			c.log.Info("closing with sends still outstanding after the close timeout", "outstanding", outstanding, "timeout", c.e.s.closeTimeout)
			return
		}
	}
}

// teardown releases the connection's URMA resources: flush the jetty, stop
// completion handling, unimport the peer, give the jetty and the receive
// buffers back, and drop the engine reference.
func (c *urmaConn) teardown() {
	if c.started {
		if err := c.res.jetty.SetError(); err == nil {
			timer := time.NewTimer(flushTimeout)
			select {
			case <-c.flushDone:
			case <-timer.C:
				c.log.Info("jetty flush did not complete in time", "timeout", flushTimeout)
			}
			timer.Stop()
		}
		c.stopCompletions()
	}
	c.releaseResources()
}

// flushTimeout bounds the wait for a jetty's flush-done record.
const flushTimeout = 2 * time.Second

// stopCompletions stops the event loop or leaves the poller, then handles
// what is left in the queue.
func (c *urmaConn) stopCompletions() {
	if c.e.pollers != nil {
		c.e.pollers.remove(c, c.pollerIdx)
	} else if c.evFile != nil {
		_ = c.evFile.Close()
	}
	<-c.evDone
	c.poll()
	c.pollMu.Lock()
	c.pollOff = true
	c.pollMu.Unlock()
}

// releaseResources undoes the handshake's allocations; used by teardown and
// by a handshake that falls back or fails.
func (c *urmaConn) releaseResources() {
	var errs []error
	if c.remoteJetty != nil {
		errs = append(errs, c.remoteJetty.Close())
	}
	if c.remoteSeg != nil {
		errs = append(errs, c.remoteSeg.Close())
	}
	if err := errors.Join(errs...); err != nil {
		c.log.Error(err, "unimporting the peer")
	}
	c.e.jetties.release(c.res)
	c.readMu.Lock()
	c.mu.Lock()
	c.res = nil
	c.torn = true
	var back []*Buffer
	for i, st := range c.rxState {
		if st == rxPosted || st == rxQueued {
			c.rxState[i] = rxReturned
			back = append(back, c.rx[i])
		}
	}
	c.rxLen = 0
	c.mu.Unlock()
	c.readMu.Unlock()
	for _, b := range back {
		c.pool.put(b)
	}
	if c.engineHeld {
		c.engineHeld = false
		c.e.unref()
	}
}

func (c *urmaConn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "urma", Source: c.tcp.LocalAddr(), Addr: c.tcp.RemoteAddr(), Err: err}
}

func (c *urmaConn) LocalAddr() net.Addr  { return c.tcp.LocalAddr() }
func (c *urmaConn) RemoteAddr() net.Addr { return c.tcp.RemoteAddr() }

func (c *urmaConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *urmaConn) SetReadDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", errConnClosed)
	}
	c.rdl.set(t)
	return nil
}

func (c *urmaConn) SetWriteDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", errConnClosed)
	}
	c.wdl.set(t)
	return nil
}

func (c *urmaConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == stateClosed
}

func (c *urmaConn) Mode() Mode             { return ModeURMA }
func (c *urmaConn) FallbackReason() string { return "" }

// Debug reports the connection's state: windows, jetties, counters.
func (c *urmaConn) Debug() DebugInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	state := "ESTABLISHED"
	switch {
	case c.state == stateHandshake:
		state = "HANDSHAKE"
	case c.state == stateClosed:
		state = "CLOSED"
	case c.err != nil:
		state = "FAILED: " + c.err.Error()
	case c.peerGone:
		state = "PEER_CLOSED"
	case c.sendErr != nil:
		state = "SEND_FAILED: " + c.sendErr.Error()
	}
	d := DebugInfo{
		Mode: ModeURMA, Role: c.role, State: state, HandshakeVersion: c.version,
		LocalAddr: c.tcp.LocalAddr().String(), RemoteAddr: c.tcp.RemoteAddr().String(),
		Device: c.e.dev.Name, RemoteJetty: c.remoteID,
		SQWindow: c.sqWindow, RemoteRQWindow: c.remoteRQWindow, WindowCapacity: c.windowCap,
		CreditThreshold: c.threshold, PendingCredits: c.pendingCredits, CreditWRsFree: c.creditWRs,
		BufferedMessages: c.rxLen, RemoteBufferSize: c.peerBufSize,
		BytesSent: c.bytesSent.Load(), BytesReceived: c.bytesReceived.Load(),
		MessagesSent: c.msgsSent.Load(), MessagesReceived: c.msgsReceived.Load(),
		WindowStalls: c.stalls.Load(),
	}
	if c.res != nil {
		d.LocalJetty = c.res.jetty.ID()
	}
	return d
}
