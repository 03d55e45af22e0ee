//go:build linux && cgo

package liburma

import (
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// pairEnds is a connected pair of jetties on the fake, for provider-level
// tests: a on udma0 sends to b on udma1.
type pairEnds struct {
	actx, bctx     urma.Context
	ajfce, bjfce   urma.JFCE
	ajfc, bjfc     urma.JFC
	ajfr, bjfr     urma.JFR
	ajetty, bjetty urma.Jetty
	amem, bmem     *urma.Memory
	aseg, bseg     urma.Segment
	target         urma.RemoteJetty
}

func newPairEnds(t testing.TB, mode urma.TransportMode) *pairEnds {
	t.Helper()
	return newPairEndsOn(t, newTestProvider(t), mode)
}

// newPairEndsOn is newPairEnds on p (providerOfFake: a fake of its own).
func newPairEndsOn(t testing.TB, p *Provider, mode urma.TransportMode) *pairEnds {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	e := &pairEnds{}
	side := func(dev string, ctx *urma.Context, ce *urma.JFCE, q *urma.JFC, r *urma.JFR, j *urma.Jetty, mem **urma.Memory, seg *urma.Segment) {
		var err error
		*ctx, err = p.Open(dev, 0)
		must(err)
		*ce, err = (*ctx).CreateJFCE()
		must(err)
		*q, err = (*ctx).CreateJFC(urma.JFCConfig{Depth: 256, JFCE: *ce})
		must(err)
		*r, err = (*ctx).CreateJFR(urma.JFRConfig{Mode: mode, Depth: 64, JFC: *q, TokenPolicy: urma.TokenPlainText, Token: 9})
		must(err)
		*j, err = (*ctx).CreateJetty(urma.JettyConfig{Mode: mode, SQDepth: 64, SendJFC: *q, JFR: *r, RNRRetry: 7})
		must(err)
		*mem, err = urma.AllocMemory(1 << 20)
		must(err)
		*seg, err = (*ctx).RegisterSegment(*mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
		must(err)
	}
	side("udma0", &e.actx, &e.ajfce, &e.ajfc, &e.ajfr, &e.ajetty, &e.amem, &e.aseg)
	side("udma1", &e.bctx, &e.bjfce, &e.bjfc, &e.bjfr, &e.bjetty, &e.bmem, &e.bseg)
	var err error
	e.target, err = e.actx.ImportJetty(t.Context(), e.bjetty.ID(), mode, 9)
	must(err)
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{e.ajetty, e.bjetty, e.target, e.ajfr, e.bjfr, e.ajfc, e.bjfc, e.ajfce, e.bjfce, e.aseg, e.bseg, e.actx, e.bctx} {
			_ = c.Close()
		}
		_ = e.amem.Free()
		_ = e.bmem.Free()
	})
	return e
}

// One message through the provider (post a receive, post a send, poll
// both completions, take and acknowledge an event, rearm) allocates
// nothing: cgo calls get their memory from fields, never from escaping
// locals.
func TestSteadyStateAllocs(t *testing.T) {
	requireFake(t) // a message completes before PostSend returns only in the fake
	e := newPairEnds(t, urma.RM)
	rwr := &urma.RecvWR{UserCtx: 1, SGEs: []urma.SGE{{Segment: e.bseg, Len: 64}}}
	swr := &urma.SendWR{Opcode: urma.OpSendWithImm, Flags: urma.SendCompleteEnable | urma.SendSolicitedEnable, Target: e.target, UserCtx: 2, Imm: 3,
		SGEs: []urma.SGE{{Segment: e.aseg, Len: 64}}}
	crs := make([]urma.Completion, 4)
	fired := make([]urma.JFC, 1)
	if err := e.bjfc.Rearm(false); err != nil {
		t.Fatal(err)
	}
	round := func() {
		if err := e.bjfr.PostRecv(rwr); err != nil {
			t.Fatal(err)
		}
		if err := e.ajetty.PostSend(swr); err != nil {
			t.Fatal(err)
		}
		for _, q := range []urma.JFC{e.ajfc, e.bjfc} {
			if n, err := q.Poll(crs); err != nil || n != 1 || crs[0].Status != urma.StatusSuccess {
				t.Fatalf("poll: %d, %v, %+v", n, err, crs[0])
			}
		}
		if n, err := e.bjfce.Wait(fired, 0); err != nil || n != 1 {
			t.Fatalf("wait: %d, %v", n, err)
		}
		e.bjfc.Ack(1)
		if err := e.bjfc.Rearm(false); err != nil {
			t.Fatal(err)
		}
	}
	round()
	if a := testing.AllocsPerRun(200, round); a != 0 {
		t.Errorf("%.1f allocations per message, want 0", a)
	}
}
