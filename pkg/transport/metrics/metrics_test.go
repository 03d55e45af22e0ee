package metrics

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCountersAndGauges(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.ConnOpened(ModeURMA, RoleClient)
	m.ConnOpened(ModeURMA, RoleClient)
	m.ConnClosed(ModeURMA, RoleClient)
	m.ConnOpened(ModeTCP, RoleServer)
	m.Fallback("jetty_budget_exhausted", RoleServer)
	m.Handshake(ResultURMA, RoleClient, 0.002)
	m.ProtocolError()
	m.ForeignMessages(RoleServer, 2)
	m.ForeignMessages(RoleServer, 1)
	m.TokenlessConn(RoleServer)
	d := m.Data(ModeURMA)
	d.BytesSent.Add(100)
	d.MessagesSent.Inc()
	d.StallRemoteRQ.Inc()
	m.FabricConn("shm", RoleClient)

	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"open urma client conns", testutil.ToFloat64(m.connsOpen.WithLabelValues(ModeURMA, RoleClient)), 1},
		{"total urma client conns", testutil.ToFloat64(m.connsTotal.WithLabelValues(ModeURMA, RoleClient)), 2},
		{"open tcp server conns", testutil.ToFloat64(m.connsOpen.WithLabelValues(ModeTCP, RoleServer)), 1},
		{"fallbacks", testutil.ToFloat64(m.fallbacks.WithLabelValues("jetty_budget_exhausted", RoleServer)), 1},
		{"bytes sent", testutil.ToFloat64(m.bytes.WithLabelValues(DirSent, ModeURMA)), 100},
		{"messages sent", testutil.ToFloat64(m.messages.WithLabelValues(DirSent)), 1},
		{"remote rq stalls", testutil.ToFloat64(m.windowStalls.WithLabelValues(WindowRemoteRQ)), 1},
		{"protocol errors", testutil.ToFloat64(m.protocolErrors), 1},
		{"foreign messages dropped by servers", testutil.ToFloat64(m.foreign.WithLabelValues(RoleServer)), 3},
		{"tokenless server conns", testutil.ToFloat64(m.tokenless.WithLabelValues(RoleServer)), 1},
		{"shm client conns", testutil.ToFloat64(m.fabricConns.WithLabelValues("shm", RoleClient)), 1},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if n := testutil.CollectAndCount(m.handshake); n != 1 {
		t.Errorf("handshake histogram series = %d, want 1", n)
	}
	// The pedantic registry checks help text, names and label consistency.
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("gather: %v", err)
	}
}

func TestResourcesSumOverSources(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	// A second owner on the same registry reuses the collectors.
	b, err := New(reg)
	if err != nil {
		t.Fatalf("second New on one registry: %v", err)
	}
	removeA := a.AddResourceSource(func() ResourceStats {
		return ResourceStats{PoolFree: 10, PoolInUse: 6, JettiesPrepared: 2, JettiesInUse: 5, JettyBudget: 8}
	})
	removeB := b.AddResourceSource(func() ResourceStats {
		return ResourceStats{PoolFree: 1, PoolInUse: 1, JettiesInUse: 1, JettyBudget: 4}
	})
	want := `
# HELP urma_transport_jetties_in_use Jetties held by connections or prepared: what counts against the jetty budget.
# TYPE urma_transport_jetties_in_use gauge
urma_transport_jetties_in_use 6
# HELP urma_transport_jetty_budget Jetties the budgets in force allow together (URMA_JETTY_BUDGET; a budget shared through Config.Budget counted once); 0 means unlimited.
# TYPE urma_transport_jetty_budget gauge
urma_transport_jetty_budget 12
# HELP urma_transport_pool_buffers Registered buffers by state (free, in_use).
# TYPE urma_transport_pool_buffers gauge
urma_transport_pool_buffers{state="free"} 11
urma_transport_pool_buffers{state="in_use"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"urma_transport_jetties_in_use", "urma_transport_jetty_budget", "urma_transport_pool_buffers"); err != nil {
		t.Fatal(err)
	}
	// Counters too are shared: what b counts, a's collector shows.
	b.ProtocolError()
	if got := testutil.ToFloat64(a.protocolErrors); got != 1 {
		t.Fatalf("shared counter = %v, want 1", got)
	}
	removeA()
	removeB()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP urma_transport_jetty_budget Jetties the budgets in force allow together (URMA_JETTY_BUDGET; a budget shared through Config.Budget counted once); 0 means unlimited.
# TYPE urma_transport_jetty_budget gauge
urma_transport_jetty_budget 0
`), "urma_transport_jetty_budget"); err != nil {
		t.Fatalf("after removing the sources: %v", err)
	}
}

// TestJettyBudgetCountsEachBudgetOnce: sources that share one budget
// (Config.Budget) count it once, and a source without a limit makes the
// whole unlimited (0), rather than hiding in a sum that reads as a limit.
func TestJettyBudgetCountsEachBudgetOnce(t *testing.T) {
	shared, own := new(int), new(int) // stand-ins for two *JettyBudget
	tests := []struct {
		name    string
		sources []ResourceStats
		want    float64
	}{
		{"one budget shared by three", []ResourceStats{
			{JettyBudget: 8, Budget: shared}, {JettyBudget: 8, Budget: shared}, {JettyBudget: 8, Budget: shared},
		}, 8},
		{"a shared budget and one of its own", []ResourceStats{
			{JettyBudget: 8, Budget: shared}, {JettyBudget: 8, Budget: shared}, {JettyBudget: 4, Budget: own},
		}, 12},
		{"budgets without identity each count", []ResourceStats{{JettyBudget: 8}, {JettyBudget: 4}}, 12},
		{"one unlimited", []ResourceStats{{JettyBudget: 8, Budget: shared}, {JettyBudget: 0, Budget: own}}, 0},
		{"none", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newResourceCollector("urma", "transport")
			for _, s := range tc.sources {
				c.add(func() ResourceStats { return s })
			}
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(c)
			want := fmt.Sprintf(`
# HELP urma_transport_jetty_budget Jetties the budgets in force allow together (URMA_JETTY_BUDGET; a budget shared through Config.Budget counted once); 0 means unlimited.
# TYPE urma_transport_jetty_budget gauge
urma_transport_jetty_budget %v
`, tc.want)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "urma_transport_jetty_budget"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMemlockShortfallSumsSources: the Listeners and Dialers on a registry
// pin their pools under the process's one RLIMIT_MEMLOCK, so the shortfall
// is their sum less the limit, computed when scraped: a source removed no
// longer counts. Sources on two Metrics of one registry count together.
func TestMemlockShortfallSumsSources(t *testing.T) {
	unset := int64(-2) // the limit was never read
	tests := []struct {
		name       string
		limit      int64
		pools      []int64 // PoolBytes of each source
		wantLimit  float64
		wantBytes  int64 // what Memlock returns
		wantPools  int
		wantShort  float64
		afterFirst float64 // the shortfall once the first source is gone
	}{
		{"each fits, together not", 150, []int64{100, 100}, 150, 200, 2, 50, 0},
		{"together exactly", 200, []int64{100, 100}, 200, 200, 2, 0, 0},
		{"neither fits", 50, []int64{100, 100}, 50, 200, 2, 150, 50},
		{"three, the first the largest", 250, []int64{200, 100, 50}, 250, 350, 3, 100, 0},
		{"a source without a pool", 50, []int64{0, 100}, 50, 100, 1, 50, 50},
		{"a limit of zero", 0, []int64{100}, 0, 100, 1, 100, 0},
		{"unlimited", -1, []int64{100, 100}, -1, 200, 2, 0, 0},
		{"never read", unset, []int64{100}, 0, 0, 0, 0, 0},
		{"no sources", 100, nil, 100, 0, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			ms := make([]*Metrics, 2)
			for i := range ms {
				m, err := New(reg)
				if err != nil {
					t.Fatal(err)
				}
				ms[i] = m
			}
			var removes []func()
			for i, b := range tc.pools {
				removes = append(removes, ms[i%2].AddResourceSource(func() ResourceStats { return ResourceStats{PoolBytes: b} }))
			}
			if tc.limit != unset {
				b, n := ms[1].Memlock(tc.limit)
				if b != tc.wantBytes || n != tc.wantPools {
					t.Errorf("Memlock(%d) = %d bytes in %d pools, want %d in %d", tc.limit, b, n, tc.wantBytes, tc.wantPools)
				}
			}
			check := func(when string, wantShort float64) {
				t.Helper()
				got := memlockGauges(t, reg)
				if got["urma_transport_memlock_limit_bytes"] != tc.wantLimit || got["urma_transport_memlock_shortfall_bytes"] != wantShort {
					t.Errorf("%s: gauges %v, want limit %v and shortfall %v", when, got, tc.wantLimit, wantShort)
				}
			}
			check("all sources", tc.wantShort)
			if len(removes) > 0 {
				removes[0]()
				check("the first source removed", tc.afterFirst)
			}
		})
	}
}

// TestRemoveWaitsForSourceCall: removing a source waits for a call of it
// in flight (a scrape, or another Listener checking RLIMIT_MEMLOCK), so that
// its owner may tear down what it reads once the removal returns.
func TestRemoveWaitsForSourceCall(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(m *Metrics, reg prometheus.Gatherer)
	}{
		{"scrape", func(_ *Metrics, reg prometheus.Gatherer) { _, _ = reg.Gather() }},
		{"memlock check", func(m *Metrics, _ prometheus.Gatherer) { m.Memlock(1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m, err := New(reg)
			if err != nil {
				t.Fatal(err)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			remove := m.AddResourceSource(func() ResourceStats {
				once.Do(func() {
					close(entered)
					<-release
				})
				return ResourceStats{}
			})
			called := make(chan struct{})
			go func() {
				defer close(called)
				tc.call(m, reg)
			}()
			<-entered
			removed := make(chan struct{})
			go func() {
				defer close(removed)
				remove()
			}()
			select {
			case <-removed:
				t.Error("remove returned while the source was being called")
			case <-time.After(50 * time.Millisecond):
			}
			close(release)
			<-removed
			<-called
		})
	}
}

// memlockGauges gathers reg and returns the two memlock gauges by name.
func memlockGauges(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "urma_transport_memlock_") {
			got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return got
}

func TestConflictingCollectorIsAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	// Someone else owns the name with a different type.
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "urma_transport_protocol_errors_total", Help: "not ours"}))
	if _, err := New(reg); err == nil || !strings.Contains(err.Error(), "register transport metrics") {
		t.Fatalf("New = %v, want a registration error", err)
	}
}

func TestNilMetricsRecordNothing(t *testing.T) {
	var m *Metrics
	m.ConnOpened(ModeTCP, RoleClient)
	m.ConnClosed(ModeTCP, RoleClient)
	m.Fallback("x", RoleClient)
	m.Handshake(ResultError, RoleServer, 1)
	m.ProtocolError()
	m.ForeignMessages(RoleClient, 1)
	m.TokenlessConn(RoleServer)
	if b, n := m.Memlock(1); b != 0 || n != 0 {
		t.Errorf("nil Metrics: Memlock = %d, %d; want 0, 0", b, n)
	}
	m.AddResourceSource(func() ResourceStats { return ResourceStats{} })()
	d := m.Data(ModeTCP)
	d.BytesSent.Add(1)
	d.StallPool.Inc()
	// Without a registry the collectors exist but are not exported anywhere.
	m2, err := New(nil)
	if err != nil || m2 == nil {
		t.Fatalf("New(nil) = %v, %v", m2, err)
	}
	m2.ConnOpened(ModeTCP, RoleClient)
	if got := testutil.ToFloat64(m2.connsOpen.WithLabelValues(ModeTCP, RoleClient)); got != 1 {
		t.Fatalf("unregistered metrics still count: got %v", got)
	}
}
