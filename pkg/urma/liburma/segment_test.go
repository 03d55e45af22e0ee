//go:build linux && cgo

package liburma

import (
	"errors"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A post naming an unregistered segment fails with ErrClosed and never
// reaches liburma: urma_unregister_seg freed the urma_target_seg_t the SGE
// would carry, and liburma reads it. A post that fails lets go of the
// segments it had already checked: they still unregister.
func TestPostNamingUnregisteredSegment(t *testing.T) {
	p := newTestProvider(t)
	c, err := p.Open("udma0", 0)
	if err != nil {
		t.Fatal(err)
	}
	q, err := c.CreateJFC(urma.JFCConfig{Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 8, MaxSGE: 2, JFC: q})
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 8, MaxSGE: 2, SendJFC: q, JFR: r})
	if err != nil {
		t.Fatal(err)
	}
	target, err := c.ImportJetty(t.Context(), j.ID(), urma.RM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, o := range []interface{ Close() error }{j, target, r, q, c} {
			if err := o.Close(); err != nil {
				t.Errorf("close %T: %v", o, err)
			}
		}
	})
	register := func() urma.Segment {
		t.Helper()
		mem, err := urma.AllocMemory(4096)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mem.Free() })
		s, err := c.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		post func(sges []urma.SGE) error
	}{
		{"recv", func(sges []urma.SGE) error { return r.PostRecv(&urma.RecvWR{UserCtx: 1, SGEs: sges}) }},
		{"send", func(sges []urma.SGE) error {
			return j.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 1, SGEs: sges})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live, gone := register(), register()
			if err := gone.Close(); err != nil {
				t.Fatal(err)
			}
			for _, sges := range [][]urma.SGE{
				{{Segment: gone, Len: 64}},
				{{Segment: live, Len: 64}, {Segment: gone, Len: 64}},
			} {
				if err := tc.post(sges); !errors.Is(err, urma.ErrClosed) {
					t.Errorf("post naming an unregistered segment in SGE %d: %v, want ErrClosed", len(sges)-1, err)
				}
			}
			if n, err := q.Poll(make([]urma.Completion, 4)); n != 0 || err != nil {
				t.Errorf("a refused post reached liburma: %d completions, %v", n, err)
			}
			// A pin the failed post kept would make this wait forever.
			if err := live.Close(); err != nil {
				t.Errorf("unregister the segment a failed post named: %v", err)
			}
		})
	}
}
