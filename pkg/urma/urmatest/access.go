package urmatest

import (
	"testing"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func init() {
	register("ImportWrongTokenRefused", testImportWrongToken)
	register("TokenCheckedPerMessage", testTokenPerMessage)
	register("SegmentRegistration", testSegmentRegistration)
	register("SGEOutOfBounds", testSGEOutOfBounds)
}

// Importing a jetty or a segment with the wrong token fails with ErrAccess;
// a local-only segment cannot be imported at all.
func testImportWrongToken(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{Token: 0x1111})
	_, err := a.ctx.ImportJetty(ctxWithTimeout(t), b.jetty.ID(), urma.RC, 0x2222)
	wantErr(t, err, urma.ErrAccess, "import jetty with a wrong token")
	a.importFrom(b, 0x1111) // the right token works

	seg, err := b.ctx.RegisterSegment(b.mem, urma.SegmentConfig{Access: urma.AccessRead | urma.AccessWrite, TokenPolicy: urma.TokenPlainText, Token: 0x3333})
	must(t, err, "register remote-accessible segment")
	b.own(seg)
	_, err = a.ctx.ImportSegment(seg.ID(), 0x4444)
	wantErr(t, err, urma.ErrAccess, "import segment with a wrong token")
	rs, err := a.ctx.ImportSegment(seg.ID(), 0x3333)
	must(t, err, "import segment with its token")
	a.own(rs)
	if rs.ID() != seg.ID() {
		t.Errorf("imported segment id %+v, want %+v", rs.ID(), seg.ID())
	}
	_, err = a.ctx.ImportSegment(b.seg.ID(), 0)
	wantErr(t, err, urma.ErrAccess, "import a local-only segment")
}

// Every message carries the token it was imported with and the receiver
// checks it: after the target jetty is re-created with another token, sends
// through the stale import fail with REM_ACCESS_ABORT.
func testTokenPerMessage(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{Token: 0x1111})
	target := a.importFrom(b, 0x1111)
	b.postRecv(1, 0, 64)
	a.send(target, 1, 0, 64)
	wait(t, a.sendJFC, 1, waitTimeout)
	wait(t, b.recvJFC, 1, waitTimeout)

	old := b.jetty.ID()
	must(t, b.jetty.Close(), "destroy target jetty")
	b.jetty = b.newJetty(0x2222)
	b.postRecv(2, 0, 64)
	a.send(target, 2, 0, 64)
	c := wait(t, a.sendJFC, 1, waitTimeout)[0]
	want := []urma.Status{urma.StatusRemAccessAbort}
	if b.jetty.ID() != old {
		// A new id means the old one names nothing: hardware may also time out.
		want = append(want, urma.StatusAckTimeout)
	}
	if !statusIn(c.Status, want...) || c.UserCtx != 2 {
		t.Errorf("send through a stale import completed as %+v, want one of %v", c, want)
	}
	empty(t, b.recvJFC, "receiver after a rejected message")
}

// Segments register mmap'd memory only, with liburma's access rules, and
// expose that very memory.
func testSegmentRegistration(t *testing.T, pr Pair) {
	e := open(t, pr.A, pr.DeviceA, epConfig{MemSize: 64 << 10})
	_, err := e.ctx.RegisterSegment(nil, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	wantErr(t, err, urma.ErrInval, "register nil memory")
	for _, acc := range []urma.Access{0, urma.AccessWrite, urma.AccessLocalOnly | urma.AccessRead, urma.AccessAtomic | urma.AccessRead} {
		_, err := e.ctx.RegisterSegment(e.mem, urma.SegmentConfig{Access: acc})
		wantErr(t, err, urma.ErrInval, "register with access flags "+accessName(acc))
	}
	b := e.seg.Bytes()
	m := e.mem.Bytes()
	if len(b) != len(m) || unsafe.SliceData(b) != unsafe.SliceData(m) {
		t.Errorf("segment bytes are not the registered memory")
	}
	id := e.seg.ID()
	if id.Len != uint64(len(m)) || id.EID != e.ctx.EID() || id.VA != uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m)))) {
		t.Errorf("segment id %+v does not describe the memory (len %d, eid %s)", id, len(m), e.ctx.EID())
	}
}

func accessName(a urma.Access) string {
	names := []string{"LOCAL_ONLY", "READ", "WRITE", "ATOMIC"}
	s := ""
	for i, n := range names {
		if a&(1<<i) != 0 {
			s += n + "|"
		}
	}
	if s == "" {
		return "none"
	}
	return s[:len(s)-1]
}

// An SGE past its segment, or on another context's segment, never touches
// memory: the work request fails with an error (at post or as LOC_ACCESS /
// LOC_LEN), and the peer receives nothing.
func testSGEOutOfBounds(t *testing.T, pr Pair) {
	const size = 64 << 10
	a := open(t, pr.A, pr.DeviceA, epConfig{MemSize: size})
	b := open(t, pr.B, pr.DeviceB, epConfig{MemSize: size})
	target := a.importFrom(b, b.cfg.Token)
	bad := []struct {
		name string
		sge  func(e *endpoint, other *endpoint) urma.SGE
	}{
		{"past-end", func(e, _ *endpoint) urma.SGE { return urma.SGE{Segment: e.seg, Offset: size - 10, Len: 20} }},
		{"offset-beyond", func(e, _ *endpoint) urma.SGE { return urma.SGE{Segment: e.seg, Offset: 1 << 40, Len: 1} }},
		{"wrapping", func(e, _ *endpoint) urma.SGE { return urma.SGE{Segment: e.seg, Offset: ^uint64(0) - 3, Len: 8} }},
		{"foreign-segment", func(_, o *endpoint) urma.SGE { return urma.SGE{Segment: o.seg, Offset: 0, Len: 8} }},
	}
	for i, c := range bad {
		t.Run("send/"+c.name, func(t *testing.T) {
			j := a.newJetty(a.cfg.Token) // each failure may put the jetty in ERROR
			a.own(j)
			err := j.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i), SGEs: []urma.SGE{c.sge(a, b)}})
			if err == nil {
				if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; !statusIn(c.Status, urma.StatusLocAccess, urma.StatusLocLen) || c.UserCtx != uint64(i) {
					t.Errorf("send with a bad SGE completed as %+v, want LOC_ACCESS or LOC_LEN", c)
				}
			}
		})
		t.Run("recv/"+c.name, func(t *testing.T) {
			err := b.jfr.PostRecv(&urma.RecvWR{UserCtx: uint64(i), SGEs: []urma.SGE{c.sge(b, a)}})
			if err == nil {
				if c := wait(t, b.recvJFC, 1, waitTimeout)[0]; !statusIn(c.Status, urma.StatusLocAccess, urma.StatusLocLen) || c.UserCtx != uint64(i) || !c.Recv {
					t.Errorf("receive with a bad SGE completed as %+v, want LOC_ACCESS or LOC_LEN", c)
				}
			}
		})
	}
	empty(t, b.recvJFC, "receiver after bad sends")
}
