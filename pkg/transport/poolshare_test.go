package transport

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// TestPoolRemoteRead: the buffer pool is registered local-only, so no peer
// can read what it holds for another, unless urma_pool_remote_read opts in
// to remote reads; then the shm fabric maps it in the peer (a read-only
// shared mapping of the pool's memfd) and sends from it by reference, and
// the bytes arrive intact.
func TestPoolRemoteRead(t *testing.T) {
	for _, tc := range []struct {
		name       string
		remoteRead bool
	}{
		{name: "default: local only"},
		{name: "opted in: remote read", remoteRead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mk := func() Config {
				c := fabricCfg(FabricShm, dir, nil)
				c.Flags.BufferSize = 16 << 10
				c.Flags.PoolRemoteRead = tc.remoteRead
				return c
			}
			p := connect(t, mk(), mk())
			if p.client.Mode() != ModeURMA || p.client.Debug().Fabric != FabricShm {
				t.Fatalf("client %s on %q (%s), want URMA on shm", p.client.Mode(), p.client.Debug().Fabric, p.client.FallbackReason())
			}
			msg := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB: above the by-reference minimum
			got := make([]byte, len(msg))
			for i := 0; i < 32; i++ {
				msg[0] = byte(i)
				if _, err := p.client.Write(msg); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(p.server, got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("message %d arrived changed", i)
				}
			}
			if tc.remoteRead {
				// The peer maps the pool once the first send from it
				// shares it; that is a state, with no event to wait on.
				waitFor(t, "the peer to map the pool read-only", 10*time.Second, func() bool { return peerMappings(t) > 0 })
			} else if n := peerMappings(t); n != 0 {
				t.Fatalf("%d read-only mappings of registered memory with a local-only pool", n)
			}
		})
	}
}

// peerMappings counts this process's read-only shared mappings of
// registered memory (urma.AllocMemory's memfds): the shm fabric's views of
// a peer's segments.
func peerMappings(t testing.TB) int {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "r--s" && strings.HasPrefix(f[5], "/memfd:urma-mem") {
			n++
		}
	}
	return n
}

// TestPoolRegistrationAccess: the pool's registration asks for no remote
// access by default, and for remote read only (with the engine's token)
// when urma_pool_remote_read is set.
func TestPoolRegistrationAccess(t *testing.T) {
	for _, tc := range []struct {
		name       string
		remoteRead bool
		want       urma.Access
		wantPolicy urma.TokenPolicy
	}{
		{name: "default", want: urma.AccessLocalOnly},
		{name: "remote read", remoteRead: true, want: urma.AccessRead, wantPolicy: urma.TokenPlainText},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			fp := newFaultProvider(pa)
			f := smallFlags()
			f.PoolRemoteRead = tc.remoteRead
			p := connect(t, cfgWith(fp, f), cfgWith(pb, smallFlags()))
			uc, ok := p.server.(*urmaConn)
			if !ok {
				t.Fatalf("server is %s (%s), want URMA", p.server.Mode(), p.server.FallbackReason())
			}
			pool := uc.e.pool.seg.ID()
			for _, r := range fp.f.registrations() {
				if r.id.VA != pool.VA {
					continue
				}
				if r.cfg.Access != tc.want || r.cfg.TokenPolicy != tc.wantPolicy {
					t.Fatalf("pool registered with access %#x, token policy %v; want %#x, %v", r.cfg.Access, r.cfg.TokenPolicy, tc.want, tc.wantPolicy)
				}
				return
			}
			t.Fatalf("no registration of the pool (%#x) among %+v", pool.VA, fp.f.registrations())
		})
	}
}
