//go:build linux && cgo

package liburma

import (
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// udma's poll fills only some fields of a completion record and leaves the
// rest as the caller's buffer had them (hw/udma/udma_u_jfc.c): never the
// remote jetty's uasid. The fake writes garbage there; a completion must
// not report it. RemoteID carries the EID and id udma fills, and UASID 0.
func TestCompletionIgnoresFieldsUdmaLeaves(t *testing.T) {
	requireFake(t) // the garbage is the fake's
	for _, imm := range []bool{false, true} {
		e := newPairEnds(t, urma.RM)
		swr := &urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: e.target, UserCtx: 2,
			SGEs: []urma.SGE{{Segment: e.aseg, Len: 64}}}
		if imm {
			swr.Opcode, swr.Imm = urma.OpSendWithImm, 7
		}
		if err := e.bjfr.PostRecv(&urma.RecvWR{UserCtx: 1, SGEs: []urma.SGE{{Segment: e.bseg, Len: 64}}}); err != nil {
			t.Fatal(err)
		}
		if err := e.ajetty.PostSend(swr); err != nil {
			t.Fatal(err)
		}
		crs := make([]urma.Completion, 2)
		for _, tc := range []struct {
			name   string
			q      urma.JFC
			remote urma.JettyID // as udma reports it
			imm    uint64
		}{
			{"send", e.ajfc, urma.JettyID{EID: e.bjetty.ID().EID, ID: e.bjetty.ID().ID}, 0},
			{"recv", e.bjfc, urma.JettyID{EID: e.ajetty.ID().EID, ID: e.ajetty.ID().ID}, swr.Imm},
		} {
			n, err := tc.q.Poll(crs)
			if err != nil || n != 1 || crs[0].Status != urma.StatusSuccess {
				t.Fatalf("imm=%v %s: poll %d, %v, %+v", imm, tc.name, n, err, crs[:n])
			}
			if c := crs[0]; c.RemoteID != tc.remote || c.Imm != tc.imm {
				t.Errorf("imm=%v %s completion: remote %+v imm %#x; want remote %+v (uasid 0: udma leaves it unfilled) imm %#x",
					imm, tc.name, c.RemoteID, c.Imm, tc.remote, tc.imm)
			}
		}
	}
}
