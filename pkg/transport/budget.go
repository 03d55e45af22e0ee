package transport

import (
	"slices"
	"sync"
)

// JettyBudget counts jetties against a limit: the pod's share of the
// device, as the device plugin allocated it (URMA_JETTY_BUDGET). It is an
// admission budget the workload honors, not isolation the device enforces.
// Share one between the Listeners and Dialers of a process through
// Config.Budget so they stay within the pod's budget together.
type JettyBudget struct {
	mu    sync.Mutex
	limit int // 0: unlimited
	used  int
	// pools hold prepared jetties counted here, which a connection may
	// reclaim (reclaim).
	pools []*jettyPool
}

// NewJettyBudget returns a budget of limit jetties; 0 means unlimited.
func NewJettyBudget(limit int) *JettyBudget {
	if limit < 0 {
		limit = 0
	}
	return &JettyBudget{limit: limit}
}

// Limit is the budget; 0 means unlimited.
func (b *JettyBudget) Limit() int { return b.limit }

// InUse is how many jetties count against the budget now.
func (b *JettyBudget) InUse() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// take counts one jetty if the budget allows it.
func (b *JettyBudget) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit > 0 && b.used >= b.limit {
		return false
	}
	b.used++
	return true
}

// give uncounts one jetty.
func (b *JettyBudget) give() {
	b.mu.Lock()
	b.used--
	b.mu.Unlock()
}

// addPool and removePool register the jetty pools whose prepared jetties
// count against the budget.
func (b *JettyBudget) addPool(p *jettyPool) {
	b.mu.Lock()
	b.pools = append(b.pools, p)
	b.mu.Unlock()
}

func (b *JettyBudget) removePool(p *jettyPool) {
	b.mu.Lock()
	b.pools = slices.DeleteFunc(b.pools, func(x *jettyPool) bool { return x == p })
	b.mu.Unlock()
}

// wakeOthers kicks the fillers of the pools counted here but p, after p
// gave jetties back to the budget: a pool sharing the budget may be short
// of prepared jetties for want of them, and its filler waits for a kick.
func (b *JettyBudget) wakeOthers(p *jettyPool) {
	b.mu.Lock()
	pools := slices.Clone(b.pools)
	b.mu.Unlock()
	for _, o := range pools {
		if o != p {
			o.wake()
		}
	}
}

// reclaim destroys one prepared jetty of any pool counted here, so that a
// connection may have its share of the budget: prepared jetties are a head
// start, not a claim on the budget, and a spent budget must not turn away a
// connection that none of them fits (a brpc peer's, another Listener's or
// Dialer's). It reports whether it freed a jetty of the budget. It takes
// no pool's lock while holding b.mu.
func (b *JettyBudget) reclaim() bool {
	b.mu.Lock()
	pools := slices.Clone(b.pools)
	b.mu.Unlock()
	for _, p := range pools {
		if p.dropPrepared() {
			return true
		}
	}
	return false
}
