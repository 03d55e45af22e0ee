package soft

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A send that fails on the sender's side (a bad SGE, a message larger than
// the device or the peer takes) while an older send of the jetty is still
// out completes after that older one, in post order, with its own error;
// the sends behind it are flushed and never reach the peer. The older send
// is held by RNR: the receiver posts no receive until the newer sends are
// posted.
func TestLocalErrorKeepsPostOrder(t *testing.T) {
	const small = 4096 // MaxMsgSize of the device a length case shrinks
	kinds := []struct {
		name      string
		want      urma.Status
		smallA    bool // the sender's device takes at most small bytes
		smallB    bool // the receiver's device does
		bad       func(a, b *side) urma.SGE
		notInproc bool // the in-process fabric has no peer limit to meet
	}{
		{name: "local access", want: urma.StatusLocAccess,
			bad: func(a, _ *side) urma.SGE { return urma.SGE{Segment: a.seg, Offset: 1<<20 - 8, Len: 64} }},
		{name: "foreign segment", want: urma.StatusLocAccess,
			bad: func(_, b *side) urma.SGE { return urma.SGE{Segment: b.seg, Len: 64} }},
		{name: "local length", want: urma.StatusLocLen, smallA: true,
			bad: func(a, _ *side) urma.SGE { return urma.SGE{Segment: a.seg, Len: small + 1} }},
		{name: "peer length", want: urma.StatusLocLen, smallB: true, notInproc: true,
			bad: func(a, _ *side) urma.SGE { return urma.SGE{Segment: a.seg, Len: small + 1} }},
	}
	fabrics := append([]wireFabric{
		{"inproc", func(*testing.T) Options { return Options{Fabric: NewFabric()} }},
	}, wireFabrics()...)
	for _, f := range fabrics {
		for _, k := range kinds {
			t.Run(f.name+"/"+k.name, func(t *testing.T) {
				if k.notInproc && f.name == "inproc" {
					t.Skip("the in-process fabric has no peer message limit")
				}
				noLeaks(t)
				base := f.opts(t)
				oa, ob := base, base
				if k.smallA {
					oa.Devices = []DeviceSpec{{Caps: urma.DeviceCaps{MaxMsgSize: small}}}
				}
				if k.smallB {
					ob.Devices = []DeviceSpec{{Caps: urma.DeviceCaps{MaxMsgSize: small}}}
				}
				a := newSide(t, newProvider(t, oa), urma.JettyConfig{RNRRetry: urma.RNRRetryForever}, 64)
				b := newSide(t, newProvider(t, ob), urma.JettyConfig{}, 64)
				target := a.importJetty(b)
				// No receive is posted: send 7 is retried until one is.
				mustOK(t, a.send(target, 7, 0, 64, 0), "send 7")
				bad := k.bad(a, b)
				mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable,
					Target: target, UserCtx: 8, SGEs: []urma.SGE{bad}}), "post send 8, which fails locally")
				mustOK(t, a.send(target, 9, 64, 64, 0), "send 9, behind the failed one")
				var none [4]urma.Completion
				if n, _ := a.sjfc.Poll(none[:]); n != 0 {
					t.Fatalf("completions %+v while send 7 waits for a receive", none[:n])
				}
				b.postRecv(1, 0, 64)
				b.postRecv(2, 64, 64) // room for 9, which must not come
				got := pollN(t, a.sjfc, 3, 10*time.Second)
				want := []urma.Completion{
					{UserCtx: 7, Status: urma.StatusSuccess},
					{UserCtx: 8, Status: k.want},
					{UserCtx: 9, Status: urma.StatusWRFlushErr},
				}
				wantInOrder(t, got, want)
				if st := a.jetty.State(); st != urma.JettyError {
					t.Fatalf("jetty state %v after send 8 failed, want ERROR", st)
				}
				if r := pollN(t, b.rjfc, 1, 10*time.Second)[0]; r.UserCtx != 1 || r.Status != urma.StatusSuccess {
					t.Fatalf("receive %+v, want send 7 in receive 1", r)
				}
			})
		}
	}
}

// The peer's message limit is known only once its connection is up: a
// send posted while the connection is being dialed is found too large when
// its frame is written, on the writer's goroutine. It still completes after
// the older send to another peer, outstanding meanwhile, and the send
// behind it is flushed without going out.
func TestPeerLengthFoundAtWriteKeepsPostOrder(t *testing.T) {
	noLeaks(t)
	const small = 4096
	qDone, pDone := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { <-qDone; <-pDone }) // registered first: runs once the provider has hung up
	opts := socketOpts()
	opts.PeerTimeout = time.Minute // only the test breaks a connection
	p := newProvider(t, opts)
	a := newSide(t, p, urma.JettyConfig{Mode: urma.RM}, 64)
	// Q reads send 7 and answers it when told.
	q := newFakePeer(t)
	answerQ := make(chan struct{})
	q.serve(qDone, func(nc net.Conn, br *bufio.Reader) {
		ackWhenTold(nc, br, answerQ)
		io.Copy(io.Discard, br) // until the provider hangs up
	})
	defer close(answerQ)
	// P answers the import on a first connection, which the test breaks,
	// and takes the redial announcing a smaller message limit; no SEND may
	// come on it.
	pp := newFakePeer(t)
	firstDone := make(chan struct{})
	go func() {
		defer close(pDone)
		nc, br := pp.accept()
		if nc != nil {
			io.Copy(io.Discard, br) // until the test breaks it
			nc.Close()
		}
		close(firstDone)
		pp.maxMsg = small
		nc, br = pp.handshake()
		if nc == nil {
			return
		}
		defer nc.Close()
		for {
			typ, err := readFrameType(br)
			if err != nil {
				return
			}
			if typ == frameSend || typ == frameSendRef {
				t.Errorf("P received frame type %d after send 8 failed", typ)
			}
		}
	}()
	tq, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: q.eid, ID: 5}, urma.RM, 9)
	mustOK(t, err, "import from Q")
	defer tq.Close()
	tp, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: pp.eid, ID: 5}, urma.RM, 9)
	mustOK(t, err, "import from P")
	defer tp.Close()
	for _, c := range p.conns() {
		if c.peerEID == pp.eid {
			c.fail(errors.New("broken by the test")) // no send is out to P: the jetty stays READY
		}
	}
	<-firstDone // P's redial handshake reads maxMsg after this
	mustOK(t, a.send(tq, 7, 0, 64, 0), "send 7 to Q")
	mustOK(t, a.send(tp, 8, 0, small+1, 0), "send 8 to P, larger than P's new limit")
	j := a.jetty.(*jetty)
	eventually.Holds(t, "P's writer to find send 8 too large", 0, func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.slot(1).state != slotInflight
	})
	if err := a.send(tp, 9, 0, 64, 0); err != nil {
		t.Fatalf("send 9, behind the failed send 8 while send 7 is out: %v", err)
	}
	answerQ <- struct{}{}
	got := pollN(t, a.sjfc, 3, 10*time.Second)
	want := []urma.Completion{
		{UserCtx: 7, Status: urma.StatusSuccess},
		{UserCtx: 8, Status: urma.StatusLocLen},
		{UserCtx: 9, Status: urma.StatusWRFlushErr},
	}
	wantInOrder(t, got, want)
}

// readFrameType reads one whole frame and returns its type.
func readFrameType(br *bufio.Reader) (byte, error) {
	var hb [5]byte
	if _, err := io.ReadFull(br, hb[:]); err != nil {
		return 0, err
	}
	n := be.Uint32(hb[:4])
	if n == 0 {
		return 0, errors.New("empty frame")
	}
	_, err := br.Discard(int(n) - 1)
	return hb[4], err
}

// A send that failed on this side waits for the older send; when that one
// fails instead (the peer refuses it, the connection dies, the jetty is
// moved to ERROR), the jetty's error is the older send's and the held send
// is flushed with the rest behind it, in post order.
func TestHeldLocalErrorFlushedBehindOlderFailure(t *testing.T) {
	cases := []struct {
		name string
		fail func(t *testing.T, a *side, nc net.Conn, h sendHeader) // makes send 7 fail
		want []urma.Completion
	}{
		{"peer refuses", func(t *testing.T, _ *side, nc net.Conn, h sendHeader) {
			var b [4 + ackLen]byte
			_, err := nc.Write(encodeAck(b[:], &ackFrame{status: urma.StatusRemAccessAbort, src: h.src, dst: h.dst, tag: h.tag}))
			mustOK(t, err, "answer send 7")
		}, []urma.Completion{
			{UserCtx: 7, Status: urma.StatusRemAccessAbort}, {UserCtx: 8, Status: urma.StatusWRFlushErr}, {UserCtx: 9, Status: urma.StatusWRFlushErr}}},
		{"connection dies", func(t *testing.T, _ *side, nc net.Conn, _ sendHeader) {
			mustOK(t, nc.Close(), "hang up")
		}, []urma.Completion{
			{UserCtx: 7, Status: urma.StatusAckTimeout}, {UserCtx: 8, Status: urma.StatusWRFlushErr}, {UserCtx: 9, Status: urma.StatusWRFlushErr}}},
		{"SetError", func(t *testing.T, a *side, _ net.Conn, _ sendHeader) {
			mustOK(t, a.jetty.SetError(), "set error")
		}, []urma.Completion{
			{UserCtx: 7, Status: urma.StatusWRFlushErr}, {UserCtx: 8, Status: urma.StatusWRFlushErr}, {UserCtx: 9, Status: urma.StatusWRFlushErr},
			{Status: urma.StatusWRFlushErrDone}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			peerDone := make(chan struct{})
			t.Cleanup(func() { <-peerDone }) // registered first: runs once the provider has hung up
			opts := socketOpts()
			opts.PeerTimeout = time.Minute // only the test breaks the connection
			p := newProvider(t, opts)
			a := newSide(t, p, urma.JettyConfig{}, 64)
			f := newFakePeer(t)
			type sent struct {
				nc net.Conn
				h  sendHeader
			}
			got7 := make(chan sent, 1)
			go func() {
				defer close(peerDone)
				nc, br := f.accept()
				if nc == nil {
					close(got7)
					return
				}
				defer nc.Close()
				h, err := readSend(br)
				if err != nil {
					close(got7)
					return
				}
				got7 <- sent{nc, h}
				for {
					typ, err := readFrameType(br)
					if err != nil {
						return
					}
					if typ == frameSend {
						t.Errorf("the peer received a SEND behind send 7")
					}
				}
			}()
			target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
			mustOK(t, err, "import from the fake peer")
			defer target.Close()
			mustOK(t, a.send(target, 7, 0, 64, 0), "send 7")
			s7, ok := <-got7
			if !ok {
				t.Fatal("the peer did not receive send 7")
			}
			mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 8,
				SGEs: []urma.SGE{{Segment: a.seg, Offset: 1<<20 - 8, Len: 64}}}), "send 8, past the segment's end")
			mustOK(t, a.send(target, 9, 64, 64, 0), "send 9")
			var none [4]urma.Completion
			if n, _ := a.sjfc.Poll(none[:]); n != 0 {
				t.Fatalf("completions %+v while send 7 is out", none[:n])
			}
			c.fail(t, a, s7.nc, s7.h)
			got := pollN(t, a.sjfc, len(c.want), 10*time.Second)
			wantInOrder(t, got, c.want)
		})
	}
}
