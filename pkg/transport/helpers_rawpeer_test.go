package transport

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// rawPeer is a hand-driven URMA client, built from the provider's verbs and
// the handshake codec, that can break the data-plane rules on purpose (and
// stands in for a brpc peer: no token, no extension).
type rawPeer struct {
	t       testing.TB
	ctx     urma.Context
	jfc     urma.JFC
	jfr     urma.JFR
	jetty   urma.Jetty
	mem     *urma.Memory
	seg     urma.Segment
	target  urma.RemoteJetty
	rseg    urma.RemoteSegment
	tcp     net.Conn
	server  handshake.Hello
	credits int   // credits the server returned so far
	batches []int // the credit messages, in order of arrival
	// ours makes the peer present our extension (an SQ depth) and use the
	// server's token, as our own client would; without it the peer is a
	// brpc client, which sees no token and presents none.
	ours bool
	// marks makes the peer's hello say it ends with a close marker, as
	// ours does (with ours).
	marks bool
}

const rawBuf = 4096

func newRawPeer(t *testing.T, prov urma.Provider, addr string) *rawPeer {
	t.Helper()
	r := newRawQueues(t, prov)
	r.dial(addr)
	return r
}

// serveRawPeer listens with scfg (made NoToken: the raw peer is a brpc
// client, which presents no token), connects a raw peer and returns it with
// the server's end of the connection, in URMA mode.
func serveRawPeer(t *testing.T, scfg Config, peer urma.Provider) (*rawPeer, *urmaConn) {
	t.Helper()
	scfg.NoToken = true
	ln, err := ListenTransport("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	r := newRawPeer(t, peer, ln.Addr().String())
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if c.(Conn).Mode() != ModeURMA {
		t.Fatalf("mode %s (%s)", c.(Conn).Mode(), c.(Conn).FallbackReason())
	}
	return r, c.(*urmaConn)
}

// newOurRawPeer is newRawPeer presenting our extension.
func newOurRawPeer(t *testing.T, prov urma.Provider, addr string) *rawPeer {
	t.Helper()
	r := newRawQueues(t, prov)
	r.ours = true
	r.dial(addr)
	return r
}

// newRawQueues opens a context on prov and creates the peer's queues and
// memory, its 16 receives posted; no connection yet.
func newRawQueues(t testing.TB, prov urma.Provider) *rawPeer {
	t.Helper()
	return newRawQueuesPosting(t, prov, 16)
}

// newRawQueuesPosting is newRawQueues with posted of the 16 receives
// posted: a peer that posts none never takes a SEND (RNR, forever).
func newRawQueuesPosting(t testing.TB, prov urma.Provider, posted int) *rawPeer {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	r := &rawPeer{t: t}
	t.Cleanup(r.close)
	var err error
	r.ctx, err = prov.Open("", 0)
	must(err)
	r.jfc, err = r.ctx.CreateJFC(urma.JFCConfig{Depth: 128})
	must(err)
	r.jfr, err = r.ctx.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 16, JFC: r.jfc})
	must(err)
	r.jetty, err = r.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 16, SendJFC: r.jfc, JFR: r.jfr, RNRRetry: 7})
	must(err)
	r.mem, err = urma.AllocMemory(32 * rawBuf)
	must(err)
	r.seg, err = r.ctx.RegisterSegment(r.mem, urma.SegmentConfig{Access: urma.AccessRead | urma.AccessWrite})
	must(err)
	for i := 0; i < posted; i++ {
		must(r.jfr.PostRecv(&urma.RecvWR{UserCtx: uint64(i), SGEs: []urma.SGE{{Segment: r.seg, Offset: uint64(i * rawBuf), Len: rawBuf}}}))
	}
	return r
}

// hello describes the raw peer: as brpc would (no extension), or as ours.
func (r *rawPeer) hello() handshake.Hello {
	id, sid := r.jetty.ID(), r.seg.ID()
	h := handshake.Hello{
		BufferSize: rawBuf, RecvBufferCnt: 15, JettyID: id.ID, EID: id.EID, UASID: id.UASID, TPType: handshake.TPCTP,
		SegEID: sid.EID, SegUASID: sid.UASID, SegVA: sid.VA, SegLen: sid.Len, SegTokenID: sid.TokenID,
	}
	if r.ours {
		h.SQSize = 16
		h.CloseMarker = r.marks
	}
	return h
}

// dial runs the client side of the handshake with the server at addr.
func (r *rawPeer) dial(addr string) {
	t := r.t
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	r.tcp, err = net.Dial("tcp", addr)
	must(err)
	_, err = r.tcp.Write(handshake.AppendV2(nil, r.hello()))
	must(err)
	magic := make([]byte, 4)
	_, err = io.ReadFull(r.tcp, magic)
	must(err)
	r.server, _, err = handshake.ReadHello(r.tcp, magic)
	must(err)
	h := r.server
	token := urma.Token(0) // brpc never sees our extension
	if r.ours {
		token = urma.Token(h.Token)
	}
	r.rseg, err = r.ctx.ImportSegment(urma.SegmentID{EID: h.SegEID, UASID: h.SegUASID, VA: h.SegVA, Len: h.SegLen, TokenID: h.SegTokenID}, token)
	must(err)
	r.target, err = r.ctx.ImportJetty(context.Background(), urma.JettyID{EID: h.EID, UASID: h.UASID, ID: h.JettyID}, urma.RM, token)
	must(err)
	_, err = r.tcp.Write(handshake.AppendAck(nil, true))
	must(err)
}

func (r *rawPeer) close() {
	closePeer(r.tcp, r.mem, r.ctx, r.target, r.rseg, r.jetty, r.jfr, r.jfc, r.seg)
}

// closePeer closes a test peer's TCP connection, then its imports and
// queues in the order given, frees its memory and closes its context; nil
// ones are skipped.
func closePeer(tcp net.Conn, mem *urma.Memory, ctx urma.Context, queues ...io.Closer) {
	if tcp != nil {
		_ = tcp.Close()
	}
	for _, c := range queues {
		if c != nil {
			_ = c.Close()
		}
	}
	if mem != nil {
		_ = mem.Free()
	}
	if ctx != nil {
		_ = ctx.Close()
	}
}

// send posts one SEND (n payload bytes from buffer 20) or, with imm != 0, a
// SEND_WITH_IMM, and waits for its completion.
func (r *rawPeer) send(n int, imm uint64) urma.Status {
	r.t.Helper()
	op := urma.OpSend
	if imm != 0 {
		op = urma.OpSendWithImm
	}
	return r.sendOp(op, n, imm)
}

// sendOp posts one send of opcode op (n payload bytes from buffer 20, imm
// as its immediate) and waits for its completion.
func (r *rawPeer) sendOp(op urma.Opcode, n int, imm uint64) urma.Status {
	r.t.Helper()
	wr := urma.SendWR{Opcode: op, Flags: urma.SendCompleteEnable, Target: r.target, UserCtx: 99, Imm: imm}
	if n > 0 {
		wr.SGEs = []urma.SGE{{Segment: r.seg, Offset: 20 * rawBuf, Len: uint32(n)}}
	}
	if err := r.jetty.PostSend(&wr); err != nil {
		r.t.Fatal(err)
	}
	cs := make([]urma.Completion, 8)
	var status urma.Status
	eventually.Holds(r.t, "the send's completion", 5*time.Second, func() bool {
		k, err := r.jfc.Poll(cs)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, c := range cs[:k] {
			if c.Recv && c.Opcode == urma.CROpSendWithImm && c.Status == urma.StatusSuccess {
				r.credits += int(c.Imm)
				r.batches = append(r.batches, int(c.Imm))
				slot := c.UserCtx
				if err := r.jfr.PostRecv(&urma.RecvWR{UserCtx: slot, SGEs: []urma.SGE{{Segment: r.seg, Offset: slot * rawBuf, Len: rawBuf}}}); err != nil {
					r.t.Fatal(err)
				}
			}
			if !c.Recv && c.UserCtx == 99 {
				status = c.Status
				return true
			}
		}
		return false
	})
	return status
}

// injectInto imports the jetty id with token and posts one send of opcode
// op from the raw peer's jetty (payload copied to buffer 20, imm as its
// immediate), and returns the send's completion status.
func (r *rawPeer) injectInto(id urma.JettyID, token urma.Token, op urma.Opcode, payload []byte, imm uint64) urma.Status {
	r.t.Helper()
	rj, err := r.ctx.ImportJetty(context.Background(), id, urma.RM, token)
	if err != nil {
		r.t.Fatalf("import the victim's jetty %s/%d: %v", id.EID, id.ID, err)
	}
	own := r.target
	r.target = rj
	defer func() {
		r.target = own
		_ = rj.Close()
	}()
	copy(r.mem.Bytes()[20*rawBuf:], payload)
	return r.sendOp(op, len(payload), imm)
}
