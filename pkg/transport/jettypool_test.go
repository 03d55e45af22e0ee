package transport

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// TestJettyCreationFails: a provider that fails to create a queue at any
// step (completion channel, completion queue, receive queue, jetty) makes
// the connection fall back to TCP with the step named, destroys what was
// created before it, and panics nowhere: not in a dial, not in the
// background filler of prepared jetties (issue 15, item 1).
func TestJettyCreationFails(t *testing.T) {
	checkNoLeaks(t)
	for _, verb := range []string{"jfce", "jfc", "jfr", "jetty"} {
		for _, prepared := range []int{0, 1} {
			name := verb + "/on dial"
			if prepared > 0 {
				name = verb + "/in the filler"
			}
			t.Run(name, func(t *testing.T) {
				pa, pb := fabricPair(t)
				fp := newFaultProvider(pb)
				fp.f.set(func(c *faultConfig) {
					c.create = map[string]error{verb: urma.Errorf("create_"+verb, urma.CodeNoMem, "injected")}
				})
				cf := smallFlags()
				cf.PreparedJettyCnt = prepared
				d, err := NewDialer(cfgWith(fp, cf))
				if err != nil {
					t.Fatal(err)
				}
				defer d.Close()
				ln, err := ListenTransport("tcp", "127.0.0.1:0", cfgWith(pa, smallFlags()))
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				p := dialAccept(t, ln, d)
				if p.client.Mode() != ModeTCP {
					t.Fatal("the client runs on URMA although it cannot create a jetty")
				}
				want := "create " + map[string]string{"jfce": "JFCE", "jfc": "JFC", "jfr": "JFR", "jetty": "jetty"}[verb]
				if r := p.client.FallbackReason(); !strings.HasPrefix(r, string(ReasonResources)) || !strings.Contains(r, want) {
					t.Errorf("fallback reason %q, want %s naming %q", r, ReasonResources, want)
				}
				exchange(t, p.client, p.server, "over TCP")
				cleanedUp := func() bool { return len(fp.f.liveQueues()) == 0 && d.e.s.budget.InUse() == 0 }
				if prepared > 0 {
					// The filler cleans up after its attempt in the
					// background: wait for it to have tried and cleaned up.
					eventually.Holds(t, "the filler to try and clean up", 5*time.Second, func() bool { return fp.f.attempts(verb) >= 2 && cleanedUp() })
				}
				if !cleanedUp() {
					t.Errorf("after failed creations: queues %v left, %d jetties count against the budget", fp.f.liveQueues(), d.e.s.budget.InUse())
				}
			})
		}
	}
}

// TestJettiesInUseMetric: the jetties-in-use gauge counts what the jetty
// budget counts, the prepared jetties and those of connections alike.
func TestJettiesInUseMetric(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	f := smallFlags()
	f.PreparedJettyCnt = 3
	reg := prometheus.NewRegistry()
	scfg := cfgWith(pa, f)
	scfg.Registerer = reg
	ln, d := listenAndDialer(t, scfg, cfgWith(pb, smallFlags()))
	p := dialAccept(t, ln, d)
	defer p.client.Close()
	defer p.server.Close()
	// One jetty went to the connection; the filler prepares a third again.
	eventually.Holds(t, "the pool to prepare its jetties", 10*time.Second, func() bool {
		prepared, _ := ln.e.jetties.stats()
		return prepared == 3
	})
	got := gatherFlat(t, reg)
	if inUse, budget := got["urma_transport_jetties_in_use"], ln.e.s.budget.InUse(); inUse != 4 || budget != 4 {
		t.Errorf("jetties in use: gauge %v, budget %d; want 4 (3 prepared, 1 connected)", inUse, budget)
	}
	if prepared := got["urma_transport_jetties_prepared"]; prepared != 3 {
		t.Errorf("jetties prepared gauge %v, want 3", prepared)
	}
}
