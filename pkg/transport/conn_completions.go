package transport

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

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
// many it handled. Once the connection is released the queue is gone: a
// poller still holding the connection in an old snapshot finds nothing.
func (c *urmaConn) poll() int {
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	return c.pollLocked()
}

// tryPoll polls unless someone else is polling: a spinning reader need not
// wait for the event loop, which hands it what it finds.
func (c *urmaConn) tryPoll() {
	if c.pollMu.TryLock() {
		c.pollLocked()
		c.pollMu.Unlock()
	}
}

// pollLocked is poll with pollMu held.
func (c *urmaConn) pollLocked() int {
	if c.stateNow() == stateReleased {
		return 0
	}
	total := 0
	for {
		n, err := c.res.jfc.Poll(c.cqes)
		if err != nil {
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
	// A message from any jetty but the peer's is dropped before anything
	// in it is believed: another client's, or an old peer's whose jetty
	// id a new connection reuses, must not deliver bytes, return credits,
	// end the connection or break it. Two fields of the record decide.
	if cr.Recv && (cr.RemoteID.ID != c.remoteID.ID || cr.RemoteID.EID != c.remoteID.EID) && carriesMessage(cr.Status) {
		return false, false, c.dropForeignLocked(cr)
	}
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
		b, err := c.sentBuffer(cr.UserCtx)
		if err != nil {
			return false, false, err
		}
		b.pool.put(b)
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
	c.noteCompletedLocked(int32(slot))
	if cr.Opcode == urma.CROpSendWithImm && cr.Imm == closeMarkerImm && c.peerMarks {
		return c.handleCloseMarkerLocked(cr, slot)
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
	if int(cr.CompletionLen) > c.recv.size {
		return false, false, protocolErr("message of %d bytes exceeds the %d-byte receive buffer", cr.CompletionLen, c.recv.size)
	}
	if cr.CompletionLen == 0 {
		// A credit message used one of the reserved receives: repost it at
		// once; it is not a credit to return.
		if err := c.postRecvLocked(int32(slot)); err != nil {
			return false, writable, fmt.Errorf("repost receive: %w", err)
		}
		return false, writable, nil
	}
	if placed, err := c.placedLocked(int32(slot)); placed || err != nil {
		return err == nil, writable, err
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

// carriesMessage reports whether a receive completed with status holds a
// message from the fabric, whose source it names: one delivered, or one
// too large for the receive buffer (LOC_LEN). A flushed receive, or one
// failed by its own buffer, has no source.
func carriesMessage(s urma.Status) bool {
	return s == urma.StatusSuccess || s == urma.StatusLocLen
}

// dropForeignLocked drops a message whose source is not the peer's jetty:
// its receive is reposted at once, as if never taken (the peer did not use
// it, so no credit is owed for it), and it is counted and logged. The
// receive's slot must be one we posted, as for any receive completion.
// c.mu is held.
func (c *urmaConn) dropForeignLocked(cr *urma.Completion) error {
	slot := int(cr.UserCtx) - 1
	if slot < 0 || slot >= len(c.rx) || c.rxState[slot] != rxPosted {
		return fmt.Errorf("receive completion names slot %d, not a posted receive", slot)
	}
	c.noteCompletedLocked(int32(slot))
	c.foreignDropped++
	c.e.metrics.ForeignMessages(c.role, 1)
	if c.foreignDropped <= foreignLogLimit {
		// At a debug level, and a few per connection: the sender chooses
		// how many there are.
		c.log.V(1).Info("dropped a message from a jetty that is not the connection's peer",
			"fromEID", cr.RemoteID.EID.String(), "fromJetty", cr.RemoteID.ID,
			"peerEID", c.remoteID.EID.String(), "peerJetty", c.remoteID.ID,
			"status", cr.Status.String(), "bytes", cr.CompletionLen, "dropped", c.foreignDropped,
			"more", c.foreignDropped == foreignLogLimit)
	}
	if err := c.postRecvLocked(int32(slot)); err != nil {
		return fmt.Errorf("repost receive: %w", err)
	}
	return nil
}

// foreignLogLimit is how many dropped foreign messages a connection logs;
// the metric counts them all.
const foreignLogLimit = 8

// handleCloseMarkerLocked takes the peer's close marker: everything it
// sent came before (RM delivers in order), so the stream ends cleanly here.
func (c *urmaConn) handleCloseMarkerLocked(cr *urma.Completion, slot int) (bool, bool, error) {
	if cr.CompletionLen != 0 {
		return false, false, protocolErr("close marker with %d bytes of payload", cr.CompletionLen)
	}
	if err := c.postRecvLocked(int32(slot)); err != nil {
		return false, false, fmt.Errorf("repost receive: %w", err)
	}
	c.moveLocked(statePeerClosed)
	return true, true, nil
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
		if b, err := c.sentBuffer(cr.UserCtx); err == nil {
			b.pool.put(b)
		}
		if c.sqWindow < c.windowCap {
			c.sqWindow++
		}
	}
	if !cr.Recv && cr.UserCtx == 0 && cr.Status != urma.StatusWRFlushErrDone && c.creditWRs < creditWRs {
		c.creditWRs++ // a credit message, flushed or failed: its reserved WR is free
	}
	switch cr.Status {
	case urma.StatusWRFlushErrDone:
		select {
		case <-c.flushDone:
		default: // the first record; pollMu makes this the only closer
			close(c.flushDone)
		}
		return false, true, nil
	case urma.StatusWRFlushErr:
		if c.stateNow() == stateClosing {
			return false, true, nil
		}
	}
	if cr.Recv {
		return true, true, fmt.Errorf("URMA receive completed with status %s", cr.Status)
	}
	return true, true, sendFailure{fmt.Errorf("URMA send completed with status %s", cr.Status)}
}
