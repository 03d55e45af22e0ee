package transport

import (
	"context"
	"net"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
)

// setUpBy makes a connection's URMA half (newURMAConn: its jetty, taken
// from the pool or created, its receive buffers, its receives posted) by
// end, or ctx's end if sooner; within names that bound in a fallback's
// detail, and stopped says what the handshake does instead. Provider
// calls may stall (a slow device, a blocked verb) and cannot be
// interrupted, so newURMAConn runs on a goroutine of its own: past end
// the handshake stops waiting for it and falls back, and what the call
// makes when it does finish is released at once. That goroutine holds an
// engine reference (newURMAConn takes it first), so the engine, and the
// provider context the verb runs on, outlive it; and one of the engine's
// setups (e.setups), so that a provider that stays stalled leaves at most
// that many goroutines behind, however many connections come meanwhile.
func (e *engine) setUpBy(ctx context.Context, tcp net.Conn, role string, spec jettySpec, end time.Time, within, stopped string) (*urmaConn, *fallback) {
	wctx, cancel := until(ctx, end)
	defer cancel()
	// No setup begins once end has passed: a select with a free setup
	// would pick it half the time, and a quick setup would then carry the
	// handshake on as URMA past end (a late hello, which a server that
	// already serves the client as plain TCP reads as application bytes),
	// a slow one would be work done for nothing.
	noTime := func() (*urmaConn, *fallback) {
		return nil, fallbackf(ReasonResources,
			"no time was left to set up the connection's jetty within %s: it had passed before the setup could begin (the handshake's earlier steps took it); %s",
			within, stopped)
	}
	if wctx.Err() != nil {
		return noTime()
	}
	select {
	case e.setups <- struct{}{}:
		if wctx.Err() != nil { // passed meanwhile, as a setup freed
			<-e.setups
			return noTime()
		}
	case <-wctx.Done():
		return nil, fallbackf(ReasonResources,
			"the provider has not returned from the jetty setups of %d earlier connections (%s) within %s: a slow device or a stalled verb",
			cap(e.setups), e.setupsBound(), within)
	}
	type made struct {
		c  *urmaConn
		fb *fallback
	}
	got := make(chan made)
	abandoned := make(chan struct{})
	go func() {
		c, fb := newURMAConn(e, tcp, role, spec)
		<-e.setups
		select {
		case got <- made{c, fb}:
		case <-abandoned:
			if c != nil {
				e.log.V(1).Info("releasing a jetty set up after its handshake stopped waiting", "remote", tcp.RemoteAddr().String())
				c.release()
			}
		}
	}()
	select {
	case m := <-got:
		return m.c, m.fb
	case <-wctx.Done():
	}
	// end bounds the wait, not the use of a result in hand, as with the
	// imports (importPeer, whose import that returned is used): a setup
	// that has returned by the time the handshake stops waiting is used,
	// not picked against the deadline at random. The quarter of the
	// peer's wait that end leaves covers that instant.
	select {
	case m := <-got:
		return m.c, m.fb
	default:
	}
	close(abandoned)
	return nil, fallbackf(ReasonResources,
		"the provider did not set up the connection's jetty (take a prepared one or create one, register its buffers, post its receives) within %s: a slow device or a stalled verb; %s, and releases the jetty when the provider returns it",
		within, stopped)
}

// setupsBound names the bound on the engine's setups, for a fallback's
// detail.
func (e *engine) setupsBound() string {
	if e.role == metrics.RoleClient {
		return "the most a dialer runs"
	}
	return "the most a listener runs, Config.AcceptBacklog"
}

// setupsFor is how many jetty setups an engine of role runs at once.
func setupsFor(s settings, role string) int {
	if role == metrics.RoleClient {
		return DefaultAcceptBacklog
	}
	return max(1, s.acceptBacklog)
}
