package transport

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/operator/tuning"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// softOn is a software provider on fab with devices (one default device
// when none are given), closed at cleanup.
func softOn(t *testing.T, fab *soft.Fabric, devices ...soft.DeviceSpec) *soft.Provider {
	t.Helper()
	p, err := soft.New(soft.Options{Fabric: fab, Logger: logr.Discard(), Devices: devices})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestDeviceQueueLimits: a device whose queues are too shallow for the
// configured depths makes the engine fall back to TCP, naming the limit;
// one exactly deep enough carries URMA. A connection's completion queue
// holds its sends, its receives and the flush-done record: sq + rq + 1.
func TestDeviceQueueLimits(t *testing.T) {
	checkNoLeaks(t)
	f := smallFlags()
	sq, rq := f.SQSize, f.RQSize
	tests := []struct {
		name string
		caps urma.DeviceCaps
		want string // in the fallback reason; "" for URMA
	}{
		{"send queues exactly deep enough", urma.DeviceCaps{MaxJFSDepth: uint32(sq)}, ""},
		{"send queues one short", urma.DeviceCaps{MaxJFSDepth: uint32(sq - 1)}, "max_jfs_depth"},
		{"receive queues exactly deep enough", urma.DeviceCaps{MaxJFRDepth: uint32(rq)}, ""},
		{"receive queues one short", urma.DeviceCaps{MaxJFRDepth: uint32(rq - 1)}, "max_jfr_depth"},
		{"completion queues exactly deep enough", urma.DeviceCaps{MaxJFCDepth: uint32(sq + rq + 1)}, ""},
		{"completion queues one short", urma.DeviceCaps{MaxJFCDepth: uint32(sq + rq)}, "max_jfc_depth"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fab := soft.NewFabric()
			pa := softOn(t, fab, soft.DeviceSpec{Caps: tc.caps})
			pb := softOn(t, fab)
			p := connect(t, cfgWith(pa, f), cfgWith(pb, f))
			defer p.client.Close()
			defer p.server.Close()
			r := p.server.FallbackReason()
			if tc.want == "" {
				if p.server.Mode() != ModeURMA {
					t.Fatalf("mode %s (%s), want urma", p.server.Mode(), r)
				}
				exchange(t, p.client, p.server, "through queues exactly deep enough")
				return
			}
			if p.server.Mode() != ModeTCP || !strings.HasPrefix(r, string(ReasonDeviceUnsuitable)) || !strings.Contains(r, tc.want) {
				t.Fatalf("mode %s, fallback %q; want tcp, %s naming %s", p.server.Mode(), r, ReasonDeviceUnsuitable, tc.want)
			}
		})
	}
}

// TestTunedFlagsFitTheDevice: the flags the operator derives (internal/operator/tuning)
// for a device whose completion queues are the limit are flags the transport
// accepts on that device: URMA, not a device_unsuitable fallback to TCP.
func TestTunedFlagsFitTheDevice(t *testing.T) {
	checkNoLeaks(t)
	profile := tuning.Profile{MessageSize: 4096, ConnectionsPerPod: 1, InflightPerConnection: 32, JettyBudget: 8}
	tests := []struct {
		name      string
		jfc       int64
		overrides map[string]string
	}{
		{name: "completion queue below the wanted queues", jfc: 64},
		{name: "completion queue exactly sq plus rq", jfc: 70},
		{name: "completion queue just the minimum queues", jfc: 33},
		{name: "receive queue at its minimum", jfc: 2048, overrides: map[string]string{tuning.FlagSQSize: "4096", tuning.FlagRQSize: "16"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lim := tuning.Limits{MaxJFSDepth: 4096, MaxJFRDepth: 4096, MaxJFCDepth: tc.jfc, MaxMsgSize: 1 << 20}
			res, err := tuning.Derive(profile, tc.overrides, lim)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Warnings) > 0 {
				t.Fatalf("Derive warned %q: the case does not test a fitting device", res.Warnings)
			}
			f := res.Flags
			caps := urma.DeviceCaps{MaxJFSDepth: 4096, MaxJFRDepth: 4096, MaxJFCDepth: uint32(tc.jfc), MaxMsgSize: 1 << 20}
			fab := soft.NewFabric()
			pa := softOn(t, fab, soft.DeviceSpec{Caps: caps})
			pb := softOn(t, fab, soft.DeviceSpec{Caps: caps})
			p := connect(t, cfgWith(pa, f), cfgWith(pb, f))
			defer p.client.Close()
			defer p.server.Close()
			if p.server.Mode() != ModeURMA || p.client.Mode() != ModeURMA {
				t.Fatalf("tuned sq %d rq %d for max_jfc_depth %d: server %s (%q), client %s (%q); want urma",
					f.SQSize, f.RQSize, tc.jfc, p.server.Mode(), p.server.FallbackReason(), p.client.Mode(), p.client.FallbackReason())
			}
		})
	}
}

// TestCleanShutdownLogsNoError: connections, a listener and a dialer that
// close in order release everything without logging a single error.
func TestCleanShutdownLogsNoError(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	var logs logLines
	scfg, ccfg := cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags())
	scfg.Logger, ccfg.Logger = logs.logger(), logs.logger()
	ln, d := listenAndDialer(t, scfg, ccfg)
	p := dialAccept(t, ln, d)
	if p.server.Mode() != ModeURMA {
		t.Fatalf("mode %s (%s)", p.server.Mode(), p.server.FallbackReason())
	}
	exchange(t, p.client, p.server, "before the shutdown")
	for _, c := range []interface{ Close() error }{p.client, p.server, ln, d} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if line := logs.find(`"error"=`); line != "" {
		t.Errorf("a clean shutdown logged: %s", line)
	}
}

// TestCloseWithAStalledVerb: a Listener's or Dialer's Close whose engine
// waits for a provider verb that does not return (the jetty pool's filler
// in CreateJetty on a stalled device) returns after CloseTimeout, where it
// hung for as long as the verb did, and logs an error that names what
// still runs; it leaves the device context and the pool alone meanwhile
// (destroying them under the verb is unsafe). Once the verb returns, all
// of it is released, the late jetty included, and nothing keeps running
// (checkNoLeaks).
func TestCloseWithAStalledVerb(t *testing.T) {
	checkNoLeaks(t)
	const closeTimeout = 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		open func(t *testing.T, cfg Config) (*engine, func() error)
	}{
		{"listener", func(t *testing.T, cfg Config) (*engine, func() error) {
			ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			return ln.e, ln.Close
		}},
		{"dialer", func(t *testing.T, cfg Config) (*engine, func() error) {
			d, err := NewDialer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			d.e.start(netip.MustParseAddr("127.0.0.1")) // as its first dial does
			return d.e, d.Close
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pb := fabricPair(t)
			prov, unstall := stallJettyCreate(pb)
			t.Cleanup(unstall) // before the provider's Close
			f := smallFlags()
			f.PreparedJettyCnt = 1 // the filler's jetty stalls
			cfg := cfgWith(prov, f)
			cfg.CloseTimeout = closeTimeout
			var logs logLines
			cfg.Logger = logs.logger()
			e, closeIt := tc.open(t, cfg)
			eventually.Holds(t, "the jetty pool's filler to create a jetty", stallBound, func() bool { return prov.f.attempts("jetty") > 0 })

			closed := make(chan error, 1)
			go func() { closed <- closeIt() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Errorf("close: %v", err)
				}
			case <-time.After(stallBound):
				unstall()
				<-closed
				t.Fatalf("Close still waited for the stalled CreateJetty %s later; want it to return after CloseTimeout (%s)", stallBound, closeTimeout)
			}
			line := logs.find("URMA resources NOT released")
			for _, want := range []string{`"error"=`, "the jetty pool's filler", "CreateJFCE/JFC/JFR/Jetty", "leaking the device context"} {
				if !strings.Contains(line, want) {
					t.Errorf("log after a stalled teardown %q; want it to say %q", line, want)
				}
			}
			// The teardown waits for the verb, which waits for unstall
			// below: these reads come before its writes.
			if e.uctx == nil || e.pool == nil {
				t.Error("the device context or the pool was destroyed while the provider's CreateJetty still ran")
			}

			unstall()
			select {
			case <-e.released:
			case <-time.After(stallBound):
				t.Fatalf("the URMA resources were not released %s after the stalled verb returned", stallBound)
			}
			if live := prov.f.liveQueues(); len(live) != 0 {
				t.Errorf("queues left after the stalled verb returned: %v", live)
			}
			eventually.Holds(t, "the log of the late release", stallBound, func() bool {
				return logs.find("released the URMA resources left behind") != ""
			})
		})
	}
}

// TestFabricOfAGivenProvider: with a provider passed in Config.Provider,
// a connection's fabric is that provider's name.
func TestFabricOfAGivenProvider(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	defer p.client.Close()
	defer p.server.Close()
	if got, want := p.client.Debug().Fabric, pb.Name(); got != want || want == "" {
		t.Errorf("fabric %q, want the provider's name %q", got, want)
	}
}

// TestAdvertiseAddr: the software fabric listens on the connection's own
// IPv4 address; for an unspecified one on POD_IP, else on the host's first
// IPv4 address that is neither loopback nor link-local, else 127.0.0.1.
func TestAdvertiseAddr(t *testing.T) {
	// The host's first usable address, found through its interfaces.
	host := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
found:
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if ip, ok := netip.AddrFromSlice(ipn.IP.To4()); ok && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				host = ip
				break found
			}
		}
	}
	t.Logf("the host's first usable IPv4 address: %s", host)
	tests := []struct {
		name  string
		local string
		podIP string // "-": unset
		want  netip.Addr
	}{
		{"own IPv4 address", "10.1.2.3", "10.9.9.9", netip.MustParseAddr("10.1.2.3")},
		{"own address, IPv4-mapped", "::ffff:10.1.2.3", "-", netip.MustParseAddr("10.1.2.3")},
		{"unspecified takes POD_IP", "0.0.0.0", " 10.9.9.9 ", netip.MustParseAddr("10.9.9.9")},
		{"unspecified, POD_IP not IPv4", "0.0.0.0", "fd00::1", host},
		{"unspecified, no POD_IP", "0.0.0.0", "-", host},
		{"IPv6", "fd00::2", "-", host},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			if tc.podIP != "-" {
				env[EnvPodIP] = tc.podIP
			}
			// POD_IP is read through Config.LookupEnv, never the
			// process environment.
			t.Setenv(EnvPodIP, "10.7.7.7")
			fs, err := resolveFabric("", func(k string) (string, bool) { v, ok := env[k]; return v, ok }, flags.Defaults())
			if err != nil {
				t.Fatal(err)
			}
			if got := advertiseAddr(netip.MustParseAddr(tc.local), fs.podIP); got != tc.want {
				t.Errorf("advertiseAddr(%s) with POD_IP %q = %s, want %s", tc.local, tc.podIP, got, tc.want)
			}
		})
	}
}

// TestPoolMemoryByProvider: the engine pool is a memfd wherever a peer may
// map it (the shm fabric, or a provider given in Config.Provider, whose
// fabric the engine cannot see), and private memory, which the kernel may
// put on huge pages, where none can (liburma, the socket fabric), unless
// urma_pool_huge_pages is off. Bytes flow over the socket fabric's private
// pool.
func TestPoolMemoryByProvider(t *testing.T) {
	checkNoLeaks(t)
	dir := t.TempDir()
	liburmaStub := func(string, logr.Logger) (urma.Provider, error) {
		p, err := soft.New(soft.Options{Fabric: soft.NewFabric(), Devices: []soft.DeviceSpec{{Name: "udma0", Ports: []urma.Port{{Index: 1, State: urma.PortActive}}}}})
		if err != nil {
			return nil, err
		}
		return &stubLiburma{Provider: p, library: "liburma.so.0"}, nil
	}
	tests := []struct {
		name        string
		cfg         func() Config
		wantPrivate bool
	}{
		{name: "shm fabric", cfg: func() Config { return fabricCfg(FabricShm, dir, nil) }},
		{name: "socket fabric", cfg: func() Config { return fabricCfg(FabricSocket, dir, nil) }, wantPrivate: true},
		{name: "socket fabric, huge pages off", cfg: func() Config {
			c := fabricCfg(FabricSocket, dir, nil)
			c.Flags.PoolHugePages = false
			return c
		}},
		{name: "liburma", cfg: func() Config {
			f := smallFlags()
			return Config{ProviderName: ProviderLiburma, Flags: &f, LookupEnv: noEnv, Logger: logr.Discard(), openLiburma: liburmaStub}
		}, wantPrivate: true},
		{name: "given provider", cfg: func() Config { return cfgWith(isolatedProvider(t), smallFlags()) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := ListenTransport("tcp", "127.0.0.1:0", tc.cfg())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ln.Close() })
			if fb := ln.e.unavailable(); fb != nil {
				t.Fatalf("URMA unavailable: %s: %s", fb.reason, fb.detail)
			}
			if private := ln.e.pool.mem.Fd() < 0; private != tc.wantPrivate {
				t.Fatalf("pool memory private: %v (fd %d), want %v", private, ln.e.pool.mem.Fd(), tc.wantPrivate)
			}
		})
	}
	t.Run("bytes flow on the private pool", func(t *testing.T) {
		p := connect(t, fabricCfg(FabricSocket, dir, nil), fabricCfg(FabricSocket, dir, nil))
		if p.client.Mode() != ModeURMA {
			t.Fatalf("client %s (%s), want URMA on the socket fabric", p.client.Mode(), p.client.FallbackReason())
		}
		if fd := p.client.(*urmaConn).e.pool.mem.Fd(); fd >= 0 {
			t.Fatalf("client pool is memfd %d, want private memory", fd)
		}
		exchange(t, p.client, p.server, "bytes over private pool memory")
	})
}
