package stopsignal

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/logtest"
)

// Without a signal, the context ends with stop or with its parent, and
// nothing says the process is stopping. (A signal's effect is checked by
// the binaries' tests, in a subprocess: see package stopsignaltest.)
func TestContextEndsWithoutSignal(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(stop func(), cancelParent context.CancelFunc)
	}{
		{"stop", func(stop func(), _ context.CancelFunc) { stop() }},
		{"parent canceled", func(_ func(), cancelParent context.CancelFunc) { cancelParent() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lines logtest.Lines
			parent, cancelParent := context.WithCancel(context.Background())
			defer cancelParent()
			ctx, stop := Context(parent, lines.Logger(t), syscall.SIGTERM)
			if ctx.Err() != nil {
				t.Fatal("context ended before anything ended it")
			}
			tc.end(stop, cancelParent)
			<-ctx.Done()
			stop() // after the parent's end, or a second time: harmless
			if lines.Contains(StoppingMessage) {
				t.Fatalf("logged %q without a signal: %s", StoppingMessage, lines.String())
			}
		})
	}
}

// A second signal that reached the channel before signal.Stop returned was
// caught and dropped, so two signals did not end the process: it must be
// raised again, and only it. (The real signals are the binaries' tests'.)
func TestWatchRaisesSignalsCaughtAfterTheFirst(t *testing.T) {
	for _, tc := range []struct {
		name       string
		sent       []os.Signal
		wantRaised []os.Signal
	}{
		{"none, context ended", nil, nil},
		{"one", []os.Signal{syscall.SIGTERM}, nil},
		{"SIGTERM twice", []os.Signal{syscall.SIGTERM, syscall.SIGTERM}, []os.Signal{syscall.SIGTERM}},
		{"SIGINT then SIGTERM", []os.Signal{syscall.SIGINT, syscall.SIGTERM}, []os.Signal{syscall.SIGTERM}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lines logtest.Lines
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if len(tc.sent) == 0 {
				cancel()
			}
			// Context's own channel: it must hold both signals, or os/signal
			// would drop the second before watch could see it.
			ch := newChan()
			for _, s := range tc.sent {
				select {
				case ch <- s:
				default:
					t.Fatalf("no room for %v after %v", s, tc.sent)
				}
			}
			var raised []os.Signal
			watch(ctx, cancel, lines.Logger(t), ch, func(s os.Signal) { raised = append(raised, s) })
			if !slices.Equal(raised, tc.wantRaised) {
				t.Errorf("raised %v, want %v", raised, tc.wantRaised)
			}
			if ctx.Err() == nil {
				t.Error("context not ended")
			}
			if got, want := lines.Count(StoppingMessage), min(len(tc.sent), 1); got != want {
				t.Errorf("logged %q %d times, want %d: %s", StoppingMessage, got, want, lines.String())
			}
		})
	}
}

// envRaiseChild, set to "1", tells TestRaiseEndsTheProcess that it runs as
// its own child.
const envRaiseChild = "URMA_STOPSIGNAL_RAISE_CHILD"

// What watch raises must end the process: once ch is stopped, the signal has
// its default action again.
func TestRaiseEndsTheProcess(t *testing.T) {
	if os.Getenv(envRaiseChild) == "1" {
		ch := newChan()
		signal.Notify(ch, syscall.SIGTERM)
		ch <- syscall.SIGTERM // the first, as if caught
		ch <- syscall.SIGTERM // a second, caught before signal.Stop returned
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		watch(ctx, cancel, logr.Discard(), ch, raise)
		// A bound, reached only if the raised signal did not end the
		// process: the parent then sees an exit instead of the signal.
		time.Sleep(10 * time.Second)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRaiseEndsTheProcess$")
	cmd.Env = append(os.Environ(), envRaiseChild+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child ended with %v, want killed by SIGTERM; it said:\n%s", err, out)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("child ended with %v, want killed by SIGTERM; it said:\n%s", err, out)
	}
}
