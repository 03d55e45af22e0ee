package transport

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// urmaConn is a connection whose bytes move over URMA: SENDs from the
// registered pool into the peer's posted receives, credits returned as empty
// SEND_WITH_IMMs, the TCP connection kept only to notice the peer's end.
//
// Its life is one state (conn_lifecycle.go), changed only by the named
// transitions there, under mu. mu also guards the windows and the receive
// ring. The other three locks carry no state of their own: readMu
// serializes readers, writeMu writers, pollMu completion handling.
// Order: readMu -> pollMu -> mu; writeMu -> mu. Provider calls never call
// back, so they may be made under any of them.
type urmaConn struct {
	e       *engine
	res     *jettyRes
	spec    jettySpec   // what res is: send queue depth, token or none
	pool    *bufferPool // the engine's: sends without ownSend, copies of small receives
	ownSend *bufferPool // the connection's own send buffers (sendbuffers.go), or nil
	rxPool  *bufferPool // where the receive buffers are: the engine pool or, with recv.own, a region of the connection's own
	recv    recvPlan    // the receives' size and count (bufferplan.go), as the hello says
	tcp     net.Conn
	role    string
	log     logr.Logger
	version int
	// limitMark is the engine's connLimitRefusals when the handshake
	// began (peerDeclined).
	limitMark uint64

	// Fixed once the peer's hello is applied.
	route       peerRoute // how the peer's device is reached (routeTo)
	remoteJetty urma.RemoteJetty
	remoteSeg   urma.RemoteSegment
	remoteID    urma.JettyID
	peerBufSize int
	peerMarks   bool // the peer ends with a close marker (its hello says so)
	chunk       int  // most bytes per SEND: min(our, the peer's buffer size)
	windowCap   int  // both windows: min(sq, peer rq) - 3
	threshold   int  // credits held back before returning them

	rx []*Buffer // receive buffers, by slot (the receive's user_ctx - 1)

	mu             sync.Mutex
	state          atomic.Uint32 // a connState; written only under mu
	cause          error         // why the state is stateSendFailed or stateFailed
	escalate       *time.Timer   // stateSendFailed: turns it into stateFailed
	rxState        []rxState
	rxq            []int32 // ring of slots holding unread messages
	rxHead, rxLen  int
	sqWindow       int // sends we may post
	remoteRQWindow int // receives the peer has posted for us
	creditWRs      int // of the reserved credit WRs, free
	pendingCredits int // receives reposted, not yet returned to the peer
	foreignDropped int // messages dropped for their source (dropForeignLocked)
	creditWR       urma.SendWR
	direct         directPlacement // conn_placement.go
	recvWR         urma.RecvWR
	recvSGE        [1]urma.SGE

	// Channels the transitions close, for the goroutines waiting on them.
	stopCh   chan struct{} // writing can no longer succeed (left stateOpen)
	closedCh chan struct{} // Close was called (stateClosing)
	peerDone chan struct{} // the peer ended cleanly (statePeerClosed)
	readable chan struct{}
	writable chan struct{}

	readMu, writeMu sync.Mutex
	rdl, wdl        *deadline
	sendWR          urma.SendWR // writeMu
	sendSGE         [1]urma.SGE

	pollMu    sync.Mutex
	cqes      []urma.Completion
	flushDone chan struct{} // closed under pollMu when the flush-done record arrives
	pollerIdx int
	evFile    *os.File
	evJFCs    [1]urma.JFC
	evDone    chan struct{}
	watchDone chan struct{}

	bytesSent, bytesReceived atomic.Uint64
	msgsSent, msgsReceived   atomic.Uint64
	stalls                   atomic.Uint64
	spinReads, spinMisses    atomic.Uint64
	// readSleeps counts reads that went to sleep for a message, past any
	// spin: a test knows from it that a read is in its wait, when what it
	// did (or did not) spin is settled.
	readSleeps atomic.Uint64
	counters   metrics.DataCounters
}

var (
	_ Conn         = (*urmaConn)(nil)
	_ ZeroCopyConn = (*urmaConn)(nil)
)

// newURMAConn takes what a connection needs from the engine (a reference,
// a jetty of spec with its token and hello page, its receive buffers) and
// posts the receives. On failure it gives everything back and says why
// the connection must use TCP.
func newURMAConn(e *engine, tcp net.Conn, role string, spec jettySpec) (*urmaConn, *fallback) {
	if !e.ref() {
		return nil, fallbackf(ReasonResources, "the transport is shutting down")
	}
	res, fb := e.jetties.acquire(spec)
	if fb != nil {
		e.unref()
		return nil, fb
	}
	plan, rxPool := spec.recv, e.pool
	if plan.own {
		own, err := e.newRecvRegion(plan)
		if err != nil {
			// Not fatal: the pool's receives, as the flags size them.
			e.log.Info("receiving into the shared pool", "error", err.Error())
			plan = e.poolRecv
		} else {
			rxPool = own
		}
	}
	rq := plan.count
	rx := make([]*Buffer, rq)
	if !rxPool.tryGetN(rq, rx) {
		free, _ := rxPool.stats()
		e.jetties.release(res)
		e.unref()
		return nil, fallbackf(ReasonResources, "buffer pool has %d free buffers, a connection needs %d for its receive queue (raise urma_buffer_count)", free, rq)
	}
	c := &urmaConn{
		e: e, res: res, spec: spec, pool: e.pool, rxPool: rxPool, recv: plan, tcp: tcp, role: role, limitMark: e.connLimitRefusals(),
		log:      e.log.WithValues("local", tcp.LocalAddr().String(), "remote", tcp.RemoteAddr().String()),
		rx:       rx,
		rxState:  make([]rxState, rq), // rxSpare: the connection's, not posted yet
		rxq:      make([]int32, rq),
		stopCh:   make(chan struct{}),
		closedCh: make(chan struct{}),
		peerDone: make(chan struct{}),
		readable: make(chan struct{}, 1), writable: make(chan struct{}, 1),
		flushDone: make(chan struct{}),
		rdl:       newDeadline(), wdl: newDeadline(),
		cqes:   make([]urma.Completion, e.s.flags.CQEPollOnce),
		evDone: make(chan struct{}), watchDone: make(chan struct{}),
		counters: e.metrics.Data(metrics.ModeURMA),
	}
	for i, b := range rx {
		b.recv, b.slot = c, int32(i)
	}
	c.direct = newDirectPlacement(res.jfr, e.s.flags.ReadDirect, e.s.flags.ZerocopyMinSize, rq)
	c.mu.Lock()
	var err error
	for i := range rx {
		if err = c.postRecvLocked(int32(i)); err != nil {
			break
		}
	}
	c.mu.Unlock()
	if err != nil {
		c.release()
		return nil, fallbackf(ReasonResources, "post receive: %v", err)
	}
	return c, nil
}

// localHello describes our side for the peer: the connection's jetty, its
// hello page and its token. The EID is the context's, as brpc advertises
// it: on a bonding device the jetty's own is a port's. A connection routed
// over the socket fabric of a device on both fabrics (a server's, which
// routes before it answers) names the device's socket EID instead, the one
// the peer reaches; every hello of such a device offers that EID.
func (c *urmaConn) localHello() handshake.Hello {
	id := c.res.jetty.ID()
	seg := c.res.hello.seg.ID()
	h := handshake.Hello{
		BufferSize:    uint32(c.recv.size),
		RecvBufferCnt: uint32(c.recv.count - 1),
		JettyID:       id.ID,
		EID:           c.e.uctx.EID(),
		UASID:         id.UASID,
		TPType:        handshake.TPCTP, // what brpc sends
		SegEID:        seg.EID,
		SegUASID:      seg.UASID,
		SegVA:         seg.VA,
		SegLen:        seg.Len,
		SegTokenID:    seg.TokenID,
		SQSize:        uint32(c.spec.sq),
		CloseMarker:   true,
		BootID:        c.e.fabric.bootID,
		SocketEID:     c.e.fabric.socketEID,
	}
	if c.route.fabric == FabricSocket && !c.e.fabric.socketEID.IsZero() {
		h.EID, h.SegEID = c.e.fabric.socketEID, c.e.fabric.socketEID
	}
	if !c.spec.tokenless {
		h.Token, h.HasToken = uint32(c.res.token), true
	}
	return h
}

// fabricName names the fabric the connection runs on, for Debug and
// metrics: its route's, else the engine's.
func (c *urmaConn) fabricName() string {
	if c.route.fabric != "" {
		return c.route.fabric
	}
	return c.e.fabricName()
}

// brpcCreditThreshold is when a brpc peer with a receive queue of depth rq
// returns credits: once more than (rq - 3) / 2 are pending (its SendAck).
func brpcCreditThreshold(rq int) int { return (rq - creditWRs) / 2 }

// brpcMinSQ is the smallest send queue depth whose window toward a brpc
// peer with a receive queue of depth rq exceeds that threshold: with a
// window at or below it, the peer never returns a credit and the writer
// stalls forever.
func brpcMinSQ(rq int) int { return brpcCreditThreshold(rq) + 1 + creditWRs }

// applyPeer sizes the windows from the peer's hello and imports its segment,
// then its jetty: in that order, or the first SEND fails on hardware.
func (c *urmaConn) applyPeer(ctx context.Context, h handshake.Hello) *fallback {
	route, fb := c.e.routeTo(h)
	if fb != nil {
		return fb
	}
	c.route = route
	if !route.eid.IsZero() {
		// The peer's device, at the EID that reaches it from here.
		h.EID, h.SegEID = route.eid, route.eid
	}
	peerRQ := int(h.RecvBufferCnt) + 1
	c.windowCap = min(c.spec.sq, peerRQ) - creditWRs
	if !h.HasExtension() && c.windowCap <= brpcCreditThreshold(peerRQ) {
		return fallbackf(ReasonWindowTooSmall,
			"the peer (a brpc peer: its hello has no extension) returns credits only when more than (its rq %d - 3) / 2 = %d are pending, but our send window is min(sq %d, %d) - 3 = %d: raise urma_sq_size to at least %d",
			peerRQ, brpcCreditThreshold(peerRQ), c.spec.sq, peerRQ, c.windowCap, brpcMinSQ(peerRQ))
	}
	// Our receive window as the peer computes it; the peer's SQ depth is
	// only known from our extension, else assume the smallest legal one.
	peerWindow := min(c.recv.count-creditWRs, minPeerWindow)
	if h.SQSize != 0 {
		peerWindow = min(c.recv.count, int(h.SQSize)) - creditWRs
	}
	c.threshold = max(peerWindow, 1) / 2
	c.peerBufSize = int(h.BufferSize)
	c.peerMarks = h.CloseMarker
	c.sqWindow, c.remoteRQWindow, c.creditWRs = c.windowCap, c.windowCap, creditWRs
	c.setUpSends()

	token := urma.Token(0)
	if h.HasToken {
		token = urma.Token(h.Token)
	}
	seg, err := c.e.uctx.ImportSegment(urma.SegmentID{
		EID: h.SegEID, UASID: h.SegUASID, VA: h.SegVA, Len: h.SegLen, TokenID: h.SegTokenID,
	}, token)
	if err != nil {
		return c.importFailed(fmt.Errorf("import the peer's segment: %w", err))
	}
	c.remoteSeg = seg
	c.remoteID = urma.JettyID{EID: h.EID, UASID: h.UASID, ID: h.JettyID}
	if c.direct.p != nil {
		// A reader's slice takes the peer's messages only: another's
		// passes it by and is dropped when its receive completes.
		c.direct.p.From(c.remoteID)
	}
	rj, err := c.e.uctx.ImportJetty(ctx, c.remoteID, urma.RM, token)
	if err != nil {
		return c.importFailed(fmt.Errorf("import the peer's jetty %s/%d: %w", h.EID, h.JettyID, err))
	}
	c.remoteJetty = rj
	return nil
}

// notify wakes the waiter on ch, if any, without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
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

// isClosed reports whether Close was called.
func (c *urmaConn) isClosed() bool {
	s := c.stateNow()
	return s == stateClosing || s == stateReleased
}

func (c *urmaConn) Mode() Mode             { return ModeURMA }
func (c *urmaConn) FallbackReason() string { return "" }

// Debug reports the connection's state: windows, jetties, counters.
func (c *urmaConn) Debug() DebugInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stateNow()
	state := s.String()
	if s == stateFailed || s == stateSendFailed {
		state += ": " + c.cause.Error()
	}
	d := DebugInfo{
		Mode: ModeURMA, Role: c.role, State: state, HandshakeVersion: c.version,
		LocalAddr: c.tcp.LocalAddr().String(), RemoteAddr: c.tcp.RemoteAddr().String(),
		Provider: c.e.provName, Device: c.e.dev.Name, Fabric: c.fabricName(), RemoteJetty: c.remoteID,
		SQWindow: c.sqWindow, RemoteRQWindow: c.remoteRQWindow, WindowCapacity: c.windowCap,
		CreditThreshold: c.threshold, PendingCredits: c.pendingCredits, CreditWRsFree: c.creditWRs,
		BufferedMessages: c.rxLen, RemoteBufferSize: c.peerBufSize,
		BufferSize: c.recv.size, Receives: c.recv.count, MaxMessage: c.chunk,
		OwnSendBuffers: c.ownSendCount(),
		BytesSent:      c.bytesSent.Load(), BytesReceived: c.bytesReceived.Load(),
		MessagesSent: c.msgsSent.Load(), MessagesReceived: c.msgsReceived.Load(),
		WindowStalls: c.stalls.Load(), SpinReads: c.spinReads.Load(), SpinMisses: c.spinMisses.Load(),
		DirectReads: c.direct.placedReads,
	}
	if c.res != nil {
		d.LocalJetty = c.res.jetty.ID()
	}
	return d
}
