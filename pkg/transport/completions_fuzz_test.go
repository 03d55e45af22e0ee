package transport

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"testing"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// What a peer controls on the data plane is what its messages make the
// receive completions say: the opcode, the length, the immediate, and
// (anyone who reaches the jetty) the source. FuzzReceiveCompletions drives
// a connection's completion handler with any sequence of such completions,
// the credit sends they provoke, and reads, against a receive queue and a
// jetty that keep the device's books, and checks after every step that
// nothing is posted twice or beyond the queue's depth, that the windows
// and credit work requests stay within their bounds, that a foreign
// message changes nothing, and that a read returns only the peer's bytes.

// bookJFR is a receive queue that keeps the books a device keeps: which
// receives are posted, none twice, at most depth.
type bookJFR struct {
	depth     int
	posted    map[uint64]bool // by user context
	violation error
}

func (r *bookJFR) ID() urma.JettyID { return urma.JettyID{ID: 1} }
func (r *bookJFR) Close() error     { return nil }

func (r *bookJFR) PostRecv(wr *urma.RecvWR) error {
	switch {
	case r.posted[wr.UserCtx]:
		r.violation = fmt.Errorf("receive %d posted twice", wr.UserCtx)
	case len(r.posted) >= r.depth:
		return urma.ErrAgain
	}
	r.posted[wr.UserCtx] = true
	return nil
}

// slots are the posted receives, in a stable order.
func (r *bookJFR) slots() []uint64 {
	s := make([]uint64, 0, len(r.posted))
	for k := range r.posted {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// bookJetty is a jetty that counts the credit messages posted on it and
// not yet completed.
type bookJetty struct {
	credits int
}

func (j *bookJetty) ID() urma.JettyID { return urma.JettyID{ID: 2} }
func (j *bookJetty) PostSend(wr *urma.SendWR) error {
	if wr.UserCtx == 0 {
		j.credits++
	}
	return nil
}
func (j *bookJetty) SetError() error        { return nil }
func (j *bookJetty) State() urma.JettyState { return urma.JettyReady }
func (j *bookJetty) Close() error           { return nil }

// fuzzPeer is the connection's peer in fuzzConn; fuzzRQ its receive
// queue depth and fuzzBuf its buffer size.
var fuzzPeer = urma.JettyID{EID: urma.EID{0xfd, 15: 1}, UASID: 9, ID: 5}

const fuzzRQ, fuzzBuf = 16, 1024

// fuzzConn is an established connection over bookJFR and bookJetty: a
// window of 13 both ways, every receive posted, the peer fuzzPeer, which
// ends with close markers.
func fuzzConn(t testing.TB) (*urmaConn, *bookJFR, *bookJetty) {
	t.Helper()
	pool := newHeapPool(fuzzBuf, 2*fuzzRQ)
	rx := make([]*Buffer, fuzzRQ)
	if !pool.tryGetN(fuzzRQ, rx) {
		t.Fatal("take the receive buffers")
	}
	ours, theirs := net.Pipe()
	t.Cleanup(func() { _ = ours.Close(); _ = theirs.Close() })
	jfr, jetty := &bookJFR{depth: fuzzRQ, posted: map[uint64]bool{}}, &bookJetty{}
	e := &engine{bufSize: fuzzBuf, rqSize: fuzzRQ, sqSize: fuzzRQ, log: logr.Discard()}
	e.s.flags = smallFlags()
	c := &urmaConn{
		e: e, res: &jettyRes{jfr: jfr, jetty: jetty}, pool: pool, rxPool: pool, recv: recvPlan{size: fuzzBuf, count: fuzzRQ}, tcp: ours, role: metrics.RoleServer, log: logr.Discard(),
		rx: rx, rxState: make([]rxState, fuzzRQ), rxq: make([]int32, fuzzRQ),
		stopCh: make(chan struct{}), closedCh: make(chan struct{}), peerDone: make(chan struct{}),
		readable: make(chan struct{}, 1), writable: make(chan struct{}, 1), flushDone: make(chan struct{}),
		rdl: newDeadline(), wdl: newDeadline(), counters: (*metrics.Metrics)(nil).Data(metrics.ModeURMA),
		remoteID: fuzzPeer, peerMarks: true, chunk: fuzzBuf, peerBufSize: fuzzBuf,
		windowCap: fuzzRQ - creditWRs, threshold: (fuzzRQ - creditWRs) / 2,
	}
	c.sqWindow, c.remoteRQWindow, c.creditWRs = c.windowCap, c.windowCap, creditWRs
	for i, b := range rx {
		b.recv, b.slot = c, int32(i)
	}
	c.direct = newDirectPlacement(jfr, false, 0, fuzzRQ)
	c.mu.Lock()
	for i := range rx {
		if err := c.postRecvLocked(int32(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Unlock()
	c.state.Store(uint32(stateOpen))
	t.Cleanup(func() {
		c.mu.Lock()
		if c.escalate != nil {
			c.escalate.Stop()
		}
		c.mu.Unlock()
	})
	return c, jfr, jetty
}

// Message contents the fuzzer's device writes into a receive buffer: a
// read must never return the foreign byte.
const (
	peerByte    = 'p'
	foreignByte = 'X'
)

// fuzzImms are the immediates worth trying: none, credits within and past
// a window, the close marker, and whatever the input says.
var fuzzImms = []uint64{0, 1, 2, fuzzRQ - creditWRs, fuzzRQ, 1000, closeMarkerImm, 1 << 63}

// snapshot is what a foreign message must not change.
type snapshot struct {
	state                            connState
	rxLen, sqWindow, remoteRQ        int
	creditWRs, pendingCredits, nrecv int
}

func (c *urmaConn) snapshotLocked() snapshot {
	return snapshot{c.stateNow(), c.rxLen, c.sqWindow, c.remoteRQWindow, c.creditWRs, c.pendingCredits, int(c.msgsReceived.Load())}
}

func FuzzReceiveCompletions(f *testing.F) {
	rec := func(kind, src, op, status, lenHi, lenLo, imm, slot byte) []byte {
		return []byte{kind, src, op, status, lenHi, lenLo, imm, slot}
	}
	const send, credit, read = 0, 2, 3
	join := func(rs ...[]byte) []byte { return bytes.Join(rs, nil) }
	f.Add(join(rec(send, 0, 0, 0, 0, 100, 0, 0), rec(read, 200, 0, 0, 0, 0, 0, 0)))
	f.Add(join(rec(send, 1, 0, 0, 0, 40, 0, 0), rec(read, 200, 0, 0, 0, 0, 0, 0), rec(send, 0, 0, 0, 0, 10, 0, 1), rec(read, 200, 0, 0, 0, 0, 0, 0)))
	f.Add(join(rec(send, 1, 1, 0, 0, 0, 6, 0), rec(send, 0, 0, 0, 0, 5, 0, 0)))                                     // a foreign close marker
	f.Add(join(rec(send, 3, 1, 0, 0, 0, 5, 0), rec(send, 0, 1, 0, 0, 0, 1, 0)))                                     // foreign credits, then the peer's
	f.Add(join(rec(send, 1, 0, 0, 0x10, 0, 0, 3), rec(send, 0, 0, 0, 0x10, 0, 0, 3)))                               // oversized, foreign then the peer's
	f.Add(join(rec(send, 0, 0, 0, 0, 200, 0, 0), rec(send, 0, 0, 0, 0, 200, 0, 1), rec(read, 0, 0, 0, 0, 0, 0, 0))) // a short read
	msgs := make([][]byte, 0, 20)
	for i := 0; i < 10; i++ {
		msgs = append(msgs, rec(send, 0, 0, 0, 0, 50, 0, byte(i)), rec(read, 200, 0, 0, 0, 0, 0, 0))
	}
	msgs = append(msgs, rec(credit, 0, 0, 0, 0, 0, 0, 0), rec(credit, 0, 0, 9, 0, 0, 0, 0))
	f.Add(join(msgs...)) // enough reads to return credits, and their completions
	f.Fuzz(func(t *testing.T, in []byte) {
		c, jfr, jetty := fuzzConn(t)
		buf := make([]byte, 2*fuzzBuf)
		for ; len(in) >= 8; in = in[8:] {
			r := in[:8]
			switch r[0] % 4 {
			case 0, 1:
				receive(t, c, jfr, r)
			case credit:
				if jetty.credits == 0 {
					continue // the peer cannot complete a send we never posted
				}
				jetty.credits--
				c.handleBatch([]urma.Completion{{UserCtx: 0, Status: status(r[3])}})
			case read:
				c.mu.Lock()
				queued := c.rxLen
				c.mu.Unlock()
				if queued == 0 {
					continue // a read would wait
				}
				n, err := c.Read(buf[:1+int(r[1])%len(buf)])
				if i := bytes.IndexByte(buf[:n], foreignByte); i >= 0 {
					t.Fatalf("a read returned a foreign message's byte at %d of %d (%v)", i, n, err)
				}
			}
			checkBooks(t, c, jfr, jetty)
		}
	})
}

// status is a send's completion status: SUCCESS mostly, and now and then
// any status.
func status(b byte) urma.Status {
	if b < 192 {
		return urma.StatusSuccess
	}
	return urma.Status(b % 17)
}

// recvStatuses are what a receive can complete with besides SUCCESS: a
// message too long for it, a flush, or a local failure (the flush-done
// record is the jetty's, never a receive's).
var recvStatuses = []urma.Status{urma.StatusLocLen, urma.StatusWRFlushErr, urma.StatusLocAccess, urma.StatusLocDataPoison, urma.StatusRemAccessAbort}

// recvStatus is SUCCESS mostly, and now and then one of recvStatuses.
func recvStatus(b byte) urma.Status {
	if b < 192 {
		return urma.StatusSuccess
	}
	return recvStatuses[int(b)%len(recvStatuses)]
}

// receive completes one receive as record r says: from the peer or a
// foreign jetty, with an opcode, status, length and immediate, for a
// posted slot or (rarely) any user context at all.
func receive(t *testing.T, c *urmaConn, jfr *bookJFR, r []byte) {
	t.Helper()
	foreign := r[1]&1 != 0
	src := fuzzPeer
	if foreign {
		switch r[1] >> 1 & 3 {
		case 0:
			src.ID++ // another jetty of the peer's device
		case 1:
			src.EID[15]++ // the same id on another device
		case 2:
			src = urma.JettyID{} // no source at all
		default:
			src.UASID++ // only the uasid differs: hardware leaves it unfilled, so this is the peer
			foreign = false
		}
	}
	cr := urma.Completion{
		Recv: true, Status: recvStatus(r[3]), Opcode: urma.Opcode(r[2] % 4), RemoteID: src,
		CompletionLen: uint32(r[4])<<8 | uint32(r[5]),
	}
	if cr.Opcode == urma.CROpSendWithImm {
		if i := int(r[6]); i < len(fuzzImms) {
			cr.Imm = fuzzImms[i]
		} else {
			cr.Imm = uint64(r[6])
		}
	}
	posted := jfr.slots()
	valid := len(posted) > 0 && r[7] < 250
	if valid {
		cr.UserCtx = posted[int(r[7])%len(posted)]
		delete(jfr.posted, cr.UserCtx) // the device took it
		if cr.Status == urma.StatusSuccess && int(cr.CompletionLen) > fuzzBuf {
			cr.Status, cr.CompletionLen = urma.StatusLocLen, 0
		}
		if cr.Status == urma.StatusSuccess {
			fill := byte(peerByte)
			if foreign {
				fill = foreignByte
			}
			b := c.rx[cr.UserCtx-1]
			copy(b.data[:cr.CompletionLen], bytes.Repeat([]byte{fill}, int(cr.CompletionLen)))
		}
	} else {
		cr.UserCtx = uint64(r[7]) // not a posted receive: a broken device, never a peer
	}
	c.mu.Lock()
	before := c.snapshotLocked()
	c.mu.Unlock()
	c.handleBatch([]urma.Completion{cr})
	if !foreign || !valid || !carriesMessage(cr.Status) {
		return
	}
	c.mu.Lock()
	after := c.snapshotLocked()
	reposted := c.rxState[cr.UserCtx-1] == rxPosted
	c.mu.Unlock()
	if after != before || !reposted || !jfr.posted[cr.UserCtx] {
		t.Fatalf("a foreign message (%+v) changed the connection: %+v -> %+v, its receive reposted %v (device: %v)",
			cr, before, after, reposted, jfr.posted[cr.UserCtx])
	}
}

// checkBooks checks the connection's books against the device's.
func checkBooks(t *testing.T, c *urmaConn, jfr *bookJFR, jetty *bookJetty) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if jfr.violation != nil {
		t.Fatal(jfr.violation)
	}
	if c.sqWindow < 0 || c.sqWindow > c.windowCap || c.remoteRQWindow < 0 || c.remoteRQWindow > c.windowCap {
		t.Fatalf("windows out of bounds: send %d, remote receive %d, capacity %d", c.sqWindow, c.remoteRQWindow, c.windowCap)
	}
	if c.creditWRs < 0 || c.creditWRs > creditWRs || c.creditWRs+jetty.credits != creditWRs {
		t.Fatalf("%d credit work requests free with %d credit messages outstanding, of %d", c.creditWRs, jetty.credits, creditWRs)
	}
	if c.pendingCredits < 0 || c.pendingCredits > fuzzRQ || c.rxLen < 0 || c.rxLen > fuzzRQ {
		t.Fatalf("pending credits %d, queued messages %d, of %d receives", c.pendingCredits, c.rxLen, fuzzRQ)
	}
	if c.stateNow() == stateFailed {
		return // its books no longer matter: nothing is posted again
	}
	posted, queued := 0, 0
	for _, st := range c.rxState {
		switch st {
		case rxPosted:
			posted++
		case rxQueued:
			queued++
		}
	}
	if posted != len(jfr.posted) || queued != c.rxLen {
		t.Fatalf("the connection counts %d receives posted and %d queued; the device has %d posted, the queue %d", posted, queued, len(jfr.posted), c.rxLen)
	}
}
