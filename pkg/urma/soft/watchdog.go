package soft

import (
	"errors"
	"fmt"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/framebound"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// watchdog declares silent connections dead and keeps idle ones alive: every
// PeerTimeout/4 it sends a PING on connections that wrote nothing, and fails
// those that read nothing for four ticks, or took too long over a frame
// (watchFrame). On the shm fabric it fails connections whose live peer
// stopped (watchShm) instead.
func (sd *fabricSide) watchdog() {
	tick := max(sd.peerTO/4, time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	var conns []*conn
	for {
		select {
		case <-t.C:
		case <-sd.ctx.Done():
			return
		}
		conns = conns[:0]
		sd.mu.Lock()
		for c := range sd.conns {
			conns = append(conns, c)
		}
		sd.mu.Unlock()
		var awaited map[*peer]bool // made once a tick, when a connection needs it
		awaitedPeers := func() map[*peer]bool {
			if awaited == nil {
				awaited = sd.dev.awaitedPeers()
			}
			return awaited
		}
		for _, c := range conns {
			if s, ok := c.io.(*shmIO); ok {
				sd.watchShm(c, s, awaitedPeers)
				continue
			}
			rx := c.rx.Load()
			if rx != c.lastRx {
				c.lastRx, c.idleTicks = rx, 0
			} else if c.idleTicks++; c.idleTicks >= 4 {
				c.fail(fmt.Errorf("peer silent for %v", sd.peerTO))
				continue
			}
			if s, ok := c.io.(*sockIO); ok && sd.watchFrame(c, s, rx) {
				continue
			}
			if tx := c.tx.Load(); tx == c.lastTx {
				var it txItem
				it.n = uint8(len(encodePing(it.ctl[:])))
				if c.enqueue(&it) == nil {
					c.ring()
				}
			} else {
				c.lastTx = tx
			}
		}
		clear(conns)
		if f := sd.afterWatch.Load(); f != nil {
			(*f)()
		}
	}
}

// watchFrame fails a socket connection whose peer takes too long over a
// frame, and reports whether it did. A peer that trickles a frame, a byte
// now and then, is never silent for PeerTimeout, yet holds the reader
// goroutine, the sends waiting for answers behind the frame and a receive
// being written (and so JFR.Close) for as long as it likes. The reader
// marks a frame from its first byte to its end (sockReader.frame); the
// frame is timed from the tick that first saw it, so it is failed no
// earlier than framebound.For the bytes read since (the socket's bytes, as
// near to the frame's as the watchdog can tell) and at most a tick later.
func (sd *fabricSide) watchFrame(c *conn, s *sockIO, rx uint64) bool {
	f := s.frame.Load()
	if f&1 == 0 {
		return false // between frames
	}
	now := time.Now()
	if f != c.frameSeen {
		c.frameSeen, c.frameSince, c.frameRx = f, now, rx
		return false
	}
	waited, bound := now.Sub(c.frameSince), framebound.For(sd.peerTO, rx-c.frameRx)
	if waited <= bound {
		return false
	}
	c.fail(framebound.Overdue(waited, bound))
	return true
}

// watchShm fails an shm connection whose peer process lives but stopped
// (SIGSTOP, a debugger, a hang): its unix socket reports a dead peer, not
// a stopped one. A stopped peer neither reads this side's ring nor writes
// its own, so the watch is on the words it moves (the tail of its ring,
// the head of its reading of this side's, and the bytes it pulled out of
// this side's memory, which a long one-copy SEND moves while the ring
// words stand still); no heartbeat, so an idle peer costs no wake-up and
// is never timed out. The connection fails when the peer moved none of
// them for PeerTimeout (four ticks at least, so that this process being
// held up does not count) while something of this side waits on it: bytes
// to read, sends or imports to answer (waitsOnPeer). A peer that moves
// any of them, however slowly, is making progress, and
// RNR answers are progress: an RNR wait, however long, is no stall.
func (sd *fabricSide) watchShm(c *conn, s *shmIO, awaited func() map[*peer]bool) {
	w, ok := s.WatchWords()
	if !ok {
		return // closed: its reader fails it
	}
	if w.PeerTail != c.peerTail || w.PeerHead != c.peerHead || w.PeerPulled != c.peerPulled {
		c.peerTail, c.peerHead, c.peerPulled, c.idleTicks = w.PeerTail, w.PeerHead, w.PeerPulled, 0
		return
	}
	why := c.waitsOnPeer(w, awaited)
	if why == nil {
		c.idleTicks = 0
		return
	}
	if c.idleTicks == 0 {
		c.quietSince = time.Now()
	}
	if c.idleTicks++; c.idleTicks >= 4 && time.Since(c.quietSince) >= sd.peerTO {
		c.fail(fmt.Errorf("%w for %v", why, sd.peerTO))
	}
}

// errPeerNotReading and errPeerNotAnswering say that a live peer left what
// this side wrote unread, or the sends it read unanswered, for PeerTimeout
// (fabricSide.watchShm).
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
