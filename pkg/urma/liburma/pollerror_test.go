//go:build linux && cgo

package liburma

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// udma's urma_poll_jfc that meets a CQE it cannot parse returns
// -UDMA_INTER_ERR for the whole call, although the records it parsed before
// that one are consumed and in the caller's array (hw/udma/udma_u_jfc.c
// udma_u_poll_jfc). Poll must deliver them, and report the error without
// records beside it: a caller that checks the error first (pkg/transport)
// drops what comes with it. Every send but the bad CQE completes, in order,
// and the error is seen once.
func TestPollErrorKeepsRecordsBeforeIt(t *testing.T) {
	requireFake(t)
	for _, tc := range []struct {
		name          string
		before, after int // sends completed before and after the bad CQE
		outLen        int
	}{
		{"first in its batch", 0, 2, 8},
		{"mid-batch", 3, 2, 8},
		{"mid-batch, more than out holds", 3, 2, 2},
		{"in a later batch of the same Poll", crBatch + 2, 1, 2 * crBatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newPairEnds(t, urma.RM)
			send := func(ctx uint64) {
				t.Helper()
				if err := e.bjfr.PostRecv(&urma.RecvWR{UserCtx: ctx, SGEs: []urma.SGE{{Segment: e.bseg, Len: 8}}}); err != nil {
					t.Fatal(err)
				}
				if err := e.ajetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: e.target,
					UserCtx: ctx, SGEs: []urma.SGE{{Segment: e.aseg, Len: 8}}}); err != nil {
					t.Fatal(err)
				}
			}
			var want []uint64
			for i := range tc.before {
				send(uint64(i + 1))
				want = append(want, uint64(i+1))
			}
			if err := e.actx.(*devContext).lib.fakeHook("fakeurma_bad_cqe", unsafe.Pointer(e.ajfc.(*jfc).c)); err != nil {
				t.Fatal(err)
			}
			for i := range tc.after {
				send(uint64(100 + i))
				want = append(want, uint64(100+i))
			}
			var got []uint64
			errs := 0
			out := make([]urma.Completion, tc.outLen)
			for range 100 {
				n, err := e.ajfc.Poll(out)
				if err != nil {
					errs++
					if n != 0 {
						t.Errorf("Poll returned %d records with its error %v: a caller checking the error drops them", n, err)
					}
				}
				for _, c := range out[:n] {
					got = append(got, c.UserCtx)
				}
				if n == 0 && err == nil {
					break
				}
			}
			if !slices.Equal(got, want) || errs != 1 {
				t.Errorf("polled sends %v and %d errors; want %v and one error", got, errs, want)
			}
		})
	}
}

// urma_poll_jfc returns at most the records asked for, or -1 (liburma's
// checks, and -UDMA_INTER_ERR from udma's poll). Any other count is none
// liburma gives: Poll must not read past what was asked for, nor trust the
// records of such a call (the -1 convention, records before the first
// unwritten status, holds for -1 only), and reports an error naming
// urma_poll_jfc and the count, with no records beside it.
func TestPollRejectsBadCount(t *testing.T) {
	const outLen = 4 // urma_poll_jfc is asked for this many records
	for _, tc := range []struct {
		name  string
		count int32
	}{
		{"one more than asked", outLen + 1},
		{"beyond the array", 1000},
		{"negative, not -1", -2},
		{"most negative", math.MinInt32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newPairEndsOn(t, providerOfFake(t, "fakeurma"), urma.RM) // the miscount stays in this fake
			for i := range 2 {
				if err := e.bjfr.PostRecv(&urma.RecvWR{UserCtx: uint64(i), SGEs: []urma.SGE{{Segment: e.bseg, Len: 8}}}); err != nil {
					t.Fatal(err)
				}
				if err := e.ajetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: e.target,
					UserCtx: uint64(i + 1), SGEs: []urma.SGE{{Segment: e.aseg, Len: 8}}}); err != nil {
					t.Fatal(err)
				}
			}
			count := tc.count
			if err := e.actx.(*devContext).lib.fakeHook("fakeurma_miscount_poll", unsafe.Pointer(&count)); err != nil {
				t.Fatal(err)
			}
			records, errs := pollUntilEmpty(t, e.ajfc, outLen)
			var got []uint64
			for _, c := range records {
				got = append(got, c.UserCtx)
			}
			if len(got) != 0 {
				t.Errorf("Poll delivered records %v of a call that returned %d", got, tc.count)
			}
			wantOneFailure(t, errs, fmt.Sprintf("urma_poll_jfc returned %d (asked for %d records)", tc.count, outLen))
		})
	}
}

// pollUntilEmpty polls q, outLen records at a time, until a Poll returns
// neither records nor an error (at most 100 Polls), and returns what came.
// A Poll that returns an error must return no records with it.
func pollUntilEmpty(t *testing.T, q urma.JFC, outLen int) ([]urma.Completion, []error) {
	t.Helper()
	var got []urma.Completion
	var errs []error
	out := make([]urma.Completion, outLen)
	for range 100 {
		n, err := q.Poll(out)
		if err != nil {
			errs = append(errs, err)
			if n != 0 {
				t.Errorf("Poll returned %d records with its error %v", n, err)
			}
		}
		got = append(got, out[:n]...)
		if n == 0 && err == nil {
			break
		}
	}
	return got, errs
}

// wantOneFailure fails t unless errs is one ErrFail whose text holds msg.
func wantOneFailure(t *testing.T, errs []error, msg string) {
	t.Helper()
	if len(errs) != 1 || !errors.Is(errs[0], urma.ErrFail) || !strings.Contains(errs[0].Error(), msg) {
		t.Errorf("Poll errors %v; want one ErrFail saying %q", errs, msg)
	}
}
