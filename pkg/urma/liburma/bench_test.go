//go:build linux && cgo

package liburma

import (
	"fmt"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// BenchmarkMessage: what one message costs the caller of a provider, in
// polling mode: post a receive, post a send, poll the send completion, poll
// the receive completion; four calls. path=liburma makes them through cgo
// into the fake liburma, path=soft into the software provider (in-process
// fabric), and path=cgo-nop makes four cgo calls that do nothing: the
// crossing alone. make bench prints liburma beside both, as ratios of the
// same run.
func BenchmarkMessage(b *testing.B) {
	for _, size := range []int{64, 4096} {
		label := fmt.Sprintf("size=%dB", size)
		if size >= 1024 {
			label = fmt.Sprintf("size=%dKiB", size/1024)
		}
		b.Run("path=soft/"+label, func(b *testing.B) {
			fab := soft.NewFabric()
			pa, err := soft.New(soft.Options{Fabric: fab})
			if err != nil {
				b.Fatal(err)
			}
			pb, err := soft.New(soft.Options{Fabric: fab})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = pa.Close(); _ = pb.Close() })
			benchMessages(b, newBenchEnds(b, pa, pb, "", ""), size)
		})
		b.Run("path=cgo-nop/"+label, func(b *testing.B) {
			p := newTestProvider(b)
			b.ReportAllocs()
			for b.Loop() {
				for range 4 {
					p.lib.nop()
				}
			}
		})
		b.Run("path=liburma/"+label, func(b *testing.B) {
			p := newTestProvider(b)
			benchMessages(b, newBenchEnds(b, p, p, "udma0", "udma1"), size)
		})
	}
}

// benchEnds is a sender and a receiver, polling only.
type benchEnds struct {
	sjfc, rjfc urma.JFC
	jfr        urma.JFR
	jetty      urma.Jetty
	sseg, rseg urma.Segment
	target     urma.RemoteJetty
}

func newBenchEnds(b *testing.B, pa, pb urma.Provider, da, db string) *benchEnds {
	b.Helper()
	must := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}
	e := &benchEnds{}
	var closers []interface{ Close() error }
	b.Cleanup(func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i].Close()
		}
	})
	side := func(p urma.Provider, dev string) (urma.Context, urma.JFC, urma.JFR, urma.Jetty, urma.Segment) {
		ctx, err := p.Open(dev, 0)
		must(err)
		q, err := ctx.CreateJFC(urma.JFCConfig{Depth: 64})
		must(err)
		r, err := ctx.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 16, JFC: q})
		must(err)
		j, err := ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 16, SendJFC: q, JFR: r, RNRRetry: urma.RNRRetryForever})
		must(err)
		mem, err := urma.AllocMemory(1 << 16)
		must(err)
		seg, err := ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
		must(err)
		closers = append(closers, ctx, q, r, j, memCloser{mem}, seg)
		return ctx, q, r, j, seg
	}
	actx, sq, _, aj, sseg := side(pa, da)
	_, rq, rr, bj, rseg := side(pb, db)
	t, err := actx.ImportJetty(b.Context(), bj.ID(), urma.RM, 0)
	must(err)
	closers = append(closers, t)
	e.sjfc, e.rjfc, e.jfr, e.jetty, e.sseg, e.rseg, e.target = sq, rq, rr, aj, sseg, rseg, t
	return e
}

// memCloser frees memory after its segment is unregistered (closers run
// last first, and the segment is added after the memory).
type memCloser struct{ m *urma.Memory }

func (c memCloser) Close() error { return c.m.Free() }

func benchMessages(b *testing.B, e *benchEnds, size int) {
	rwr := &urma.RecvWR{UserCtx: 1, SGEs: []urma.SGE{{Segment: e.rseg, Len: uint32(size)}}}
	swr := &urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: e.target, UserCtx: 2,
		SGEs: []urma.SGE{{Segment: e.sseg, Len: uint32(size)}}}
	crs := make([]urma.Completion, 1)
	poll := func(q urma.JFC) {
		for {
			n, err := q.Poll(crs)
			if err != nil || (n == 1 && crs[0].Status != urma.StatusSuccess) {
				b.Fatalf("poll: %v %+v", err, crs[0])
			}
			if n == 1 {
				return
			}
		}
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if err := e.jfr.PostRecv(rwr); err != nil {
			b.Fatal(err)
		}
		if err := e.jetty.PostSend(swr); err != nil {
			b.Fatal(err)
		}
		poll(e.sjfc)
		poll(e.rjfc)
	}
}
