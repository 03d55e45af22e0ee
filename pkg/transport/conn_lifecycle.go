package transport

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
)

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
