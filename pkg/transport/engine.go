package transport

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// creditWRs is the number of send work requests reserved for credit
// messages, on both queues (brpc's RESERVED_WR_NUM).
const creditWRs = 3

// minPeerWindow is the smallest window a legal peer can have: the smallest
// queue depth the flags allow, less the credit reservation. Credits returned
// to a peer whose SQ depth we do not know are batched below it.
const minPeerWindow = 16 - creditWRs

// engine is what a Listener or Dialer owns: the provider, the device
// context, the registered pool, the jetty pool and the pollers. URMA
// connections hold a reference, so an engine outlives its owner until its
// last connection closes.
type engine struct {
	s       settings
	role    string
	log     logr.Logger
	metrics *metrics.Metrics

	startOnce  sync.Once
	launchOnce sync.Once                // startBy's goroutine
	up         chan struct{}            // closed when start has run (isUp)
	unusable   atomic.Pointer[fallback] // why URMA cannot be used; nil when ready

	prov     urma.Provider
	provName string // prov.Name(), kept: Debug outlives the teardown that drops prov
	ownsProv bool   // created from urma_provider: Close closes it
	softProv bool   // that provider is the software one
	fabric   fabricState
	uctx     urma.Context
	dev      urma.DeviceInfo
	pool     *bufferPool
	jetties  *jettyPool
	pollers  *pollerGroup
	sqSize   int
	rqSize   int
	bufSize  int
	// How connections receive (bufferplan.go): from the pool as the
	// flags say (poolRecv), or, with autoSized, from buffers of their own
	// the transport sizes (autoRecv).
	poolRecv  recvPlan
	autoRecv  recvPlan
	autoSized bool

	// Readers spinning for their message now (urma_event_spin), and how
	// many may: half the processors, at least one, so that a server with
	// many connections whose messages come just beyond the spin does not
	// spend every processor polling.
	spinners  atomic.Int32
	spinLimit int32

	// setups has an element for each jetty setup running on its own
	// goroutine (setUpBy), those a handshake stopped waiting for
	// included: a Listener's AcceptBacklog of them at most, a Dialer's
	// (which ignores AcceptBacklog) DefaultAcceptBacklog.
	setups chan struct{}

	removeSource func()

	mu       sync.Mutex
	refs     int
	shutdown bool
	done     chan struct{} // closed when the last reference goes
	wg       sync.WaitGroup
	// After the last reference: what the final teardown is doing (a
	// string), for the log when it outlasts CloseTimeout; released closes
	// once it has destroyed everything.
	teardownStep atomic.Value
	released     chan struct{}
}

func newEngine(s settings, role string, m *metrics.Metrics) *engine {
	return &engine{
		s: s, role: role, metrics: m, refs: 1, done: make(chan struct{}), up: make(chan struct{}),
		released: make(chan struct{}),
		log:      s.log.WithValues("role", role),
		sqSize:   s.flags.SQSize, rqSize: s.flags.RQSize, bufSize: s.flags.BufferSize,
		spinLimit: int32(max(1, runtime.GOMAXPROCS(0)/2)),
		setups:    make(chan struct{}, setupsFor(s, role)),
	}
}

// start brings URMA up once, on the host address local (where the software
// provider's fabric listens). Failure is not an error: it records why every
// connection of this engine will use TCP.
func (e *engine) start(local netip.Addr) {
	e.startOnce.Do(func() {
		if fb := e.bringUp(local); fb != nil {
			e.log.Info("URMA unavailable, connections will use TCP", "reason", fb.reason, "detail", fb.detail)
			e.teardownResources()
			e.unusable.Store(fb)
		}
		close(e.up)
	})
}

// isUp reports whether start has run.
func (e *engine) isUp() bool {
	select {
	case <-e.up:
		return true
	default:
		return false
	}
}

// startBy runs start on a goroutine of its own (the first call starts it,
// later ones wait for the same) and waits for it until ctx ends, returning
// ctx's error then. Opening the provider and registering the pool are
// provider calls that may stall and cannot be interrupted: a dial must not
// outlive its context for them. The bring-up goes on for later dials, and
// holds an engine reference meanwhile, so that a Close that comes first
// leaves the teardown to it. The caller holds a reference, so the
// goroutine's ref cannot fail.
func (e *engine) startBy(ctx context.Context, local netip.Addr) error {
	e.launchOnce.Do(func() {
		e.ref()
		go func() {
			defer e.unref()
			e.start(local)
		}()
	})
	select {
	case <-e.up:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unavailable says why URMA cannot be used; nil when it can (or before start).
func (e *engine) unavailable() *fallback { return e.unusable.Load() }

func (e *engine) bringUp(local netip.Addr) *fallback {
	if e.s.disable {
		return fallbackf(ReasonDisabled, "URMA disabled by configuration (TCP-only mode)")
	}
	if fb := e.openProvider(local); fb != nil {
		return fb
	}
	e.provName = e.prov.Name()
	devs, err := e.prov.Devices()
	if err != nil {
		return fallbackf(ReasonProviderUnavailable, "list devices of provider %s: %v", e.prov.Name(), err)
	}
	dev, fb := pickDevice(devs, e.s.device)
	if fb != nil {
		return fb
	}
	e.dev = dev
	if fb := e.checkDevice(); fb != nil {
		return fb
	}
	if dev.Bonding() {
		// brpc sets the bonding mode right after creating the context;
		// urma.Context has no call for it yet.
		e.log.Info("bonding device: urma_bonding_mode and urma_bonding_level cannot be applied through the provider API; the device's current mode is used",
			"device", dev.Name, "bondingMode", e.s.flags.BondingMode, "bondingLevel", e.s.flags.BondingLevel)
	}
	eidIndex := 0
	if e.s.eid != nil {
		if e.softProv {
			// URMA_EID names a hardware EID; the software provider's EID
			// encodes its socket address instead.
			e.log.V(1).Info("ignoring the configured EID on the software provider", "eid", e.s.eid.String())
		} else {
			eidIndex = -1
			for _, x := range dev.EIDs {
				if x.EID == *e.s.eid {
					eidIndex = x.Index
				}
			}
			if eidIndex < 0 {
				return fallbackf(ReasonDeviceMissing, "device %s has no EID %s", dev.Name, e.s.eid)
			}
		}
	}
	e.uctx, err = e.prov.Open(dev.Name, eidIndex)
	if err != nil {
		return fallbackf(ReasonDeviceMissing, "open device %s: %v", dev.Name, err)
	}
	if err := e.registerPool(); err != nil {
		return fallbackf(ReasonResources, "%v", err)
	}
	e.planBuffers()
	e.jetties = newJettyPool(e)
	if e.s.flags.UsePolling {
		e.pollers = newPollerGroup(e.s.flags.PollerNum, e.s.flags.PollerYield)
		e.pollers.start(&e.wg, e.done)
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.jetties.fill(e.done)
	}()
	e.removeSource = e.metrics.AddResourceSource(e.resourceStats)
	e.checkMemlock() // after adding our source: the check counts our pool
	// At the default level: an operator must be able to tell from the log
	// whether bytes move through hardware or through the software provider.
	e.log.Info("URMA ready", "provider", e.prov.Name(), "device", dev.Name, "eid", e.uctx.EID().String(),
		"buffers", e.s.flags.BufferCount, "bufferSize", e.bufSize, "sq", e.sqSize, "rq", e.rqSize,
		"ownBuffers", e.autoSized, "ownBufferSize", e.autoRecv.size, "ownReceives", e.autoRecv.count,
		"polling", e.s.flags.UsePolling, "jettyBudget", e.s.budget.Limit(), "preparedJetties", e.jetties.target)
	return nil
}

// pickDevice finds the named device, or the first with an active port.
func pickDevice(devs []urma.DeviceInfo, name string) (urma.DeviceInfo, *fallback) {
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
		if name != "" && d.Name == name {
			return d, nil
		}
	}
	if name != "" {
		return urma.DeviceInfo{}, fallbackf(ReasonDeviceMissing, "device %q not found (devices: %s)", name, strings.Join(names, ", "))
	}
	for _, d := range devs {
		if d.HasUsablePort() {
			return d, nil
		}
	}
	if len(devs) == 0 {
		return urma.DeviceInfo{}, fallbackf(ReasonDeviceMissing, "the provider has no devices")
	}
	return urma.DeviceInfo{}, fallbackf(ReasonDeviceMissing, "no device has an active port (devices: %s)", strings.Join(names, ", "))
}

// checkDevice checks that the device can carry our queues and an ordered
// byte stream over RM jetties, brpc's transport mode.
func (e *engine) checkDevice() *fallback {
	c := e.dev.Caps
	switch {
	case c.TransMode&urma.TransModeRM == 0:
		return fallbackf(ReasonDeviceUnsuitable, "device %s does not support RM jetties", e.dev.Name)
	case !c.OrderedRM:
		return fallbackf(ReasonDeviceUnsuitable, "device %s does not deliver RM messages in order", e.dev.Name)
	case c.MaxJFSDepth != 0 && uint32(e.sqSize) > c.MaxJFSDepth:
		return fallbackf(ReasonDeviceUnsuitable, "urma_sq_size %d exceeds device %s max_jfs_depth %d", e.sqSize, e.dev.Name, c.MaxJFSDepth)
	case c.MaxJFRDepth != 0 && uint32(e.rqSize) > c.MaxJFRDepth:
		return fallbackf(ReasonDeviceUnsuitable, "urma_rq_size %d exceeds device %s max_jfr_depth %d", e.rqSize, e.dev.Name, c.MaxJFRDepth)
	case c.MaxJFCDepth != 0 && uint32(e.jfcDepth(e.sqSize)) > c.MaxJFCDepth:
		return fallbackf(ReasonDeviceUnsuitable, "completion queue depth %d exceeds device %s max_jfc_depth %d", e.jfcDepth(e.sqSize), e.dev.Name, c.MaxJFCDepth)
	case c.MaxMsgSize != 0 && uint64(e.bufSize) > c.MaxMsgSize:
		return fallbackf(ReasonDeviceUnsuitable, "urma_buffer_size %d exceeds device %s max_msg_size %d", e.bufSize, e.dev.Name, c.MaxMsgSize)
	}
	return nil
}

// jfcDepth holds every completion a connection with a send queue of depth
// sq can have outstanding: its sends, its receives, and the flush-done
// record (flags.JFCSpare, which internal/operator/tuning budgets for too).
func (e *engine) jfcDepth(sq int) int { return sq + e.rqSize + flags.JFCSpare }

// registerPool maps and registers the buffer pool (registerPoolMemory).
func (e *engine) registerPool() error {
	pool, err := allocPool(e.bufSize, e.s.flags.BufferCount, e.allocPoolMemory, e.registerPoolMemory)
	if err != nil {
		return fmt.Errorf("buffer pool: %w", err)
	}
	e.pool = pool
	return nil
}

// allocPoolMemory maps the engine pool. The shm fabric hands memory to its
// peer by file, so it needs AllocMemory's memfd, and so may a provider
// given in Config.Provider, whose fabric the engine cannot see. Everywhere
// else (liburma, the socket fabric) the pool is private and, with
// urma_pool_huge_pages, advised for huge pages: the socket fabric's 1 MiB
// stream moved about a tenth more bytes on them (docs/benchmarks.md), since
// a pool of many megabytes no longer costs a page walk per 4 KiB copied.
func (e *engine) allocPoolMemory(size int) (*urma.Memory, error) {
	if e.s.flags.PoolHugePages && e.ownsProv && e.fabric.name != FabricShm {
		return urma.AllocPrivateMemory(size)
	}
	return urma.AllocMemory(size)
}

// registerPoolMemory registers the pool local-only when the provider
// allows it (a SEND lands in posted receives without any remote access
// right), so that no peer can read what the pool holds for another.
// urma_pool_remote_read opts in to remote reads: a provider that sends by
// reference (the shm fabric) then copies each byte once instead of twice.
// Remote access always comes with a token of the pool's own that no hello
// carries: our protocol has no peer access the pool by its token, so none
// needs it, and on hardware, which checks the token on every access, no
// peer can reach the pool, which holds every connection's data.
func (e *engine) registerPoolMemory(mem *urma.Memory) (urma.Segment, error) {
	if e.s.flags.PoolRemoteRead {
		seg, err := e.uctx.RegisterSegment(mem, secretSegmentConfig(urma.AccessRead))
		if err != nil {
			return nil, fmt.Errorf("with remote read (urma_pool_remote_read): %w", err)
		}
		return seg, nil
	}
	seg, err := e.uctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	if err == nil {
		return seg, nil
	}
	e.log.Info("provider refused a local-only registration; registering the pool with remote access under a token of its own, which no peer is told", "error", err.Error())
	return e.uctx.RegisterSegment(mem, secretSegmentConfig(urma.AccessRead|urma.AccessWrite))
}

// secretSegmentConfig is access a under a random token that is never sent:
// remote access no peer can use.
func secretSegmentConfig(a urma.Access) urma.SegmentConfig {
	return urma.SegmentConfig{Access: a, TokenPolicy: urma.TokenPlainText, Token: randomToken()}
}

// helloAccess is what brpc asks for when it imports the segment a hello
// names (urma_import_seg with READ, WRITE and ATOMIC); a registration with
// less may refuse that import on hardware. The segment is a page of its
// own, never pool memory, so this access exposes nothing.
const helloAccess = urma.AccessRead | urma.AccessWrite | urma.AccessAtomic

// helloPage is the one-page segment a hello names, for the peer to import
// before our jetty.
type helloPage struct {
	mem *urma.Memory
	seg urma.Segment
}

// newHelloPage maps and registers a jetty's hello page, with the jetty's
// token, or none when tokenless. The page is private memory: no peer maps
// it, and it costs no file descriptor.
func (e *engine) newHelloPage(token urma.Token, tokenless bool) (*helloPage, error) {
	mem, err := urma.AllocPrivateMemory(os.Getpagesize())
	if err != nil {
		return nil, fmt.Errorf("allocate handshake segment: %w", err)
	}
	cfg := urma.SegmentConfig{Access: helloAccess, TokenPolicy: urma.TokenPlainText, Token: token}
	if tokenless {
		cfg = urma.SegmentConfig{Access: helloAccess, TokenPolicy: urma.TokenNone}
	}
	seg, err := e.uctx.RegisterSegment(mem, cfg)
	if err != nil {
		_ = mem.Free()
		return nil, fmt.Errorf("register handshake segment: %w", err)
	}
	return &helloPage{mem: mem, seg: seg}, nil
}

// close unregisters and unmaps the page; the memory stays mapped if the
// unregistration fails.
func (p *helloPage) close() error {
	if err := p.seg.Close(); err != nil {
		return fmt.Errorf("unregister handshake segment (its memory stays mapped): %w", err)
	}
	return p.mem.Free()
}

// randomToken draws a non-zero 32-bit token.
func randomToken() urma.Token {
	var b [4]byte
	for {
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
		if t := binary.BigEndian.Uint32(b[:]); t != 0 {
			return urma.Token(t)
		}
	}
}

// registeredBytes is what the engine registers, which a hardware provider
// pins: the buffer pool, and a hello page (one per jetty, which the pool
// dwarfs).
func (e *engine) registeredBytes() int64 {
	return int64(e.bufSize)*int64(e.s.flags.BufferCount) + int64(os.Getpagesize())
}

// checkMemlock warns when RLIMIT_MEMLOCK cannot hold the registered pools:
// the most common reason RDMA-style registration fails on hardware. Every
// Listener and Dialer of the process pins its pool under the one limit, so
// it compares the limit with the pools of all the engines on our metrics,
// ours included; the shortfall gauge follows them as they come and go.
func (e *engine) checkMemlock() {
	limit, unlimited, err := memlockLimit()
	if err != nil {
		e.log.Error(err, "cannot read RLIMIT_MEMLOCK")
		return
	}
	if unlimited {
		limit = -1
	}
	need, pools := e.metrics.Memlock(limit)
	if pools == 0 {
		// No registry: ours is the only pool we know of.
		need, pools = e.registeredBytes(), 1
	}
	if !unlimited && limit < need {
		e.log.Info("WARNING: RLIMIT_MEMLOCK is below the registered buffer pools; hardware providers will fail to register them (raise the container's memlock limit, or lower urma_buffer_count/urma_buffer_size)",
			"memlockBytes", limit, "poolBytes", need, "pools", pools, "ownPoolBytes", e.registeredBytes(), "provider", e.prov.Name())
	}
}

// ref takes a reference for a connection; false once the engine is gone.
func (e *engine) ref() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shutdown {
		return false
	}
	e.refs++
	return true
}

// unref drops a reference; the last one tears everything down.
func (e *engine) unref() {
	e.mu.Lock()
	e.refs--
	last := e.refs == 0 && !e.shutdown
	if last {
		e.shutdown = true
	}
	e.mu.Unlock()
	if !last {
		return
	}
	e.finalTeardown()
}

// finalTeardown stops the engine's goroutines and, once they have all
// returned, destroys what bringUp created, waiting for that at most
// CloseTimeout. A provider verb may never return (the jetty pool's filler
// in CreateJetty on a stalled device) and cannot be interrupted, so the
// wait and the teardown run on a goroutine of their own: past the timeout
// Close returns and logs what still runs, and the device context, the
// registered pool and the provider are deliberately left to that
// goroutine, which destroys them if the verb ever returns. Destroying them
// under the running verb instead could crash the process.
func (e *engine) finalTeardown() {
	e.teardownStep.Store("waiting for the engine's goroutines to return")
	close(e.done)
	go func() {
		defer close(e.released)
		e.wg.Wait()
		e.teardownResources()
	}()
	timer := time.NewTimer(e.s.closeTimeout)
	defer timer.Stop()
	select {
	case <-e.released:
		return
	case <-timer.C:
	}
	e.log.Error(errTeardownStalled, "URMA resources NOT released: leaking the device context, the registered buffer pool and the provider until the provider returns, since destroying them under a running verb is unsafe",
		"stillRunning", e.stillRunning(), "closeTimeout", e.s.closeTimeout, "provider", e.provName)
	go func() {
		<-e.released
		e.log.Info("released the URMA resources left behind at close, now that the provider returned")
	}()
}

// errTeardownStalled is what finalTeardown logs when it gives up waiting.
var errTeardownStalled = errors.New("the engine's teardown did not finish within CloseTimeout: a provider call has not returned")

// stillRunning says what a final teardown that has not finished waits for.
func (e *engine) stillRunning() string {
	step, _ := e.teardownStep.Load().(string)
	if e.jetties != nil && e.jetties.creating() {
		return "the jetty pool's filler, in the provider creating a prepared jetty (CreateJFCE/JFC/JFR/Jetty); " + step
	}
	return step
}

// teardownResources destroys what bringUp created, in reverse order. It is
// safe on a partial bring-up.
func (e *engine) teardownResources() {
	step := func(s string) { e.teardownStep.Store("releasing the resources: " + s) }
	if e.removeSource != nil {
		e.removeSource()
		e.removeSource = nil
	}
	if e.jetties != nil {
		step("destroying the prepared jetties")
		e.jetties.drain()
	}
	var errs []error
	if e.pool != nil {
		step("unregistering the buffer pool")
		errs = append(errs, e.pool.unregister(e.log, "the buffer pool"))
		e.pool = nil
	}
	if e.uctx != nil {
		step("closing the device context")
		errs = append(errs, e.uctx.Close())
		e.uctx = nil
	}
	if e.ownsProv && e.prov != nil {
		step("closing the provider")
		errs = append(errs, e.prov.Close())
		e.prov = nil
	}
	if err := errors.Join(errs...); err != nil {
		e.log.Error(err, "releasing URMA resources")
	}
}

func (e *engine) resourceStats() metrics.ResourceStats {
	var s metrics.ResourceStats
	if e.pool != nil {
		s.PoolFree, s.PoolInUse = e.pool.stats()
		s.PoolBytes = e.registeredBytes()
	}
	if e.jetties != nil {
		s.JettiesPrepared, s.JettiesInUse = e.jetties.stats()
	}
	s.JettyBudget, s.Budget = e.s.budget.Limit(), e.s.budget
	return s
}
