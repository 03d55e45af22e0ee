package soft

import (
	"testing"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Closing a jetty whose send waits on "receiver not ready" cancels the RNR
// block the receiver keeps for it, and the CANCEL goes out at once: on
// shared memory nothing else (no watchdog PING, no answer owed) would make
// the writer send it.
func TestShmClosedJettyCancelsRNRBlock(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	mustOK(t, a.send(target, 1, 0, 64, 0), "send") // b posted no receive
	eventually.Holds(t, "the receiver to block the send", 0, func() bool { return pb.blocks() == 1 })
	mustOK(t, a.jetty.Close(), "close the sending jetty")
	eventually.Holds(t, "the receiver to drop the cancelled block", 0, func() bool { return pb.blocks() == 0 })
}
