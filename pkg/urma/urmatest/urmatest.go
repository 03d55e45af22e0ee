// Package urmatest is the conformance suite for urma.Provider
// implementations. Run takes any pair of providers that can reach each other
// and checks, one subtest per behaviour, what a transport relies on: real
// bytes arrive intact and in order, queue depths are enforced, receivers
// without buffers make senders retry (RNR), tokens are checked per message
// (not at import), errors flush queues, vanished peers produce error
// completions instead of hangs, completion events fire exactly when armed,
// and objects refuse to die out of order. Where UB hardware imposes a rule a
// software provider could get wrong, the case says where in UMDK the rule
// comes from (hardware.go gathers most of them). The software provider runs
// the suite in its tests, and the liburma provider runs it unchanged.
package urmatest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Pair is two providers that can reach each other, plus hooks for the
// behaviours that need a peer to go away.
type Pair struct {
	A, B urma.Provider
	// DeviceA and DeviceB name the devices to open; "" opens the first.
	DeviceA, DeviceB string
	// KillB makes B vanish abruptly, as a crashed process or a broken link
	// would (for example closing its provider, or kill -9 of its process).
	// Nil skips the behaviours that need it.
	KillB func()
	// PeerGoneTimeout bounds how long sends to a vanished peer may take to
	// complete with an error; zero means 10s.
	PeerGoneTimeout time.Duration
}

// NewPair builds a fresh Pair for one subtest; it registers the providers'
// teardown with t.Cleanup.
type NewPair func(t *testing.T) Pair

// waitTimeout bounds every wait for a completion that must arrive.
const waitTimeout = 10 * time.Second

// Run runs every behaviour as a subtest, each on a fresh Pair.
func Run(t *testing.T, newPair NewPair) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pr := newPair(t)
			if pr.PeerGoneTimeout == 0 {
				pr.PeerGoneTimeout = 10 * time.Second
			}
			c.run(t, pr)
		})
	}
}

type testCase struct {
	name string
	run  func(t *testing.T, pr Pair)
}

// cases lists every behaviour; the files of this package append to it in
// their init functions, grouped by topic.
var cases []testCase

func register(name string, run func(t *testing.T, pr Pair)) {
	cases = append(cases, testCase{name: name, run: run})
}

// epConfig shapes an endpoint; zero fields take the defaults below.
type epConfig struct {
	Mode      urma.TransportMode // RC
	SQDepth   uint32             // 64
	RQDepth   uint32             // 64
	CQDepth   uint32             // 1024
	MaxSGE    uint32             // 4
	MaxInline uint32             // 0: no inline sends
	RNRRetry  *uint8             // 7: retry forever
	MinRNR    uint8
	Token     urma.Token // 0x5eed
	MemSize   int        // 4 MiB
	Events    bool       // put the receive JFC on a JFCE
}

func rnr(n uint8) *uint8 { return &n }

// endpoint is one side's full set of objects: a context, a JFCE (when asked),
// a send JFC, a receive JFC, a JFR, a jetty and one registered segment.
type endpoint struct {
	t       testing.TB
	cfg     epConfig
	ctx     urma.Context
	jfce    urma.JFCE
	sendJFC urma.JFC
	recvJFC urma.JFC
	jfr     urma.JFR
	jetty   urma.Jetty
	mem     *urma.Memory
	seg     urma.Segment
	extra   []io.Closer // closed first, last added first
}

func (c *epConfig) fill() {
	if c.Mode == 0 {
		c.Mode = urma.RC
	}
	if c.SQDepth == 0 {
		c.SQDepth = 64
	}
	if c.RQDepth == 0 {
		c.RQDepth = 64
	}
	if c.CQDepth == 0 {
		c.CQDepth = 1024
	}
	if c.MaxSGE == 0 {
		c.MaxSGE = 4
	}
	if c.RNRRetry == nil {
		c.RNRRetry = rnr(7)
	}
	if c.Token == 0 {
		c.Token = 0x5eed
	}
	if c.MemSize == 0 {
		c.MemSize = 4 << 20
	}
}

// open creates an endpoint on provider p and registers its teardown.
func open(t testing.TB, p urma.Provider, dev string, cfg epConfig) *endpoint {
	t.Helper()
	cfg.fill()
	e := &endpoint{t: t, cfg: cfg}
	t.Cleanup(e.close)
	var err error
	e.ctx, err = p.Open(dev, 0)
	must(t, err, "open device %q", dev)
	if cfg.Events {
		e.jfce, err = e.ctx.CreateJFCE()
		must(t, err, "create JFCE")
	}
	e.sendJFC, err = e.ctx.CreateJFC(urma.JFCConfig{Depth: cfg.CQDepth})
	must(t, err, "create send JFC")
	e.recvJFC, err = e.ctx.CreateJFC(urma.JFCConfig{Depth: cfg.CQDepth, JFCE: e.jfce})
	must(t, err, "create receive JFC")
	e.jfr = e.newJFR(cfg.Token)
	e.jetty = e.newJetty()
	e.mem, err = urma.AllocMemory(cfg.MemSize)
	must(t, err, "alloc memory")
	e.seg, err = e.ctx.RegisterSegment(e.mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	must(t, err, "register segment")
	return e
}

// newJFR creates a receive queue guarded by token (policy PLAIN_TEXT).
func (e *endpoint) newJFR(token urma.Token) urma.JFR {
	e.t.Helper()
	r, err := e.ctx.CreateJFR(urma.JFRConfig{
		Mode: e.cfg.Mode, Depth: e.cfg.RQDepth, MaxSGE: e.cfg.MaxSGE, JFC: e.recvJFC, MinRNRTimer: e.cfg.MinRNR,
		TokenPolicy: urma.TokenPlainText, Token: token,
	})
	must(e.t, err, "create JFR")
	return r
}

// newJetty creates a jetty on the endpoint's send JFC and JFR; its receive
// side has the JFR's token.
func (e *endpoint) newJetty() urma.Jetty {
	e.t.Helper()
	j, err := e.ctx.CreateJetty(urma.JettyConfig{
		Mode: e.cfg.Mode, SQDepth: e.cfg.SQDepth, MaxSGE: e.cfg.MaxSGE, MaxInline: e.cfg.MaxInline, SendJFC: e.sendJFC, JFR: e.jfr,
		RNRRetry: *e.cfg.RNRRetry,
	})
	must(e.t, err, "create jetty")
	return j
}

// close tears down in liburma's order. The endpoint's jetty goes first: it
// unbinds an RC target, which cannot be unimported while bound. A provider
// killed under the test has destroyed everything already; its objects then
// close as no-ops.
func (e *endpoint) close() {
	ok := func(err error, what string) bool {
		if err != nil && !errors.Is(err, urma.ErrClosed) {
			e.t.Errorf("teardown: close %s: %v", what, err)
			return false
		}
		return true
	}
	if e.jetty != nil {
		ok(e.jetty.Close(), "jetty")
	}
	for i := len(e.extra) - 1; i >= 0; i-- {
		ok(e.extra[i].Close(), "extra object")
	}
	for _, c := range []struct {
		o    io.Closer
		what string
	}{{e.jfr, "JFR"}, {e.recvJFC, "receive JFC"}, {e.sendJFC, "send JFC"}, {e.jfce, "JFCE"}} {
		if c.o != nil {
			ok(c.o.Close(), c.what)
		}
	}
	segClosed := e.seg == nil || ok(e.seg.Close(), "segment")
	if e.mem != nil && segClosed {
		ok(e.mem.Free(), "memory")
	}
	if e.ctx != nil {
		ok(e.ctx.Close(), "context")
	}
}

func ctxWithTimeout(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// own registers an object for teardown before the endpoint's own.
func (e *endpoint) own(c io.Closer) { e.extra = append(e.extra, c) }

// importFrom imports peer's jetty into this endpoint's context.
func (e *endpoint) importFrom(peer *endpoint, token urma.Token) urma.RemoteJetty {
	e.t.Helper()
	return e.importJetty(peer.jetty.ID(), token)
}

func (e *endpoint) importJetty(id urma.JettyID, token urma.Token) urma.RemoteJetty {
	e.t.Helper()
	rj, err := e.ctx.ImportJetty(ctxWithTimeout(e.t), id, e.cfg.Mode, token)
	must(e.t, err, "import jetty %v", id)
	e.own(rj)
	return rj
}

// mem returns n bytes of the endpoint's memory at off.
func (e *endpoint) bytes(off, n int) []byte { return e.mem.Bytes()[off : off+n] }

// postRecv posts one receive of n bytes at off.
func (e *endpoint) postRecv(userCtx uint64, off, n int) {
	e.t.Helper()
	must(e.t, e.jfr.PostRecv(&urma.RecvWR{UserCtx: userCtx, SGEs: []urma.SGE{{Segment: e.seg, Offset: uint64(off), Len: uint32(n)}}}), "post receive")
}

// sendWR builds a send of n bytes at off.
func (e *endpoint) sendWR(target urma.RemoteJetty, userCtx uint64, off, n int) *urma.SendWR {
	wr := &urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: userCtx}
	if n > 0 {
		wr.SGEs = []urma.SGE{{Segment: e.seg, Offset: uint64(off), Len: uint32(n)}}
	}
	return wr
}

func (e *endpoint) send(target urma.RemoteJetty, userCtx uint64, off, n int) {
	e.t.Helper()
	must(e.t, e.jetty.PostSend(e.sendWR(target, userCtx, off, n)), "post send")
}

// wait polls jfc until n completions have arrived; fewer by the deadline
// fails the test.
func wait(t testing.TB, jfc urma.JFC, n int, timeout time.Duration) []urma.Completion {
	t.Helper()
	out := make([]urma.Completion, 0, n)
	buf := make([]urma.Completion, 32)
	deadline := time.Now().Add(timeout)
	for spins := 0; len(out) < n; spins++ {
		k, err := jfc.Poll(buf[:min(len(buf), n-len(out))])
		must(t, err, "poll JFC")
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %d completions, got %d: %v", timeout, n, len(out), out)
		}
		backoff(spins)
	}
	return out
}

// backoff yields while a poll finds nothing: first the CPU, then briefly
// the thread, so a polling test neither spins a core nor adds latency.
func backoff(spins int) {
	if spins < 64 {
		runtime.Gosched()
		return
	}
	time.Sleep(50 * time.Microsecond)
}

// empty asserts that jfc holds no completion right now.
func empty(t testing.TB, jfc urma.JFC, what string) {
	t.Helper()
	var buf [4]urma.Completion
	n, err := jfc.Poll(buf[:])
	must(t, err, "poll JFC")
	if n != 0 {
		t.Fatalf("%s: want no completion, got %v", what, buf[:n])
	}
}

func must(t testing.TB, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}

// wantErr asserts err matches target.
func wantErr(t testing.TB, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: want %v, got %v", what, target, err)
	}
}

// fillRandom writes a deterministic pattern.
func fillRandom(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// statusIn reports whether s is one of want.
func statusIn(s urma.Status, want ...urma.Status) bool {
	for _, w := range want {
		if s == w {
			return true
		}
	}
	return false
}
