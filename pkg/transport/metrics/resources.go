package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ResourceStats are the resource levels of one Listener or Dialer.
type ResourceStats struct {
	PoolFree, PoolInUse           int // registered buffers
	JettiesPrepared, JettiesInUse int // in use counts the prepared ones too
	JettyBudget                   int // 0: unlimited
	// Budget identifies the budget JettyBudget is the limit of (a pointer
	// to it, or any comparable value), so that sources sharing one budget
	// count its limit once; nil counts this source's JettyBudget on its
	// own.
	Budget any
}

// resourceCollector sums ResourceStats over its sources at scrape time, so
// the data path never touches a gauge and several owners can share one
// registry.
type resourceCollector struct {
	pool, prepared, inUse, budget *prometheus.Desc

	mu      sync.Mutex
	sources map[int]func() ResourceStats
	next    int
}

func newResourceCollector(ns, sub string) *resourceCollector {
	name := func(n string) string { return prometheus.BuildFQName(ns, sub, n) }
	return &resourceCollector{
		pool:     prometheus.NewDesc(name("pool_buffers"), "Registered buffers by state (free, in_use).", []string{"state"}, nil),
		prepared: prometheus.NewDesc(name("jetties_prepared"), "Jetties created ahead of connections and waiting in the pool.", nil, nil),
		inUse:    prometheus.NewDesc(name("jetties_in_use"), "Jetties held by connections or prepared: what counts against the jetty budget.", nil, nil),
		budget: prometheus.NewDesc(name("jetty_budget"),
			"Jetties the budgets in force allow together (URMA_JETTY_BUDGET; a budget shared through Config.Budget counted once); 0 means unlimited.", nil, nil),
		sources: make(map[int]func() ResourceStats),
	}
}

func (c *resourceCollector) add(f func() ResourceStats) func() {
	c.mu.Lock()
	id := c.next
	c.next++
	c.sources[id] = f
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.sources, id)
		c.mu.Unlock()
	}
}

// Describe implements prometheus.Collector.
func (c *resourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pool
	ch <- c.prepared
	ch <- c.inUse
	ch <- c.budget
}

// Collect implements prometheus.Collector.
func (c *resourceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	fs := make([]func() ResourceStats, 0, len(c.sources))
	for _, f := range c.sources {
		fs = append(fs, f)
	}
	c.mu.Unlock()
	var sum ResourceStats
	counted := map[any]bool{} // budgets already in sum.JettyBudget
	unlimited := false
	for _, f := range fs {
		s := f()
		sum.PoolFree += s.PoolFree
		sum.PoolInUse += s.PoolInUse
		sum.JettiesPrepared += s.JettiesPrepared
		sum.JettiesInUse += s.JettiesInUse
		if s.Budget != nil {
			if counted[s.Budget] {
				continue
			}
			counted[s.Budget] = true
		}
		unlimited = unlimited || s.JettyBudget <= 0
		sum.JettyBudget += s.JettyBudget
	}
	if unlimited {
		sum.JettyBudget = 0 // a source without a limit: no limit in all
	}
	ch <- prometheus.MustNewConstMetric(c.pool, prometheus.GaugeValue, float64(sum.PoolFree), "free")
	ch <- prometheus.MustNewConstMetric(c.pool, prometheus.GaugeValue, float64(sum.PoolInUse), "in_use")
	ch <- prometheus.MustNewConstMetric(c.prepared, prometheus.GaugeValue, float64(sum.JettiesPrepared))
	ch <- prometheus.MustNewConstMetric(c.inUse, prometheus.GaugeValue, float64(sum.JettiesInUse))
	ch <- prometheus.MustNewConstMetric(c.budget, prometheus.GaugeValue, float64(sum.JettyBudget))
}
