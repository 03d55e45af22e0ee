package soft

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func (c *conn) writeLoop() {
	defer close(c.writerDone)
	// On shared memory the writer waits for room without the write lock,
	// so that a poller can write meanwhile (see drive).
	waiter, _ := c.io.(interface{ WaitWritable() error })
	for {
		select {
		case <-c.doorbell:
		case <-c.done:
			return
		}
		for {
			c.wmu.Lock()
			stuck, err := c.drain(waiter == nil)
			c.wmu.Unlock()
			if err == nil && stuck {
				err = waiter.WaitWritable()
			}
			if err != nil {
				c.fail(fmt.Errorf("write: %w", err))
				return
			}
			if !stuck {
				break
			}
		}
	}
}

// kick writes what is queued from the calling goroutine, without blocking:
// it saves the writer goroutine's wakeup on the common path. Whatever it
// cannot write (lock taken, stream full) it leaves to the writer goroutine.
// The caller holds no jetty lock.
func (c *conn) kick() {
	if !c.wmu.TryLock() {
		c.ring()
		return
	}
	stuck, err := c.drain(false)
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("write: %w", err))
		return
	}
	if stuck || c.hasQueued() {
		c.ring()
	}
}

// drain writes queued frames until nothing is queued; c.wmu is held. Owed
// answers go first, and again between every chunk of a long batch, so a
// peer's sends complete while ours stream. Sends are encoded into iovecs
// (headers from the items, payloads straight from registered memory). A
// send's slot stays marked as being written until its bytes are in the
// stream. Without wait it returns stuck when the stream is full, leaving
// its progress in c.batch/c.iov for the next holder.
func (c *conn) drain(wait bool) (stuck bool, err error) {
	for {
		if len(c.iov) > 0 {
			c.iov, err = c.io.Writev(c.iov, wait)
			if errors.Is(err, unix.EAGAIN) && !wait {
				return true, nil
			}
			if err != nil {
				return false, err
			}
			if len(c.iov) > 0 {
				continue
			}
			clear(c.iovBuf[:cap(c.iovBuf)]) // drop the pointers into registered memory
			c.endWrites()
		}
		// At a frame boundary: answers first.
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			return false, errConnDead
		}
		if len(c.answers.list) > 0 {
			c.answers, c.ansOut = c.ansOut, c.answers
			c.mu.Unlock()
			c.ansBuf = c.ansOut.encode(c.ansBuf[:0])
			c.ansOut.reset()
			c.iovBuf = appendIov(c.iovBuf[:0], c.ansBuf)
			c.iov = c.iovBuf
			continue
		}
		if c.next < len(c.batch) {
			c.mu.Unlock()
			c.encode()
			continue
		}
		if c.batch != nil {
			clear(c.batch)
			c.spare = c.batch[:0]
			c.batch, c.next = nil, 0
		}
		if len(c.q) == 0 {
			c.mu.Unlock()
			return false, nil
		}
		c.batch, c.q, c.spare = c.q, c.spare[:0], nil
		c.cancels = 0
		c.mu.Unlock()
	}
}

// encode turns the next frames of c.batch into iovecs, up to half the
// kernel's iovec limit.
func (c *conn) encode() {
	iov := c.iovBuf[:0]
	c.refBuf = c.refBuf[:0]
	for ; c.next < len(c.batch) && len(iov) < iovMax/2; c.next++ {
		it := &c.batch[c.next]
		if it.j == nil {
			iov = appendIov(iov, it.ctl[:it.n])
			continue
		}
		var h sendHeader
		payload, inline, ok := it.j.beginWrite(it.seq, it.tx, c.peerMax, &h)
		if !ok {
			continue
		}
		if frame := c.encodeRef(&h, payload); frame != nil {
			iov = appendIov(iov, frame)
			c.started = append(c.started, c.next)
			continue
		}
		iov = appendIov(iov, encodeSendHeader(it.ctl[:], &h))
		iov = appendIov(iov, inline)
		for k := range payload {
			iov = appendIov(iov, payload[k].buf)
		}
		c.started = append(c.started, c.next)
	}
	c.iovBuf, c.iov = iov, iov
	if len(iov) == 0 {
		c.endWrites()
	}
}

// encodeRef encodes the SEND h as a SEND_REF when its payload lies in
// segments the peer maps (shm fabric, pull.go); nil when it must be copied.
// The frames of one encode call live in c.refBuf until written.
func (c *conn) encodeRef(h *sendHeader, payload []sgeRef) []byte {
	s, ok := c.io.(*shmIO)
	if !ok || h.length < pullMin {
		return nil
	}
	refs, ok := s.refsFor(payload, c.sendRef[:0])
	c.sendRef = refs[:0]
	if !ok {
		return nil
	}
	const most = 4 + sendHdrLen + MaxSGE*sendRefLen
	if c.refBuf == nil {
		c.refBuf = make([]byte, 0, iovMax/2*most) // never grows: iovecs point into it
	}
	if cap(c.refBuf)-len(c.refBuf) < most {
		return nil
	}
	at := len(c.refBuf)
	frame := encodeSendRef(c.refBuf[at:at+most], h, refs)
	c.refBuf = c.refBuf[:at+len(frame)]
	s.pulls.Add(1)
	return frame
}

// endWrites releases the slots whose frames are written (or abandoned).
func (c *conn) endWrites() {
	for _, i := range c.started {
		c.batch[i].j.endWrite(c.batch[i].seq)
	}
	c.started = c.started[:0]
}

// abandonWrites releases slots still marked as being written when the
// connection dies.
func (c *conn) abandonWrites() {
	c.wmu.Lock()
	c.endWrites()
	c.iov = nil
	clear(c.iovBuf[:cap(c.iovBuf)])
	c.wmu.Unlock()
}

// answerQueue is what a connection owes its peer, in order: ACKs, with the
// SUCCESS answers to consecutive SENDs of one sender jetty merged into one
// run, and import answers.
type answerQueue struct {
	list []answer
	runs map[uint32]int // sender jetty instance -> its open run in list
}

type answer struct {
	typ      byte // frameAck, frameAckRun or frameImportResp
	status   urma.Status
	rnrTimer uint8
	src, dst uint32
	tag      uint64
	count    uint32 // frameAckRun
	req      uint32 // frameImportResp
	code     urma.Code
}

func newAnswerQueue() answerQueue { return answerQueue{runs: make(map[uint32]int)} }

func (q *answerQueue) reset() {
	clear(q.list)
	q.list = q.list[:0]
	clear(q.runs)
}

// ack owes the answer st to the SEND h. A SUCCESS that follows the open
// run of its sender jetty extends it; any other answer closes the run, so
// the sender sees its answers in order.
func (q *answerQueue) ack(h *sendHeader, st urma.Status, rnrTimer uint8) {
	inst := uint32(h.tag >> 32)
	if st == urma.StatusSuccess {
		if i, ok := q.runs[inst]; ok {
			a := &q.list[i]
			if a.src == h.src && uint32(a.tag)+a.count == uint32(h.tag) && a.count < maxAckRun {
				a.typ = frameAckRun
				a.count++
				return
			}
		}
		q.runs[inst] = len(q.list)
		q.list = append(q.list, answer{typ: frameAck, status: st, src: h.src, dst: h.dst, tag: h.tag, count: 1})
		return
	}
	delete(q.runs, inst)
	q.list = append(q.list, answer{typ: frameAck, status: st, rnrTimer: rnrTimer, src: h.src, dst: h.dst, tag: h.tag, count: 1})
}

func (q *answerQueue) importResp(req uint32, code urma.Code) {
	q.list = append(q.list, answer{typ: frameImportResp, req: req, code: code})
}

// encode appends the frames of every answer to b.
func (q *answerQueue) encode(b []byte) []byte {
	var f [4 + maxCtlFrame]byte
	for i := range q.list {
		a := &q.list[i]
		switch a.typ {
		case frameAck:
			b = append(b, encodeAck(f[:], &ackFrame{status: a.status, rnrTimer: a.rnrTimer, src: a.src, dst: a.dst, tag: a.tag})...)
		case frameAckRun:
			b = append(b, encodeAckRun(f[:], &ackRunFrame{src: a.src, dst: a.dst, tag: a.tag, count: a.count})...)
		case frameImportResp:
			b = append(b, encodeImportResp(f[:], a.req, a.code)...)
		}
	}
	return b
}
