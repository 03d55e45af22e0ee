package transport

import (
	"testing"
)

// TestDebugAfterTheEngineIsGone: a connection's Debug is a snapshot for
// logs, commonly taken after Close (final byte counts). When that Close
// dropped the last reference to a provider the transport created itself,
// the engine is torn down; Debug must still answer, naming the provider
// the connection ran on, not dereference what the teardown let go.
func TestDebugAfterTheEngineIsGone(t *testing.T) {
	checkNoLeaks(t)
	dir := t.TempDir()
	ln, d := listenAndDialer(t, fabricCfg(FabricShm, dir, nil), fabricCfg(FabricShm, dir, nil))
	p := dialAccept(t, ln, d)
	if p.client.Mode() != ModeURMA {
		t.Fatalf("mode %s (%s), want URMA", p.client.Mode(), p.client.FallbackReason())
	}
	want := p.client.Debug()
	exchange(t, p.client, p.server, "before the close")
	// The connections hold the last references to the engines.
	_ = ln.Close()
	_ = d.Close()
	for _, c := range []Conn{p.client, p.server} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		got := c.Debug()
		if got.State != "CLOSED" || got.Provider != want.Provider || got.Fabric != want.Fabric || got.BytesSent == 0 {
			t.Errorf("Debug after Close: %s; want state CLOSED, provider %s, fabric %s and the bytes sent", got, want.Provider, want.Fabric)
		}
	}
}
