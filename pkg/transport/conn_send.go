package transport

import (
	"errors"
	"fmt"
	"os"

	"github.com/openeuler/urma-k8s/internal/memcopy"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// writeErrLocked is why a write cannot proceed; c.mu is held.
func (c *urmaConn) writeErrLocked() error {
	switch c.stateNow() {
	case stateClosing, stateReleased:
		return errConnClosed
	case stateFailed, stateSendFailed:
		return c.cause
	case statePeerClosed:
		return errPeerClosed
	}
	return nil
}

// reserveWindow takes one slot of both windows, waiting within the write
// deadline while either is empty. A closed or broken connection says so
// before a passed deadline does, as Read and Go's own connections do.
func (c *urmaConn) reserveWindow() error {
	stalled := false
	for {
		if c.wdl.passed() {
			c.mu.Lock()
			err := c.writeErrLocked()
			c.mu.Unlock()
			if err == nil {
				err = os.ErrDeadlineExceeded
			}
			return err
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

// takeBuffer takes a buffer for a send: one of the connection's own while
// any is free, else one of the engine pool; while both are dry it waits
// for either.
func (c *urmaConn) takeBuffer() (*Buffer, error) {
	b, err := c.pool.getPreferring(c.ownSend, c.stopCh, c.wdl.done(), c.e.s.failWhenPoolDry)
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
	c.sendSGE[0] = b.pool.sge(b, n)
	c.sendWR = urma.SendWR{
		Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: c.remoteJetty,
		UserCtx: c.sendCtx(b), SGEs: c.sendSGE[:],
	}
	b.held.Store(false)
	if err := c.res.jetty.PostSend(&c.sendWR); err != nil {
		b.pool.put(b)
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
	// Close holds writeMu while it waits for the sends posted before it
	// (up to CloseTimeout): a write that starts meanwhile fails at once
	// instead of waiting with it.
	if c.isClosed() {
		return 0, c.opErr("write", errConnClosed)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if len(p) == 0 {
		if err := c.emptyWriteErr(); err != nil {
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
		k := c.fill(b, p[n:])
		if err := c.postData(b, k); err != nil {
			return n, c.opErr("write", err)
		}
		n += k
	}
	return n, nil
}

// emptyWriteErr is what a write of nothing reports, as a socket's does:
// why a write would fail now (closed, broken, past its deadline), else
// nil; writeMu is held.
func (c *urmaConn) emptyWriteErr() error {
	c.mu.Lock()
	err := c.writeErrLocked()
	c.mu.Unlock()
	if err == nil && c.wdl.passed() {
		err = os.ErrDeadlineExceeded
	}
	return err
}

// fill copies the start of p into b. The peer process reads the
// connection's own send buffers from another core: streaming stores spare
// the copy from fetching every line back from that core first.
func (c *urmaConn) fill(b *Buffer, p []byte) int {
	// A pool buffer may be smaller than the connection's messages (when
	// its own send buffers are all out): it carries what it holds.
	dst := b.data[:min(c.chunk, len(b.data))]
	if c.ownsSendBuffer(b) && c.sharesSendBuffers() {
		return memcopy.Stream(dst, p)
	}
	return copy(dst, p)
}

// AllocBuffer takes a buffer to fill and WriteBuffer: one of the
// connection's own send buffers while any is free, else a pool buffer.
func (c *urmaConn) AllocBuffer() (*Buffer, error) {
	c.mu.Lock()
	err := c.writeErrLocked()
	c.mu.Unlock()
	if err != nil {
		return nil, c.opErr("write", err)
	}
	b, err := c.takeBuffer()
	if err != nil {
		return nil, c.opErr("write", err)
	}
	return b, nil
}

// WriteBuffer sends the first n bytes of b as one message, without copying.
// It takes b back whether it succeeds or not.
func (c *urmaConn) WriteBuffer(b *Buffer, n int) error {
	if err := claimWriteBuffer(b, n); err != nil {
		return c.opErr("write", err)
	}
	giveBack := func(err error) error {
		b.pool.put(b)
		return c.opErr("write", err)
	}
	switch {
	case b.pool != c.pool && !c.ownsSendBuffer(b):
		return giveBack(errors.New("write buffer: the buffer is from another transport's pool or another connection's send buffers; take it with AllocBuffer on the connection that writes it"))
	case n > c.chunk:
		return giveBack(fmt.Errorf("write buffer: %d bytes exceed the largest message of %d (the peer's buffer size)", n, c.chunk))
	}
	if c.isClosed() { // not to wait for writeMu with Close, as Write
		return giveBack(errConnClosed)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if n == 0 {
		// Nothing to send, but the same answer as Write(nil): a caller
		// must not take a closed connection for a working one.
		b.pool.put(b)
		if err := c.emptyWriteErr(); err != nil {
			return c.opErr("write", err)
		}
		return nil
	}
	if err := c.reserveWindow(); err != nil {
		return giveBack(err)
	}
	if err := c.postData(b, n); err != nil {
		return c.opErr("write", err)
	}
	return nil
}

// MaxMessage is the most bytes one WriteBuffer may send.
func (c *urmaConn) MaxMessage() int { return c.chunk }
