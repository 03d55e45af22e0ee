//go:build linux && cgo

package liburma

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// failedDeleteCase is an object of one kind, whose delete in liburma the
// fake fails once.
type failedDeleteCase struct {
	call string // the liburma function that fails
	// make creates the object on c; use exercises it (nil: nothing to
	// try), and deps are what it needs, closed after it.
	make func(t *testing.T, c urma.Context) (obj io.Closer, use func() error, deps []io.Closer)
}

func failedDeleteCases() map[string]failedDeleteCase {
	return map[string]failedDeleteCase{
		"context": {"urma_delete_context", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			return c, func() error {
				e, err := c.CreateJFCE()
				if err == nil {
					err = e.Close()
				}
				return err
			}, nil
		}},
		"JFCE": {"urma_delete_jfce", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			e := must(c.CreateJFCE())(t)
			return e, func() error {
				if e.Fd() < 0 {
					return urma.ErrClosed
				}
				_, err := e.Wait(make([]urma.JFC, 1), time.Millisecond)
				return err
			}, nil
		}},
		"JFC": {"urma_delete_jfc", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			q := must(c.CreateJFC(urma.JFCConfig{Depth: 16}))(t)
			return q, func() error { _, err := q.Poll(make([]urma.Completion, 4)); return err }, nil
		}},
		// A polling-only JFC's hidden JFCE goes after the JFC: when its
		// delete fails, the JFC is gone in liburma and refuses every verb
		// (nothing to try), but Close must delete the JFCE again.
		"polling-JFC-JFCE": {"urma_delete_jfce", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			return must(c.CreateJFC(urma.JFCConfig{Depth: 16}))(t), nil, nil
		}},
		"JFR": {"urma_delete_jfr", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			q := must(c.CreateJFC(urma.JFCConfig{Depth: 16}))(t)
			r := must(c.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 4, JFC: q}))(t)
			return r, func() error { return r.PostRecv(&urma.RecvWR{UserCtx: 1}) }, []io.Closer{q}
		}},
		"jetty": {"urma_delete_jetty", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			q := must(c.CreateJFC(urma.JFCConfig{Depth: 16}))(t)
			r := must(c.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 4, JFC: q}))(t)
			j := must(c.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 4, SendJFC: q, JFR: r}))(t)
			// SetError needs the jetty where Poll finds it, as a flush does.
			return j, j.SetError, []io.Closer{r, q}
		}},
		"remote-jetty": {"urma_unimport_jetty", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			q := must(c.CreateJFC(urma.JFCConfig{Depth: 16}))(t)
			r := must(c.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 4, JFC: q}))(t)
			j := must(c.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 4, SendJFC: q, JFR: r}))(t)
			target := must(c.ImportJetty(t.Context(), j.ID(), urma.RM, 0))(t)
			return target, func() error {
				if err := r.PostRecv(&urma.RecvWR{UserCtx: 1}); err != nil {
					return err
				}
				return j.PostSend(&urma.SendWR{Opcode: urma.OpSend, Target: target, UserCtx: 2})
			}, []io.Closer{j, r, q}
		}},
		"segment": {"urma_unregister_seg", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			mem := must(urma.AllocMemory(4096))(t)
			t.Cleanup(func() { _ = mem.Free() })
			s := must(c.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly}))(t)
			return s, func() error {
				if s.Bytes() == nil {
					return urma.ErrClosed
				}
				return nil
			}, nil
		}},
		"remote-segment": {"urma_unimport_seg", func(t *testing.T, c urma.Context) (io.Closer, func() error, []io.Closer) {
			mem := must(urma.AllocMemory(4096))(t)
			t.Cleanup(func() { _ = mem.Free() })
			s := must(c.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessRead}))(t)
			rs := must(c.ImportSegment(s.ID(), 0))(t)
			return rs, nil, []io.Closer{s}
		}},
	}
}

// must returns v, or fails t with err.
func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// A delete that fails in liburma leaves the object there, so the Go side
// keeps it too: Close returns the error, the object still works, and a
// second Close deletes it. Forgetting it leaked it in liburma (and, for a
// context, never deleted it again), which the fake shows by refusing to
// delete the context of a leaked object. Each case breaks a fake of its own.
func TestFailedDeleteKeepsTheObject(t *testing.T) {
	for name, tc := range failedDeleteCases() {
		t.Run(name, func(t *testing.T) {
			p := providerOfFake(t, "fakeurma")
			c := must(p.Open("udma0", 0))(t)
			obj, use, deps := tc.make(t, c)
			failNextDelete(t, p, tc.call)
			op := strings.TrimPrefix(tc.call, "urma_")
			if err := obj.Close(); err == nil || !strings.Contains(err.Error(), op) {
				t.Fatalf("Close when %s fails: %v, want its error", tc.call, err)
			}
			if use != nil {
				if err := use(); err != nil {
					t.Errorf("the object after its failed Close: %v; it is still in liburma", err)
				}
			}
			if err := obj.Close(); err != nil {
				t.Errorf("Close again: %v", err)
			}
			for _, d := range append(deps, c) {
				if err := d.Close(); err != nil {
					t.Errorf("close %T: %v; liburma kept something", d, err)
				}
			}
			if n := liveContexts(t, p); n != 0 {
				t.Errorf("%d contexts left in liburma", n)
			}
		})
	}
}

// Provider.Close tears everything down also when a delete fails, and says
// which failed; the object is closed after, since nothing may reach
// liburma once it is uninitialised.
func TestProviderCloseReportsFailedDeletes(t *testing.T) {
	for name, tc := range failedDeleteCases() {
		t.Run(name, func(t *testing.T) {
			p := providerOfFake(t, "fakeurma")
			c := must(p.Open("udma0", 0))(t)
			obj, use, _ := tc.make(t, c)
			failNextDelete(t, p, tc.call)
			op := strings.TrimPrefix(tc.call, "urma_")
			if err := p.Close(); err == nil || !strings.Contains(err.Error(), op) {
				t.Errorf("Provider.Close when %s fails: %v, want its error", tc.call, err)
			}
			if use != nil {
				if err := use(); !errors.Is(err, urma.ErrClosed) {
					t.Errorf("the object after Provider.Close: %v, want ErrClosed", err)
				}
			}
			if err := obj.Close(); err != nil {
				t.Errorf("Close after Provider.Close: %v", err)
			}
		})
	}
}

// failNextDelete makes the fake fail the next call of the liburma function
// call.
func failNextDelete(t *testing.T, p *Provider, call string) {
	t.Helper()
	b := append([]byte(call), 0)
	if err := p.lib.fakeHook("fakeurma_fail_delete", unsafe.Pointer(&b[0])); err != nil {
		t.Fatal(err)
	}
}

// liveContexts is how many contexts p's fake holds undeleted.
func liveContexts(t *testing.T, p *Provider) int {
	t.Helper()
	var n int32
	if err := p.lib.fakeHook("fakeurma_live_contexts", unsafe.Pointer(&n)); err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// A urma_uninit that fails leaves liburma initialised and ours: the next
// Provider meets EEXIST, and its last Close must uninitialise it, or
// nobody ever does.
func TestFailedUninitIsRetriedByTheNextLastClose(t *testing.T) {
	p := providerOfFake(t, "fakeurma")
	path := p.lib.path
	failNextDelete(t, p, "urma_uninit")
	if err := p.Close(); err == nil || !strings.Contains(err.Error(), "urma_uninit") {
		t.Fatalf("Close with a failing urma_uninit = %v, want an error naming it", err)
	}
	again, err := newProvider(Options{Library: path})
	if err != nil {
		t.Fatalf("New after a failed uninit: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatalf("the next last Close: %v", err)
	}
	// Uninitialised now: a third Provider initialises liburma itself.
	third, err := newProvider(Options{Library: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = third.Close() })
	if !third.lib.ownsInit {
		t.Error("liburma was still initialised: the failed uninit was never retried")
	}
}

// A polling JFC whose creation fails takes back the JFCE made for it; when
// liburma fails that delete too, nothing holds the JFCE but liburma, which
// keeps the context alive for it. The context deletes it before itself,
// and again at the next Close when that delete fails once more.
func TestFailedJFCCreationLeavesNoJFCE(t *testing.T) {
	for _, tc := range []struct {
		name         string
		jfceFailures int // failed deletes of the JFCE: at creation, then at Close
	}{
		{"deleted by the context's Close", 1},
		{"deleted by the second Close", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := providerOfFake(t, "fakeurma")
			c := must(p.Open("udma0", 0))(t)
			failNextDelete(t, p, "urma_create_jfc")
			for range tc.jfceFailures {
				failNextDelete(t, p, "urma_delete_jfce")
			}
			if _, err := c.CreateJFC(urma.JFCConfig{Depth: 16}); err == nil || !strings.Contains(err.Error(), "create_jfc") {
				t.Fatalf("CreateJFC when urma_create_jfc fails: %v, want its error", err)
			}
			for i := 1; i < tc.jfceFailures; i++ {
				if err := c.Close(); err == nil || !strings.Contains(err.Error(), "delete_jfce") {
					t.Fatalf("Close %d when the JFCE's delete fails: %v, want its error", i, err)
				}
				if n := liveContexts(t, p); n != 1 {
					t.Fatalf("%d contexts in liburma after a failed Close, want it kept", n)
				}
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v; liburma kept the JFCE", err)
			}
			if n := liveContexts(t, p); n != 0 {
				t.Errorf("%d contexts left in liburma", n)
			}
		})
	}
}

// Provider.Close deletes such a JFCE before its context as well.
func TestProviderCloseDeletesOrphanedJFCE(t *testing.T) {
	p := providerOfFake(t, "fakeurma")
	c := must(p.Open("udma0", 0))(t)
	failNextDelete(t, p, "urma_create_jfc")
	failNextDelete(t, p, "urma_delete_jfce")
	if _, err := c.CreateJFC(urma.JFCConfig{Depth: 16}); err == nil {
		t.Fatal("CreateJFC succeeded although urma_create_jfc failed")
	}
	if n := liveContexts(t, p); n != 1 {
		t.Fatalf("%d contexts in liburma, want 1", n)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Provider.Close: %v; the context's orphaned JFCE was not deleted first", err)
	}
}
