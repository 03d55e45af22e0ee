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
	// PoolBytes is the memory the source has registered (its buffer pool
	// and the like), which a hardware provider pins: the sources on one
	// registry count against the process's one RLIMIT_MEMLOCK together.
	PoolBytes int64
}

// resourceCollector sums ResourceStats over its sources at scrape time, so
// the data path never touches a gauge and several owners can share one
// registry.
type resourceCollector struct {
	pool, prepared, inUse, budget  *prometheus.Desc
	memlockLimit, memlockShortfall *prometheus.Desc

	mu      sync.Mutex
	sources map[int]func() ResourceStats
	next    int
	// RLIMIT_MEMLOCK as last read by a source (-1: unlimited); the limit is
	// the process's, so the latest reading stands for all.
	memlock    int64
	memlockSet bool
}

func newResourceCollector(ns, sub string) *resourceCollector {
	name := func(n string) string { return prometheus.BuildFQName(ns, sub, n) }
	return &resourceCollector{
		pool:     prometheus.NewDesc(name("pool_buffers"), "Registered buffers by state (free, in_use).", []string{"state"}, nil),
		prepared: prometheus.NewDesc(name("jetties_prepared"), "Jetties created ahead of connections and waiting in the pool.", nil, nil),
		inUse:    prometheus.NewDesc(name("jetties_in_use"), "Jetties held by connections or prepared: what counts against the jetty budget.", nil, nil),
		budget: prometheus.NewDesc(name("jetty_budget"),
			"Jetties the budgets in force allow together (URMA_JETTY_BUDGET; a budget shared through Config.Budget counted once); 0 means unlimited.", nil, nil),
		memlockLimit: prometheus.NewDesc(name("memlock_limit_bytes"), "RLIMIT_MEMLOCK soft limit of the process; -1 means unlimited.", nil, nil),
		memlockShortfall: prometheus.NewDesc(name("memlock_shortfall_bytes"),
			"How far RLIMIT_MEMLOCK is below the buffer pools the open Listeners and Dialers on this registry have registered together; 0 when they fit. Hardware providers fail to register memory when this is above 0.", nil, nil),
		sources: make(map[int]func() ResourceStats),
	}
}

// add adds a source. The func it returns removes it, and returns only once
// no call of f is in flight, so that its owner may then tear down what f
// reads; f therefore must not call back into the collector.
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

// setMemlockLimit records RLIMIT_MEMLOCK and returns the registered bytes
// of the sources that registered any, and how many they are.
func (c *resourceCollector) setMemlockLimit(limit int64) (poolBytes int64, pools int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.memlock, c.memlockSet = limit, true
	for _, s := range c.statsLocked() {
		if s.PoolBytes > 0 {
			poolBytes += s.PoolBytes
			pools++
		}
	}
	return poolBytes, pools
}

// statsLocked calls every source. Its caller holds c.mu, so that a remove
// waits for a call in flight.
func (c *resourceCollector) statsLocked() []ResourceStats {
	stats := make([]ResourceStats, 0, len(c.sources))
	for _, f := range c.sources {
		stats = append(stats, f())
	}
	return stats
}

// Describe implements prometheus.Collector.
func (c *resourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pool
	ch <- c.prepared
	ch <- c.inUse
	ch <- c.budget
	ch <- c.memlockLimit
	ch <- c.memlockShortfall
}

// Collect implements prometheus.Collector.
func (c *resourceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	stats, limit, limitSet := c.statsLocked(), c.memlock, c.memlockSet
	c.mu.Unlock()
	var sum ResourceStats
	counted := map[any]bool{} // budgets already in sum.JettyBudget
	unlimited := false
	for _, s := range stats {
		sum.PoolFree += s.PoolFree
		sum.PoolInUse += s.PoolInUse
		sum.JettiesPrepared += s.JettiesPrepared
		sum.JettiesInUse += s.JettiesInUse
		sum.PoolBytes += s.PoolBytes
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
	// Until a source has read the limit it shows 0, as it always has, and
	// nothing is short: a real limit of 0 is short by every byte.
	var shortfall int64
	if limitSet && limit >= 0 {
		shortfall = max(0, sum.PoolBytes-limit)
	}
	ch <- prometheus.MustNewConstMetric(c.memlockLimit, prometheus.GaugeValue, float64(limit))
	ch <- prometheus.MustNewConstMetric(c.memlockShortfall, prometheus.GaugeValue, float64(shortfall))
}
