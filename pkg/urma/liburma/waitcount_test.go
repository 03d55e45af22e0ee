//go:build linux && cgo

package liburma

import (
	"fmt"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// urma_wait_jfc returns the kernel's event count as it is, though it copies
// at most as many JFCs as asked for (core/urma_cmd.c:2568-2571). Wait must
// not trust a larger count: reading past what was written counted events
// for JFCs that did not fire (to be acknowledged to liburma, which never
// reported them) or ran off the arrays (a panic). It returns the JFCs
// liburma wrote, counted, and the error with the next Wait.
func TestWaitRejectsEventCountBeyondAsked(t *testing.T) {
	for _, tc := range []struct {
		name      string
		overcount int32
		outLen    int
		stale     bool // a Wait before left the other JFC in the array
	}{
		{"one more than asked", 1, 1, false},
		{"a stale JFC after the written one", 1, 1, true},
		{"beyond the array", 1000, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := providerOfFake(t, "fakeurma")
			c := must(p.Open("udma0", 0))(t)
			ce := must(c.CreateJFCE())(t)
			a := must(c.CreateJFC(urma.JFCConfig{Depth: 16, JFCE: ce}))(t)
			b := must(c.CreateJFC(urma.JFCConfig{Depth: 16, JFCE: ce}))(t)
			fire := func(q urma.JFC) {
				t.Helper()
				if err := q.Rearm(false); err != nil {
					t.Fatal(err)
				}
				// Any record fires an armed JFC; this one is never polled.
				if err := p.lib.fakeHook("fakeurma_bad_cqe", unsafe.Pointer(q.(*jfc).c)); err != nil {
					t.Fatal(err)
				}
			}
			wait := func(out []urma.JFC) (n int, err error) {
				t.Helper()
				defer func() {
					if r := recover(); r != nil {
						// Wait ran off its array holding its lock, with A's
						// event taken from liburma and not counted: undo
						// both, or Close waits for the acknowledgement.
						ce.(*jfce).mu.Unlock()
						a.(*jfc).reported()
						n, err = 0, fmt.Errorf("Wait panicked: %v", r)
					}
				}()
				return ce.Wait(out, time.Second)
			}
			if tc.stale {
				fire(a)
				fire(b)
				if n, err := wait(make([]urma.JFC, 2)); n != 2 || err != nil {
					t.Fatalf("Wait for both: %d, %v", n, err)
				}
			}
			fire(a)
			extra := tc.overcount
			if err := p.lib.fakeHook("fakeurma_overcount_wait", unsafe.Pointer(&extra)); err != nil {
				t.Fatal(err)
			}
			out := make([]urma.JFC, tc.outLen)
			n, err := wait(out)
			if err != nil || !slices.Equal(out[:n], []urma.JFC{a}) {
				t.Errorf("Wait when liburma says %d more events than it wrote: %v, %v; want the one JFC it wrote, no error yet", tc.overcount, out[:n], err)
			}
			if n, err := wait(out); n != 0 || err == nil {
				t.Errorf("the Wait after: %d, %v; want the bad count's error", n, err)
			}
			want := map[urma.JFC]uint64{a: 1, b: 0}
			if tc.stale {
				want = map[urma.JFC]uint64{a: 2, b: 1}
			}
			for q, w := range want {
				if got := q.(*jfc).events; got != w {
					t.Errorf("JFC %d counts %d events, want %d: liburma reported %d", q.ID(), got, w, w)
				}
			}
			for q, w := range want {
				q.Ack(uint32(w)) // what liburma reported: more would keep Close waiting
			}
			closeAll(t, a, b, ce, c)
		})
	}
}
