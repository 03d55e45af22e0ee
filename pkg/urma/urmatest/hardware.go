package urmatest

import (
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Rules that UB hardware imposes and that a software provider could easily
// get wrong. Each names its source in UMDK (openeuler-mirror/umdk at
// 00cc16f1; hw/udma is the udma provider, core is liburma itself).
func init() {
	register("ModeMustMatchJFR", testModeMustMatch)
	register("RCPostIgnoresTarget", testRCIgnoresTarget)
	register("RCBoundTargetCannotBeUnimported", testRCBoundTarget)
	register("JFCCloseWaitsForAcks", testJFCCloseWaitsForAcks)
	register("SetErrorAfterSendError", testSetErrorAfterSendError)
}

// A jetty's mode must equal its JFR's (hw/udma/udma_u_jetty.c:105-118,
// init_jetty_trans_mode returns EINVAL), and a JFR must name its mode
// (urma_jfr_cfg_t.trans_mode is required, urma_types.h).
func testModeMustMatch(t *testing.T, pr Pair) {
	e := open(t, pr.A, pr.DeviceA, epConfig{Mode: urma.RC})
	_, err := e.ctx.CreateJFR(urma.JFRConfig{Depth: 4, JFC: e.recvJFC})
	wantErr(t, err, urma.ErrInval, "create a JFR without a transport mode")
	j, err := e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 4, SendJFC: e.sendJFC, JFR: e.jfr})
	closeIf(j, err)
	wantErr(t, err, urma.ErrInval, "create an RM jetty on an RC JFR")
	rm, err := e.ctx.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 4, JFC: e.recvJFC})
	must(t, err, "create an RM JFR")
	e.own(rm)
	j, err = e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 4, SendJFC: e.sendJFC, JFR: rm})
	closeIf(j, err)
	wantErr(t, err, urma.ErrInval, "create an RC jetty on an RM JFR")
	j, err = e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 4, SendJFC: e.sendJFC, JFR: rm})
	must(t, err, "create an RM jetty on an RM JFR")
	e.own(j)
}

// An RC jetty is bound to the target of its first send (urma_bind_jetty);
// udma then takes the bound target for every send and ignores the work
// request's (hw/udma/udma_u_jfs.c:960-963). A send naming another target
// still reaches the bound one.
func testRCIgnoresTarget(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	c := open(t, pr.B, pr.DeviceB, epConfig{})
	tb, tc := a.importFrom(b, b.cfg.Token), a.importFrom(c, c.cfg.Token)
	b.postRecv(1, 0, 64)
	b.postRecv(2, 64, 64)
	b.postRecv(3, 128, 64)
	c.postRecv(9, 0, 64)
	a.send(tb, 1, 0, 64)
	a.send(tc, 2, 0, 64)
	wr := a.sendWR(nil, 3, 0, 64) // a bound RC jetty needs no target at all
	must(t, a.jetty.PostSend(wr), "post send without a target on a bound RC jetty")
	for i, cr := range wait(t, a.sendJFC, 3, waitTimeout) {
		if cr.Status != urma.StatusSuccess || cr.UserCtx != uint64(i+1) || cr.RemoteID.ID != b.jetty.ID().ID {
			t.Errorf("send %d completed as %+v, want SUCCESS from the bound target %d", i+1, cr, b.jetty.ID().ID)
		}
	}
	for i, cr := range wait(t, b.recvJFC, 3, waitTimeout) {
		if cr.Status != urma.StatusSuccess || cr.UserCtx != uint64(i+1) {
			t.Errorf("bound target's receive %d completed as %+v", i+1, cr)
		}
	}
	empty(t, c.recvJFC, "the target a bound RC jetty's work request named")
}

// A bound RC target cannot be unimported (hw/udma/udma_u_jetty.c:459-463:
// udma_u_unimport_jetty fails while the RC target's TP is in use); once the
// jetty is closed (unbound), it can. An import never bound goes at once.
func testRCBoundTarget(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	unused := a.importFrom(b, b.cfg.Token)
	target := a.importFrom(b, b.cfg.Token)
	must(t, unused.Close(), "unimport an unbound RC target")
	j := a.newJetty()
	b.postRecv(1, 0, 64)
	must(t, j.PostSend(a.sendWR(target, 1, 0, 64)), "post send")
	wait(t, a.sendJFC, 1, waitTimeout)
	wantErr(t, target.Close(), urma.ErrBusy, "unimport a bound RC target")
	must(t, j.Close(), "close the bound jetty")
	must(t, target.Close(), "unimport after the jetty is gone")
	wait(t, b.recvJFC, 1, waitTimeout)
}

// Deleting a JFC waits until every event was acknowledged: urma_delete_jfc
// blocks on the JFC's event condition until comp_events_acked equals the
// events reported (core/urma_cmd.c:1174-1185).
func testJFCCloseWaitsForAcks(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{Events: true})
	// A JFC of its own on b's JFCE, with a JFR and jetty that receive.
	jfc, err := b.ctx.CreateJFC(urma.JFCConfig{Depth: 16, JFCE: b.jfce})
	must(t, err, "create JFC")
	jfr, err := b.ctx.CreateJFR(urma.JFRConfig{Mode: b.cfg.Mode, Depth: 4, JFC: jfc, TokenPolicy: urma.TokenPlainText, Token: b.cfg.Token})
	must(t, err, "create JFR")
	j, err := b.ctx.CreateJetty(urma.JettyConfig{Mode: b.cfg.Mode, SQDepth: 4, SendJFC: b.sendJFC, JFR: jfr})
	must(t, err, "create jetty")
	target := a.importJetty(j.ID(), b.cfg.Token)
	must(t, jfc.Rearm(false), "rearm")
	must(t, jfr.PostRecv(&urma.RecvWR{UserCtx: 1, SGEs: []urma.SGE{{Segment: b.seg, Len: 64}}}), "post receive")
	a.send(target, 1, 0, 64)
	wait(t, a.sendJFC, 1, waitTimeout)
	out := make([]urma.JFC, 1)
	var n int
	deadline := time.Now().Add(waitTimeout)
	for n == 0 && time.Now().Before(deadline) {
		n, err = b.jfce.Wait(out, 100*time.Millisecond)
		must(t, err, "wait JFCE")
	}
	if n != 1 || out[0] != jfc {
		t.Fatalf("wait returned %d JFCs %v, want the new JFC", n, out[:n])
	}
	wait(t, jfc, 1, waitTimeout)
	must(t, j.Close(), "close jetty")
	must(t, jfr.Close(), "close JFR")
	closed := make(chan error, 1)
	go func() { closed <- jfc.Close() }()
	// The close must still be waiting: this checks an absence, so it can
	// only wait a while; a provider that returns early fails here.
	select {
	case err := <-closed:
		t.Fatalf("JFC close returned (%v) with an event not acknowledged", err)
	case <-time.After(100 * time.Millisecond):
	}
	jfc.Ack(1)
	select {
	case err := <-closed:
		must(t, err, "close JFC after the ack")
	case <-time.After(waitTimeout):
		t.Fatal("JFC close did not return after the event was acknowledged")
	}
}

// A jetty that entered ERROR by itself (a failed send) flushes the rest
// of its queue with WR_FLUSH_ERR, but reports no WR_FLUSH_ERR_DONE until
// SetError asks; SetError then adds exactly one. On hardware the
// FLUSH_ERR_DONE arrives first and the unhandled requests only then, from
// urma_flush_jetty (hw/udma/udma_u_jfc.c:728-731, udma_u_jfs.c:1188):
// providers reorder, and hold the FLUSH_ERR_DONE back.
func testSetErrorAfterSendError(t *testing.T, pr Pair) {
	// One retry after the receiver's longest RNR timer (about half a
	// second): the second send is surely queued behind the first.
	a := open(t, pr.A, pr.DeviceA, epConfig{RNRRetry: rnr(1)})
	b := open(t, pr.B, pr.DeviceB, epConfig{MinRNR: 31})
	target := a.importFrom(b, b.cfg.Token)
	a.send(target, 1, 0, 32) // no receive is ever posted
	second := a.jetty.PostSend(a.sendWR(target, 2, 32, 32))
	n := 2
	if second != nil {
		wantErr(t, second, urma.ErrInval, "post behind a failed send")
		n = 1
	}
	cs := wait(t, a.sendJFC, n, waitTimeout)
	if cs[0].Status != urma.StatusRNRRetryCntExc || cs[0].UserCtx != 1 {
		t.Fatalf("first send completed as %+v, want RNR_RETRY_CNT_EXC", cs[0])
	}
	if n == 2 && (cs[1].Status != urma.StatusWRFlushErr || cs[1].UserCtx != 2) {
		t.Fatalf("second send completed as %+v, want WR_FLUSH_ERR", cs[1])
	}
	empty(t, a.sendJFC, "a jetty that failed by itself, before SetError")
	must(t, a.jetty.SetError(), "set error on a jetty in ERROR")
	if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; c.Status != urma.StatusWRFlushErrDone || c.LocalID != a.jetty.ID().ID {
		t.Errorf("record after SetError: %+v, want WR_FLUSH_ERR_DONE from jetty %d", c, a.jetty.ID().ID)
	}
	must(t, a.jetty.SetError(), "set error again")
	empty(t, a.sendJFC, "after a second SetError")
}
