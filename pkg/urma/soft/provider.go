package soft

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/internal/lifecycle"
)

// Provider is the software URMA provider. It implements urma.Provider and is
// safe for concurrent use.
type Provider struct {
	name    string
	log     logr.Logger
	fabric  *Fabric
	opts    Options
	devices []*device
	maps    *mapBudget // what peers may make this process map (shm)

	mu       sync.Mutex
	closed   bool
	contexts map[*devContext]struct{}

	wg   sync.WaitGroup // every goroutine the provider starts
	done chan struct{}  // closed by Close
}

var _ urma.Provider = (*Provider)(nil)

// New creates a Provider with the devices opts describes. With opts.Fabric it
// joins that in-process fabric; otherwise every device listens on TCP.
func New(opts Options) (*Provider, error) {
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = defaultPeerTimeout
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = defaultDialTimeout
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.MaxConnsPerProcess <= 0 {
		opts.MaxConnsPerProcess = DefaultMaxConnsPerProcess
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	specs := opts.Devices
	if len(specs) == 0 {
		specs = []DeviceSpec{{Name: DefaultDevice}}
	}
	p := &Provider{
		log:      opts.Logger,
		fabric:   opts.Fabric,
		opts:     opts,
		maps:     newMapBudget(opts),
		contexts: make(map[*devContext]struct{}),
		done:     make(chan struct{}),
	}
	switch {
	case p.fabric != nil && opts.ShmDir != "":
		return nil, fmt.Errorf("create soft provider: Options.Fabric and Options.ShmDir both set; choose one fabric")
	case opts.AlsoSocket && opts.ShmDir == "":
		return nil, fmt.Errorf("create soft provider: Options.AlsoSocket adds the socket fabric to the shm fabric, but Options.ShmDir is not set")
	case p.fabric != nil:
		p.name = "soft-inproc"
	case opts.ShmDir != "" && opts.AlsoSocket:
		p.name = "soft-shm+socket"
	case opts.ShmDir != "":
		p.name = "soft-shm"
	default:
		p.name = "soft-socket"
	}
	names := map[string]bool{}
	for i, raw := range specs {
		spec, err := raw.withDefaults(i)
		if err == nil && names[spec.Name] {
			err = fmt.Errorf("device name %s listed twice", spec.Name)
		}
		if err == nil {
			names[spec.Name] = true
			var d *device
			d, err = p.newDevice(spec)
			if d != nil {
				p.devices = append(p.devices, d)
			}
		}
		if err != nil {
			p.shutdown()
			return nil, fmt.Errorf("create soft provider: %w", err)
		}
	}
	return p, nil
}

// newDevice creates and attaches one device.
func (p *Provider) newDevice(spec DeviceSpec) (*device, error) {
	d := &device{
		prov: p,
		caps: spec.Caps,
		info: urma.DeviceInfo{
			Name:          spec.Name,
			Driver:        Driver,
			TransportType: spec.TransportType,
			Caps:          spec.Caps,
			ReservedJetty: urma.Range{Min: 1, Max: 0}, // none: ids are assigned, never asked for
			Ports:         slices.Clone(spec.Ports),
		},
		jetties: make([]jettySlot, spec.Caps.MaxJetty+1),
		jfrs:    make([]jfrSlot, spec.Caps.MaxJFR+1),
		segs:    make(map[uint32]*segment),
	}
	var eids []urma.EID
	if p.fabric != nil {
		var err error
		if eids, err = p.fabric.attach(d, spec.EIDs); err != nil {
			return nil, err
		}
	} else {
		sd, err := listen(d, spec, p.opts)
		if err != nil {
			return nil, err
		}
		d.side = sd
		eids = []urma.EID{sd.eid}
		if p.opts.AlsoSocket {
			tcpOpts := p.opts
			tcpOpts.ShmDir = ""
			tcpSpec := spec
			tcpSpec.EIDs = nil // explicit EIDs name the shm side
			alt, err := listen(d, tcpSpec, tcpOpts)
			if err != nil {
				sd.close()
				return nil, err
			}
			d.tcpSide = alt
			eids = append(eids, alt.eid)
		}
	}
	d.eids = eids
	for i, e := range eids {
		d.info.EIDs = append(d.info.EIDs, urma.EIDEntry{Index: i, EID: e})
	}
	d.info.GUID = fmt.Sprintf("%x", eids[0][8:])
	for _, sd := range d.sides() {
		sd.start()
	}
	return d, nil
}

// Name says which fabric the provider uses: "soft-inproc", "soft-socket",
// "soft-shm", or "soft-shm+socket" for both (Options.AlsoSocket).
func (p *Provider) Name() string { return p.name }

// Devices lists the provider's devices.
func (p *Provider) Devices() ([]urma.DeviceInfo, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, urma.Errorf("get_device_list", urma.ErrClosed.Code, "provider is closed")
	}
	out := make([]urma.DeviceInfo, len(p.devices))
	for i, d := range p.devices {
		out[i] = d.infoCopy()
	}
	return out, nil
}

// ConnLimitRefusals counts the peer devices the provider's devices refused
// for their connection limit (Options.MaxConns), in a handshake or past
// it, since New. A caller that sees a peer give up on it can tell from a
// rise that the limit may be why: the refused peer learns ErrConnLimit,
// this side only counts.
func (p *Provider) ConnLimitRefusals() uint64 {
	var n uint64
	for _, d := range p.devices {
		for _, sd := range d.sides() {
			n += sd.limitRefusals.Load()
		}
	}
	return n
}

// Open creates a context on a device ("" means the first) bound to the EID at
// eidIndex.
func (p *Provider) Open(name string, eidIndex int) (urma.Context, error) {
	var d *device
	for _, c := range p.devices {
		if name == "" || c.info.Name == name {
			d = c
			break
		}
	}
	if d == nil {
		return nil, urma.Errorf("create_context", urma.CodeNoDev, "no device named %q", name)
	}
	if eidIndex < 0 || eidIndex >= len(d.eids) {
		return nil, urma.Errorf("create_context", urma.CodeInval, "device %s has no EID at index %d (it has %d)", d.info.Name, eidIndex, len(d.eids))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, urma.Errorf("create_context", urma.ErrClosed.Code, "provider is closed")
	}
	c := &devContext{prov: p, dev: d, eid: d.eids[eidIndex], uasid: d.nextUASID.Add(1)}
	p.contexts[c] = struct{}{}
	return c, nil
}

// Close tears everything down: every context and object still open is
// destroyed (outstanding work requests are dropped without completions),
// connections are closed, and every goroutine the provider started has
// returned when Close does. Peers see this device vanish. Close is
// idempotent.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ctxs := make([]*devContext, 0, len(p.contexts))
	for c := range p.contexts {
		ctxs = append(ctxs, c)
	}
	p.mu.Unlock()
	p.shutdown()
	for _, c := range ctxs {
		c.forceClose()
	}
	return nil
}

// shutdown detaches the devices and stops the goroutines.
func (p *Provider) shutdown() {
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	for _, d := range p.devices {
		d.closed.Store(true)
		if p.fabric != nil {
			p.fabric.detach(d)
		}
		for _, sd := range d.sides() {
			sd.close()
		}
	}
	p.wg.Wait()
}

func (p *Provider) forgetContext(c *devContext) {
	p.mu.Lock()
	delete(p.contexts, c)
	p.mu.Unlock()
}

// go runs f on a goroutine Close waits for.
func (p *Provider) goTracked(f func()) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
}

// sleep waits d or until the provider closes; it reports whether it slept
// the whole time.
func (p *Provider) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.done:
		return false
	}
}

// errClosed builds the error every verb returns on a destroyed object.
func errClosed(op, what string) error { return lifecycle.Closed(op, what) }
