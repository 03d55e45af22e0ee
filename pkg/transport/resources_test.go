package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// TestJettyBudget: when the budget is spent new connections fall back to
// TCP (and say so), or fail by configuration; a closed connection gives its
// jetty back.
func TestJettyBudget(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		name   string
		server func(*Config)
	}{
		{"Config.JettyBudget", func(c *Config) { c.JettyBudget = 1 }},
		{"URMA_JETTY_BUDGET", func(c *Config) { c.LookupEnv = envOf(map[string]string{EnvJettyBudget: "1"}) }},
		{"shared budget", func(c *Config) { c.Budget = NewJettyBudget(1) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			scfg := cfgWith(pa, smallFlags())
			tc.server(&scfg)
			reg := prometheus.NewRegistry()
			scfg.Registerer = reg
			ln, err := ListenTransport("tcp", "127.0.0.1:0", scfg)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			d, err := NewDialer(cfgWith(pb, smallFlags()))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()

			first := dialAccept(t, ln, d)
			if first.server.Mode() != ModeURMA {
				t.Fatalf("first connection: %s (%s)", first.server.Mode(), first.server.FallbackReason())
			}
			second := dialAccept(t, ln, d)
			if second.server.Mode() != ModeTCP || !strings.HasPrefix(second.server.FallbackReason(), string(ReasonBudgetExhausted)) {
				t.Fatalf("second connection: %s %q, want tcp %s", second.server.Mode(), second.server.FallbackReason(), ReasonBudgetExhausted)
			}
			if got := fallbackCount(t, reg, string(ReasonBudgetExhausted)); got != 1 {
				t.Errorf("fallback metric for the budget = %v, want 1", got)
			}
			exchange(t, second.client, second.server, "still served, over TCP")
			_ = first.client.Close()
			_ = first.server.Close()
			// The jetty comes back; the pool prepares one again, and the
			// next connection gets URMA.
			third := dialAccept(t, ln, d)
			if third.server.Mode() != ModeURMA {
				t.Fatalf("after a close: %s (%s)", third.server.Mode(), third.server.FallbackReason())
			}
		})
	}
}

// TestJettyBudgetMetricSharedBudget: two Listeners that share one budget
// (Config.Budget, as docs/troubleshooting.md advises) on one registry
// report that budget once, not once per Listener.
func TestJettyBudgetMetricSharedBudget(t *testing.T) {
	checkNoLeaks(t)
	pa, _ := fabricPair(t)
	reg := prometheus.NewRegistry()
	budget := NewJettyBudget(8)
	for range 2 {
		cfg := cfgWith(pa, smallFlags())
		cfg.Budget, cfg.Registerer = budget, reg
		ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if fb := ln.FallbackReason(); fb != "" {
			t.Fatalf("listener without URMA: %s", fb)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "urma_transport_jetty_budget" {
			got = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if got != 8 {
		t.Fatalf("urma_transport_jetty_budget = %v, want 8: one budget of 8 shared by two listeners", got)
	}
}

// fallbackCount reads the fallback counter for reason.
func fallbackCount(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == "urma_transport_fallbacks_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == reason {
						v += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return v
}

func TestJettyBudgetFail(t *testing.T) {
	checkNoLeaks(t)
	t.Run("client", func(t *testing.T) {
		pa, pb := fabricPair(t)
		ln, err := ListenTransport("tcp", "127.0.0.1:0", cfgWith(pa, smallFlags()))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ccfg := cfgWith(pb, smallFlags())
		ccfg.JettyBudget, ccfg.FailWhenBudgetExhausted = 1, true
		d, err := NewDialer(ccfg)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		p := dialAccept(t, ln, d)
		if p.client.Mode() != ModeURMA {
			t.Fatalf("first: %s", p.client.FallbackReason())
		}
		_, err = d.DialContext(context.Background(), ln.Addr().String())
		if err == nil || !strings.Contains(err.Error(), string(ReasonBudgetExhausted)) {
			t.Fatalf("second dial: %v, want a budget error", err)
		}
	})
	t.Run("server", func(t *testing.T) {
		pa, pb := fabricPair(t)
		scfg := cfgWith(pa, smallFlags())
		scfg.JettyBudget, scfg.FailWhenBudgetExhausted = 1, true
		ln, err := ListenTransport("tcp", "127.0.0.1:0", scfg)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		d, err := NewDialer(cfgWith(pb, smallFlags()))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		p := dialAccept(t, ln, d)
		if p.server.Mode() != ModeURMA {
			t.Fatalf("first: %s", p.server.FallbackReason())
		}
		// The server drops the second connection during the handshake.
		c, err := d.DialContext(context.Background(), ln.Addr().String())
		if err == nil {
			_ = c.Close()
			t.Fatal("second dial succeeded; the server should have dropped it")
		}
	})
}

// TestPoolDry: with every buffer taken, a write waits within its deadline,
// or fails at once with ErrPoolExhausted by configuration, and proceeds as
// soon as a buffer comes back.
func TestPoolDry(t *testing.T) {
	checkNoLeaks(t)
	for _, failFast := range []bool{false, true} {
		name := "blocks"
		if failFast {
			name = "fails"
		}
		t.Run(name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			f := smallFlags()
			f.BufferCount = 32 // 16 for receives, 16 left
			ccfg := cfgWith(pb, f)
			ccfg.FailWhenPoolDry = failFast
			p := connect(t, cfgWith(pa, smallFlags()), ccfg)
			zc := p.client.(ZeroCopyConn)
			var held []*Buffer
			for {
				_ = p.client.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
				b, err := zc.AllocBuffer()
				if err != nil {
					if failFast && !errors.Is(err, ErrPoolExhausted) {
						t.Fatalf("AllocBuffer on a dry pool: %v, want ErrPoolExhausted", err)
					}
					if !failFast && !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("AllocBuffer on a dry pool: %v, want a timeout", err)
					}
					break
				}
				held = append(held, b)
			}
			if len(held) != 16 {
				t.Fatalf("took %d buffers, want the 16 not used for receives", len(held))
			}
			_ = p.client.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := p.client.Write([]byte("x"))
			var ne net.Error
			switch {
			case failFast && !errors.Is(err, ErrPoolExhausted):
				t.Fatalf("Write on a dry pool: %d, %v; want ErrPoolExhausted", n, err)
			case !failFast && (!errors.As(err, &ne) || !ne.Timeout()):
				t.Fatalf("Write on a dry pool: %d, %v; want a timeout", n, err)
			}
			// The failed write gave back the window slot it had reserved.
			if d := p.client.Debug(); d.SQWindow != d.WindowCapacity || d.RemoteRQWindow != d.WindowCapacity {
				t.Fatalf("after a write failed on a dry pool: send queue window %d, remote receive window %d; want both %d", d.SQWindow, d.RemoteRQWindow, d.WindowCapacity)
			}
			_ = p.client.SetWriteDeadline(time.Time{})
			done := make(chan error, 1)
			if failFast {
				held[0].Release()
			}
			go func() {
				_, err := p.client.Write([]byte("y"))
				done <- err
			}()
			if !failFast {
				pool := p.client.(*urmaConn).pool
				eventually.Holds(t, "the writer to wait for a buffer", 5*time.Second, func() bool { return pool.waiters() == 1 })
				held[0].Release()
			}
			if err := <-done; err != nil {
				t.Fatalf("write after a buffer came back: %v", err)
			}
			got := make([]byte, 1)
			if _, err := io.ReadFull(p.server, got); err != nil || got[0] != 'y' {
				t.Fatalf("read %q, %v", got, err)
			}
			for _, b := range held[1:] {
				b.Release()
			}
		})
	}
}

func TestConfigResolve(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/flags"
	if err := os.WriteFile(good, []byte("--urma_sq_size=64\n--urma_device=udma3\n--urma_use_polling\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	strict := dir + "/strict"
	if err := os.WriteFile(strict, []byte("--urma_require_token\n--urma_first_bytes_timeout=250ms\n--urma_ack_timeout=300ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := dir + "/bad"
	if err := os.WriteFile(bad, []byte("--urma_rq_size=5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cfg     Config
		env     map[string]string
		check   func(settings) string // "" when right
		wantErr string
	}{
		{
			name: "defaults",
			check: func(s settings) string {
				return expect(s.flags.SQSize == 128 && s.device == "" && s.budget.Limit() == 0 &&
					s.handshakeTimeout == DefaultHandshakeTimeout && s.closeTimeout == DefaultCloseTimeout, "brpc defaults")
			},
		},
		{
			name: "flags file",
			env:  map[string]string{EnvFlagsFile: good},
			check: func(s settings) string {
				return expect(s.flags.SQSize == 64 && s.flags.UsePolling && s.device == "udma3", "file values")
			},
		},
		{
			name:  "URMA_DEVICE beats the file",
			env:   map[string]string{EnvFlagsFile: good, EnvDevice: "udma7"},
			check: func(s settings) string { return expect(s.device == "udma7", "device udma7") },
		},
		{
			name:  "URMA_DEVICES first, URMA_DEVICE unset",
			env:   map[string]string{EnvDevices: "udma4:64,udma5:32"},
			check: func(s settings) string { return expect(s.device == "udma4", "device udma4") },
		},
		{
			name:  "URMA_DEVICES of bare names",
			env:   map[string]string{EnvDevices: " udma4, udma5"},
			check: func(s settings) string { return expect(s.device == "udma4", "device udma4") },
		},
		{
			name:  "Config.Device beats the environment",
			cfg:   Config{Device: "udma1"},
			env:   map[string]string{EnvDevice: "udma7"},
			check: func(s settings) string { return expect(s.device == "udma1", "device udma1") },
		},
		{
			name:  "URMA_JETTY_BUDGET",
			env:   map[string]string{EnvJettyBudget: "12"},
			check: func(s settings) string { return expect(s.budget.Limit() == 12, "budget 12") },
		},
		{
			name:  "URMA_JETTY_BUDGET=0 means no budget",
			env:   map[string]string{EnvJettyBudget: "0"},
			check: func(s settings) string { return expect(s.budget.Limit() == 0, "no budget") },
		},
		{
			name:  "Config.JettyBudget beats the environment",
			cfg:   Config{JettyBudget: 3},
			env:   map[string]string{EnvJettyBudget: "12"},
			check: func(s settings) string { return expect(s.budget.Limit() == 3, "budget 3") },
		},
		{
			name:  "negative JettyBudget means unlimited",
			cfg:   Config{JettyBudget: -1},
			env:   map[string]string{EnvJettyBudget: "12"},
			check: func(s settings) string { return expect(s.budget.Limit() == 0, "no budget") },
		},
		{
			name: "URMA_EID",
			env:  map[string]string{EnvEID: "10.0.0.1"},
			check: func(s settings) string {
				return expect(s.eid != nil && s.eid.String() == "::ffff:10.0.0.1", "EID parsed")
			},
		},
		{
			name:  "URMA_PROVIDER",
			env:   map[string]string{EnvProvider: " Soft "},
			check: func(s settings) string { return expect(s.providerName == ProviderSoft, "provider soft") },
		},
		{
			name: "token and first-bytes defaults",
			check: func(s settings) string {
				return expect(!s.requireToken && s.firstBytes == time.Second, "no token required, first bytes within 1s")
			},
		},
		{
			name: "token and first bytes from flags file",
			env:  map[string]string{EnvFlagsFile: strict},
			check: func(s settings) string {
				return expect(s.requireToken && s.firstBytes == 250*time.Millisecond, "token required, first bytes within 250ms")
			},
		},
		{
			name:  "URMA_REQUIRE_TOKEN beats the file",
			env:   map[string]string{EnvFlagsFile: strict, EnvRequireToken: "false"},
			check: func(s settings) string { return expect(!s.requireToken, "no token required") },
		},
		{
			name:  "URMA_REQUIRE_TOKEN",
			env:   map[string]string{EnvRequireToken: " true "},
			check: func(s settings) string { return expect(s.requireToken, "token required") },
		},
		{
			name:  "Config.RequireToken over the environment",
			cfg:   Config{RequireToken: true},
			env:   map[string]string{EnvRequireToken: "false"},
			check: func(s settings) string { return expect(s.requireToken, "token required") },
		},
		{
			name:  "Config.FirstBytesTimeout beats the file",
			cfg:   Config{FirstBytesTimeout: 50 * time.Millisecond},
			env:   map[string]string{EnvFlagsFile: strict},
			check: func(s settings) string { return expect(s.firstBytes == 50*time.Millisecond, "first bytes within 50ms") },
		},
		{
			name:  "ACK timeout default",
			check: func(s settings) string { return expect(s.ackTimeout == 3*time.Second, "ACK within 3s") },
		},
		{
			name:  "ACK timeout from the flags file",
			env:   map[string]string{EnvFlagsFile: strict},
			check: func(s settings) string { return expect(s.ackTimeout == 300*time.Millisecond, "ACK within 300ms") },
		},
		{
			name:  "Config.AckTimeout beats the file",
			cfg:   Config{AckTimeout: 50 * time.Millisecond},
			env:   map[string]string{EnvFlagsFile: strict},
			check: func(s settings) string { return expect(s.ackTimeout == 50*time.Millisecond, "ACK within 50ms") },
		},
		{
			name:  "negative AckTimeout waits the handshake",
			cfg:   Config{AckTimeout: -1},
			check: func(s settings) string { return expect(s.ackTimeout == 0, "no ACK timeout") },
		},
		{
			name:  "negative FirstBytesTimeout, whole wait",
			cfg:   Config{FirstBytesTimeout: -1},
			check: func(s settings) string { return expect(s.firstBytes == 0, "no first-bytes timeout") },
		},
		{
			name:  "accept backlog default",
			check: func(s settings) string { return expect(s.acceptBacklog == DefaultAcceptBacklog, "the default backlog") },
		},
		{
			name:  "Config.AcceptBacklog",
			cfg:   Config{AcceptBacklog: MaxAcceptBacklog},
			check: func(s settings) string { return expect(s.acceptBacklog == MaxAcceptBacklog, "the largest backlog") },
		},
		{name: "negative Config.AcceptBacklog", cfg: Config{AcceptBacklog: -1}, wantErr: "Config.AcceptBacklog=-1 is out of range: want 1..65536, or 0 for the default (128)"},
		{name: "Config.AcceptBacklog too large", cfg: Config{AcceptBacklog: MaxAcceptBacklog + 1}, wantErr: "Config.AcceptBacklog=65537 is out of range"},
		{name: "bad URMA_REQUIRE_TOKEN", env: map[string]string{EnvRequireToken: "maybe"}, wantErr: `URMA_REQUIRE_TOKEN="maybe" is not true or false`},
		{name: "missing flags file", env: map[string]string{EnvFlagsFile: dir + "/nope"}, wantErr: "open flags file"},
		{name: "flags file out of range", env: map[string]string{EnvFlagsFile: bad}, wantErr: "line 1: flag urma_rq_size: 5 is out of range (want 16..4096)"},
		{name: "bad budget", env: map[string]string{EnvJettyBudget: "many"}, wantErr: `URMA_JETTY_BUDGET="many" is not a non-negative integer`},
		{name: "negative budget", env: map[string]string{EnvJettyBudget: "-2"}, wantErr: "URMA_JETTY_BUDGET"},
		{name: "bad EID", env: map[string]string{EnvEID: "nope"}, wantErr: "URMA_EID: parse EID"},
		{name: "bad URMA_DEVICES", env: map[string]string{EnvDevices: "udma0:lots"}, wantErr: `URMA_DEVICES entry "udma0:lots": jetties "lots" is not an integer`},
		{name: "invalid Config.Flags", cfg: Config{Flags: func() *flags.Flags { f := smallFlags(); f.SQSize = 1; return &f }()}, wantErr: "urma_sq_size: 1 is out of range"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.LookupEnv = envOf(tc.env)
			s, err := cfg.resolve()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("resolve() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg := tc.check(s); msg != "" {
				t.Fatalf("want %s, got %+v", msg, s)
			}
		})
	}
}

func expect(ok bool, what string) string {
	if ok {
		return ""
	}
	return what
}

// TestListenAndDialErrors: what makes a listener or dialer impossible is an
// error naming the problem.
func TestListenAndDialErrors(t *testing.T) {
	if _, err := Listen("udp", "127.0.0.1:0", Config{LookupEnv: noEnv}); err == nil || !strings.Contains(err.Error(), `network "udp" is not supported`) {
		t.Errorf("Listen(udp) = %v", err)
	}
	if _, err := Dial(context.Background(), "unix", "/tmp/x", Config{LookupEnv: noEnv}); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("Dial(unix) = %v", err)
	}
	if _, err := NewDialer(Config{LookupEnv: envOf(map[string]string{EnvJettyBudget: "x"})}); err == nil {
		t.Error("NewDialer with a bad budget succeeded")
	}
	d, err := NewDialer(Config{LookupEnv: noEnv, DisableURMA: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
	if _, err := d.DialContext(context.Background(), "127.0.0.1:1"); !errors.Is(err, net.ErrClosed) {
		t.Errorf("dial on a closed dialer: %v, want net.ErrClosed", err)
	}
}

// TestPoolExactlyEnoughForReceives: a pool with exactly one connection's
// receive buffers left gives them all to it: the connection is URMA, not
// a resources fallback, and receives.
func TestPoolExactlyEnoughForReceives(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	f := smallFlags()
	f.BufferCount = f.RQSize // 16: the receives, nothing more
	f.PreparedJettyCnt = 0
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, f))
	if p.client.Mode() != ModeURMA {
		t.Fatalf("a client whose pool holds exactly its receive buffers: mode %s (%s), want urma", p.client.Mode(), p.client.FallbackReason())
	}
	if free, inUse := p.client.(*urmaConn).pool.stats(); free != 0 || inUse != f.RQSize {
		t.Fatalf("client pool: %d free, %d in use; want 0 and %d", free, inUse, f.RQSize)
	}
	msg := pattern(3*f.BufferSize, 9)
	go func() { _, _ = p.server.Write(msg) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(p.client, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes, %v; want the server's %d", len(got), err, len(msg))
	}
}
