package transport

import (
	"strconv"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// The flag's default is the provider's: the flags package cannot import
// soft to say so itself.
func TestSoftMaxConnsDefaultIsTheProviders(t *testing.T) {
	s, ok := flags.Lookup("urma_soft_max_conns")
	if !ok {
		t.Fatal("urma_soft_max_conns is not a flag")
	}
	if s.Default != strconv.Itoa(soft.DefaultMaxConns) || flags.Defaults().SoftMaxConns != soft.DefaultMaxConns {
		t.Fatalf("urma_soft_max_conns defaults to %s, soft.DefaultMaxConns is %d", s.Default, soft.DefaultMaxConns)
	}
}

// urma_soft_max_conns reaches the software provider's device. It bounds
// the peer devices that dial in, and in the handshake it is the server that
// dials: it imports the client's segment and jetty before it answers. So
// the flag limits a client process (a Dialer: one device for all its
// connections) to that many server processes (a Listener each) over URMA.
// The next server serves it on TCP at once, not after a timeout, with the
// reasons docs/transport.md gives: import_failed on the server, naming the
// refusal, the limit and the flag, peer_declined on the client, naming its
// device's refusal and the flag. The servers the
// client holds keep URMA, for further connections too. With the default,
// the same third server gets URMA.
func TestSoftMaxConnsFlag(t *testing.T) {
	checkNoLeaks(t)
	for _, fabric := range []string{FabricAuto, FabricSocket} {
		for _, tc := range []struct {
			name     string
			maxConns int // 0: the default
			wantMode Mode
		}{
			{name: "limit 2", maxConns: 2, wantMode: ModeTCP},
			{name: "default", wantMode: ModeURMA},
		} {
			t.Run(fabric+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				ccfg := fabricCfg(fabric, dir, nil)
				if tc.maxConns != 0 {
					if err := ccfg.Flags.Set("urma_soft_max_conns", strconv.Itoa(tc.maxConns)); err != nil {
						t.Fatal(err)
					}
				}
				ln1, d := listenAndDialer(t, fabricCfg(fabric, dir, nil), ccfg)
				ln2, ln3 := listenLoopback(t, fabricCfg(fabric, dir, nil)), listenLoopback(t, fabricCfg(fabric, dir, nil))
				for i, ln := range []*Listener{ln1, ln2} {
					p := dialAccept(t, ln, d)
					if p.client.Mode() != ModeURMA || p.server.Mode() != ModeURMA {
						t.Fatalf("server %d: modes %s/%s (%q, %q), want URMA", i+1, p.client.Mode(), p.server.Mode(), p.client.FallbackReason(), p.server.FallbackReason())
					}
				}
				p := dialAccept(t, ln3, d)
				if p.client.Mode() != tc.wantMode || p.server.Mode() != tc.wantMode {
					t.Fatalf("third server: modes %s/%s (%q, %q), want %s", p.client.Mode(), p.server.Mode(), p.client.FallbackReason(), p.server.FallbackReason(), tc.wantMode)
				}
				if tc.wantMode == ModeTCP {
					// Both name the flag to raise: the server from the
					// refusal it met (soft.ErrConnLimit), the client from its
					// device's refusal while the handshake ran.
					got := p.server.FallbackReason()
					if !strings.HasPrefix(got, string(ReasonImportFailed)+":") || !strings.Contains(got, "refused the connection") || !strings.Contains(got, "Options.MaxConns") ||
						!strings.Contains(got, "raise --urma_soft_max_conns on the client") {
						t.Errorf("third server's fallback %q, want import_failed: the client's device refused, naming its limit and the flag to raise on the client", got)
					}
					if got := p.client.FallbackReason(); !strings.HasPrefix(got, string(ReasonPeerDeclined)+":") || !strings.Contains(got, "refused 1 peer device(s) at its connection limit") ||
						!strings.Contains(got, "raise --urma_soft_max_conns here") {
						t.Errorf("client's fallback to the third server %q, want peer_declined naming its device's refusal and the flag to raise", got)
					}
				}
				exchange(t, p.client, p.server, "bytes with the third server")
				again := dialAccept(t, ln1, d)
				if again.client.Mode() != ModeURMA || again.server.Mode() != ModeURMA {
					t.Fatalf("second connection to the first server: modes %s/%s (%q, %q), want URMA", again.client.Mode(), again.server.Mode(), again.client.FallbackReason(), again.server.FallbackReason())
				}
				exchange(t, again.client, again.server, "the second connection to the first server")
			})
		}
	}
}
