// Package stopsignal gives a binary's main a context that ends at the first
// stop signal, and lets a second one end the process at once.
package stopsignal

import (
	"context"
	"os"
	"os/signal"

	"github.com/go-logr/logr"
)

// StoppingMessage is logged when the first signal arrives.
const StoppingMessage = "stopping; a second signal ends the process at once"

// Context returns a copy of parent that ends when one of sigs arrives, as
// signal.NotifyContext's does, but catches sigs only until the first one:
// from then on they have their default action again, so that a second one
// ends the process at once, however long the shutdown takes (a user
// pressing Ctrl-C twice need not wait, as with controller-runtime's signal
// handler). The first is logged, once the second would end the process.
// stop releases the signals and returns once the log line is written; call
// it when done with ctx.
func Context(parent context.Context, log logr.Logger, sigs ...os.Signal) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case s := <-ch:
			// Before ctx ends, so that no part of the shutdown runs while a
			// second signal would still be caught.
			signal.Stop(ch)
			cancel()
			log.Info(StoppingMessage, "signal", s.String())
		case <-ctx.Done():
			signal.Stop(ch)
		}
	}()
	return ctx, func() {
		cancel()
		<-done
	}
}
