// Package stopsignal gives a binary's main a context that ends at the first
// stop signal, and lets a second one end the process at once.
package stopsignal

import (
	"context"
	"os"
	"os/signal"
	"syscall"

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
	ch := newChan()
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watch(ctx, cancel, log, ch, raise)
	}()
	return ctx, func() {
		cancel()
		<-done
	}
}

// newChan makes the channel that Context catches signals on, with room for
// the first signal and a second sent before the first is received: os/signal
// drops a signal that does not fit.
func newChan() chan os.Signal { return make(chan os.Signal, 2) }

// watch waits on ch, registered with signal.Notify, for the first signal,
// or for ctx to end; either way it stops ch. At the first signal it gives
// any later one already in ch to raise, and then cancels ctx.
func watch(ctx context.Context, cancel context.CancelFunc, log logr.Logger, ch chan os.Signal, raise func(os.Signal)) {
	select {
	case s := <-ch:
		// Before ctx ends, so that no part of the shutdown runs while a
		// second signal would still be caught.
		signal.Stop(ch)
		// os/signal gives each signal either to ch or to its default
		// action; a second one that came before Stop returned is in ch, and
		// would be lost: raise it again, now that it has its default action.
		for len(ch) > 0 {
			raise(<-ch)
		}
		cancel()
		log.Info(StoppingMessage, "signal", s.String())
	case <-ctx.Done():
		signal.Stop(ch)
	}
}

// raise sends s to this process. Once no channel is notified of s, the Go
// runtime takes its default action (for SIGINT and SIGTERM, to end the
// process), as it would for a signal sent from outside.
func raise(s os.Signal) {
	if sig, ok := s.(syscall.Signal); ok {
		_ = syscall.Kill(os.Getpid(), sig)
	}
}
