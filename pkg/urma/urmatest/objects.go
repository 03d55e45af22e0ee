package urmatest

import (
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func init() {
	register("CloseOrderEnforced", testCloseOrder)
	register("UseAfterClose", testUseAfterClose)
	register("CloseReleasesOutstandingSends", testCloseReleasesOutstanding)
}

// Closing a jetty with sends outstanding drops them and lets go of the
// memory they named: the segment then unregisters (the software provider
// refuses while a send still uses it).
func testCloseReleasesOutstanding(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	// No receive is posted and RNR retries forever: all three stay queued.
	for i := range 3 {
		a.send(target, uint64(i), i*64, 64)
	}
	must(t, a.jetty.Close(), "close a jetty with three sends outstanding")
	must(t, a.seg.Close(), "unregister the segment its sends named")
}

// Objects refuse to be destroyed while others depend on them (ErrBusy);
// destroyed in order they go, and closing twice is harmless.
func testCloseOrder(t *testing.T, pr Pair) {
	ctx, err := pr.A.Open(pr.DeviceA, 0)
	must(t, err, "open")
	jfce, err := ctx.CreateJFCE()
	must(t, err, "create JFCE")
	jfc, err := ctx.CreateJFC(urma.JFCConfig{Depth: 16, JFCE: jfce})
	must(t, err, "create JFC")
	jfr, err := ctx.CreateJFR(urma.JFRConfig{Mode: urma.RC, Depth: 4, JFC: jfc})
	must(t, err, "create JFR")
	jetty, err := ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 4, SendJFC: jfc, JFR: jfr})
	must(t, err, "create jetty")
	mem, err := urma.AllocMemory(4096)
	must(t, err, "alloc memory")
	t.Cleanup(func() { _ = mem.Free() })
	seg, err := ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	must(t, err, "register segment")

	busy := []struct {
		what string
		c    func() error
	}{
		{"context with children", ctx.Close},
		{"JFCE used by a JFC", jfce.Close},
		{"JFC used by a JFR and a jetty", jfc.Close},
		{"JFR shared by a jetty", jfr.Close},
	}
	for _, b := range busy {
		wantErr(t, b.c(), urma.ErrBusy, "close "+b.what)
	}
	for _, step := range []struct {
		what string
		c    func() error
	}{
		{"jetty", jetty.Close}, {"JFR", jfr.Close}, {"JFC", jfc.Close}, {"JFCE", jfce.Close},
		{"segment", seg.Close}, {"context", ctx.Close},
	} {
		must(t, step.c(), "close %s in order", step.what)
		must(t, step.c(), "close %s twice", step.what)
	}
}

// Every verb on a destroyed object fails with ErrClosed.
func testUseAfterClose(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{Events: true})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	// A closed import is no longer a target.
	must(t, target.Close(), "close remote jetty")
	if err := a.jetty.PostSend(a.sendWR(target, 2, 0, 8)); err == nil {
		t.Error("post send to an unimported jetty succeeded")
	}
	wr := a.sendWR(a.importFrom(b, b.cfg.Token), 1, 0, 8)
	must(t, a.jetty.Close(), "close jetty")
	wantErr(t, a.jetty.PostSend(wr), urma.ErrClosed, "post send on a closed jetty")
	wantErr(t, a.jetty.SetError(), urma.ErrClosed, "set error on a closed jetty")
	must(t, a.jfr.Close(), "close JFR")
	wantErr(t, a.jfr.PostRecv(&urma.RecvWR{SGEs: []urma.SGE{{Segment: a.seg, Len: 8}}}), urma.ErrClosed, "post receive on a closed JFR")
	must(t, a.recvJFC.Close(), "close JFC")
	_, err := a.recvJFC.Poll(make([]urma.Completion, 1))
	wantErr(t, err, urma.ErrClosed, "poll a closed JFC")
	wantErr(t, a.recvJFC.Rearm(false), urma.ErrClosed, "rearm a closed JFC")
	must(t, a.jfce.Close(), "close JFCE")
	_, err = a.jfce.Wait(make([]urma.JFC, 1), time.Millisecond)
	wantErr(t, err, urma.ErrClosed, "wait on a closed JFCE")
	must(t, a.sendJFC.Close(), "close send JFC")
	must(t, a.seg.Close(), "close segment")
	for _, o := range a.extra {
		must(t, o.Close(), "unimport")
	}
	ctx := a.ctx
	must(t, ctx.Close(), "close context")
	_, err = ctx.CreateJFC(urma.JFCConfig{Depth: 4})
	wantErr(t, err, urma.ErrClosed, "create a JFC on a closed context")
	_, err = ctx.CreateJFCE()
	wantErr(t, err, urma.ErrClosed, "create a JFCE on a closed context")
	_, err = ctx.ImportJetty(ctxWithTimeout(t), b.jetty.ID(), urma.RC, b.cfg.Token)
	wantErr(t, err, urma.ErrClosed, "import on a closed context")
}
