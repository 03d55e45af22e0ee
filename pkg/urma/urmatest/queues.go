package urmatest

import (
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func init() {
	register("SQDepthEnforced", testSQDepth)
	register("JFRDepthEnforced", testJFRDepth)
	register("DepthAboveCapsRefused", testDepthAboveCaps)
	register("TooManySGEsRefused", testTooManySGEs)
	register("ReceiveTooSmall", testRecvTooSmall)
	register("RNRRetryExhausted", testRNRExhausted)
	register("RNRDeliversWhenReceivePosted", testRNRDelivers)
	register("RNRDeliversWithinFiniteRetries", testRNRFinite)
	register("LocalErrorInPostOrder", testLocalErrorInPostOrder)
	register("SendCompleteEnable", testCompleteEnable)
	register("SetErrorFlushes", testSetErrorFlush)
}

// Posting past the SQ depth fails with ErrAgain and the queue does not grow;
// a completion frees a slot. (liburma says URMA_ENOMEM: hw/udma/udma_u_jfs.c:945-947.)
func testSQDepth(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{SQDepth: 4})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	// No receive is posted and RNR retries forever: sends stay outstanding.
	for i := 0; i < 4; i++ {
		a.send(target, uint64(i), i*64, 64)
	}
	for i := 0; i < 3; i++ {
		wantErr(t, a.jetty.PostSend(a.sendWR(target, 99, 0, 64)), urma.ErrAgain, "post past the SQ depth")
	}
	b.postRecv(0, 0, 64)
	if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; c.Status != urma.StatusSuccess || c.UserCtx != 0 {
		t.Fatalf("first send completed as %+v", c)
	}
	a.send(target, 4, 4*64, 64) // the freed slot takes one more
	wantErr(t, a.jetty.PostSend(a.sendWR(target, 99, 0, 64)), urma.ErrAgain, "post past the SQ depth again")
	for i := 1; i < 5; i++ {
		b.postRecv(uint64(i), i*64, 64)
	}
	for i, c := range wait(t, a.sendJFC, 4, waitTimeout) {
		if c.Status != urma.StatusSuccess || c.UserCtx != uint64(i+1) {
			t.Fatalf("send %d completed as %+v", i+1, c)
		}
	}
	wait(t, b.recvJFC, 5, waitTimeout)
}

// Posting past the JFR depth fails with ErrAgain; a consumed receive frees a
// slot. (liburma says URMA_ENOMEM: hw/udma/udma_u_jfr.c:457-460.)
func testJFRDepth(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{RQDepth: 4})
	for i := 0; i < 4; i++ {
		b.postRecv(uint64(i), i*64, 64)
	}
	err := b.jfr.PostRecv(&urma.RecvWR{UserCtx: 9, SGEs: []urma.SGE{{Segment: b.seg, Offset: 0, Len: 64}}})
	wantErr(t, err, urma.ErrAgain, "post past the JFR depth")
	target := a.importFrom(b, b.cfg.Token)
	a.send(target, 1, 0, 64)
	wait(t, b.recvJFC, 1, waitTimeout)
	b.postRecv(4, 4*64, 64)
	err = b.jfr.PostRecv(&urma.RecvWR{UserCtx: 9, SGEs: []urma.SGE{{Segment: b.seg, Offset: 0, Len: 64}}})
	wantErr(t, err, urma.ErrAgain, "post past the JFR depth again")
}

// Depths above the device's capabilities, and zero depths, are refused at
// creation with ErrInval.
func testDepthAboveCaps(t *testing.T, pr Pair) {
	e := open(t, pr.A, pr.DeviceA, epConfig{})
	caps := e.ctx.Device().Caps
	cases := []struct {
		name   string
		create func() error
	}{
		{"JFC", func() error {
			q, err := e.ctx.CreateJFC(urma.JFCConfig{Depth: caps.MaxJFCDepth + 1})
			closeIf(q, err)
			return err
		}},
		{"JFC-zero", func() error {
			q, err := e.ctx.CreateJFC(urma.JFCConfig{Depth: 0})
			closeIf(q, err)
			return err
		}},
		{"JFR", func() error {
			r, err := e.ctx.CreateJFR(urma.JFRConfig{Mode: e.cfg.Mode, Depth: caps.MaxJFRDepth + 1, JFC: e.recvJFC})
			closeIf(r, err)
			return err
		}},
		{"JFR-SGE", func() error {
			r, err := e.ctx.CreateJFR(urma.JFRConfig{Mode: e.cfg.Mode, Depth: 4, MaxSGE: caps.MaxJFRSge + 1, JFC: e.recvJFC})
			closeIf(r, err)
			return err
		}},
		{"jetty", func() error {
			j, err := e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: caps.MaxJFSDepth + 1, SendJFC: e.sendJFC, JFR: e.jfr})
			closeIf(j, err)
			return err
		}},
		{"jetty-zero", func() error {
			j, err := e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 0, SendJFC: e.sendJFC, JFR: e.jfr})
			closeIf(j, err)
			return err
		}},
		{"jetty-SGE", func() error {
			j, err := e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 4, MaxSGE: caps.MaxJFSSge + 1, SendJFC: e.sendJFC, JFR: e.jfr})
			closeIf(j, err)
			return err
		}},
		{"jetty-RNR-retry", func() error {
			j, err := e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 4, RNRRetry: 8, SendJFC: e.sendJFC, JFR: e.jfr})
			closeIf(j, err)
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantErr(t, c.create(), urma.ErrInval, "create "+c.name) })
	}
}

// closeIf closes an object a create should not have made.
func closeIf[T interface{ Close() error }](o T, err error) {
	if err == nil {
		_ = o.Close()
	}
}

// Work requests with more SGEs than the queue takes are refused.
func testTooManySGEs(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{MaxSGE: 2})
	b := open(t, pr.B, pr.DeviceB, epConfig{MaxSGE: 2})
	target := a.importFrom(b, b.cfg.Token)
	sges := []urma.SGE{{Segment: a.seg, Len: 8}, {Segment: a.seg, Offset: 8, Len: 8}, {Segment: a.seg, Offset: 16, Len: 8}}
	err := a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Target: target, SGEs: sges})
	wantErr(t, err, urma.ErrInval, "post send with 3 SGEs on a 2-SGE jetty")
	rsges := []urma.SGE{{Segment: b.seg, Len: 8}, {Segment: b.seg, Offset: 8, Len: 8}, {Segment: b.seg, Offset: 16, Len: 8}}
	wantErr(t, b.jfr.PostRecv(&urma.RecvWR{SGEs: rsges}), urma.ErrInval, "post receive with 3 SGEs on a 2-SGE JFR")
}

// A receive buffer too small for the message completes with LOC_LEN; the
// sender gets an error completion too and its jetty enters ERROR.
func testRecvTooSmall(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	b.postRecv(77, 0, 16)
	a.send(target, 5, 0, 64)
	rc := wait(t, b.recvJFC, 1, waitTimeout)[0]
	if rc.Status != urma.StatusLocLen || !rc.Recv || rc.UserCtx != 77 {
		t.Errorf("receive completion %+v: want LOC_LEN, s_r 1, user_ctx 77", rc)
	}
	sc := wait(t, a.sendJFC, 1, waitTimeout)[0]
	if sc.Status == urma.StatusSuccess || sc.UserCtx != 5 {
		t.Errorf("send completion %+v: want an error status, user_ctx 5", sc)
	}
	if a.jetty.State() != urma.JettyError {
		t.Errorf("sender jetty state %v after a send error, want ERROR", a.jetty.State())
	}
}

// With no receive posted, a send retries RNRRetry times and completes with
// RNR_RETRY_CNT_EXC; the jetty enters ERROR and refuses further sends.
func testRNRExhausted(t *testing.T, pr Pair) {
	for _, retries := range []uint8{0, 1, 3} {
		t.Run("retry="+string(rune('0'+retries)), func(t *testing.T) {
			a := open(t, pr.A, pr.DeviceA, epConfig{RNRRetry: rnr(retries), MemSize: 64 << 10})
			b := open(t, pr.B, pr.DeviceB, epConfig{MemSize: 64 << 10})
			target := a.importFrom(b, b.cfg.Token)
			a.send(target, 11, 0, 32)
			// The first send may already have failed (a provider can try it
			// at once); then the jetty is in ERROR and refuses the second.
			second := a.jetty.PostSend(a.sendWR(target, 12, 32, 32))
			if second != nil {
				wantErr(t, second, urma.ErrInval, "post behind a failed send")
			}
			n := 2
			if second != nil {
				n = 1
			}
			cs := wait(t, a.sendJFC, n, waitTimeout)
			if cs[0].Status != urma.StatusRNRRetryCntExc || cs[0].UserCtx != 11 {
				t.Errorf("first send completed as %+v, want RNR_RETRY_CNT_EXC", cs[0])
			}
			if n == 2 && (cs[1].Status != urma.StatusWRFlushErr || cs[1].UserCtx != 12) {
				t.Errorf("second send completed as %+v, want WR_FLUSH_ERR", cs[1])
			}
			if a.jetty.State() != urma.JettyError {
				t.Errorf("jetty state %v, want ERROR", a.jetty.State())
			}
			wantErr(t, a.jetty.PostSend(a.sendWR(target, 13, 0, 8)), urma.ErrInval, "post on a jetty in ERROR")
			empty(t, b.recvJFC, "receiver after RNR")
		})
	}
}

// With RNRRetry 7 (forever: urma_jfs_cfg_t.rnr_retry, urma_types.h:565),
// sends wait for receives; once posted, every waiting send is delivered, in
// order and intact.
func testRNRDelivers(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	for i := 0; i < 3; i++ {
		fillRandom(a.bytes(i*1000, 1000), uint64(i))
		a.send(target, uint64(i), i*1000, 1000)
	}
	empty(t, a.sendJFC, "sender before any receive is posted")
	for i := 0; i < 3; i++ {
		b.postRecv(uint64(10+i), 100000+i*1000, 1000)
	}
	for i, c := range wait(t, a.sendJFC, 3, waitTimeout) {
		if c.Status != urma.StatusSuccess || c.UserCtx != uint64(i) {
			t.Fatalf("send %d completed as %+v", i, c)
		}
	}
	for i, c := range wait(t, b.recvJFC, 3, waitTimeout) {
		if c.Status != urma.StatusSuccess || c.UserCtx != uint64(10+i) || c.CompletionLen != 1000 {
			t.Fatalf("receive %d completed as %+v", i, c)
		}
		if string(b.bytes(100000+i*1000, 1000)) != string(a.bytes(i*1000, 1000)) {
			t.Fatalf("message %d corrupted or out of order", i)
		}
	}
}

// A receive posted while a send is between finite RNR retries is delivered.
// The receiver's min RNR timer is the largest, so the retry window is wide.
func testRNRFinite(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{RNRRetry: rnr(3)})
	b := open(t, pr.B, pr.DeviceB, epConfig{MinRNR: 31})
	target := a.importFrom(b, b.cfg.Token)
	a.send(target, 1, 0, 100)
	b.postRecv(2, 0, 100)
	if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("send completed as %+v, want SUCCESS", c)
	}
	wait(t, b.recvJFC, 1, waitTimeout)
}

// A send that fails on the sender's side while an older send is still out
// completes after it: a jetty's completions come in post order
// (docs/liburma.md: "in FIFO order"). The older send's SUCCESS comes
// first, then the failed send's local error, and the jetty enters ERROR:
// the send behind it is flushed (WR_FLUSH_ERR) and never reaches the peer.
// The receiver posts its receives only once all three are posted, so the
// older send waits out RNR (retried forever) meanwhile.
func testLocalErrorInPostOrder(t *testing.T, pr Pair) {
	const memSize = 64 << 10
	kinds := []struct {
		name string
		want []urma.Status
		sges func(t *testing.T, a, b *endpoint) []urma.SGE
	}{
		{"past-segment-end", []urma.Status{urma.StatusLocAccess, urma.StatusLocLen}, func(_ *testing.T, a, _ *endpoint) []urma.SGE {
			return []urma.SGE{{Segment: a.seg, Offset: memSize - 8, Len: 64}}
		}},
		{"foreign-segment", []urma.Status{urma.StatusLocAccess}, func(_ *testing.T, _, b *endpoint) []urma.SGE {
			return []urma.SGE{{Segment: b.seg, Len: 64}}
		}},
		{"longer-than-max-msg", []urma.Status{urma.StatusLocLen}, func(t *testing.T, a, _ *endpoint) []urma.SGE {
			// MaxSGE overlapping SGEs of one segment add up to a byte
			// per SGE more than the device's MaxMsgSize.
			per := a.ctx.Device().Caps.MaxMsgSize/uint64(a.cfg.MaxSGE) + 1
			if per > 64<<20 {
				t.Skipf("MaxMsgSize %d needs %d bytes of memory per SGE", a.ctx.Device().Caps.MaxMsgSize, per)
			}
			mem, err := urma.AllocMemory(int(per))
			must(t, err, "alloc memory")
			a.own(freeOnClose{mem})
			seg, err := a.ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
			must(t, err, "register segment")
			a.own(seg)
			sges := make([]urma.SGE, a.cfg.MaxSGE)
			for i := range sges {
				sges[i] = urma.SGE{Segment: seg, Len: uint32(per)}
			}
			return sges
		}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			a := open(t, pr.A, pr.DeviceA, epConfig{MemSize: memSize})
			b := open(t, pr.B, pr.DeviceB, epConfig{MemSize: memSize})
			target := a.importFrom(b, b.cfg.Token)
			a.send(target, 1, 0, 64) // no receive is posted: RNR until one is
			wr := &urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 2, SGEs: k.sges(t, a, b)}
			if err := a.jetty.PostSend(wr); err != nil {
				t.Skipf("the provider refuses the work request at post (%v): no completion to order", err)
			}
			a.send(target, 3, 64, 64)
			empty(t, a.sendJFC, "while the oldest send waits for a receive")
			b.postRecv(1, 0, 64)
			b.postRecv(2, 64, 64) // room for the third send, which must not come
			cs := wait(t, a.sendJFC, 3, waitTimeout)
			if cs[0].UserCtx != 1 || cs[0].Status != urma.StatusSuccess ||
				cs[1].UserCtx != 2 || !statusIn(cs[1].Status, k.want...) ||
				cs[2].UserCtx != 3 || cs[2].Status != urma.StatusWRFlushErr {
				t.Fatalf("completions %v, want user_ctx 1 SUCCESS, 2 %v, 3 WR_FLUSH_ERR", cs, k.want)
			}
			if a.jetty.State() != urma.JettyError {
				t.Errorf("jetty state %v after a send error, want ERROR", a.jetty.State())
			}
			if rc := wait(t, b.recvJFC, 1, waitTimeout)[0]; rc.Status != urma.StatusSuccess || rc.UserCtx != 1 {
				t.Errorf("receive %+v, want the first send in receive 1", rc)
			}
			empty(t, b.recvJFC, "receiver after the flushed send")
		})
	}
}

// freeOnClose frees memory when the endpoint's extra objects are closed.
type freeOnClose struct{ m *urma.Memory }

func (f freeOnClose) Close() error { return f.m.Free() }

// Without SendCompleteEnable a successful send produces no completion.
func testCompleteEnable(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	for i := 0; i < 4; i++ {
		b.postRecv(uint64(i), i*64, 64)
	}
	for i := 0; i < 3; i++ {
		wr := a.sendWR(target, uint64(100+i), 0, 64)
		wr.Flags = 0
		must(t, a.jetty.PostSend(wr), "post unsignaled send")
	}
	a.send(target, 103, 0, 64)
	c := wait(t, a.sendJFC, 1, waitTimeout)[0]
	if c.UserCtx != 103 || c.Status != urma.StatusSuccess {
		t.Fatalf("first send completion %+v, want the signaled send 103", c)
	}
	empty(t, a.sendJFC, "sender after the signaled send")
	wait(t, b.recvJFC, 4, waitTimeout)
}

// SetError flushes outstanding sends with WR_FLUSH_ERR, in order, then adds
// exactly one WR_FLUSH_ERR_DONE; the jetty refuses further sends. (This is
// how providers present hardware's two-phase flush: see
// testSetErrorAfterSendError.)
func testSetErrorFlush(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	for i := 0; i < 3; i++ {
		wr := a.sendWR(target, uint64(i+1), i*64, 64)
		if i == 1 {
			wr.Flags = 0 // unsignaled sends are flushed too
		}
		must(t, a.jetty.PostSend(wr), "post send")
	}
	must(t, a.jetty.SetError(), "set jetty error")
	cs := wait(t, a.sendJFC, 4, waitTimeout)
	for i := 0; i < 3; i++ {
		if cs[i].Status != urma.StatusWRFlushErr || cs[i].UserCtx != uint64(i+1) || cs[i].Recv {
			t.Errorf("flushed send %d: %+v, want WR_FLUSH_ERR user_ctx %d", i, cs[i], i+1)
		}
	}
	if cs[3].Status != urma.StatusWRFlushErrDone {
		t.Errorf("last record %+v, want WR_FLUSH_ERR_DONE", cs[3])
	}
	must(t, a.jetty.SetError(), "set jetty error again")
	empty(t, a.sendJFC, "after a second SetError")
	if a.jetty.State() != urma.JettyError {
		t.Errorf("state %v, want ERROR", a.jetty.State())
	}
	wantErr(t, a.jetty.PostSend(a.sendWR(target, 9, 0, 8)), urma.ErrInval, "post on a jetty in ERROR")
	// An idle jetty flushes nothing but still reports the end of the flush.
	idle := a.newJetty()
	a.own(idle)
	must(t, idle.SetError(), "set idle jetty error")
	if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; c.Status != urma.StatusWRFlushErrDone || c.LocalID != idle.ID().ID {
		t.Errorf("idle jetty flush record %+v, want WR_FLUSH_ERR_DONE from jetty %d", c, idle.ID().ID)
	}
}
