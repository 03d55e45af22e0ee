package transport

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// closeMarkerImm is the immediate of the close marker, a zero-length
// SEND_WITH_IMM: bit 31, far above any credit count (credits never exceed
// a window of at most 4093), so it cannot be mistaken for one.
const closeMarkerImm = 1 << 31

// connState is where a URMA connection is in its life. It changes only
// through the transitions below, each under c.mu:
//
//	handshake --establish--> open
//	handshake --release----> released           (fallback or failed handshake)
//	open --failSend--> sendFailed --escalate--> failed
//	open, sendFailed --peerClose--> peerClosed
//	open, sendFailed, peerClosed --fail--> failed
//	any but closing, released --Close--> closing --release--> released
type connState uint32

const (
	// stateHandshake: the jetty and receive buffers are taken and the
	// receives posted; the peer's hello is being applied.
	stateHandshake connState = iota
	// stateOpen: data flows both ways.
	stateOpen
	// stateSendFailed: our sends fail (cause); reads go on until the peer's
	// end, or until sendFailGrace passes (then stateFailed).
	stateSendFailed
	// statePeerClosed: the peer ended the connection: reads drain what
	// arrived, then io.EOF; writes fail with EPIPE.
	statePeerClosed
	// stateFailed: broken both ways; reads (once drained) and writes return
	// cause.
	stateFailed
	// stateClosing: Close was called; reads and writes return net.ErrClosed
	// while posted sends drain and the jetty is flushed.
	stateClosing
	// stateReleased: the jetty is destroyed and the receive buffers are
	// back in the pool; a buffer the application still holds goes back when
	// it is released.
	stateReleased
)

var connStateNames = [...]string{"HANDSHAKE", "ESTABLISHED", "SEND_FAILED", "PEER_CLOSED", "FAILED", "CLOSING", "CLOSED"}

func (s connState) String() string { return connStateNames[s] }

// nextStates lists, for each state, the states a transition may lead to.
var nextStates = [...][]connState{
	stateHandshake:  {stateOpen, stateReleased},
	stateOpen:       {stateSendFailed, statePeerClosed, stateFailed, stateClosing},
	stateSendFailed: {statePeerClosed, stateFailed, stateClosing},
	statePeerClosed: {stateFailed, stateClosing},
	stateFailed:     {stateClosing},
	stateClosing:    {stateReleased},
	stateReleased:   nil,
}

// stateNow is the current state. Under c.mu it is exact; without, it is a
// snapshot (used by poll, which needs only "released or not" and holds
// pollMu, which the release transition also holds).
func (c *urmaConn) stateNow() connState { return connState(c.state.Load()) }

// moveLocked makes the transition to next if the current state allows it,
// and reports whether it did; c.mu is held. It performs what entering and
// leaving a state implies, so no caller has to remember it.
func (c *urmaConn) moveLocked(next connState) bool {
	cur := c.stateNow()
	allowed := false
	for _, s := range nextStates[cur] {
		allowed = allowed || s == next
	}
	if !allowed {
		return false
	}
	c.state.Store(uint32(next))
	if cur == stateSendFailed && c.escalate != nil {
		c.escalate.Stop()
		c.escalate = nil
	}
	if cur == stateOpen || (cur == stateHandshake && next == stateReleased) {
		close(c.stopCh)
	}
	if next == stateClosing {
		close(c.closedCh)
	}
	if next == statePeerClosed {
		close(c.peerDone)
	}
	return true
}

// wake tells blocked readers and writers to look at the state again.
func (c *urmaConn) wake() {
	notify(c.readable)
	notify(c.writable)
}

// establish starts the data plane's completion handling and makes the
// transition handshake -> open; the TCP watcher starts after the handshake
// (startWatching).
func (c *urmaConn) establish(version int) error {
	c.version = version
	if c.e.pollers != nil {
		c.pollerIdx = c.e.pollers.add(c)
		close(c.evDone)
	} else if err := c.startEvents(); err != nil {
		return err
	}
	c.mu.Lock()
	c.moveLocked(stateOpen)
	c.mu.Unlock()
	c.e.metrics.ConnOpened(metrics.ModeURMA, c.role)
	c.e.metrics.FabricConn(c.fabricName(), c.role)
	if c.spec.tokenless {
		c.e.metrics.TokenlessConn(c.role)
	}
	return nil
}

// startWatching starts the TCP watcher of conn, if it is a URMA
// connection. The handshakes call it once boundHandshake's stop has cleared
// the TCP deadline: a watcher reading before could end with the
// handshake's deadline, or its context's end, and fail a connection that
// is up as aborted by the peer.
func startWatching(conn Conn) {
	if c, ok := conn.(*urmaConn); ok {
		go c.watchTCP()
	}
}

// watchTCP waits for the peer's end on the TCP connection, which carries no
// data once URMA is up, and tells a clean end from a failure:
//   - a byte on it is a protocol error;
//   - an error (RST, keepalive timeout) fails the connection: the peer
//     aborted it, or the network is gone, and a reader must not take the
//     truncated stream for a complete one;
//   - EOF from a peer that ends with a close marker is clean only if the
//     marker came; without it the peer vanished (its process died) and
//     the connection fails;
//   - EOF from a peer without close markers (brpc) is its clean end.
func (c *urmaConn) watchTCP() {
	defer close(c.watchDone)
	var b [1]byte
	n, err := c.tcp.Read(b[:])
	if n > 0 {
		c.fail(protocolErr("the peer sent data on the TCP connection after URMA was established"))
		return
	}
	if c.isClosed() {
		return // our own Close ended it
	}
	// Take the receives that completed before the end, so that the reader
	// sees every byte before the end is reported.
	c.poll()
	switch {
	case err != nil && !errors.Is(err, io.EOF):
		c.fail(fmt.Errorf("%w: %w", errPeerAborted, err))
	case !c.peerMarks:
		c.peerClose()
	case !c.awaitCloseMarker():
		c.fail(errPeerVanished)
	}
}

// closeMarkerGrace is how long after the peer's FIN its close marker may
// still be on its way: the peer closes TCP once its marker's send
// completed, and a device may write the receiver's completion a little
// after the sender's.
const closeMarkerGrace = 200 * time.Millisecond

// awaitCloseMarker waits, within closeMarkerGrace, for the peer's close
// marker; it reports whether the connection ended cleanly (or is closing).
func (c *urmaConn) awaitCloseMarker() bool {
	timer := time.NewTimer(closeMarkerGrace)
	defer timer.Stop()
	select {
	case <-c.peerDone:
		return true
	case <-c.closedCh:
		return true
	case <-timer.C:
	}
	c.poll()
	return c.stateNow() == statePeerClosed
}

// peerClose makes the transition to peerClosed: the peer ended cleanly.
func (c *urmaConn) peerClose() {
	c.mu.Lock()
	moved := c.moveLocked(statePeerClosed)
	c.mu.Unlock()
	if moved {
		c.wake()
	}
}

// fail makes the transition to failed with err (the first error wins) and
// aborts the TCP connection (RST), so the peer's reader gets an error, never
// a clean end of stream.
func (c *urmaConn) fail(err error) {
	c.mu.Lock()
	moved := c.moveLocked(stateFailed)
	if moved {
		c.cause = err
	}
	c.mu.Unlock()
	if !moved {
		return
	}
	if errors.Is(err, ErrProtocol) {
		c.e.metrics.ProtocolError()
	}
	c.log.Info("URMA connection failed", "error", err.Error())
	abortTCP(c.tcp)
	c.wake()
}

// abortTCP closes tcp with a reset instead of a FIN, as TCP does when it is
// closed with unread data: the peer's read fails with ECONNRESET.
func abortTCP(tcp net.Conn) {
	if l, ok := tcp.(interface{ SetLinger(sec int) error }); ok {
		_ = l.SetLinger(0)
	}
	_ = tcp.Close()
}

// sendFailGrace is how long a connection whose sends fail waits for the
// peer's EOF before it counts as broken. A peer that closes gracefully
// closes its TCP connection before it destroys its jetty, so a credit sent
// in that instant fails although the session is ending cleanly.
const sendFailGrace = 2 * time.Second

// failSend makes the transition to sendFailed: writes fail with err at
// once; reads go on, and end with io.EOF if the peer's TCP connection ends
// within sendFailGrace, else with err.
func (c *urmaConn) failSend(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.moveLocked(stateSendFailed) {
		return
	}
	c.cause = err
	c.escalate = time.AfterFunc(sendFailGrace, func() { c.fail(err) })
	notify(c.writable)
}

// Close ends the connection gracefully: sends already posted complete (so
// the peer reads every byte written before Close), a peer that understands
// it gets the close marker after them, then the TCP connection closes,
// which is the peer's io.EOF. CloseTimeout bounds the two waits together.
// The jetty's flush follows outside it (within flushTimeout, at once on a
// working provider): the buffers of sends still posted come back only
// through their flushed completions, so cutting it short would lose them
// from the pool. Blocked reads and writes return at once.
func (c *urmaConn) Close() error { return c.close(true) }

// abort ends a connection no Accept took (Listener.Close): the application
// wrote nothing on it, so there is nothing to drain and no close marker to
// wait for, and a peer that takes no message must not hold the listener's
// Close up for CloseTimeout. The peer gets a reset, as from a kernel
// listen queue, and everything is given back at once.
func (c *urmaConn) abort() { _ = c.close(false) }

// close is Close, graceful or (abort) not.
func (c *urmaConn) close(graceful bool) error {
	c.mu.Lock()
	was := c.stateNow()
	moved := c.moveLocked(stateClosing)
	c.mu.Unlock()
	if !moved {
		return c.opErr("close", errConnClosed)
	}
	c.wake()

	// No write is half-posted past here, whatever the state was: a writer
	// that reserved its window before the connection failed still posts to
	// the jetty, which release destroys.
	c.writeMu.Lock()
	if was == stateOpen && graceful {
		// One deadline for both waits: a peer that never answers holds
		// Close up for CloseTimeout, not once per wait.
		deadline := time.Now().Add(c.e.s.closeTimeout)
		c.waitSendsDone(deadline)
		if c.peerMarks && c.sendCloseMarker() {
			c.waitSendsDone(deadline)
		}
	}
	c.writeMu.Unlock()
	var err error
	if graceful {
		err = c.tcp.Close()
		if errors.Is(err, net.ErrClosed) {
			err = nil // fail() closed it already
		}
	} else {
		abortTCP(c.tcp)
	}
	<-c.watchDone
	c.flush()
	c.stopCompletions()
	c.release()
	c.rdl.stop()
	c.wdl.stop()
	c.e.metrics.ConnClosed(metrics.ModeURMA, c.role)
	return err
}

// waitSendsDone waits until every posted send, data or credit, completed or
// Close's deadline passed. A failed send completes too, so a broken peer
// does not hold Close up.
func (c *urmaConn) waitSendsDone(deadline time.Time) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		c.mu.Lock()
		outstanding := (c.windowCap - c.sqWindow) + (creditWRs - c.creditWRs)
		c.mu.Unlock()
		if outstanding == 0 {
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

// sendCloseMarker posts the close marker, on a reserved credit work
// request; it reports whether it did. Without a free one (sends still
// outstanding after CloseTimeout) the peer sees no marker, and rightly
// an error: bytes may have been lost. Posted after sends still
// outstanding, it reaches the peer only if they do (RM keeps the order).
func (c *urmaConn) sendCloseMarker() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.creditWRs == 0 {
		return false
	}
	c.creditWR = urma.SendWR{
		Opcode: urma.OpSendWithImm, Flags: urma.SendCompleteEnable | urma.SendSolicitedEnable,
		Target: c.remoteJetty, Imm: closeMarkerImm,
	}
	if err := c.res.jetty.PostSend(&c.creditWR); err != nil {
		c.log.V(1).Info("posting the close marker failed", "error", err.Error())
		return false
	}
	c.creditWRs--
	return true
}

// flushTimeout bounds the wait for a jetty's flush-done record.
const flushTimeout = 2 * time.Second

// flush moves the jetty to ERROR, so every send still posted completes
// (flushed), and waits for the flush-done record.
func (c *urmaConn) flush() {
	if err := c.res.jetty.SetError(); err != nil {
		return
	}
	timer := time.NewTimer(flushTimeout)
	defer timer.Stop()
	select {
	case <-c.flushDone:
	case <-timer.C:
		c.log.Info("jetty flush did not complete in time", "timeout", flushTimeout)
	}
}

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
}

// release makes the transition to released (from handshake, when the
// connection falls back or its handshake fails, or from closing) and gives
// everything back: the imported peer, the jetty, the receive buffers not
// held by the application, the engine reference. The transition comes
// first, under every lock that could touch the receive queue, so that a
// Buffer.Release racing with it either reposts to a live JFR or returns
// the buffer to the pool: never both, never neither.
func (c *urmaConn) release() {
	c.readMu.Lock() // no reader is copying out of a receive buffer
	c.pollMu.Lock() // no completion is being handled, and none will be
	c.mu.Lock()
	moved := c.moveLocked(stateReleased)
	var back []*Buffer
	if moved {
		for i, st := range c.rxState {
			if st == rxSpare || st == rxPosted || st == rxQueued {
				c.rxState[i] = rxReturned
				back = append(back, c.rx[i])
			}
		}
		c.rxLen = 0
	}
	res := c.res
	c.res = nil
	c.mu.Unlock()
	c.pollMu.Unlock()
	c.readMu.Unlock()
	if !moved {
		return
	}

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
	// The JFR goes before its buffers: a posted buffer is the device's
	// until then.
	c.e.jetties.release(res)
	for _, b := range back {
		b.pool.put(b)
	}
	if c.rxPool != c.pool {
		// Unmapped once the application gives back the last receive
		// buffer it holds (ReadBuffer), at once if it holds none.
		if err := c.rxPool.unregister(c.log, "the connection's receive buffers"); err != nil {
			c.log.Error(err, "releasing the connection's receive buffers")
		}
	}
	if c.ownSend != nil {
		// The jetty is flushed: no SEND reads the buffers any more.
		if err := c.ownSend.unregister(c.log, "the connection's send buffers"); err != nil {
			c.log.Error(err, "releasing the connection's send buffers")
		}
	}
	c.e.unref()
}
