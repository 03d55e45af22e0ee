package transport

import (
	"net"
	"testing"

	"golang.org/x/net/nettest"
)

// TestConnContract runs golang.org/x/net/nettest's net.Conn conformance
// suite (deadlines, concurrent Read/Write, Close unblocking both, errors
// after Close) against the URMA connection and the TCP fallback.
func TestConnContract(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		name     string
		mode     Mode
		polling  bool
		disabled bool
		version  int
	}{
		{name: "urma event mode", mode: ModeURMA},
		{name: "urma polling mode", mode: ModeURMA, polling: true},
		{name: "urma v3 hello", mode: ModeURMA, version: 3},
		{name: "tcp fallback", mode: ModeTCP, disabled: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			f := smallFlags()
			f.UsePolling = tc.polling
			f.PollerYield = tc.polling
			if tc.version != 0 {
				f.ClientHandshakeVersion = tc.version
			}
			scfg, ccfg := cfgWith(pa, f), cfgWith(pb, f)
			scfg.DisableURMA = tc.disabled
			ln, d := listenAndDialer(t, scfg, ccfg)
			nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
				p := dialAccept(t, ln, d)
				if p.client.Mode() != tc.mode || p.server.Mode() != tc.mode {
					t.Fatalf("modes %s/%s, want %s", p.client.Mode(), p.server.Mode(), tc.mode)
				}
				return p.client, p.server, func() {
					_ = p.client.Close()
					_ = p.server.Close()
				}, nil
			})
		})
	}
}
