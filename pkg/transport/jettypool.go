package transport

import (
	"errors"
	"fmt"
	"sync"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// jettyRes is one connection's queues: completion channel (event mode),
// completion queue, receive queue, and the jetty sharing it; and the
// token that guards its receive queue and its hello page, drawn for this
// jetty alone. A jetty serves one connection and is destroyed with it, so
// its token reaches one peer, in that connection's hello, and no other:
// a prepared jetty's token is drawn before its connection exists, and
// nobody learns it until then.
type jettyRes struct {
	jfce  urma.JFCE // nil in polling mode
	jfc   urma.JFC
	jfr   urma.JFR
	jetty urma.Jetty
	token urma.Token // 0 when tokenless
	hello *helloPage // what the peer imports before the jetty
}

// jettySpec is what a connection's queues must be. Prepared jetties have
// the engine's spec; a brpc peer may need another: no token (it cannot
// present one) and a deeper send queue (see brpcMinSQ).
type jettySpec struct {
	sq        int
	tokenless bool
	// recv is how the connection receives (bufferplan.go): not part of
	// the jetty, whose receive queue is urma_rq_size deep whatever is
	// posted to it.
	recv recvPlan
}

// spec is the engine's own jetty spec: the configured send queue depth,
// a token of its own unless Config.NoToken, and receives for a peer of
// ours.
func (e *engine) spec() jettySpec {
	return jettySpec{sq: e.sqSize, tokenless: e.s.noToken, recv: e.recvPlanFor(true)}
}

// prepared reports whether a prepared jetty (the engine's spec) serves s.
func (s jettySpec) prepared(e *engine) bool {
	own := e.spec()
	return s.sq == own.sq && s.tokenless == own.tokenless
}

// createJetty builds a jettyRes in liburma's order. On failure it destroys
// whatever it created and names the step that failed.
func (e *engine) createJetty(spec jettySpec) (*jettyRes, error) {
	r := &jettyRes{}
	if err := e.buildJetty(r, spec); err != nil {
		if derr := r.destroy(); derr != nil {
			e.log.Error(derr, "destroying a partly created jetty")
		}
		return nil, err
	}
	return r, nil
}

// buildJetty creates r's queues one by one, stopping at the first error.
// Each is stored only once created: a provider may return a typed nil with
// its error.
func (e *engine) buildJetty(r *jettyRes, spec jettySpec) error {
	if !e.s.flags.UsePolling {
		jfce, err := e.uctx.CreateJFCE()
		if err != nil {
			return fmt.Errorf("create JFCE: %w", err)
		}
		r.jfce = jfce
	}
	depth := e.jfcDepth(spec.sq)
	jfc, err := e.uctx.CreateJFC(urma.JFCConfig{Depth: uint32(depth), JFCE: r.jfce})
	if err != nil {
		return fmt.Errorf("create JFC of depth %d: %w", depth, err)
	}
	r.jfc = jfc
	policy := urma.TokenNone
	if !spec.tokenless {
		policy, r.token = urma.TokenPlainText, randomToken()
	}
	jfr, err := e.uctx.CreateJFR(urma.JFRConfig{
		Mode: urma.RM, Depth: uint32(e.rqSize), MaxSGE: 1, JFC: r.jfc, MinRNRTimer: minRNRTimer,
		TokenPolicy: policy, Token: r.token,
	})
	if err != nil {
		return fmt.Errorf("create JFR of depth %d: %w", e.rqSize, err)
	}
	r.jfr = jfr
	jetty, err := e.uctx.CreateJetty(urma.JettyConfig{
		Mode: urma.RM, SQDepth: uint32(spec.sq), MaxSGE: 1, SendJFC: r.jfc, JFR: r.jfr,
		RNRRetry: rnrRetryForever, ErrTimeout: errTimeout,
	})
	if err != nil {
		return fmt.Errorf("create jetty of SQ depth %d: %w", spec.sq, err)
	}
	r.jetty = jetty
	hello, err := e.newHelloPage(r.token, spec.tokenless)
	if err != nil {
		return err
	}
	r.hello = hello
	return nil
}

// Jetty parameters. Credits keep a sender from outrunning posted receives,
// so "receiver not ready" only happens in the instant a credit message's
// buffer is being reposted: retry it, forever, briefly.
const (
	minRNRTimer     = 4
	rnrRetryForever = 7
	errTimeout      = 17
)

// destroy tears a jettyRes down in reverse order.
func (r *jettyRes) destroy() error {
	var errs []error
	if r.hello != nil {
		errs = append(errs, r.hello.close())
	}
	if r.jetty != nil {
		errs = append(errs, r.jetty.Close())
	}
	if r.jfr != nil {
		errs = append(errs, r.jfr.Close())
	}
	if r.jfc != nil {
		errs = append(errs, r.jfc.Close())
	}
	if r.jfce != nil {
		errs = append(errs, r.jfce.Close())
	}
	return errors.Join(errs...)
}

// jettyPool hands out jettyRes: prepared ones first, fresh ones while the
// budget allows. Every jetty, prepared or connected, counts against the
// budget. Jetties are used once (reusing one needs a reset brpc does not do
// either) and the pool is refilled in the background.
type jettyPool struct {
	e      *engine
	budget *JettyBudget
	target int // prepared jetties to keep

	mu        sync.Mutex
	prepared  []*jettyRes
	preparing int        // jetties the filler is creating, budget already taken
	ready     *sync.Cond // signaled when the filler finishes one
	live      int        // counted against the budget by this pool
	kick      chan struct{}
	drained   bool           // the engine is going: nothing is prepared any more
	dropping  sync.WaitGroup // prepared jetties being reclaimed (dropPrepared)
}

func newJettyPool(e *engine) *jettyPool {
	target := e.s.flags.PreparedJettyCnt
	if n, ok := nofileLimit(); ok {
		if c := preparedCap(n); c < target {
			e.log.Info("capping prepared jetties by RLIMIT_NOFILE", "requested", target, "cap", c, "nofile", n)
			target = c
		}
	}
	if l := e.s.budget.Limit(); l > 0 && l < target {
		target = l
	}
	p := &jettyPool{e: e, budget: e.s.budget, target: target, kick: make(chan struct{}, 1)}
	p.ready = sync.NewCond(&p.mu)
	p.budget.addPool(p)
	return p
}

// acquire returns a jetty of spec for a new connection, or why there is
// none: a prepared one when spec is the engine's, else a fresh one. When the
// budget is spent only because the filler is creating a jetty right now, it
// waits for that one.
func (p *jettyPool) acquire(spec jettySpec) (*jettyRes, *fallback) {
	usePrepared := spec.prepared(p.e)
	p.mu.Lock()
	for {
		if n := len(p.prepared); n > 0 && usePrepared {
			r := p.prepared[n-1]
			p.prepared = p.prepared[:n-1]
			p.mu.Unlock()
			p.wake()
			return r, nil
		}
		if p.budget.take() {
			p.live++
			break
		}
		if p.preparing > 0 {
			p.ready.Wait()
			continue
		}
		// Spent, maybe on prepared jetties this connection cannot use:
		// destroy one of them for it.
		p.mu.Unlock()
		if !p.budget.reclaim() {
			return nil, fallbackf(ReasonBudgetExhausted, "all %d jetties of the budget are in use (%s)", p.budget.Limit(), EnvJettyBudget)
		}
		p.mu.Lock()
	}
	p.mu.Unlock()
	r, err := p.e.createJetty(spec)
	if err != nil {
		p.mu.Lock()
		p.live--
		p.mu.Unlock()
		p.budget.give()
		return nil, fallbackf(ReasonResources, "%v", err)
	}
	return r, nil
}

// release destroys a connection's jetty and gives its budget back.
func (p *jettyPool) release(r *jettyRes) {
	if err := r.destroy(); err != nil {
		p.e.log.Error(err, "destroying a connection's jetty")
	}
	p.mu.Lock()
	p.live--
	p.mu.Unlock()
	p.budget.give()
	p.wake()
	p.budget.wakeOthers(p)
}

func (p *jettyPool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// fill keeps target jetties prepared until done closes.
func (p *jettyPool) fill(done <-chan struct{}) {
	for {
		p.mu.Lock()
		short := len(p.prepared)+p.preparing < p.target && p.budget.take()
		if short {
			p.preparing++
		}
		p.mu.Unlock()
		if short {
			r, err := p.e.createJetty(p.e.spec())
			p.mu.Lock()
			p.preparing--
			if err == nil {
				p.prepared = append(p.prepared, r)
				p.live++
			}
			p.ready.Broadcast()
			p.mu.Unlock()
			if err == nil {
				continue
			}
			// Wait for a kick before trying again.
			p.budget.give()
			p.e.log.Error(err, "preparing a jetty")
		}
		select {
		case <-done:
			return
		case <-p.kick:
		}
	}
}

// dropPrepared destroys one prepared jetty and gives it back to the budget
// (JettyBudget.reclaim); it reports whether there was one.
func (p *jettyPool) dropPrepared() bool {
	p.mu.Lock()
	n := len(p.prepared)
	if n == 0 || p.drained {
		p.mu.Unlock()
		return false
	}
	r := p.prepared[n-1]
	p.prepared = p.prepared[:n-1]
	p.live--
	p.dropping.Add(1) // drain waits: the engine's context outlives r
	p.mu.Unlock()
	defer p.dropping.Done()
	if err := r.destroy(); err != nil {
		p.e.log.Error(err, "destroying a prepared jetty for a connection's")
	}
	p.budget.give()
	return true
}

// drain destroys the prepared jetties (engine shutdown).
func (p *jettyPool) drain() {
	p.budget.removePool(p)
	p.mu.Lock()
	rs := p.prepared
	p.prepared = nil
	p.drained = true
	p.live -= len(rs)
	p.mu.Unlock()
	p.dropping.Wait()
	for _, r := range rs {
		if err := r.destroy(); err != nil {
			p.e.log.Error(err, "destroying a prepared jetty")
		}
		p.budget.give()
	}
	p.budget.wakeOthers(p)
}

// creating reports whether the filler is inside the provider, creating a
// prepared jetty.
func (p *jettyPool) creating() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.preparing > 0
}

// stats reports prepared jetties and all jetties this pool counts.
func (p *jettyPool) stats() (prepared, live int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.prepared), p.live
}
