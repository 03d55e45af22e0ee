package transport

import (
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// slowOpenProvider is a provider whose device takes delay to open, as a
// UB device does while a large pool waits to be registered.
type slowOpenProvider struct {
	urma.Provider
	delay time.Duration
}

func (p slowOpenProvider) Open(device string, eidIndex int) (urma.Context, error) {
	time.Sleep(p.delay) // the slow device itself, not a wait for an event
	return p.Provider.Open(device, eidIndex)
}

// TestSlowFirstDialBringUp: a Dialer brings URMA up on its first dial.
// When that takes longer than the server's urma_first_bytes_timeout, the
// bring-up must not happen while the TCP connection is open and silent:
// the server would serve it as a plain TCP client (peer_silent) and hand
// the client's hello to its application as data.
func TestSlowFirstDialBringUp(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	scfg := cfgWith(pa, smallFlags())
	scfg.FirstBytesTimeout = 300 * time.Millisecond
	ccfg := cfgWith(slowOpenProvider{Provider: pb, delay: 3 * scfg.FirstBytesTimeout}, smallFlags())
	ccfg.HandshakeTimeout = 3 * time.Second // a client waiting for a hello that never comes gives up soon
	p := connect(t, scfg, ccfg)
	if p.client.Mode() != ModeURMA || p.server.Mode() != ModeURMA {
		t.Fatalf("first dial with a slow bring-up: client %s (%s), server %s (%s); want URMA on both",
			p.client.Mode(), p.client.FallbackReason(), p.server.Mode(), p.server.FallbackReason())
	}
	exchange(t, p.client, p.server, "after a slow bring-up")
}
