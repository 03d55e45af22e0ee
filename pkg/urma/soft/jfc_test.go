package soft

import (
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Records past a JFC's depth are kept and come out after the others, each
// once and in order, however the Polls split them.
func TestJFCOverflowKeepsOrder(t *testing.T) {
	const depth, records = 4, 11
	for _, chunk := range []int{1, 3, depth, records} {
		p := newProvider(t, Options{Fabric: NewFabric(), Logger: quiet()})
		ctx, err := p.Open("", 0)
		mustOK(t, err, "open")
		q, err := ctx.CreateJFC(urma.JFCConfig{Depth: depth})
		mustOK(t, err, "create JFC")
		for i := range records {
			q.(*jfc).push(&urma.Completion{Status: urma.StatusSuccess, UserCtx: uint64(i)}, false)
		}
		var got []uint64
		buf := make([]urma.Completion, chunk)
		for {
			n, err := q.Poll(buf)
			mustOK(t, err, "poll")
			if n == 0 {
				break
			}
			for _, c := range buf[:n] {
				got = append(got, c.UserCtx)
			}
		}
		if len(got) != records {
			t.Fatalf("Polls of %d: %d records %v, want %d", chunk, len(got), got, records)
		}
		for i, v := range got {
			if v != uint64(i) {
				t.Fatalf("Polls of %d: records %v, want 0..%d in order", chunk, got, records-1)
			}
		}
		mustOK(t, q.Close(), "close JFC")
		mustOK(t, ctx.Close(), "close context")
	}
}
