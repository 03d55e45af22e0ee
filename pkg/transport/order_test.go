package transport

import (
	"context"
	"sync"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// recordingProvider wraps a provider and records the imports its contexts
// make, in order.
type recordingProvider struct {
	urma.Provider
	mu    sync.Mutex
	calls []string
}

func (p *recordingProvider) Open(dev string, eid int) (urma.Context, error) {
	c, err := p.Provider.Open(dev, eid)
	if err != nil {
		return nil, err
	}
	return &recordingContext{Context: c, p: p}, nil
}

func (p *recordingProvider) record(call string) {
	p.mu.Lock()
	p.calls = append(p.calls, call)
	p.mu.Unlock()
}

type recordingContext struct {
	urma.Context
	p *recordingProvider
}

func (c *recordingContext) ImportSegment(id urma.SegmentID, tok urma.Token) (urma.RemoteSegment, error) {
	c.p.record("segment")
	return c.Context.ImportSegment(id, tok)
}

func (c *recordingContext) ImportJetty(ctx context.Context, id urma.JettyID, m urma.TransportMode, tok urma.Token) (urma.RemoteJetty, error) {
	c.p.record("jetty:" + m.String())
	return c.Context.ImportJetty(ctx, id, m, tok)
}

// TestSegmentImportedBeforeJetty: both sides import the peer's segment
// before its jetty (on hardware the first SEND fails otherwise), and the
// jetty as RM, brpc's transport mode.
func TestSegmentImportedBeforeJetty(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	ra, rb := &recordingProvider{Provider: pa}, &recordingProvider{Provider: pb}
	p := connect(t, cfgWith(ra, smallFlags()), cfgWith(rb, smallFlags()))
	if p.client.Mode() != ModeURMA {
		t.Fatal(p.client.FallbackReason())
	}
	for name, rp := range map[string]*recordingProvider{"server": ra, "client": rb} {
		rp.mu.Lock()
		calls := append([]string(nil), rp.calls...)
		rp.mu.Unlock()
		if len(calls) != 2 || calls[0] != "segment" || calls[1] != "jetty:RM" {
			t.Errorf("%s imported %v, want [segment jetty:RM]", name, calls)
		}
	}
}
