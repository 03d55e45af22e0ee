package transport

import (
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// TestSoftFabricResolve: urma_soft_fabric comes from Config, else
// URMA_SOFT_FABRIC, else the flag; anything but auto, shm and socket is an
// error that names its source. URMA_SHM_DIR sets the shm directory.
func TestSoftFabricResolve(t *testing.T) {
	def := flags.Defaults()
	shm := flags.Defaults()
	shm.SoftFabric = FabricShm
	tests := []struct {
		name    string
		cfg     string
		env     map[string]string
		flags   flags.Flags
		want    string
		wantDir string
		// wantSockDir is URMA_SHM_SOCKET_DIR resolved: "" when unset,
		// which the provider takes as the shm directory itself.
		wantSockDir string
		wantErr     string
	}{
		{name: "default", flags: def, want: FabricAuto, wantDir: filepath.Join(os.TempDir(), "urma-k8s-shm-")},
		{name: "flag", flags: shm, want: FabricShm},
		{name: "environment over flag", flags: shm, env: map[string]string{EnvSoftFabric: " Socket "}, want: FabricSocket},
		{name: "Config over environment", cfg: FabricShm, flags: def, env: map[string]string{EnvSoftFabric: "socket"}, want: FabricShm},
		{name: "shm directory", flags: def, env: map[string]string{EnvShmDir: "/var/run/urma-k8s/shm"}, want: FabricAuto, wantDir: "/var/run/urma-k8s/shm"},
		{name: "shm socket directory", flags: def, env: map[string]string{EnvShmDir: "/run/shm", EnvShmSocketDir: " /run/shm/pod1 "}, want: FabricAuto, wantDir: "/run/shm", wantSockDir: "/run/shm/pod1"},
		{name: "bad Config", cfg: "rdma", flags: def, wantErr: `Config.SoftFabric="rdma": want one of auto, shm, socket`},
		{name: "bad environment", flags: def, env: map[string]string{EnvSoftFabric: "tcp"}, wantErr: `URMA_SOFT_FABRIC="tcp"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveFabric(tc.cfg, envOf(tc.env), tc.flags)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.choice != tc.want || !strings.HasPrefix(got.shmDir, tc.wantDir) || got.sockDir != tc.wantSockDir || got.ringSize != def.ShmRingSize {
				t.Fatalf("resolved %+v, want %s in %s", got, tc.want, tc.wantDir)
			}
		})
	}
	bad := flags.Defaults()
	if err := bad.Set("urma_soft_fabric", "rdma"); err == nil {
		t.Error("--urma_soft_fabric=rdma accepted")
	}
}

// onAnotherHost is cfg for a process on another host: its boot id differs
// from this one's (so the shm fabric does not reach it), the rest of the
// machine is shared.
func onAnotherHost(t *testing.T, cfg Config) Config {
	t.Helper()
	boot, err := soft.BootID()
	if err != nil {
		t.Skip(err)
	}
	boot[0] ^= 0xff
	cfg.bootID = func() ([handshake.BootIDLen]byte, error) { return boot, nil }
	return cfg
}

// withHostID is cfg in a process whose URMA_HOST_ID is id.
func withHostID(cfg Config, id string) Config {
	lookup := cfg.LookupEnv
	cfg.LookupEnv = func(k string) (string, bool) {
		if k == EnvHostID {
			return id, true
		}
		return lookup(k)
	}
	return cfg
}

// podCfg is fabricCfg for a pod that creates its shm socket in a
// subdirectory of its own (URMA_SHM_SOCKET_DIR) of the shared directory.
func podCfg(fabric, dir, pod string) Config {
	c := fabricCfg(fabric, dir, nil)
	c.LookupEnv = envOf(map[string]string{EnvShmDir: dir, EnvShmSocketDir: filepath.Join(dir, pod)})
	return c
}

// TestSoftFabricPerConnection: the transport picks the fabric per
// connection. Shared memory carries a connection to a peer on this host
// that meets its peers in the same directory; the socket fabric one to a
// peer on another host when both sides run it (auto, or socket forced);
// anything else is plain TCP with reason no_fast_path, and on one host the
// socket fabric runs only where both sides force it.
func TestSoftFabricPerConnection(t *testing.T) {
	checkNoLeaks(t)
	dir, other := t.TempDir(), t.TempDir()
	tests := []struct {
		name                       string
		server, client             Config
		wantMode                   Mode
		wantFabric                 string
		serverReason, clientReason string
	}{
		{name: "auto, same host and directory", server: fabricCfg(FabricAuto, dir, nil), client: fabricCfg(FabricAuto, dir, nil),
			wantMode: ModeURMA, wantFabric: FabricShm},
		{name: "pods in subdirectories of one directory", server: podCfg(FabricAuto, dir, "pod-server"), client: podCfg(FabricAuto, dir, "pod-client"),
			wantMode: ModeURMA, wantFabric: FabricShm},
		{name: "shm forced", server: fabricCfg(FabricShm, dir, nil), client: fabricCfg(FabricAuto, dir, nil),
			wantMode: ModeURMA, wantFabric: FabricShm},
		{name: "socket forced both sides", server: fabricCfg(FabricSocket, dir, nil), client: fabricCfg(FabricSocket, dir, nil),
			wantMode: ModeURMA, wantFabric: FabricSocket},
		{name: "another shm directory", server: fabricCfg(FabricAuto, dir, nil), client: fabricCfg(FabricAuto, other, nil),
			wantMode: ModeTCP, serverReason: "no_fast_path: the peer is on this host but meets its peers in another shm directory", clientReason: string(ReasonPeerDeclined)},
		{name: "socket client, auto server", server: fabricCfg(FabricAuto, dir, nil), client: fabricCfg(FabricSocket, dir, nil),
			wantMode: ModeTCP, serverReason: "no_fast_path: the peer is on this host but its software provider does not use shared memory", clientReason: string(ReasonPeerDeclined)},
		{name: "auto client, socket server", server: fabricCfg(FabricSocket, dir, nil), client: fabricCfg(FabricAuto, dir, nil),
			wantMode: ModeTCP, serverReason: "no_fast_path: the peer's software provider uses shared memory and this side forces the socket fabric", clientReason: string(ReasonPeerDeclined)},
		{name: "auto, another host", server: fabricCfg(FabricAuto, dir, nil), client: onAnotherHost(t, fabricCfg(FabricAuto, dir, nil)),
			wantMode: ModeURMA, wantFabric: FabricSocket},
		{name: "auto, another host and shm directory", server: fabricCfg(FabricAuto, dir, nil), client: onAnotherHost(t, fabricCfg(FabricAuto, other, nil)),
			wantMode: ModeURMA, wantFabric: FabricSocket},
		{name: "socket client elsewhere, auto server", server: fabricCfg(FabricAuto, dir, nil), client: onAnotherHost(t, fabricCfg(FabricSocket, dir, nil)),
			wantMode: ModeURMA, wantFabric: FabricSocket},
		{name: "auto client elsewhere, socket server", server: fabricCfg(FabricSocket, dir, nil), client: onAnotherHost(t, fabricCfg(FabricAuto, dir, nil)),
			wantMode: ModeURMA, wantFabric: FabricSocket},
		{name: "shm client elsewhere, auto server", server: fabricCfg(FabricAuto, dir, nil), client: onAnotherHost(t, fabricCfg(FabricShm, dir, nil)),
			wantMode: ModeTCP, serverReason: "no_fast_path: the peer runs on another host (another boot id); the peer offers no socket fabric (urma_soft_fabric=shm there", clientReason: string(ReasonPeerDeclined)},
		{name: "auto, one kernel, two URMA_HOST_IDs", server: withHostID(fabricCfg(FabricAuto, dir, nil), "node-a"), client: withHostID(fabricCfg(FabricAuto, dir, nil), "node-b"),
			wantMode: ModeURMA, wantFabric: FabricSocket},
		{name: "auto, one host by URMA_HOST_ID", server: withHostID(fabricCfg(FabricAuto, dir, nil), "node-a"), client: withHostID(fabricCfg(FabricAuto, dir, nil), "node-a"),
			wantMode: ModeURMA, wantFabric: FabricShm},
		{name: "auto client elsewhere, shm server", server: fabricCfg(FabricShm, dir, nil), client: onAnotherHost(t, fabricCfg(FabricAuto, dir, nil)),
			wantMode: ModeTCP, serverReason: "no_fast_path: the peer runs on another host (another boot id); this side uses shared memory only (urma_soft_fabric=shm", clientReason: string(ReasonPeerDeclined)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			tc.server.Registerer = reg
			p := connect(t, tc.server, tc.client)
			for _, side := range []struct {
				name   string
				c      Conn
				reason string
			}{{"server", p.server, tc.serverReason}, {"client", p.client, tc.clientReason}} {
				if side.c.Mode() != tc.wantMode {
					t.Fatalf("%s mode %s (%s), want %s", side.name, side.c.Mode(), side.c.FallbackReason(), tc.wantMode)
				}
				if got := side.c.FallbackReason(); !strings.HasPrefix(got, side.reason) || (side.reason == "") != (got == "") {
					t.Errorf("%s fallback %q, want %q", side.name, got, side.reason)
				}
				d := side.c.Debug()
				if d.Fabric != tc.wantFabric {
					t.Errorf("%s Debug().Fabric = %q, want %q", side.name, d.Fabric, tc.wantFabric)
				}
				if tc.wantFabric != "" && !strings.Contains(d.String(), "fabric="+tc.wantFabric) {
					t.Errorf("%s debug line %q lacks the fabric", side.name, d)
				}
			}
			if tc.wantMode == ModeURMA {
				got := gatherFlat(t, reg)
				if n := got[`urma_transport_fabric_conns_total{fabric="`+tc.wantFabric+`",role="server"}`]; n != 1 {
					t.Errorf("fabric_conns_total{fabric=%s,role=server} = %v, want 1 (%v)", tc.wantFabric, n, got)
				}
			}
			exchange(t, p.client, p.server, "bytes flow on "+tc.name)
		})
	}
}

// A hello from another host (another boot id) or without one (brpc) gets
// the fallback hello from a server on the shm fabric, and the connection is
// plain TCP with reason no_fast_path.
func TestShmServerDeclinesOtherHosts(t *testing.T) {
	checkNoLeaks(t)
	boot, err := soft.BootID()
	if err != nil {
		t.Skip(err)
	}
	ln, err := ListenTransport("tcp", "127.0.0.1:0", fabricCfg(FabricAuto, t.TempDir(), nil))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	shmEID, err := soft.ShmEID()
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := fakeHello()
	elsewhere.EID, elsewhere.SQSize, elsewhere.BootID = shmEID, 16, boot
	elsewhere.BootID[0] ^= 0xff
	brpc := fakeHello()
	brpc.EID = shmEID
	for _, tc := range []struct {
		name  string
		hello handshake.Hello
		want  string
	}{
		{"another host", elsewhere, "no_fast_path: the peer runs on another host"},
		{"no boot id", brpc, "no_fast_path: the peer does not say which host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, reply, err := rawHello(t, ln.Addr().String(), handshake.AppendV2(nil, tc.hello))
			if !handshake.IsFallback(reply) {
				t.Fatalf("reply %+v, %v: want the fallback hello", reply, err)
			}
			if _, err := raw.Write(handshake.AppendAck(nil, false)); err != nil {
				t.Fatal(err)
			}
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := c.(Conn).FallbackReason(); !strings.HasPrefix(got, tc.want) {
				t.Fatalf("server fallback %q, want %q", got, tc.want)
			}
			if _, err := raw.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
				t.Fatalf("plain TCP after the fallback: %q, %v", got, err)
			}
		})
	}
}

// When the shm fabric cannot start (the directory is a file), every
// connection is plain TCP, and the reason says why.
func TestShmFabricUnavailable(t *testing.T) {
	checkNoLeaks(t)
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := connect(t, fabricCfg(FabricAuto, file, nil), fabricCfg(FabricAuto, file, nil))
	for _, c := range []Conn{p.client, p.server} {
		if c.Mode() != ModeTCP {
			t.Fatalf("mode %s", c.Mode())
		}
	}
	if got := p.client.FallbackReason(); !strings.HasPrefix(got, "no_fast_path: create software provider: urma_soft_fabric=auto: the shm fabric cannot start in URMA_SHM_DIR="+file) {
		t.Fatalf("client fallback %q", got)
	}
	exchange(t, p.client, p.server, "TCP without a fast path")
}

// TestCheckClientAddress: a server imports over the socket fabric only
// devices at the address its client connects from (the port cannot be
// checked): the hello's EIDs on a socket engine, or the socket EID a
// client on another host offers to an auto engine on both fabrics. Any
// other EID is not an address it connects to, and a connection that does
// not go over the socket fabric checks nothing.
func TestCheckClientAddress(t *testing.T) {
	at := func(s string) urma.EID {
		e, err := soft.SocketEID(netip.MustParseAddrPort(s))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	client := &net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 40000}
	mapped := &net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.7"), Port: 40000}
	shm, err := soft.ShmEID()
	if err != nil {
		t.Fatal(err)
	}
	here, there := [handshake.BootIDLen]byte{1}, [handshake.BootIDLen]byte{2}
	socketOnly := fabricState{name: FabricSocket, bootID: here}
	both := fabricState{name: FabricShm, bootID: here, socketEID: at("10.0.0.1:7000")}
	fromThere := func(offered urma.EID) handshake.Hello {
		return handshake.Hello{EID: shm, SegEID: shm, BootID: there, SocketEID: offered}
	}
	tests := []struct {
		name        string
		fabric      fabricState
		hello       handshake.Hello
		remote      net.Addr
		wantRefusal string // in the detail; "" when allowed
	}{
		{"the client address", socketOnly, handshake.Hello{EID: at("10.0.0.7:5000"), SegEID: at("10.0.0.7:5000")}, client, ""},
		{"the client address, another port", socketOnly, handshake.Hello{EID: at("10.0.0.7:5001"), SegEID: at("10.0.0.7:6000")}, client, ""},
		{"an IPv4-mapped connection", socketOnly, handshake.Hello{EID: at("10.0.0.7:5000"), SegEID: at("10.0.0.7:5000")}, mapped, ""},
		{"the jetty elsewhere", socketOnly, handshake.Hello{EID: at("10.0.0.8:5000"), SegEID: at("10.0.0.7:5000")}, client, "its jetty on a socket-fabric device at 10.0.0.8:5000, but the client connects from 10.0.0.7"},
		{"the segment elsewhere", socketOnly, handshake.Hello{EID: at("10.0.0.7:5000"), SegEID: at("127.0.0.1:22")}, client, "its segment on a socket-fabric device at 127.0.0.1:22"},
		{"an shm device, no_fast_path later", socketOnly, handshake.Hello{EID: shm, SegEID: shm}, client, ""},
		{"auto, socket side at the address", both, fromThere(at("10.0.0.7:9000")), client, ""},
		{"auto, socket side elsewhere", both, fromThere(at("10.0.0.9:9000")), client, "its device's socket side on a socket-fabric device at 10.0.0.9:9000"},
		{"auto, socket device elsewhere", both, handshake.Hello{EID: at("10.0.0.9:9000"), SegEID: at("10.0.0.9:9000"), BootID: there}, client, "its jetty on a socket-fabric device at 10.0.0.9:9000"},
		{"auto, no boot id, no_fast_path later", both, handshake.Hello{EID: at("10.0.0.9:9000"), SegEID: at("10.0.0.9:9000")}, client, ""},
		{"no address to compare", socketOnly, handshake.Hello{EID: at("10.0.0.7:5000"), SegEID: at("10.0.0.7:5000")}, &net.UnixAddr{Name: "@x", Net: "unix"}, "cannot tell the address of the client's connection"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := &engine{fabric: tc.fabric}
			fb := e.checkClientAddress(tc.hello, tc.remote)
			switch {
			case tc.wantRefusal == "" && fb != nil:
				t.Fatalf("refused: %s", fb)
			case tc.wantRefusal != "" && (fb == nil || fb.reason != ReasonPeerAddress || !strings.Contains(fb.detail, tc.wantRefusal)):
				t.Fatalf("got %v, want %s saying %q", fb, ReasonPeerAddress, tc.wantRefusal)
			}
		})
	}
}
