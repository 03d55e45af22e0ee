package soft

import (
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Posting and completing work requests allocates nothing in steady state,
// on either fabric: slots, rings and frame buffers are sized up front and
// reused.
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	for _, fabric := range []string{"inproc", "socket"} {
		t.Run(fabric, func(t *testing.T) {
			opts := Options{Logger: logr.Discard()}
			if fabric == "inproc" {
				opts.Fabric = NewFabric()
			}
			a := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 256)
			b := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 256)
			target := a.importJetty(b)
			// Work requests built once, as a transport would keep them.
			rsge := []urma.SGE{{Segment: b.seg, Len: 4096}}
			rwr := &urma.RecvWR{SGEs: rsge}
			ssge := []urma.SGE{{Segment: a.seg, Len: 4096}}
			swr := &urma.SendWR{Opcode: urma.OpSendWithImm, Flags: urma.SendCompleteEnable, Target: target, SGEs: ssge}
			cs := make([]urma.Completion, 4)
			var failed error
			wait := func(q urma.JFC) {
				deadline := time.Now().Add(5 * time.Second)
				for {
					n, err := q.Poll(cs)
					if err != nil || (n == 1 && cs[0].Status != urma.StatusSuccess) {
						failed = err
						return
					}
					if n == 1 {
						return
					}
					if time.Now().After(deadline) {
						failed = urma.ErrTimeout
						return
					}
					runtime.Gosched()
				}
			}
			cycle := func() {
				rwr.UserCtx++
				swr.UserCtx++
				if err := b.jfr.PostRecv(rwr); err != nil {
					failed = err
				}
				if err := a.jetty.PostSend(swr); err != nil {
					failed = err
				}
				wait(a.sjfc)
				wait(b.rjfc)
			}
			for i := 0; i < 200; i++ { // warm up: grow queues to their working size
				cycle()
			}
			allocs := testing.AllocsPerRun(1000, cycle)
			if failed != nil {
				t.Fatalf("cycle failed: %v", failed)
			}
			if allocs != 0 {
				t.Errorf("%v allocations per send/receive cycle, want 0", allocs)
			}
		})
	}
}
