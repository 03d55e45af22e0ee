package urmatest

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func init() {
	register("WrongTokenSendAborts", testWrongTokenSendAborts)
	register("TokenNoneChecksNothing", testTokenNone)
	register("TokenCheckedPerMessage", testTokenPerMessage)
	register("SegmentRegistration", testSegmentRegistration)
	register("SGEOutOfBounds", testSGEOutOfBounds)
}

// Importing never checks a token: udma stores the token with the import
// (hw/udma/udma_u_jetty.c:701-704, udma_u_segment.c udma_u_import_seg) and
// the target checks it on every packet ("URMA User Guide.md":2293). So an
// import with a wrong token succeeds, and a SEND through it completes at the
// sender with REM_ACCESS_ABORT while the receiver sees nothing. Segments
// import the same way, local-only ones included: access is refused when it
// happens, not at import.
func testWrongTokenSendAborts(t *testing.T, pr Pair) {
	cfg := epConfig{Mode: urma.RM} // one jetty may address both imports
	a := open(t, pr.A, pr.DeviceA, cfg)
	b := open(t, pr.B, pr.DeviceB, epConfig{Mode: urma.RM, Token: 0x1111})
	wrong := a.importFrom(b, 0x2222)
	b.postRecv(1, 0, 64)
	a.send(wrong, 1, 0, 64)
	if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; c.Status != urma.StatusRemAccessAbort || c.UserCtx != 1 || c.Recv {
		t.Errorf("send with a wrong token completed as %+v, want REM_ACCESS_ABORT", c)
	}
	empty(t, b.recvJFC, "receiver after a wrong-token send")
	// The failed send put a's jetty in ERROR; a fresh one sends with the
	// right token, and the receive posted before is still there for it.
	ok := a.importFrom(b, 0x1111)
	j := a.newJetty()
	a.own(j)
	must(t, j.PostSend(a.sendWR(ok, 2, 0, 64)), "post with the right token")
	if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; c.Status != urma.StatusSuccess || c.UserCtx != 2 {
		t.Errorf("send with the right token completed as %+v", c)
	}
	if c := wait(t, b.recvJFC, 1, waitTimeout)[0]; c.Status != urma.StatusSuccess || c.UserCtx != 1 {
		t.Errorf("receive completed as %+v, want receive 1", c)
	}

	seg, err := b.ctx.RegisterSegment(b.mem, urma.SegmentConfig{Access: urma.AccessRead | urma.AccessWrite, TokenPolicy: urma.TokenPlainText, Token: 0x3333})
	must(t, err, "register remote-accessible segment")
	b.own(seg)
	for _, c := range []struct {
		what  string
		id    urma.SegmentID
		token urma.Token
	}{{"a wrong token", seg.ID(), 0x4444}, {"its token", seg.ID(), 0x3333}, {"a local-only segment", b.seg.ID(), 0}} {
		rs, err := a.ctx.ImportSegment(c.id, c.token)
		must(t, err, "import segment with %s", c.what)
		a.own(rs)
		if rs.ID() != c.id {
			t.Errorf("imported segment id %+v, want %+v", rs.ID(), c.id)
		}
	}
}

// A JFR with token policy NONE carries and checks no token value ("URMA
// User Guide.md":2318): a send through an import with any token arrives.
func testTokenNone(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	must(t, b.jetty.Close(), "destroy the jetty")
	must(t, b.jfr.Close(), "destroy the JFR")
	var err error
	b.jfr, err = b.ctx.CreateJFR(urma.JFRConfig{Mode: b.cfg.Mode, Depth: 4, JFC: b.recvJFC, TokenPolicy: urma.TokenNone, Token: 0x1111})
	must(t, err, "create JFR without token policy")
	b.jetty = b.newJetty()
	target := a.importFrom(b, 0x2222)
	b.postRecv(1, 0, 64)
	a.send(target, 1, 0, 64)
	if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; c.Status != urma.StatusSuccess {
		t.Errorf("send to a TokenNone JFR completed as %+v, want SUCCESS", c)
	}
	wait(t, b.recvJFC, 1, waitTimeout)
}

// Every message carries the token it was imported with and the receiver
// checks it: after the target's JFR and jetty are re-created with another
// token, sends through the stale import fail with REM_ACCESS_ABORT.
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
	must(t, b.jfr.Close(), "destroy target JFR")
	b.jfr = b.newJFR(0x2222)
	b.jetty = b.newJetty()
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
// memory: the work request fails, at post with ErrInval or as a LOC_ACCESS
// / LOC_LEN completion, and the peer receives nothing. Any other error at
// post would tell the caller something else (a full queue, a closed
// object) and is wrong.
func testSGEOutOfBounds(t *testing.T, pr Pair) {
	const size = 64 << 10
	a := open(t, pr.A, pr.DeviceA, epConfig{MemSize: size})
	b := open(t, pr.B, pr.DeviceB, epConfig{MemSize: size})
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
			// Each failure may put the jetty in ERROR, and an RC jetty
			// binds its target: a fresh jetty and import every time.
			target := a.importFrom(b, b.cfg.Token)
			j := a.newJetty()
			a.own(j)
			err := j.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i), SGEs: []urma.SGE{c.sge(a, b)}})
			switch {
			case err == nil:
				if c := wait(t, a.sendJFC, 1, waitTimeout)[0]; !statusIn(c.Status, urma.StatusLocAccess, urma.StatusLocLen) || c.UserCtx != uint64(i) {
					t.Errorf("send with a bad SGE completed as %+v, want LOC_ACCESS or LOC_LEN", c)
				}
			case !errors.Is(err, urma.ErrInval):
				t.Errorf("send with a bad SGE refused with %v, want ErrInval", err)
			}
		})
		t.Run("recv/"+c.name, func(t *testing.T) {
			err := b.jfr.PostRecv(&urma.RecvWR{UserCtx: uint64(i), SGEs: []urma.SGE{c.sge(b, a)}})
			switch {
			case err == nil:
				if c := wait(t, b.recvJFC, 1, waitTimeout)[0]; !statusIn(c.Status, urma.StatusLocAccess, urma.StatusLocLen) || c.UserCtx != uint64(i) || !c.Recv {
					t.Errorf("receive with a bad SGE completed as %+v, want LOC_ACCESS or LOC_LEN", c)
				}
			case !errors.Is(err, urma.ErrInval):
				t.Errorf("receive with a bad SGE refused with %v, want ErrInval", err)
			}
		})
	}
	empty(t, b.recvJFC, "receiver after bad sends")
}
