package transport

import (
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
)

// TestPreparedJettiesYieldToConnections: jetties prepared ahead of
// connections count against the jetty budget, but they are a speed-up, not
// a claim: a connection that needs a jetty the prepared ones do not fit (a
// brpc client's tokenless one) or another Listener or Dialer sharing the
// budget (Config.Budget) gets one, a prepared one destroyed for it, instead
// of falling back with jetty_budget_exhausted while no connection uses the
// budget at all.
func TestPreparedJettiesYieldToConnections(t *testing.T) {
	checkNoLeaks(t)
	waitPrepared := func(t *testing.T, ln *Listener, want int) {
		t.Helper()
		eventually.Holds(t, "the listener to prepare its jetties", 10*time.Second, func() bool {
			prepared, _ := ln.e.jetties.stats()
			return prepared == want
		})
	}
	t.Run("brpc client, the listener budget", func(t *testing.T) {
		pa, pb := fabricPair(t)
		cfg := cfgWith(pa, smallFlags()) // one prepared jetty
		cfg.JettyBudget = 1
		ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		waitPrepared(t, ln, 1)
		b := newBrpcPeer(t, pb, 16, 16)
		negotiated, err := b.dial(ln.Addr().String())
		if err != nil {
			t.Fatalf("brpc client handshake: %v", err)
		}
		if !negotiated {
			_, _ = b.tcp.Write([]byte("PRPC"))
		}
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !negotiated || c.(Conn).Mode() != ModeURMA {
			t.Fatalf("brpc client negotiated %v, server mode %s (%s); want URMA: the budget holds only a prepared jetty", negotiated, c.(Conn).Mode(), c.(Conn).FallbackReason())
		}
		streamBoth(t, b, c, 4*13*1024)
		// The prepared jetty went and the connection's came: the pool
		// counts one, as the budget does.
		if _, live := ln.e.jetties.stats(); live != ln.e.s.budget.InUse() || live < 1 {
			t.Errorf("the pool counts %d jetties, the budget %d", live, ln.e.s.budget.InUse())
		}
	})
	t.Run("dialer sharing a listener budget", func(t *testing.T) {
		ln, d, budget, _ := sharedBudget(t)
		waitPrepared(t, ln, 2) // the whole budget
		p := dialAccept(t, ln, d)
		requireURMA(t, "the budget holds only prepared jetties", p.client, p.server)
		exchange(t, p.client, p.server, "over URMA")
		if used := budget.InUse(); used > budget.Limit() {
			t.Fatalf("%d jetties counted against a budget of %d", used, budget.Limit())
		}
	})
	t.Run("closed dialer leaves others reclaimable", func(t *testing.T) {
		ln, d, _, ccfg := sharedBudget(t)
		waitPrepared(t, ln, 2)
		// Another dialer on the budget, used once (its engine, and pool,
		// start with its first dial) and closed.
		gone, err := NewDialer(ccfg)
		if err != nil {
			t.Fatal(err)
		}
		first := dialAccept(t, ln, gone)
		exchange(t, first.client, first.server, "over the dialer that goes")
		_ = first.client.Close()
		_ = first.server.Close()
		if err := gone.Close(); err != nil {
			t.Fatal(err)
		}
		waitPrepared(t, ln, 2) // the whole budget again
		p := dialAccept(t, ln, d)
		requireURMA(t, "closing another dialer must not hide the listener's prepared jetties", p.client, p.server)
	})
}

// sharedBudget is a Listener and a Dialer sharing a budget of 2 jetties,
// each preparing 2, and the Dialer's Config, for another one on it.
func sharedBudget(t *testing.T) (*Listener, *Dialer, *JettyBudget, Config) {
	t.Helper()
	pa, pb := fabricPair(t)
	budget := NewJettyBudget(2)
	f := smallFlags()
	f.PreparedJettyCnt = 2
	scfg, ccfg := cfgWith(pa, f), cfgWith(pb, f)
	scfg.Budget, ccfg.Budget = budget, budget
	ln, d := listenAndDialer(t, scfg, ccfg)
	return ln, d, budget, ccfg
}
