package liburmasoft

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// inprocLibraries are two libraries, as two processes' liburma, whose
// providers meet on one in-process fabric: delivery happens in the posting
// goroutine, so the tests need no waiting but for retries.
func inprocLibraries(t *testing.T) (*Library, *Library) {
	t.Helper()
	fab := soft.NewFabric()
	mk := func(name string) *Library {
		l := NewLibrary(func(cfg Config, _ logr.Logger) (urma.Provider, error) {
			return soft.New(soft.Options{Fabric: fab, Devices: []soft.DeviceSpec{{Name: name}}})
		}, logr.Discard())
		if err := l.Init(Config{Devices: []string{name}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := l.Uninit(); err != nil {
				t.Error(err)
			}
		})
		return l
	}
	return mk("softa"), mk("softb")
}

// end is one side's objects: a context with an event channel, a JFC for
// sends and receives, a JFR and a jetty on it, and 64 KiB of the caller's
// own memory registered.
type end struct {
	ctx   *Context
	jfce  *JFCE
	jfc   *JFC
	jfr   *JFR
	jetty *Jetty
	mem   []byte
	seg   *Segment
}

type endConfig struct {
	mode      uint32 // URMA_TM_*
	rnrRetry  uint8
	token     uint32
	policy    uint32
	jfrDepth  uint32
	sendDepth uint32
	minRNR    uint8
}

func defaults(c endConfig) endConfig {
	if c.mode == 0 {
		c.mode = TMRM
	}
	if c.jfrDepth == 0 {
		c.jfrDepth = 16
	}
	if c.sendDepth == 0 {
		c.sendDepth = 16
	}
	return c
}

// mmapped is memory as a C program has it: mapped by the program, never
// by the provider.
func mmapped(t *testing.T, size int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Munmap(b); err != nil {
			t.Error(err)
		}
	})
	return b
}

func newEnd(t *testing.T, l *Library, cfg endConfig) *end {
	t.Helper()
	cfg = defaults(cfg)
	devs, err := l.Devices()
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	e := &end{}
	e.ctx, err = l.Open(devs[0].Name, 0)
	must(err)
	e.jfce, err = e.ctx.CreateJFCE()
	must(err)
	e.jfc, err = e.ctx.CreateJFC(256, e.jfce, 0, 0xc0ffee)
	must(err)
	e.jfr, err = e.ctx.CreateJFR(JFRConfig{Mode: cfg.mode, Depth: cfg.jfrDepth, MaxSGE: 2, MinRNRTimer: cfg.minRNR, JFC: e.jfc, TokenPolicy: cfg.policy, Token: cfg.token})
	must(err)
	e.jetty, err = e.ctx.CreateJetty(JettyConfig{ShareJFR: true, Mode: cfg.mode, Depth: cfg.sendDepth, MaxSGE: 2, RNRRetry: cfg.rnrRetry, SendJFC: e.jfc, JFR: e.jfr})
	must(err)
	e.mem = mmapped(t, 64<<10)
	e.seg, err = e.ctx.RegisterSegment(e.mem, uint32(urma.AccessRead|urma.AccessWrite), 0, 0)
	must(err)
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{e.jetty, e.jfr, e.seg, e.jfc, e.jfce, e.ctx} {
			if err := c.Close(); err != nil && !errors.Is(err, urma.ErrClosed) {
				t.Errorf("close %T: %v", c, err)
			}
		}
	})
	return e
}

func (e *end) addr(off int) uint64 { return uint64(uintptr(unsafe.Pointer(&e.mem[off]))) }

// sge is an SGE of n bytes at off in the end's segment.
func (e *end) sge(off, n int) []SGE { return []SGE{{Addr: e.addr(off), Len: uint32(n), Seg: e.seg}} }

func (e *end) importJetty(t *testing.T, peer *end, mode, token uint32) *TargetJetty {
	t.Helper()
	tj, err := e.ctx.ImportJetty(peer.jetty.ID(), mode, TargetTypeJetty, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tj.Close() })
	return tj
}

// poll takes n records from the end's JFC, sleeping on its event channel
// between tries; it fails after 5 s.
func (e *end) poll(t *testing.T, n int) []urma.Completion {
	t.Helper()
	got := make([]urma.Completion, 0, n)
	buf := make([]urma.Completion, n)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := e.jfc.Rearm(false); err != nil {
			t.Fatal(err)
		}
		k, err := e.jfc.Poll(buf[:n-len(got)])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:k]...)
		if len(got) == n {
			return got
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("%d of %d records after 5 s: %+v", len(got), n, got)
		}
		var fired [1]uintptr
		if k, err := e.jfce.Wait(fired[:], int(left/time.Millisecond)+1); err != nil {
			t.Fatal(err)
		} else if k == 1 {
			e.jfc.Ack(1)
		}
	}
}

func (e *end) send(t *testing.T, tj *TargetJetty, opcode uint32, userCtx, imm uint64, sges []SGE) {
	t.Helper()
	if err := e.jetty.PostSend(&Send{Opcode: opcode, Complete: true, Target: tj, UserCtx: userCtx, Imm: imm, SGEs: sges}); err != nil {
		t.Fatal(err)
	}
}

func code(err error) urma.Code {
	var e *urma.Error
	if !errors.As(err, &e) {
		return -1
	}
	return e.Code
}

func TestInitOncePerProcess(t *testing.T) {
	a, _ := inprocLibraries(t)
	if err := a.Init(Config{}); code(err) != urma.CodeExist {
		t.Errorf("second Init: %v, want EEXIST as liburma's", err)
	}
	if err := a.Uninit(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Devices(); code(err) != urma.CodeNoDev {
		t.Errorf("Devices uninitialised: %v, want ENODEV", err)
	}
	if _, err := a.Open("softa", 0); code(err) != urma.CodeInval {
		t.Errorf("Open uninitialised: %v, want EINVAL", err)
	}
	if err := a.Uninit(); err != nil {
		t.Errorf("Uninit twice: %v, want nothing (liburma warns and succeeds)", err)
	}
	if err := a.Init(Config{}); err != nil {
		t.Errorf("Init after Uninit: %v", err)
	}
}

// SEND and SEND_IMM reach the peer's caller-owned memory, and every
// completion field says what liburma's does.
func TestSendCompletions(t *testing.T) {
	la, lb := inprocLibraries(t)
	a, b := newEnd(t, la, endConfig{}), newEnd(t, lb, endConfig{policy: uint32(urma.TokenPlainText), token: 77})
	tj := a.importJetty(t, b, TMRM, 77)
	for i, tc := range []struct {
		opcode uint32
		imm    uint64
		crOp   urma.Opcode
	}{{OpcSend, 0, urma.CROpSend}, {OpcSendImm, 0xfeed, urma.CROpSendWithImm}} {
		msg := fmt.Sprintf("message %d from A", i)
		copy(a.mem, msg)
		if err := b.jfr.PostRecv(uint64(100+i), b.sge(4096, 1024)); err != nil {
			t.Fatal(err)
		}
		a.send(t, tj, tc.opcode, uint64(200+i), tc.imm, a.sge(0, len(msg)))
		sent, recv := a.poll(t, 1)[0], b.poll(t, 1)[0]
		if got := string(b.mem[4096 : 4096+len(msg)]); got != msg {
			t.Errorf("B's memory holds %q, want %q", got, msg)
		}
		wantSent := urma.Completion{Status: urma.StatusSuccess, UserCtx: uint64(200 + i), CompletionLen: uint32(len(msg)), LocalID: a.jetty.ID().ID, RemoteID: b.jetty.ID()}
		if sent != wantSent {
			t.Errorf("send record %+v, want %+v", sent, wantSent)
		}
		wantRecv := urma.Completion{Status: urma.StatusSuccess, Opcode: tc.crOp, Recv: true, UserCtx: uint64(100 + i), CompletionLen: uint32(len(msg)), LocalID: b.jetty.ID().ID, RemoteID: a.jetty.ID(), Imm: tc.imm}
		if recv != wantRecv {
			t.Errorf("receive record %+v, want %+v", recv, wantRecv)
		}
	}
	// A wrong token is refused per message, at the sender, and the
	// receiver sees nothing.
	bad := a.importJetty(t, b, TMRM, 78)
	if err := b.jfr.PostRecv(300, b.sge(4096, 1024)); err != nil {
		t.Fatal(err)
	}
	a.send(t, bad, OpcSend, 301, 0, a.sge(0, 8))
	if cr := a.poll(t, 1)[0]; cr.Status != urma.StatusRemAccessAbort || cr.UserCtx != 301 {
		t.Errorf("send with a wrong token: %+v, want REM_ACCESS_ABORT", cr)
	}
	if n, _ := b.jfc.Poll(make([]urma.Completion, 4)); n != 0 {
		t.Errorf("B got %d records from a send with a wrong token", n)
	}
}

// The sends of a jetty moved to ERROR come back as UB hardware reports
// them: FLUSH_ERR_DONE on the JFC, then, from urma_flush_jetty, the
// requests never carried out as WR_UNHANDLED, in post order.
func TestTwoPhaseFlush(t *testing.T) {
	la, lb := inprocLibraries(t)
	a, b := newEnd(t, la, endConfig{rnrRetry: urma.RNRRetryForever}), newEnd(t, lb, endConfig{})
	tj := a.importJetty(t, b, TMRM, 0)
	for i := range 3 { // B posts no receive: they wait, retrying
		a.send(t, tj, OpcSend, uint64(10+i), 0, a.sge(0, 16))
	}
	out := make([]urma.Completion, 4)
	if n, err := a.jetty.Flush(out); n != 0 || err != nil {
		t.Errorf("flush before ERROR: %d, %v; want 0", n, err)
	}
	if err := a.jetty.Modify(AttrState, JettyStateError); err != nil {
		t.Fatal(err)
	}
	if n, err := a.jetty.Flush(out); n != 0 || err != nil {
		t.Errorf("flush before FLUSH_ERR_DONE was polled: %d, %v; want 0", n, err)
	}
	if cr := a.poll(t, 1)[0]; cr.Status != urma.StatusWRFlushErrDone || cr.LocalID != a.jetty.ID().ID {
		t.Fatalf("first record after ERROR: %+v, want the jetty's FLUSH_ERR_DONE", cr)
	}
	if n, _ := a.jfc.Poll(out); n != 0 {
		t.Errorf("poll after FLUSH_ERR_DONE: %d more records %+v, want none: the rest is urma_flush_jetty's", n, out[:n])
	}
	for _, n := range []int{0, 17} {
		if _, err := a.jetty.Flush(make([]urma.Completion, n)); code(err) != urma.CodeInval {
			t.Errorf("flush of %d records (SQ depth 16): %v, want EINVAL", n, err)
		}
	}
	got := make([]urma.Completion, 0, 3)
	for len(got) < 3 {
		n, err := a.jetty.Flush(out[:2])
		if err != nil || n == 0 {
			t.Fatalf("flush: %d, %v after %d records", n, err, len(got))
		}
		got = append(got, out[:n]...)
	}
	for i, cr := range got {
		if cr.Status != urma.StatusWRUnhandled || cr.UserCtx != uint64(10+i) || cr.LocalID != a.jetty.ID().ID {
			t.Errorf("flushed record %d: %+v, want send %d WR_UNHANDLED", i, cr, 10+i)
		}
	}
	if n, err := a.jetty.Flush(out); n != 0 || err != nil {
		t.Errorf("flush once drained: %d, %v", n, err)
	}
	if err := a.jetty.PostSend(&Send{Opcode: OpcSend, Target: tj}); code(err) != urma.CodeInval {
		t.Errorf("post on a jetty in ERROR: %v, want EINVAL", err)
	}
}

// A send that fails moves the jetty to ERROR with the rest of its queue
// unhandled: the failure comes through the JFC, the rest only from
// urma_flush_jetty once the program moved the jetty to ERROR.
func TestSendErrorThenFlush(t *testing.T) {
	la, lb := inprocLibraries(t)
	// One retry, after about 10 ms (B's min_rnr_timer 20): the second
	// send is queued behind the first when it fails.
	a, b := newEnd(t, la, endConfig{rnrRetry: 1}), newEnd(t, lb, endConfig{minRNR: 20})
	tj := a.importJetty(t, b, TMRM, 0)
	a.send(t, tj, OpcSend, 1, 0, a.sge(0, 8))
	a.send(t, tj, OpcSend, 2, 0, a.sge(0, 8))
	if cr := a.poll(t, 1)[0]; cr.Status != urma.StatusRNRRetryCntExc || cr.UserCtx != 1 {
		t.Fatalf("first record %+v, want send 1 RNR_RETRY_CNT_EXC", cr)
	}
	if err := a.jetty.Modify(AttrState, JettyStateError); err != nil {
		t.Fatal(err)
	}
	if cr := a.poll(t, 1)[0]; cr.Status != urma.StatusWRFlushErrDone {
		t.Fatalf("record after ERROR %+v, want FLUSH_ERR_DONE", cr)
	}
	out := make([]urma.Completion, 4)
	if n, err := a.jetty.Flush(out); err != nil || n != 1 || out[0].Status != urma.StatusWRUnhandled || out[0].UserCtx != 2 {
		t.Fatalf("flush: %d %v %+v, want send 2 WR_UNHANDLED", n, err, out[:n])
	}
}

func TestModifyJetty(t *testing.T) {
	la, _ := inprocLibraries(t)
	a := newEnd(t, la, endConfig{})
	for _, tc := range []struct {
		name        string
		mask, state uint32
		want        urma.Code
	}{
		{"nothing named", 0, JettyStateReset, 0},
		{"receive threshold", AttrRxThreshold, 0, urma.CodeInval},
		{"reset", AttrState, JettyStateReset, urma.CodeInval},
		{"ready", AttrState, JettyStateReady, urma.CodeInval},
		{"unknown attribute", 0x4, 0, urma.CodeInval},
	} {
		if err := a.jetty.Modify(tc.mask, tc.state); (err == nil && tc.want != 0) || (err != nil && code(err) != tc.want) {
			t.Errorf("%s: %v, want code %v", tc.name, err, tc.want)
		}
	}
}

// RC follows liburma's rules for bound jetties, over a provider that binds
// an RC jetty to the target of its first send for its life.
func TestRCBinding(t *testing.T) {
	la, lb := inprocLibraries(t)
	a, b := newEnd(t, la, endConfig{mode: TMRC}), newEnd(t, lb, endConfig{mode: TMRC})
	c := newEnd(t, lb, endConfig{mode: TMRC})
	rm := newEnd(t, la, endConfig{})
	tb, tc := a.importJetty(t, b, TMRC, 0), a.importJetty(t, c, TMRC, 0)
	if err := a.jetty.PostSend(&Send{Opcode: OpcSend, Target: tb}); code(err) != urma.CodeInval {
		t.Errorf("post on an RC jetty not bound: %v, want EINVAL", err)
	}
	if err := rm.jetty.Bind(rm.importJetty(t, b, TMRC, 0)); code(err) != codeNoPerm {
		t.Errorf("bind of an RM jetty: %v, want URMA_ENOPERM", err)
	}
	if err := a.jetty.Bind(tb); err != nil {
		t.Fatal(err)
	}
	if err := a.jetty.Bind(tc); code(err) != urma.CodeInval {
		t.Errorf("bind while bound: %v, want EINVAL", err)
	}
	if err := b.jfr.PostRecv(1, b.sge(0, 64)); err != nil {
		t.Fatal(err)
	}
	a.send(t, tc, OpcSend, 5, 0, a.sge(0, 8)) // goes to the bound target, B
	if cr := b.poll(t, 1)[0]; cr.RemoteID != a.jetty.ID() {
		t.Errorf("B's record %+v: the send went elsewhere", cr)
	}
	if cr := a.poll(t, 1)[0]; cr.Status != urma.StatusSuccess || cr.RemoteID.ID != b.jetty.ID().ID {
		t.Errorf("A's record %+v, want success to B", cr)
	}
	if err := a.jetty.Close(); code(err) != codeNoPerm {
		t.Errorf("delete of a bound jetty: %v, want URMA_ENOPERM", err)
	}
	if err := tb.Close(); code(err) != urma.CodeFail {
		t.Errorf("unimport of a bound target: %v, want URMA_FAIL", err)
	}
	if err := a.jetty.Unbind(); err != nil {
		t.Fatal(err)
	}
	if err := a.jetty.Unbind(); code(err) != urma.CodeInval {
		t.Errorf("unbind when not bound: %v, want EINVAL", err)
	}
	if err := a.jetty.Bind(tc); code(err) != urma.CodeInval {
		t.Errorf("bind to another target after sending: %v, want EINVAL", err)
	}
	if err := tb.Close(); err != nil {
		t.Errorf("unimport once unbound: %v", err)
	}
	if err := a.jetty.Close(); err != nil {
		t.Fatalf("delete once unbound: %v", err)
	}
	// The import the provider still held went with the jetty: the context
	// has only its other objects left.
	for _, o := range []interface{ Close() error }{tc, a.jfr, a.seg, a.jfc, a.jfce} {
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ctx.Close(); err != nil {
		t.Errorf("delete context: %v; something of the RC jetty outlived it", err)
	}
}

// Deleting a jetty drops its records not yet polled, as udma's delete
// does: a new jetty given the same id must not get them.
func TestJettyCloseDropsItsRecords(t *testing.T) {
	la, lb := inprocLibraries(t)
	a, b := newEnd(t, la, endConfig{}), newEnd(t, lb, endConfig{})
	tj := a.importJetty(t, b, TMRM, 0)
	other, err := a.ctx.CreateJetty(JettyConfig{ShareJFR: true, Mode: TMRM, Depth: 4, SendJFC: a.jfc, JFR: a.jfr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	for i := range 3 {
		if err := b.jfr.PostRecv(uint64(i), b.sge(i*64, 64)); err != nil {
			t.Fatal(err)
		}
	}
	a.send(t, tj, OpcSend, 1, 0, a.sge(0, 8))
	a.send(t, tj, OpcSend, 2, 0, a.sge(0, 8))
	if err := other.PostSend(&Send{Opcode: OpcSend, Complete: true, Target: tj, UserCtx: 3, SGEs: a.sge(0, 8)}); err != nil {
		t.Fatal(err)
	}
	b.poll(t, 3)
	id := a.jetty.ID().ID
	if err := a.jetty.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := a.ctx.CreateJetty(JettyConfig{ShareJFR: true, Mode: TMRM, Depth: 4, SendJFC: a.jfc, JFR: a.jfr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Close() })
	if again.ID().ID != id {
		t.Logf("the new jetty has id %d, not the deleted one's %d", again.ID().ID, id)
	}
	out := make([]urma.Completion, 8)
	n, err := a.jfc.Poll(out)
	if err != nil || n != 1 || out[0].UserCtx != 3 || out[0].LocalID != other.ID().ID {
		t.Errorf("poll after the delete: %d %v %+v, want only the other jetty's record", n, err, out[:n])
	}
}

// urma_wait_jfc returns the JFC the program created, by its own address.
func TestWaitNamesTheJFC(t *testing.T) {
	la, lb := inprocLibraries(t)
	a, b := newEnd(t, la, endConfig{}), newEnd(t, lb, endConfig{})
	tj := a.importJetty(t, b, TMRM, 0)
	if err := b.jfc.Rearm(false); err != nil {
		t.Fatal(err)
	}
	var out [2]uintptr
	if n, err := b.jfce.Wait(out[:], 0); n != 0 || err != nil {
		t.Errorf("wait with nothing fired: %d, %v", n, err)
	}
	if err := b.jfr.PostRecv(1, b.sge(0, 64)); err != nil {
		t.Fatal(err)
	}
	a.send(t, tj, OpcSend, 1, 0, a.sge(0, 8))
	n, err := b.jfce.Wait(out[:], 5000)
	if err != nil || n != 1 || out[0] != 0xc0ffee {
		t.Fatalf("wait: %d, %v, %#x; want the JFC created as 0xc0ffee", n, err, out[0])
	}
	b.jfc.Ack(1)
}

// Deletes of objects in use fail as liburma's do; the caller's memory
// stays the caller's.
func TestDeleteStatuses(t *testing.T) {
	la, _ := inprocLibraries(t)
	a := newEnd(t, la, endConfig{})
	if err := a.ctx.Close(); code(err) != urma.CodeAgain {
		t.Errorf("delete of a context in use: %v, want EAGAIN as liburma's", err)
	}
	if err := a.jfc.Close(); code(err) != urma.CodeFail {
		t.Errorf("delete of a JFC in use: %v, want URMA_FAIL", err)
	}
	if err := a.jfr.Close(); code(err) != urma.CodeFail {
		t.Errorf("delete of a JFR in use: %v, want URMA_FAIL", err)
	}
	if err := a.seg.Close(); err != nil {
		t.Fatal(err)
	}
	a.mem[0] = 1 // still mapped: unregistering never unmaps
	if Status(a.seg.Close()) != 0 {
		t.Error("second unregister failed")
	}
}

func TestPostRefusals(t *testing.T) {
	la, lb := inprocLibraries(t)
	a, b := newEnd(t, la, endConfig{jfrDepth: 1}), newEnd(t, lb, endConfig{})
	tj := a.importJetty(t, b, TMRM, 0)
	for _, tc := range []struct {
		name string
		w    Send
	}{
		{"WRITE", Send{Opcode: OpcWrite, Target: tj}},
		{"READ", Send{Opcode: OpcRead, Target: tj}},
		{"no target", Send{Opcode: OpcSend}},
		{"17 SGEs", Send{Opcode: OpcSend, Target: tj, SGEs: make([]SGE, 17)}},
	} {
		if err := a.jetty.PostSend(&tc.w); code(err) != urma.CodeInval {
			t.Errorf("%s: %v, want EINVAL", tc.name, err)
		}
	}
	if err := a.jfr.PostRecv(1, a.sge(0, 8)); err != nil {
		t.Fatal(err)
	}
	if err := a.jfr.PostRecv(2, a.sge(0, 8)); code(err) != urma.CodeNoMem {
		t.Errorf("receive past the depth: %v, want URMA_ENOMEM as udma's", err)
	}
}

// An SGE outside the context's registered memory is accepted and
// completes with LOC_ACCESS; nothing is read from it.
func TestSGEOutsideSegments(t *testing.T) {
	la, lb := inprocLibraries(t)
	b := newEnd(t, lb, endConfig{})
	for _, tc := range []struct {
		name string
		sges func(own, other *end) []SGE
	}{
		{"no segment named", func(own, _ *end) []SGE { return []SGE{{Addr: own.addr(0), Len: 8}} }},
		{"past its end", func(own, _ *end) []SGE { return []SGE{{Addr: own.addr(0) + 64<<10 - 4, Len: 8, Seg: own.seg}} }},
		{"before it", func(own, _ *end) []SGE { return []SGE{{Addr: own.addr(0) - 8, Len: 8, Seg: own.seg}} }},
		{"another context's", func(_, other *end) []SGE { return other.sge(0, 8) }},
	} {
		if err := b.jfr.PostRecv(1, b.sge(0, 64)); err != nil {
			t.Fatal(err)
		}
		a := newEnd(t, la, endConfig{}) // a fresh jetty each: the error moves it to ERROR
		if err := a.jetty.PostSend(&Send{Opcode: OpcSend, Complete: true, Target: a.importJetty(t, b, TMRM, 0), UserCtx: 9, SGEs: tc.sges(a, b)}); err != nil {
			t.Fatal(err)
		}
		if cr := a.poll(t, 1)[0]; cr.Status != urma.StatusLocAccess {
			t.Errorf("%s: %+v, want LOC_ACCESS", tc.name, cr)
		}
	}
}

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("plain"), 0x1000},
		{urma.Errorf("x", urma.CodeAgain, "full"), int(syscall.EAGAIN)},
		{fmt.Errorf("wrapped: %w", urma.Errorf("x", urma.CodeNoDev, "none")), int(syscall.ENODEV)},
		{urma.Errorf("x", urma.ErrClosed.Code, "closed"), int(syscall.EINVAL)},
	} {
		if got := Status(tc.err); got != tc.want {
			t.Errorf("Status(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// Each fabric's provider: auto puts a device on both, shm EID first.
func TestNewSoftProvider(t *testing.T) {
	for _, tc := range []struct {
		fabric string
		eids   int
		shm    bool // the first EID is an shm one
	}{{FabricAuto, 2, true}, {FabricShm, 1, true}, {FabricSocket, 1, false}} {
		t.Run(tc.fabric, func(t *testing.T) {
			dir := t.TempDir()
			p, err := NewSoftProvider(Config{Fabric: tc.fabric, ShmDir: dir, ShmSocketDir: filepath.Join(dir, "own"),
				Devices: []string{"soft0", "soft1"}, ListenIP: netip.MustParseAddr("127.0.0.1")}, logr.Discard())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			devs, err := p.Devices()
			if err != nil || len(devs) != 2 || devs[0].Name != "soft0" || devs[1].Name != "soft1" {
				t.Fatalf("devices %+v, %v; want soft0 and soft1", devs, err)
			}
			if n := len(devs[0].EIDs); n != tc.eids || soft.IsShmEID(devs[0].EIDs[0].EID) != tc.shm {
				t.Errorf("EIDs %+v, want %d, the first shm %v", devs[0].EIDs, tc.eids, tc.shm)
			}
			if tc.shm {
				if _, err := os.Stat(filepath.Join(dir, "own")); err != nil {
					t.Errorf("the shm sockets are not in URMA_SHM_SOCKET_DIR: %v", err)
				}
			}
		})
	}
	if _, err := NewSoftProvider(Config{Fabric: "rdma"}, logr.Discard()); err == nil {
		t.Error("an unknown fabric was taken")
	}
}
