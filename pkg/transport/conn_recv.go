package transport

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/openeuler/urma-k8s/internal/memcopy"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// rxState is where one of a connection's receive buffers is.
type rxState uint8

const (
	rxSpare    rxState = iota // the connection's, not posted (a repost failed)
	rxPosted                  // posted to the JFR
	rxQueued                  // holds a message not yet read
	rxApp                     // handed to the application by ReadBuffer
	rxReturned                // back in the pool (after release)
)

// postRecvLocked (re)posts receive slot; c.mu is held.
func (c *urmaConn) postRecvLocked(slot int32) error {
	b := c.rx[slot]
	c.recvSGE[0] = c.rxPool.sge(b, c.rxPool.size)
	c.recvWR = urma.RecvWR{UserCtx: uint64(slot) + 1, SGEs: c.recvSGE[:]}
	if err := c.res.jfr.PostRecv(&c.recvWR); err != nil {
		c.rxState[slot] = rxSpare // kept, to go back to the pool at release
		return err
	}
	c.rxState[slot] = rxPosted
	c.notePostedLocked(slot)
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
	if c.pendingCredits <= c.threshold || c.creditWRs == 0 || c.stateNow() != stateOpen {
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
	if c.stateNow() == stateReleased {
		c.rxState[slot] = rxReturned
		c.mu.Unlock()
		b.pool.put(b)
		return
	}
	err := c.consumeLocked(int32(slot))
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
	}
}

// readErrLocked is why a read with nothing buffered cannot wait; nil when it
// can. c.mu is held.
func (c *urmaConn) readErrLocked() error {
	switch c.stateNow() {
	case stateFailed:
		return c.cause
	case statePeerClosed:
		return io.EOF
	case stateClosing, stateReleased:
		return errConnClosed
	}
	return nil
}

// Read reads from the received messages, waiting within the read deadline.
func (c *urmaConn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if len(p) == 0 {
		// As a socket's (Go's poll.FD.Read): nothing happened, whatever
		// the state but closed. io.EOF here would end a caller's stream
		// on a probe, as a timeout would fail it.
		if c.isClosed() {
			return 0, c.opErr("read", errConnClosed)
		}
		return 0, nil
	}
	spun := false
	for {
		if c.direct.armed {
			if c.offerStands() {
				// Woken for nothing (a notice of a message read
				// already, say): the offer stays out. Taken back and
				// made again, it left a gap in which the next message
				// passed it by and cost its copy after all.
				c.awaitMessage(&spun)
				continue
			}
			// Whatever woke us, the provider must be done with p first;
			// a message it placed there is read, deadline or not.
			if n, ok := c.settlePlacement(); ok {
				c.countReceived(n)
				return n, nil
			}
		}
		if c.isClosed() {
			return 0, c.opErr("read", errConnClosed)
		}
		if c.rdl.passed() {
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		c.mu.Lock()
		if c.rxLen == 0 {
			err := c.readErrLocked()
			if err == nil {
				c.offerLocked(p)
			}
			c.mu.Unlock()
			if errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			if err != nil {
				return 0, c.opErr("read", err)
			}
			c.awaitMessage(&spun)
			continue
		}
		head, avail := c.rxHead, c.rxLen
		c.mu.Unlock()
		// The writer side of the ring only appends beyond head+avail, and
		// only this reader consumes, so the messages can be copied unlocked.
		n, used := 0, 0
		for used < avail && n < len(p) {
			b := c.rx[c.rxq[(head+used)%len(c.rxq)]]
			// Through the cache, as the kernel's copy of a TCP read: the
			// caller reads what it asked for next.
			k := memcopy.Cached(p[n:], b.data[b.off:b.n])
			n += k
			b.off += k
			if b.off < b.n {
				break
			}
			used++
		}
		var err error
		c.mu.Lock()
		for i := 0; i < used; i++ {
			slot := c.rxq[c.rxHead]
			c.rxHead = (c.rxHead + 1) % len(c.rxq)
			c.rxLen--
			if err == nil {
				err = c.consumeLocked(slot)
			} else {
				c.rxState[slot] = rxSpare // read already; the connection is failing
			}
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
	spun := false
	for {
		if c.isClosed() {
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
		c.waitUnofferedLocked() // a buffer is handed over as it is, not offered
		c.mu.Unlock()
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		if err != nil {
			return nil, c.opErr("read", err)
		}
		c.awaitMessage(&spun)
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
	// reposted at once; a message larger than a pool buffer (the
	// connection's own receives) is handed out a pool buffer at a time.
	nb, err := c.pool.get(c.closedCh, c.rdl.done(), c.e.s.failWhenPoolDry)
	if err != nil {
		return nil, c.opErr("read", err)
	}
	nb.n = copy(nb.data, b.data[b.off:b.n])
	b.off += nb.n
	if b.off < b.n {
		c.countReceived(nb.n)
		return nb, nil
	}
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

// awaitMessage waits, for a reader that found nothing to read, until
// something may have changed: in a read's first wait it spins (spinRead),
// then it sleeps until the connection is readable, closes or the read
// deadline passes. The caller looks again either way.
func (c *urmaConn) awaitMessage(spun *bool) {
	if !*spun {
		*spun = true
		if c.spinRead() {
			return
		}
	}
	c.readSleeps.Add(1)
	select {
	case <-c.readable:
	case <-c.closedCh:
	case <-c.rdl.done():
	}
}

// spinRead is event mode's answer to the wake-ups a sleeping reader costs:
// an event takes three goroutine hand-offs (the provider's, the event
// loop's, this goroutine's), each a wake-up of another thread, where a TCP
// read takes one. A reader with nothing to read first polls the completion
// queue itself, for up to urma_event_spin, so that a message arriving
// meanwhile reaches it with none. It yields the processor between polls:
// the goroutines it waits for (the peer's answer may need this process's
// writer) share the same few processors. It reports whether it found
// something to read, or a reason not to wait. Polling mode has pollers for
// this, and spins nowhere else; the socket fabric does not spin at all
// (readerSpin). At most the engine's spinLimit readers spin at once; the
// others sleep at once, as without the spin.
func (c *urmaConn) spinRead() bool {
	spin := c.e.readerSpin(c.fabricName())
	if spin <= 0 {
		return false
	}
	if c.e.spinners.Add(1) > c.e.spinLimit {
		c.e.spinners.Add(-1)
		return false
	}
	defer c.e.spinners.Add(-1)
	c.spinReads.Add(1)
	start := time.Now()
	for i := 0; ; i++ {
		c.tryPoll()
		c.mu.Lock()
		found := c.rxLen > 0 || c.readErrLocked() != nil || c.placementLanded() // closing included
		c.mu.Unlock()
		if found {
			return true
		}
		if i&7 == 7 && (time.Since(start) >= spin || c.rdl.passed()) {
			c.spinMisses.Add(1)
			return false
		}
		runtime.Gosched()
	}
}

func (c *urmaConn) countReceived(n int) {
	if n > 0 {
		c.bytesReceived.Add(uint64(n))
		c.counters.BytesReceived.Add(float64(n))
	}
}
