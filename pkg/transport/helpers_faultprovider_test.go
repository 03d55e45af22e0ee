package transport

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// faultConfig is what a faultProvider does wrong, on demand. The zero value
// does nothing wrong.
type faultConfig struct {
	// create makes Create<verb> fail, by verb: "jfce", "jfc", "jfr", "jetty".
	create map[string]error
	// postSend makes every PostSend fail.
	postSend error
	// poll makes every JFC poll fail.
	poll error
	// stallImport makes ImportJetty wait until its context ends.
	stallImport bool
	// jettyGate, when set, makes CreateJetty wait until it is closed: a
	// device whose verb blocks and cannot be interrupted.
	jettyGate <-chan struct{}
	// onJFRClose runs just after a JFR is destroyed.
	onJFRClose func()
	// muteEvents makes JFCE waits find no event: only a Poll (the event
	// loop's first, or a spinning reader's) takes completions.
	muteEvents bool
	// jettyEID, when set, is the EID jetties report in their ID, as a
	// bonding device's jetties report a port's EID, not the context's.
	jettyEID *urma.EID
	// refuseLocalOnly makes RegisterSegment refuse AccessLocalOnly, as a
	// provider that cannot register memory without remote access would.
	refuseLocalOnly bool
	// placing hands out JFRs that take a reader's offers (urma.Placement)
	// where the provider's do, and counts them (faults.offers).
	placing bool
}

// segmentReg is one RegisterSegment call that succeeded.
type segmentReg struct {
	id  urma.SegmentID
	cfg urma.SegmentConfig
}

// faults is a faultConfig that tests change while connections run, and
// the count of queues created and not yet destroyed, by verb.
type faults struct {
	mu    sync.Mutex
	cfg   faultConfig
	live  map[string]int
	tried map[string]int // Create<verb> calls, failed ones included
	segs  []segmentReg
	jfrs  []urma.JFRConfig // CreateJFR calls that succeeded
	waits int              // JFCE.Wait calls
	// offers counts the placements offered to JFRs (faultConfig.placing).
	offers atomic.Int64
}

// waitCalls is how many JFCE waits there were: an event loop makes its
// first after its first poll.
func (f *faults) waitCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waits
}

func (f *faults) createErr(verb string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tried == nil {
		f.tried = map[string]int{}
	}
	f.tried[verb]++
	if err := f.cfg.create[verb]; err != nil {
		return err
	}
	if f.live == nil {
		f.live = map[string]int{}
	}
	f.live[verb]++
	return nil
}

func (f *faults) destroyed(verb string) {
	f.mu.Lock()
	f.live[verb]--
	f.mu.Unlock()
}

func (f *faults) set(change func(c *faultConfig)) {
	f.mu.Lock()
	change(&f.cfg)
	f.mu.Unlock()
}

func (f *faults) get() faultConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg
}

// registrations lists the segments registered so far.
func (f *faults) registrations() []segmentReg {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]segmentReg(nil), f.segs...)
}

// receiveQueues lists the configurations of the JFRs created so far.
func (f *faults) receiveQueues() []urma.JFRConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]urma.JFRConfig(nil), f.jfrs...)
}

// attempts is how many times Create<verb> was called.
func (f *faults) attempts(verb string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tried[verb]
}

// liveQueues is how many queues of each verb exist.
func (f *faults) liveQueues() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.live {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// faultProvider wraps a provider and fails or stalls the verbs its faults
// name. The wrappers it hands out are unwrapped again on the way down, so
// the provider underneath sees only its own objects.
type faultProvider struct {
	urma.Provider
	f *faults
}

func newFaultProvider(p urma.Provider) *faultProvider {
	return &faultProvider{Provider: p, f: &faults{}}
}

func (p *faultProvider) Open(device string, eidIndex int) (urma.Context, error) {
	c, err := p.Provider.Open(device, eidIndex)
	if err != nil {
		return nil, err
	}
	return &faultContext{Context: c, f: p.f}, nil
}

type faultContext struct {
	urma.Context
	f *faults
}

type (
	faultJFCE struct {
		urma.JFCE
		f *faults
	}
	faultJFC struct {
		urma.JFC
		f *faults
	}
	faultJFR struct {
		urma.JFR
		f *faults
	}
	faultJetty struct {
		urma.Jetty
		f *faults
	}
)

func unwrapJFCE(x urma.JFCE) urma.JFCE {
	if w, ok := x.(*faultJFCE); ok {
		return w.JFCE
	}
	return x
}

func unwrapJFC(x urma.JFC) urma.JFC {
	if w, ok := x.(*faultJFC); ok {
		return w.JFC
	}
	return x
}

func unwrapJFR(x urma.JFR) urma.JFR {
	switch w := x.(type) {
	case *faultJFR:
		return w.JFR
	case *placingFaultJFR:
		return w.JFR
	}
	return x
}

// placingFaultJFR is a faultJFR that passes a reader's offers on to a JFR
// that takes them, counting them.
type placingFaultJFR struct {
	faultJFR
	placing placingJFR
}

func (r *placingFaultJFR) OfferPlacement(p *urma.Placement) bool {
	r.f.offers.Add(1)
	return r.placing.OfferPlacement(p)
}

func (c *faultContext) CreateJFCE() (urma.JFCE, error) {
	if err := c.f.createErr("jfce"); err != nil {
		return nil, err
	}
	x, err := c.Context.CreateJFCE()
	if err != nil {
		c.f.destroyed("jfce")
		return nil, err
	}
	return &faultJFCE{JFCE: x, f: c.f}, nil
}

func (c *faultContext) CreateJFC(cfg urma.JFCConfig) (urma.JFC, error) {
	if err := c.f.createErr("jfc"); err != nil {
		return nil, err
	}
	cfg.JFCE = unwrapJFCE(cfg.JFCE)
	x, err := c.Context.CreateJFC(cfg)
	if err != nil {
		c.f.destroyed("jfc")
		return nil, err
	}
	return &faultJFC{JFC: x, f: c.f}, nil
}

func (c *faultContext) CreateJFR(cfg urma.JFRConfig) (urma.JFR, error) {
	if err := c.f.createErr("jfr"); err != nil {
		return nil, err
	}
	cfg.JFC = unwrapJFC(cfg.JFC)
	x, err := c.Context.CreateJFR(cfg)
	if err != nil {
		c.f.destroyed("jfr")
		return nil, err
	}
	c.f.mu.Lock()
	c.f.jfrs = append(c.f.jfrs, cfg)
	c.f.mu.Unlock()
	if pj, ok := x.(placingJFR); ok && c.f.get().placing {
		return &placingFaultJFR{faultJFR: faultJFR{JFR: x, f: c.f}, placing: pj}, nil
	}
	return &faultJFR{JFR: x, f: c.f}, nil
}

func (c *faultContext) CreateJetty(cfg urma.JettyConfig) (urma.Jetty, error) {
	if err := c.f.createErr("jetty"); err != nil {
		return nil, err
	}
	if gate := c.f.get().jettyGate; gate != nil {
		<-gate
	}
	cfg.SendJFC, cfg.JFR = unwrapJFC(cfg.SendJFC), unwrapJFR(cfg.JFR)
	x, err := c.Context.CreateJetty(cfg)
	if err != nil {
		c.f.destroyed("jetty")
		return nil, err
	}
	return &faultJetty{Jetty: x, f: c.f}, nil
}

func (c *faultContext) RegisterSegment(mem *urma.Memory, cfg urma.SegmentConfig) (urma.Segment, error) {
	if cfg.Access == urma.AccessLocalOnly && c.f.get().refuseLocalOnly {
		return nil, urma.Errorf("register_seg", urma.CodeInval, "local-only registration refused by the test")
	}
	seg, err := c.Context.RegisterSegment(mem, cfg)
	if err == nil {
		c.f.mu.Lock()
		c.f.segs = append(c.f.segs, segmentReg{id: seg.ID(), cfg: cfg})
		c.f.mu.Unlock()
	}
	return seg, err
}

func (c *faultContext) ImportJetty(ctx context.Context, id urma.JettyID, mode urma.TransportMode, token urma.Token) (urma.RemoteJetty, error) {
	if c.f.get().stallImport {
		<-ctx.Done()
		return nil, urma.Errorf("import_jetty", urma.CodeTimeout, "stalled by the test: %v", ctx.Err())
	}
	return c.Context.ImportJetty(ctx, id, mode, token)
}

func (x *faultJFCE) Close() error {
	x.f.destroyed("jfce")
	return x.JFCE.Close()
}

func (x *faultJFCE) Wait(out []urma.JFC, timeout time.Duration) (int, error) {
	x.f.mu.Lock()
	x.f.waits++
	x.f.mu.Unlock()
	if x.f.get().muteEvents {
		return 0, nil
	}
	return x.JFCE.Wait(out, timeout)
}

func (x *faultJFC) Poll(out []urma.Completion) (int, error) {
	if err := x.f.get().poll; err != nil {
		return 0, err
	}
	return x.JFC.Poll(out)
}

func (x *faultJFC) Close() error {
	x.f.destroyed("jfc")
	return x.JFC.Close()
}

func (x *faultJFR) Close() error {
	err := x.JFR.Close()
	x.f.destroyed("jfr")
	if hook := x.f.get().onJFRClose; hook != nil {
		hook()
	}
	return err
}

func (x *faultJetty) PostSend(wr *urma.SendWR) error {
	if err := x.f.get().postSend; err != nil {
		return err
	}
	return x.Jetty.PostSend(wr)
}

func (x *faultJetty) ID() urma.JettyID {
	id := x.Jetty.ID()
	if e := x.f.get().jettyEID; e != nil {
		id.EID = *e
	}
	return id
}

func (x *faultJetty) Close() error {
	x.f.destroyed("jetty")
	return x.Jetty.Close()
}
