//go:build linux && cgo

package liburma

import (
	"fmt"
	"math"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// SetError on a jetty whose send queue is shallower than one poll batch
// still reports every outstanding send as WR_FLUSH_ERR, in order, before
// WR_FLUSH_ERR_DONE. urma_flush_jetty refuses to return more records per
// call than the jetty's SQ depth (core/urma_cp_api.c: EINVAL), so a
// provider that asks for a whole batch gets none, and the sends the device
// never started vanish without a completion.
func TestFlushShallowJetty(t *testing.T) {
	for _, depth := range []uint32{2, 4, 16, 31} {
		t.Run(fmt.Sprintf("sq=%d", depth), func(t *testing.T) {
			p := newTestProvider(t)
			a, b := openFlushPeer(t, p, "udma0", depth), openFlushPeer(t, p, "udma1", 4)
			target := importPeer(t, a, b)
			// B posts no receive: the first send waits for one (RNR, retried
			// forever) and the rest queue behind it, never started.
			for i := range depth {
				wr := &urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i + 1)}
				if err := a.jetty.PostSend(wr); err != nil {
					t.Fatalf("post send %d: %v", i+1, err)
				}
			}
			if err := a.jetty.SetError(); err != nil {
				t.Fatal(err)
			}
			got := pollUntilFlushDone(t, a.jfc)
			if len(got) != int(depth)+1 {
				t.Fatalf("%d records after SetError, want %d WR_FLUSH_ERR and WR_FLUSH_ERR_DONE: %+v", len(got), depth, got)
			}
			for i, c := range got[:depth] {
				if c.Status != urma.StatusWRFlushErr || c.UserCtx != uint64(i+1) || c.Recv {
					t.Errorf("record %d: %+v, want WR_FLUSH_ERR of send %d", i, c, i+1)
				}
			}
		})
	}
}

// flushPeer is one side of a flush test: a polling JFC, an RM JFR without
// a token, and a jetty of the given SQ depth.
type flushPeer struct {
	ctx   urma.Context
	jfc   urma.JFC
	jfr   urma.JFR
	jetty urma.Jetty
}

func openFlushPeer(t *testing.T, p *Provider, dev string, sqDepth uint32) *flushPeer {
	t.Helper()
	c, err := p.Open(dev, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := &flushPeer{ctx: c}
	t.Cleanup(func() { closeAll(t, e.jetty, e.jfr, e.jfc, e.ctx) })
	if e.jfc, err = c.CreateJFC(urma.JFCConfig{Depth: 256}); err != nil {
		t.Fatal(err)
	}
	if e.jfr, err = c.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 4, JFC: e.jfc, MinRNRTimer: 0}); err != nil {
		t.Fatal(err)
	}
	if e.jetty, err = c.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: sqDepth, SendJFC: e.jfc, JFR: e.jfr, RNRRetry: urma.RNRRetryForever}); err != nil {
		t.Fatal(err)
	}
	return e
}

// importPeer imports to's jetty into from's context, closed at cleanup.
func importPeer(t *testing.T, from, to *flushPeer) urma.RemoteJetty {
	t.Helper()
	target, err := from.ctx.ImportJetty(t.Context(), to.jetty.ID(), urma.RM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(t, target) })
	return target
}

// closeAll closes objects in order, skipping those never created.
func closeAll(t *testing.T, objs ...interface{ Close() error }) {
	t.Helper()
	for _, o := range objs {
		if o == nil {
			continue
		}
		if err := o.Close(); err != nil {
			t.Errorf("close %T: %v", o, err)
		}
	}
}

// pollUntilFlushDone polls q until a WR_FLUSH_ERR_DONE record, which it
// returns last; it fails the test when none comes.
func pollUntilFlushDone(t *testing.T, q urma.JFC) []urma.Completion {
	t.Helper()
	var got []urma.Completion
	buf := make([]urma.Completion, 8)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		n, err := q.Poll(buf)
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		for _, c := range buf[:n] {
			got = append(got, c)
			if c.Status == urma.StatusWRFlushErrDone {
				return got
			}
		}
	}
	t.Fatalf("no WR_FLUSH_ERR_DONE; records so far: %+v", got)
	return nil
}

// Records that follow a FLUSH_ERR_DONE in one batch from urma_poll_jfc
// survive the flush it sets off: urma_flush_jetty's records went into the
// very buffer Poll was still reading the batch from, so a receive after
// the FLUSH_ERR_DONE was lost and a flushed send reported twice (the
// second time as a failed send, WR_UNHANDLED).
func TestFlushKeepsTheRestOfTheBatch(t *testing.T) {
	p := newTestProvider(t)
	a, b := openFlushPeer(t, p, "udma0", 8), openFlushPeer(t, p, "udma1", 4)
	// a2 shares a's JFC and JFR; b sends to it.
	a2, err := a.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 4, SendJFC: a.jfc, JFR: a.jfr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(t, a2) })
	toB := importPeer(t, a, b)
	toA2, err := b.ctx.ImportJetty(t.Context(), a2.ID(), urma.RM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(t, toA2) })
	// B posts no receive: send 1 waits (RNR, forever), 2..5 queue.
	const sends = 5
	for i := range sends {
		if err := a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: toB, UserCtx: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.jetty.SetError(); err != nil {
		t.Fatal(err)
	}
	// After send 1's WR_FLUSH_ERR and the FLUSH_ERR_DONE, a receive on a2.
	if err := a.jfr.PostRecv(&urma.RecvWR{UserCtx: 100}); err != nil {
		t.Fatal(err)
	}
	if err := b.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Target: toA2, UserCtx: 200}); err != nil {
		t.Fatal(err)
	}
	got := make([]urma.Completion, 16)
	n, err := a.jfc.Poll(got)
	if err != nil {
		t.Fatal(err)
	}
	got = got[:n]
	var want []string
	for i := range sends {
		want = append(want, fmt.Sprintf("send %d WR_FLUSH_ERR", i+1))
	}
	want = append(want, "send 0 WR_FLUSH_ERR_DONE", "recv 100 SUCCESS")
	var have []string
	for _, c := range got {
		kind := "send"
		if c.Recv {
			kind = "recv"
		}
		have = append(have, fmt.Sprintf("%s %d %v", kind, c.UserCtx, c.Status))
	}
	if fmt.Sprint(have) != fmt.Sprint(want) {
		t.Errorf("poll:\n got %q\nwant %q", have, want)
	}
}

// udma's urma_flush_jetty returns at most the records asked for, and
// liburma's own check fails with -status; a count beyond the array, or a
// negative one, must neither be converted (the shim ran past its arrays,
// and Poll handed out records liburma never wrote) nor be logged and
// forgotten (the sends it did not return never complete, and a caller
// waits for them). Poll delivers the records taken before it, then the
// error, naming urma_flush_jetty and the count.
func TestFlushRejectsBadCount(t *testing.T) {
	const depth = 4 // urma_flush_jetty is asked for this many records
	for _, tc := range []struct {
		name  string
		count int32
	}{
		{"one more than asked", depth + 1},
		{"beyond the array", 1000},
		{"liburma's error", -int32(syscall.EINVAL)},
		{"most negative", math.MinInt32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := providerOfFake(t, "fakeurma") // the miscount stays in this fake
			a, b := openFlushPeer(t, p, "udma0", depth), openFlushPeer(t, p, "udma1", 4)
			target := importPeer(t, a, b)
			// B posts no receive: send 1 waits (RNR, forever), and the rest
			// are left for urma_flush_jetty.
			for i := range depth {
				if err := a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i + 1)}); err != nil {
					t.Fatal(err)
				}
			}
			count := tc.count
			if err := p.lib.fakeHook("fakeurma_miscount_flush", unsafe.Pointer(&count)); err != nil {
				t.Fatal(err)
			}
			if err := a.jetty.SetError(); err != nil {
				t.Fatal(err)
			}
			records, errs := pollUntilEmpty(t, a.jfc, 8)
			var got []string
			for _, c := range records {
				got = append(got, fmt.Sprintf("send %d %v", c.UserCtx, c.Status))
			}
			// Send 1 was handled by the device, and its record came from
			// the JFC; the sends urma_flush_jetty took are lost.
			want := []string{"send 1 WR_FLUSH_ERR", "send 0 WR_FLUSH_ERR_DONE"}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("polled %q, want %q", got, want)
			}
			wantOneFailure(t, errs, fmt.Sprintf("urma_flush_jetty returned %d", tc.count))
		})
	}
}
