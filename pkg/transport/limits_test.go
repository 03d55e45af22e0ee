package transport

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

func TestPreparedCap(t *testing.T) {
	tests := []struct {
		nofile uint64
		want   int
	}{
		{0, 0}, {64, 0}, {65, 0}, {66, 1}, {1024, 480}, {1 << 20, (1<<20 - 64) / 2},
	}
	for _, tc := range tests {
		if got := preparedCap(tc.nofile); got != tc.want {
			t.Errorf("preparedCap(%d) = %d, want %d", tc.nofile, got, tc.want)
		}
	}
}

// setRlimit lowers a soft limit for the test and restores it after.
func setRlimit(t *testing.T, resource int, cur uint64) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(resource, &old); err != nil {
		t.Fatal(err)
	}
	if old.Max != unix.RLIM_INFINITY && cur > old.Max {
		t.Skipf("hard limit %d is below %d", old.Max, cur)
	}
	if err := unix.Setrlimit(resource, &unix.Rlimit{Cur: cur, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(resource, &old) })
}

// TestPreparedJettiesCappedByNofileAndBudget: urma_prepared_jetty_cnt is
// capped by RLIMIT_NOFILE ((limit - 64) / 2) and by the jetty budget; the
// log says so when RLIMIT_NOFILE lowered it, and only then.
func TestPreparedJettiesCappedByNofileAndBudget(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		name      string
		nofile    uint64
		budget    int
		want      int
		cappedLog bool
	}{
		{"nofile caps", 100, 0, 18, true},
		{"nofile exactly enough", 64 + 2*32, 0, 32, false},
		{"budget caps", 4096, 5, 5, false},
		{"flag wins", 4096, 0, 32, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setRlimit(t, unix.RLIMIT_NOFILE, tc.nofile)
			pa, _ := fabricPair(t)
			f := smallFlags()
			f.PreparedJettyCnt = 32
			f.BufferCount = 64
			cfg := cfgWith(pa, f)
			cfg.JettyBudget = tc.budget
			var logs logLines
			cfg.Logger = logs.logger()
			ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			if got := ln.e.jetties.target; got != tc.want {
				t.Fatalf("prepared jetty target %d, want %d", got, tc.want)
			}
			if line := logs.find("capping prepared jetties by RLIMIT_NOFILE"); (line != "") != tc.cappedLog {
				t.Errorf("log line %q; want one: %v", line, tc.cappedLog)
			}
			eventually.Holds(t, "the pool to prepare its jetties", 10*time.Second, func() bool {
				prepared, _ := ln.e.jetties.stats()
				return prepared == tc.want
			})
		})
	}
}

// TestMemlockReported: an RLIMIT_MEMLOCK below the pool is reported in the
// metrics and the log; one that holds the pool exactly is no shortfall and
// no warning. The software provider works regardless.
func TestMemlockReported(t *testing.T) {
	checkNoLeaks(t)
	f := smallFlags() // 256 x 1 KiB
	pool := uint64(f.BufferCount*f.BufferSize + unix.Getpagesize())
	for _, tc := range []struct {
		name  string
		limit uint64
		warn  bool
	}{
		{"below the pool", 64 << 10, true},
		{"exactly the pool", pool, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setRlimit(t, unix.RLIMIT_MEMLOCK, tc.limit)
			reg := prometheus.NewRegistry()
			pa, pb := fabricPair(t)
			var logs logLines
			scfg := cfgWith(pa, f)
			scfg.Registerer = reg
			scfg.Logger = logs.logger()
			p := connect(t, scfg, cfgWith(pb, f))
			got := gatherFlat(t, reg)
			if got["urma_transport_memlock_limit_bytes"] != float64(tc.limit) {
				t.Errorf("memlock limit metric %v, want %d", got["urma_transport_memlock_limit_bytes"], tc.limit)
			}
			if want := float64(pool) - float64(min(tc.limit, pool)); got["urma_transport_memlock_shortfall_bytes"] != want {
				t.Errorf("memlock shortfall metric %v, want %v", got["urma_transport_memlock_shortfall_bytes"], want)
			}
			if line := logs.find("RLIMIT_MEMLOCK is below the registered buffer pool"); (line != "") != tc.warn {
				t.Errorf("warning %q; want one: %v", line, tc.warn)
			}
			if p.server.Mode() != ModeURMA {
				t.Errorf("the software provider should not mind memlock: %s", p.server.FallbackReason())
			}
		})
	}
}

// TestListenOnUnspecifiedAddress: a listener on 0.0.0.0 puts the software
// provider's socket fabric on an address peers can dial.
func TestListenOnUnspecifiedAddress(t *testing.T) {
	checkNoLeaks(t)
	f := flags.Defaults()
	f.BufferCount = 512
	cfg := Config{Flags: &f, LookupEnv: noEnv, SoftFabric: FabricSocket}
	ln, err := ListenTransport("tcp", "0.0.0.0:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if r := ln.FallbackReason(); r != "" {
		t.Fatalf("listener cannot use URMA: %s", r)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	c, err := Dial(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if m, _ := ModeOf(c); m != ModeURMA {
		t.Fatalf("mode %s: %s", m, c.(Conn).FallbackReason())
	}
	exchange(t, c, s, "over the socket fabric")
}

// TestMemlockSumsPools: the Listeners and Dialers of one process pin their
// pools together, so two Listeners on one registry are short by the sum of
// their pools less RLIMIT_MEMLOCK, even when each pool alone fits; the
// Listener whose pool tips the sum over the limit warns, naming both; and a
// closed Listener's pool no longer counts.
func TestMemlockSumsPools(t *testing.T) {
	checkNoLeaks(t)
	f := smallFlags() // 256 x 1 KiB
	pool := uint64(f.BufferCount*f.BufferSize + unix.Getpagesize())
	short := func(pools uint64, limit uint64) float64 { return float64(pools - min(pools, limit)) }
	for _, tc := range []struct {
		name       string
		limit      uint64
		warn       [2]bool // does the first, the second Listener warn
		shortBoth  float64 // shortfall while both are open
		shortFirst float64 // after the second closed
	}{
		{"each fits, together not", pool + pool/2, [2]bool{false, true}, short(2*pool, pool+pool/2), 0},
		{"together fit", 2 * pool, [2]bool{false, false}, 0, 0},
		{"neither fits", pool / 2, [2]bool{true, true}, short(2*pool, pool/2), short(pool, pool/2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setRlimit(t, unix.RLIMIT_MEMLOCK, tc.limit)
			reg := prometheus.NewRegistry()
			pa, _ := fabricPair(t)
			var lns [2]*Listener
			var logs [2]logLines
			for i := range lns {
				cfg := cfgWith(pa, f)
				cfg.Registerer = reg
				cfg.Logger = logs[i].logger()
				ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = ln.Close() })
				if fb := ln.FallbackReason(); fb != "" {
					t.Fatalf("listener %d without URMA: %s", i, fb)
				}
				lns[i] = ln
			}
			for i := range logs {
				line := logs[i].find("RLIMIT_MEMLOCK is below the registered buffer pool")
				if (line != "") != tc.warn[i] {
					t.Errorf("listener %d: warning %q; want one: %v", i, line, tc.warn[i])
				}
				if line == "" {
					continue
				}
				// The warning compares the limit with every pool open then.
				for _, fig := range []string{
					fmt.Sprintf(`"memlockBytes"=%d`, tc.limit),
					fmt.Sprintf(`"poolBytes"=%d`, uint64(i+1)*pool),
				} {
					if !strings.Contains(line, fig) {
						t.Errorf("listener %d: warning %q lacks %s", i, line, fig)
					}
				}
			}
			check := func(when string, want float64) {
				t.Helper()
				got := gatherFlat(t, reg)
				if got["urma_transport_memlock_limit_bytes"] != float64(tc.limit) {
					t.Errorf("%s: memlock limit metric %v, want %d", when, got["urma_transport_memlock_limit_bytes"], tc.limit)
				}
				if got["urma_transport_memlock_shortfall_bytes"] != want {
					t.Errorf("%s: memlock shortfall metric %v, want %v", when, got["urma_transport_memlock_shortfall_bytes"], want)
				}
			}
			check("both open", tc.shortBoth)
			_ = lns[1].Close()
			check("the second closed", tc.shortFirst)
			_ = lns[0].Close()
			check("both closed", 0)
		})
	}
}
