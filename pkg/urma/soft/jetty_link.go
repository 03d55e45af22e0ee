package soft

import (
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// peerDown fails the sends that connection generation gen of peer p
// carried, when it broke or the peer could not be reached: the first with
// ACK_TIMEOUT, the rest flushed as the jetty enters ERROR. Sends on
// another connection of p (one that replaced it) stand.
func (j *jetty) peerDown(p *peer, gen uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed || j.state != urma.JettyReady {
		return
	}
	j.failPeer(p, gen)
	j.dropPeerGen(p) // in ERROR there is none left
}

// dropPeerGen drops p's connection record when no send of this jetty is out
// to p; j.mu is held. The record's one reader, failReplaced, fails only a
// send out to p, and only transmit puts a send out: the next transmission
// to p, which records its generation anew, then finds none out either way.
// Called when one of p's connections ended, so that a jetty that talked to
// many peers over time keeps no record, and no peer, of those gone.
func (j *jetty) dropPeerGen(p *peer) {
	if _, ok := j.peerGen[p]; !ok {
		return
	}
	for seq := j.head; seq < j.tail; seq++ {
		if s := j.slot(seq); s.state == slotInflight && s.target.peer == p {
			return
		}
	}
	delete(j.peerGen, p)
	if len(j.peerGen) == 0 {
		j.peerGen = nil // a map keeps the room of its deleted entries
	}
}

// failPeer fails the oldest send outstanding that connection generation
// gen of p carried with ACK_TIMEOUT, which flushes the rest; j.mu is held.
// A send waiting for its RNR retry counts: the receiver's block went with
// the connection. The sends from a held failure on are not out: they fail
// whatever the peer does.
func (j *jetty) failPeer(p *peer, gen uint64) {
	j.failOldest(j.sendable(), func(s *sqSlot) bool {
		return (s.state == slotQueued || s.state == slotInflight) && s.target.peer == p && s.gen == gen
	})
}

// failOldest fails the oldest send before end that lost its connection
// (match) with ACK_TIMEOUT, which flushes the rest, and reports whether
// there was one; j.mu is held.
func (j *jetty) failOldest(end uint64, match func(*sqSlot) bool) bool {
	for seq := j.head; seq < end; seq++ {
		if s := j.slot(seq); match(s) {
			s.rnrBlock = false // the connection that held the block is gone
			s.state = slotInflight
			j.result(s, urma.StatusAckTimeout, 0)
			return true
		}
	}
	return false
}

// failReplaced fails, as failPeer, the oldest send before seq still out
// to p on an older connection than gen, now that the peer has a newer
// one: that connection is replaced and dies without its answers, and a
// send on the new one, answered first, would otherwise complete out of
// post order. It reports whether it failed one; j.mu is held.
func (j *jetty) failReplaced(p *peer, gen, seq uint64) bool {
	return j.failOldest(seq, func(s *sqSlot) bool {
		return s.state == slotInflight && s.target.peer == p && s.gen != 0 && s.gen != gen
	})
}

// addAwaited adds to m the peers that sends of this jetty wait on:
// transmitted and not yet answered. A send waiting for its RNR retry is
// queued, not transmitted: the receiver answered it. Rewound sends may
// leave inflight ones to other targets past next, so the scan goes to tail.
func (j *jetty) addAwaited(m map[*peer]bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for seq := j.head; seq < j.tail; seq++ {
		if s := j.slot(seq); s.state == slotInflight && s.target.peer != nil {
			m[s.target.peer] = true
		}
	}
}

// onAnswer applies the answer of peer from for the send tagged tag; false
// when no send of this jetty to that peer waits for it any more.
func (j *jetty) onAnswer(from *peer, tag uint64, st urma.Status, rnrTimer uint8) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.answered(from, tag, st, rnrTimer)
}

// onSuccessRun applies peer from's answer SUCCESS to count sends from the
// one tagged tag on (sequence numbers wrap within the tag's low half).
func (j *jetty) onSuccessRun(from *peer, tag uint64, count uint32) {
	j.mu.Lock()
	defer j.mu.Unlock()
	// Only the sends in flight, at most the queue's depth of them, can take
	// an answer: walk those, in post order, not the run's count of
	// sequence numbers, which a peer may set as high as maxAckRun to keep
	// this lock busy. The unsigned difference places a send in the run
	// across the wrap of the 32-bit sequence number.
	first := uint32(tag)
	for seq, end := j.head, j.tail; seq < end; seq++ {
		if uint32(seq)-first < count {
			j.answered(from, tag&^0xffffffff|uint64(uint32(seq)), urma.StatusSuccess, 0)
		}
	}
}

// answered applies one answer from peer from, or defers it while the
// send's frame is being written; false when no send to that peer waits for
// it; j.mu is held. Tags are consecutive, so any peer can name the sends
// of an RM jetty to other peers: only the peer a send went to answers it.
func (j *jetty) answered(from *peer, tag uint64, st urma.Status, rnrTimer uint8) bool {
	if j.closed || j.state != urma.JettyReady || uint32(tag>>32) != j.instance {
		return false
	}
	s := j.slot(uint64(uint32(tag)))
	if s.state != slotInflight || uint32(s.seq) != uint32(tag) || s.target.peer != from {
		return false
	}
	if s.writing {
		s.deferred, s.defStatus, s.defRNR = true, st, rnrTimer
		return true
	}
	j.result(s, st, rnrTimer)
	return true
}

// beginWrite describes the slot a queued frame carries, and marks it as being
// written; ok is false when the frame is stale (the slot completed or was
// rewound since it was queued) or the message is longer than peerMax, the
// connection's peer takes (it was queued before the connection was up):
// then it fails with LOC_LEN, in its turn.
func (j *jetty) beginWrite(seq uint64, tx uint32, peerMax uint64, h *sendHeader) (payload []sgeRef, inline []byte, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.slot(seq)
	if j.closed || s.seq != seq || s.state != slotInflight || s.tx != tx {
		return nil, nil, false
	}
	if uint64(s.length) > peerMax {
		j.failLocal(s, urma.StatusLocLen)
		return nil, nil, false
	}
	s.writing = true
	j.writing++
	*h = sendHeader{
		opcode: s.opcode, src: j.id.ID, srcUASID: j.id.UASID, dst: s.target.id.ID,
		token: uint32(s.target.token), tag: uint64(j.instance)<<32 | uint64(uint32(seq)), imm: s.imm,
		length: s.length,
	}
	if s.flags&urma.SendSolicitedEnable != 0 {
		h.flags |= sendFlagSolicited
	}
	if s.resume {
		h.flags |= sendFlagResume
		s.resume = false
	}
	if s.isInline {
		return nil, s.inline[:s.length], true
	}
	return s.sges[:s.nsge], nil, true
}

// endWrite clears the writing mark and frees the slot if it completed
// meanwhile.
func (j *jetty) endWrite(seq uint64) {
	j.mu.Lock()
	s := j.slot(seq)
	s.writing = false
	if j.writing--; j.writing == 0 {
		j.written.Broadcast()
	}
	if s.deferred {
		s.deferred = false
		if !j.closed && j.state == urma.JettyReady && s.state == slotInflight {
			j.result(s, s.defStatus, s.defRNR)
		} else if s.defStatus == statusRNR && s.target.peer != nil {
			// Completed while its frame was written (Close, a flush): as
			// for an answer that finds no send, the block must go.
			s.target.peer.cancel(j, seq, s.target.id.ID)
		}
	}
	if s.state == slotDone {
		// Completed while its frame was written: nothing reads its SGEs
		// any more, and its held record may now show (finish).
		releaseSGEs(s.sges[:s.nsge])
		s.nsge = 0
	}
	if len(j.held) > 0 {
		j.pushHeld()
	}
	j.reap()
	j.mu.Unlock()
}
