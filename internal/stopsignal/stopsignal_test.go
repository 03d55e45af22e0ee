package stopsignal

import (
	"context"
	"syscall"
	"testing"

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
