package soft

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// What the package's tests share: providers that close with the test,
// the options of each fabric, a minimal endpoint (side) and polling of its
// completions.

func socketOpts() Options {
	return Options{PeerTimeout: 400 * time.Millisecond, DialTimeout: time.Second, Logger: logr.Discard()}
}

// pollUntil polls q, as a polling application does, until n completions
// arrived, and returns them.
func pollUntil(t *testing.T, q urma.JFC, n int) []urma.Completion {
	t.Helper()
	out := make([]urma.Completion, 0, n)
	buf := make([]urma.Completion, 16)
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < n {
		k, err := q.Poll(buf[:min(16, n-len(out))])
		mustOK(t, err, "poll")
		out = append(out, buf[:k]...)
		if k == 0 && time.Now().After(deadline) {
			t.Fatalf("got %d of %d completions", len(out), n)
		}
	}
	return out
}

// Ordinary teardown on a sender: it closes its jetty, then unregisters a
// segment a SEND_REF still unread in the ring refers to. SEG_UNMAP, on the
// unix socket, overtakes the SEND_REF: the receiver must answer it
// REM_ACCESS_ABORT (the peer unshared the memory), not drop the
// connection as a protocol violation, failing every other send on it.
// loggedProvider is newProvider logging into the sink it returns.
func loggedProvider(t *testing.T, opts Options) (*Provider, *logtest.Lines) {
	t.Helper()
	sink := &logtest.Lines{}
	opts.Logger = sink.Logger(nil)
	return newProvider(t, opts), sink
}

// newProvider creates a provider that closes with the test.
func newProvider(t testing.TB, opts Options) *Provider {
	t.Helper()
	if opts.Logger.GetSink() == nil {
		opts.Logger = testr.NewWithInterface(t, testr.Options{Verbosity: 0})
	}
	p, err := New(opts)
	if err != nil {
		t.Fatalf("create provider: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close provider: %v", err)
		}
	})
	return p
}

// quiet is a logger that drops everything; unlike logr.Discard it keeps
// newProvider from substituting the test logger (benchmarks, children).
func quiet() logr.Logger { return funcr.New(func(string, string) {}, funcr.Options{}) }

// noLeaks checks, at the end of the test, that every goroutine started since
// now has returned.
func noLeaks(t testing.TB) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("%d goroutines leaked:\n%s", runtime.NumGoroutine()-before, buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(time.Millisecond) // polling deadline: goroutines end on their own schedule
		}
	})
}

// shmOpts places the shm fabric's sockets in a directory of the test: a
// short one, since a unix socket path holds at most 107 bytes.
func shmOpts(t testing.TB) Options {
	t.Helper()
	dir, err := os.MkdirTemp("", "shm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return Options{ShmDir: dir, PeerTimeout: 600 * time.Millisecond, DialTimeout: time.Second}
}

// wireFabric is a fabric between providers and the options that make one.
type wireFabric struct {
	name string
	opts func(t *testing.T) Options
}

// wireFabrics are the fabrics with connections, to replace and to lose:
// socket and shm.
func wireFabrics() []wireFabric {
	return []wireFabric{
		{"socket", func(*testing.T) Options { return socketOpts() }},
		{"shm", func(t *testing.T) Options { return shmOpts(t) }},
	}
}

// side is a minimal endpoint for soft-specific tests.
type side struct {
	t     testing.TB
	ctx   urma.Context
	sjfc  urma.JFC
	rjfc  urma.JFC
	jfr   urma.JFR
	jetty urma.Jetty
	mem   *urma.Memory
	seg   urma.Segment
}

func mustOK(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// ignoringEINTR calls f again while it fails with EINTR, as the provider's
// own system calls do: the runtime's preemption signal interrupts a test's
// raw calls too, and poll(2), epoll_wait(2) and socket calls with a timeout
// are not restarted after it, whatever SA_RESTART says.
func ignoringEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func newSide(t testing.TB, p *Provider, jc urma.JettyConfig, cqDepth uint32) *side {
	t.Helper()
	s := &side{t: t}
	var err error
	s.ctx, err = p.Open("", 0)
	mustOK(t, err, "open")
	s.sjfc, err = s.ctx.CreateJFC(urma.JFCConfig{Depth: cqDepth})
	mustOK(t, err, "create send JFC")
	s.rjfc, err = s.ctx.CreateJFC(urma.JFCConfig{Depth: 256})
	mustOK(t, err, "create receive JFC")
	if jc.Mode == 0 {
		jc.Mode = urma.RC
	}
	s.jfr, err = s.ctx.CreateJFR(urma.JFRConfig{Mode: jc.Mode, Depth: 64, MaxSGE: 2, JFC: s.rjfc, TokenPolicy: urma.TokenPlainText, Token: 7})
	mustOK(t, err, "create JFR")
	if jc.SQDepth == 0 {
		jc.SQDepth = 64
	}
	jc.SendJFC, jc.JFR = s.sjfc, s.jfr
	s.jetty, err = s.ctx.CreateJetty(jc)
	mustOK(t, err, "create jetty")
	s.mem, err = urma.AllocMemory(1 << 20)
	mustOK(t, err, "alloc")
	s.seg, err = s.ctx.RegisterSegment(s.mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	mustOK(t, err, "register")
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{s.jetty, s.jfr, s.rjfc, s.sjfc, s.seg} {
			_ = c.Close()
		}
		_ = s.mem.Free()
		_ = s.ctx.Close()
	})
	return s
}

func (s *side) importJetty(o *side) urma.RemoteJetty {
	s.t.Helper()
	rj, err := s.ctx.ImportJetty(s.t.Context(), o.jetty.ID(), urma.RC, 7)
	mustOK(s.t, err, "import")
	s.t.Cleanup(func() { _ = rj.Close() })
	return rj
}

func (s *side) importJettyID(id urma.JettyID) urma.RemoteJetty {
	s.t.Helper()
	rj, err := s.ctx.ImportJetty(s.t.Context(), id, urma.RC, 0)
	mustOK(s.t, err, "import")
	s.t.Cleanup(func() { _ = rj.Close() })
	return rj
}

func (s *side) postRecv(ctx uint64, off, n int) {
	s.t.Helper()
	mustOK(s.t, s.jfr.PostRecv(&urma.RecvWR{UserCtx: ctx, SGEs: []urma.SGE{{Segment: s.seg, Offset: uint64(off), Len: uint32(n)}}}), "post receive")
}

func (s *side) send(target urma.RemoteJetty, ctx uint64, off, n int, flags urma.SendFlags) error {
	return s.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: flags | urma.SendCompleteEnable, Target: target, UserCtx: ctx,
		SGEs: []urma.SGE{{Segment: s.seg, Offset: uint64(off), Len: uint32(n)}}})
}

func pollN(t testing.TB, q urma.JFC, n int, timeout time.Duration) []urma.Completion {
	t.Helper()
	out, err := pollFor(q, n, timeout)
	mustOK(t, err, "poll")
	return out
}

// pollFor polls q until it has n completions, or fails once timeout
// passes without them; unlike pollN it may run off the test's goroutine.
func pollFor(q urma.JFC, n int, timeout time.Duration) ([]urma.Completion, error) {
	var out []urma.Completion
	buf := make([]urma.Completion, 16)
	deadline := time.Now().Add(timeout)
	for len(out) < n {
		k, err := q.Poll(buf[:min(16, n-len(out))])
		if err != nil {
			return out, err
		}
		out = append(out, buf[:k]...)
		if k == 0 {
			if time.Now().After(deadline) {
				return out, fmt.Errorf("got %d of %d completions in %v: %+v", len(out), n, timeout, out)
			}
			time.Sleep(50 * time.Microsecond) // polling deadline: completions arrive from other goroutines
		}
	}
	return out, nil
}
