// Package tuning derives the urma_* transport flags for a workload from what
// its traffic looks like (a Profile), flags set by hand (overrides) and what
// the devices can do (Limits). It is pure: no I/O, no Kubernetes, so every
// rule has a table test. docs/tuning.md explains each rule and its reason.
//
// Every value that a limit pushed away from what the rules wanted is reported
// as a Clamp; problems that no flag can fix (a jetty budget no node can
// satisfy, say) are reported as Warnings. Derive never silently changes a
// value.
package tuning

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Objective is what a workload optimises for.
type Objective string

// Objectives.
const (
	Latency    Objective = "Latency"
	Throughput Objective = "Throughput"
	Balanced   Objective = "Balanced"
)

// Completion is how the transport learns about completions.
type Completion string

// Completion modes. Auto picks from the Objective.
const (
	CompletionAuto    Completion = "Auto"
	CompletionEvent   Completion = "Event"
	CompletionPolling Completion = "Polling"
)

// Flag names this package derives. They must exist in pkg/transport/flags
// (TestFlagNamesExist checks).
const (
	FlagUsePolling       = "urma_use_polling"
	FlagPollerNum        = "urma_poller_num"
	FlagPollerYield      = "urma_poller_yield"
	FlagSQSize           = "urma_sq_size"
	FlagRQSize           = "urma_rq_size"
	FlagCQEPollOnce      = "urma_cqe_poll_once"
	FlagRecvZerocopy     = "urma_recv_zerocopy"
	FlagZerocopyMinSize  = "urma_zerocopy_min_size"
	FlagBondingMode      = "urma_bonding_mode"
	FlagBondingLevel     = "urma_bonding_level"
	FlagPreparedJettyCnt = "urma_prepared_jetty_cnt"
	FlagBufferSize       = "urma_buffer_size"
	FlagBufferCount      = "urma_buffer_count"
	FlagHandshake        = "urma_client_handshake_version"
)

// Constants of the rules (docs/tuning.md gives the reasons).
const (
	// CreditReserve is the number of queue entries brpc's flow control keeps
	// for credit messages: a window starts at queue size minus this.
	CreditReserve = 3
	// MinBufferSize is the smallest buffer brpc's hello accepts.
	MinBufferSize = 1024
	// MinBufferCount is the smallest pool the flag allows.
	MinBufferCount = 16
	// ConnectionsPerPoller is how many connections one poller serves before
	// the rules add another.
	ConnectionsPerPoller = 8
	// MaxPollers caps the pollers the rules ask for: each one spins a core.
	MaxPollers = 4
	// LatencyCopyThreshold is the receive size up to which latency profiles
	// copy instead of handing the buffer over.
	LatencyCopyThreshold = 4096
	// LargeRegistrationBytes is the registered memory per pod above which,
	// without a memoryBudget, Derive warns about RLIMIT_MEMLOCK.
	LargeRegistrationBytes = 1 << 30

	// Input bounds (the CRD enforces the same): beyond them the rules would
	// overflow or ask for queues no flag can express.
	MaxMessageBytes = 1 << 40 // 1 TiB
	MaxInflight     = 4096 - CreditReserve
	MaxConnections  = 1 << 16
	MaxJettyBudget  = 1 << 20
	// MaxMemoryBudget (1 EiB) keeps a budget well inside int64: past it a
	// quantity has no int64 value and would read as no cap at all.
	MaxMemoryBudget = 1 << 60
)

// Profile is what a workload's traffic looks like, in plain numbers.
type Profile struct {
	// MessageSize is the typical message in bytes (> 0).
	MessageSize int64
	// MaxMessageSize is the largest message in bytes; 0 means MessageSize.
	MaxMessageSize int64
	// ConnectionsPerPod is how many connections one pod holds (> 0).
	ConnectionsPerPod int64
	// InflightPerConnection is how many messages a connection has in flight (> 0).
	InflightPerConnection int64
	// Objective picks the trade-offs; empty means Balanced.
	Objective Objective
	// MemoryBudget caps the registered pool in bytes per pod; 0 means no cap.
	MemoryBudget int64
	// JettyBudget is the jetties a pod may use (> 0).
	JettyBudget int64
	// Completion is the completion mode; empty means Auto.
	Completion Completion
	// HandshakeVersion is the hello a client sends (2 or 3); 0 means 2.
	HandshakeVersion int64
	// BondingMode (0 standalone, 1 active-backup, 2 balance) and BondingLevel
	// (0 IODIE, 1 port) are passed through.
	BondingMode, BondingLevel int64
}

// Limits are what the devices of the nodes a workload runs on can do. When
// nodes differ, the caller passes the element-wise minimum (Limits.Min).
type Limits struct {
	MaxJFSDepth int64 // send queue depth
	MaxJFRDepth int64 // receive queue depth
	MaxJFCDepth int64 // completion queue depth; must hold sq + rq + flags.JFCSpare
	MaxMsgSize  int64 // largest single message (SEND) in bytes
	// JettiesPerDevice is the jetty budget of one device after reserves;
	// 0 means the node did not say.
	JettiesPerDevice int64
	// DeviceCount is the devices on a node; 0 means the node did not say.
	DeviceCount int64
}

// SoftwareLimits are the limits assumed where no node reports facts: the
// software provider's devices (urma.SoftDeviceCaps), one device per node.
func SoftwareLimits() Limits {
	return Limits{
		MaxJFSDepth:      urma.SoftMaxJFSDepth,
		MaxJFRDepth:      urma.SoftMaxJFRDepth,
		MaxJFCDepth:      urma.SoftMaxJFCDepth,
		MaxMsgSize:       urma.SoftMaxMsgSize,
		JettiesPerDevice: urma.SoftMaxJetty,
		DeviceCount:      1,
	}
}

// Validate reports limits that cannot be tuned against.
func (l Limits) Validate() error {
	var bad []string
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"maxJfsDepth", l.MaxJFSDepth}, {"maxJfrDepth", l.MaxJFRDepth},
		{"maxJfcDepth", l.MaxJFCDepth}, {"maxMsgSize", l.MaxMsgSize},
	} {
		if c.v <= 0 {
			bad = append(bad, fmt.Sprintf("%s must be positive, got %d", c.name, c.v))
		}
	}
	if l.JettiesPerDevice < 0 || l.DeviceCount < 0 {
		bad = append(bad, "jettiesPerDevice and deviceCount must not be negative")
	}
	if len(bad) > 0 {
		return fmt.Errorf("device limits: %s", strings.Join(bad, "; "))
	}
	return nil
}

// Min is the element-wise minimum of two limits: what every node of both
// groups can do. For the optional fields, 0 (unknown) loses to a known value.
func (l Limits) Min(o Limits) Limits {
	return Limits{
		MaxJFSDepth:      min(l.MaxJFSDepth, o.MaxJFSDepth),
		MaxJFRDepth:      min(l.MaxJFRDepth, o.MaxJFRDepth),
		MaxJFCDepth:      min(l.MaxJFCDepth, o.MaxJFCDepth),
		MaxMsgSize:       min(l.MaxMsgSize, o.MaxMsgSize),
		JettiesPerDevice: minKnown(l.JettiesPerDevice, o.JettiesPerDevice),
		DeviceCount:      minKnown(l.DeviceCount, o.DeviceCount),
	}
}

func minKnown(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// String is a compact description for conditions and logs.
func (l Limits) String() string {
	return fmt.Sprintf("maxJfsDepth=%d maxJfrDepth=%d maxJfcDepth=%d maxMsgSize=%d jettiesPerDevice=%d deviceCount=%d",
		l.MaxJFSDepth, l.MaxJFRDepth, l.MaxJFCDepth, l.MaxMsgSize, l.JettiesPerDevice, l.DeviceCount)
}

// Clamp says that a limit moved a flag away from what was wanted.
type Clamp struct {
	Flag   string
	Wanted int64
	Got    int64
	// Override is true when the wanted value came from spec.overrides.
	Override bool
	// Reason names the limit, e.g. "device maxJfsDepth 1024".
	Reason string
}

// String reads like "urma_sq_size 8195 -> 4096 (flag maximum 4096)".
func (c Clamp) String() string {
	src := ""
	if c.Override {
		src = "override "
	}
	return fmt.Sprintf("%s %s%d -> %d (%s)", c.Flag, src, c.Wanted, c.Got, c.Reason)
}

// Result is the derived flag set and what happened on the way.
type Result struct {
	Flags flags.Flags
	// Clamps lists every value a limit changed, in rule order.
	Clamps []Clamp
	// Warnings are problems no flag can fix, e.g. a budget no node can give.
	Warnings []string
	// RegisteredBytes is buffer size times buffer count: the memory each pod
	// registers (and locks: it counts against RLIMIT_MEMLOCK).
	RegisteredBytes int64
}

// ValidateProfile reports what is wrong on its face with a profile.
func ValidateProfile(p Profile) error {
	var bad []string
	if p.MessageSize <= 0 {
		bad = append(bad, fmt.Sprintf("messageSize must be positive, got %d", p.MessageSize))
	}
	if p.MessageSize > MaxMessageBytes || p.MaxMessageSize > MaxMessageBytes {
		bad = append(bad, fmt.Sprintf("messageSize and maxMessageSize must be at most %d", int64(MaxMessageBytes)))
	}
	if p.MaxMessageSize != 0 && p.MaxMessageSize < p.MessageSize {
		bad = append(bad, fmt.Sprintf("messageSize %d is above maxMessageSize %d", p.MessageSize, p.MaxMessageSize))
	}
	for _, c := range []struct {
		name   string
		v, max int64
	}{
		{"connectionsPerPod", p.ConnectionsPerPod, MaxConnections},
		{"inflightPerConnection", p.InflightPerConnection, MaxInflight},
		{"jettyBudget", p.JettyBudget, MaxJettyBudget},
	} {
		if c.v <= 0 || c.v > c.max {
			bad = append(bad, fmt.Sprintf("%s must be in 1..%d, got %d", c.name, c.max, c.v))
		}
	}
	if p.MemoryBudget < 0 {
		bad = append(bad, fmt.Sprintf("memoryBudget must not be negative, got %d", p.MemoryBudget))
	}
	if p.MemoryBudget > MaxMemoryBudget {
		bad = append(bad, fmt.Sprintf("memoryBudget %d is above %d bytes (1Ei)", p.MemoryBudget, int64(MaxMemoryBudget)))
	}
	if p.MemoryBudget > 0 && p.MemoryBudget < MinBufferCount*MinBufferSize {
		bad = append(bad, fmt.Sprintf("memoryBudget %d is below %d bytes (%d buffers of %d bytes)",
			p.MemoryBudget, MinBufferCount*MinBufferSize, MinBufferCount, MinBufferSize))
	}
	if p.HandshakeVersion != 0 && p.HandshakeVersion != 2 && p.HandshakeVersion != 3 {
		bad = append(bad, fmt.Sprintf("handshakeVersion must be 2 or 3, got %d", p.HandshakeVersion))
	}
	if p.BondingMode < 0 || p.BondingMode > 2 {
		bad = append(bad, fmt.Sprintf("bondingMode must be in 0..2, got %d", p.BondingMode))
	}
	if p.BondingLevel < 0 || p.BondingLevel > 1 {
		bad = append(bad, fmt.Sprintf("bondingLevel must be in 0..1, got %d", p.BondingLevel))
	}
	switch p.Objective {
	case "", Latency, Throughput, Balanced:
	default:
		bad = append(bad, fmt.Sprintf("objective %q is not one of Latency, Throughput, Balanced", p.Objective))
	}
	switch p.Completion {
	case "", CompletionAuto, CompletionEvent, CompletionPolling:
	default:
		bad = append(bad, fmt.Sprintf("completion %q is not one of Auto, Event, Polling", p.Completion))
	}
	if len(bad) > 0 {
		return fmt.Errorf("profile: %s", strings.Join(bad, "; "))
	}
	return nil
}

// ValidateOverrides checks every override against pkg/transport/flags: the
// name must be a known flag and the value within its range. The error names
// every bad entry, sorted by flag name.
func ValidateOverrides(overrides map[string]string) error {
	var scratch flags.Flags
	var bad []string
	for _, name := range sortedKeys(overrides) {
		if _, ok := flags.Lookup(name); !ok {
			bad = append(bad, fmt.Sprintf("unknown flag %q", name))
			continue
		}
		if err := scratch.Set(name, overrides[name]); err != nil {
			bad = append(bad, err.Error())
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("overrides: %s", strings.Join(bad, "; "))
	}
	return nil
}

// ErrInvalid marks errors about the inputs (as opposed to a bug).
var ErrInvalid = errors.New("invalid tuning input")

// Derive applies the rules. It fails only when the inputs are wrong on their
// face (ValidateProfile, ValidateOverrides, Limits.Validate); errors wrap
// ErrInvalid.
func Derive(p Profile, overrides map[string]string, lim Limits) (Result, error) {
	if err := ValidateProfile(p); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := ValidateOverrides(overrides); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := lim.Validate(); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if p.Objective == "" {
		p.Objective = Balanced
	}
	if p.Completion == "" {
		p.Completion = CompletionAuto
	}
	if p.MaxMessageSize == 0 {
		p.MaxMessageSize = p.MessageSize
	}
	d := deriver{p: p, o: overrides, lim: lim, f: flags.Defaults()}
	d.bufferSize()
	d.queueDepths()
	d.bufferCount()
	d.preparedJetties()
	d.completion()
	d.zerocopy()
	d.passThrough()
	d.otherOverrides()
	d.hardwareWarnings()
	if err := d.f.Validate(); err != nil {
		// The rules keep every value in range; reaching this is a bug.
		return Result{}, fmt.Errorf("derived flags out of range (a tuning bug): %w", err)
	}
	return Result{
		Flags:           d.f,
		Clamps:          d.clamps,
		Warnings:        d.warnings,
		RegisteredBytes: int64(d.f.BufferSize) * int64(d.f.BufferCount),
	}, nil
}

type deriver struct {
	p        Profile
	o        map[string]string
	lim      Limits
	f        flags.Flags
	clamps   []Clamp
	warnings []string
	used     map[string]bool // overrides already applied by a rule
}

// wanted returns the override for name when there is one, else derived.
// Overrides were validated, so their values parse.
func (d *deriver) wanted(name string, derived int64) (int64, bool) {
	s, ok := d.o[name]
	if !ok {
		return derived, false
	}
	if d.used == nil {
		d.used = map[string]bool{}
	}
	d.used[name] = true
	// Read the value as pkg/transport/flags does (gflags' forms: yes, 0x100,
	// ...) and take its canonical text, so no form reads differently here.
	var scratch flags.Flags
	_ = scratch.Set(name, s)
	canon, _ := scratch.Get(name)
	switch canon {
	case "true":
		return 1, true
	case "false":
		return 0, true
	}
	v, _ := strconv.ParseInt(canon, 10, 64)
	return v, true
}

// cap lowers v to limit and records why; it returns the new value.
func (d *deriver) cap(name string, v, limit int64, override bool, reason string) int64 {
	if v <= limit {
		return v
	}
	d.clamps = append(d.clamps, Clamp{Flag: name, Wanted: v, Got: limit, Override: override, Reason: reason})
	return limit
}

func spec(name string) flags.Spec {
	s, ok := flags.Lookup(name)
	if !ok {
		panic("tuning: flag " + name + " missing from pkg/transport/flags") // TestFlagNamesExist
	}
	return s
}

// bufferSize: one typical message per buffer, at least the objective's floor,
// at most what one SEND may carry and what lets 16 buffers fit the budget.
func (d *deriver) bufferSize() {
	s := spec(FlagBufferSize)
	floor := int64(MinBufferSize)
	switch d.p.Objective {
	case Throughput:
		floor = 64 << 10
	case Balanced:
		floor = 8 << 10
	}
	want := nextPow2(max(d.p.MessageSize, floor))
	v, ov := d.wanted(FlagBufferSize, want)
	v = d.cap(FlagBufferSize, v, s.Max, ov, fmt.Sprintf("flag maximum %d", s.Max))
	if m := prevPow2(d.lim.MaxMsgSize); m >= MinBufferSize {
		v = d.cap(FlagBufferSize, v, m, ov, fmt.Sprintf("device maxMsgSize %d", d.lim.MaxMsgSize))
	} else {
		v = d.cap(FlagBufferSize, v, MinBufferSize, ov, fmt.Sprintf("device maxMsgSize %d is below the %d-byte minimum buffer", d.lim.MaxMsgSize, MinBufferSize))
		d.warnings = append(d.warnings, fmt.Sprintf("device maxMsgSize %d is below brpc's minimum buffer size %d: SENDs of a full buffer will fail", d.lim.MaxMsgSize, MinBufferSize))
	}
	if d.p.MemoryBudget > 0 {
		fit := prevPow2(d.p.MemoryBudget / MinBufferCount)
		v = d.cap(FlagBufferSize, v, fit, ov, fmt.Sprintf("memoryBudget %d must hold %d buffers", d.p.MemoryBudget, MinBufferCount))
	}
	d.f.BufferSize = int(v)
}

// queueDepths: room for every in-flight work request plus the credit reserve;
// a message larger than a buffer takes several work requests.
func (d *deriver) queueDepths() {
	buf := int64(d.f.BufferSize)
	wrs := max(d.p.InflightPerConnection*ceilDiv(d.p.MessageSize, buf), ceilDiv(d.p.MaxMessageSize, buf))
	want := wrs + CreditReserve
	sq := d.depth(FlagSQSize, want, d.lim.MaxJFSDepth, "device maxJfsDepth")
	rq := d.depth(FlagRQSize, want, d.lim.MaxJFRDepth, "device maxJfrDepth")
	// The transport gives each connection one completion queue for both
	// queues plus flags.JFCSpare: the flush-done record its jetty posts
	// when closing moves it to ERROR. Past maxJfcDepth - JFCSpare it
	// refuses the device and every connection falls back to TCP.
	d.f.SQSize, d.f.RQSize = int(sq), int(rq)
	d.fitQueues(d.lim.MaxJFCDepth-flags.JFCSpare,
		fmt.Sprintf("device maxJfcDepth %d must hold sq + rq + %d", d.lim.MaxJFCDepth, flags.JFCSpare),
		fmt.Sprintf("device maxJfcDepth %d cannot hold the minimum queues (%%d + %%d) and the transport's %d spare completion", d.lim.MaxJFCDepth, flags.JFCSpare))
}

// fitQueues scales urma_sq_size and urma_rq_size down, in proportion, so
// that together they take at most room entries, each at least the flag
// minimum (a queue raised to it takes its room from the other). Where room
// cannot hold two minimum queues it warns with tooSmall, a format for the
// two minimums.
func (d *deriver) fitQueues(room int64, reason, tooSmall string) {
	sq, rq := int64(d.f.SQSize), int64(d.f.RQSize)
	if sq+rq <= room {
		return
	}
	minDepth := spec(FlagSQSize).Min
	if room < 2*minDepth {
		d.warnings = append(d.warnings, fmt.Sprintf(tooSmall, minDepth, minDepth))
		return
	}
	newSQ := max(minDepth, room*sq/(sq+rq))
	newRQ := max(minDepth, room-newSQ)
	// rq raised to its minimum takes its room from sq.
	newSQ = room - newRQ
	_, sqOv := d.o[FlagSQSize]
	_, rqOv := d.o[FlagRQSize]
	d.f.SQSize = int(d.cap(FlagSQSize, sq, newSQ, sqOv, reason))
	d.f.RQSize = int(d.cap(FlagRQSize, rq, newRQ, rqOv, reason))
}

func (d *deriver) depth(name string, want, device int64, what string) int64 {
	s := spec(name)
	// The flag minimum is part of the rule, not a clamp: small in-flight
	// counts simply get the smallest queue.
	v, ov := d.wanted(name, max(want, s.Min))
	v = d.cap(name, v, s.Max, ov, fmt.Sprintf("flag maximum %d", s.Max))
	if device < s.Min {
		d.warnings = append(d.warnings, fmt.Sprintf("%s %d is below the flag minimum %d", what, device, s.Min))
		return v
	}
	return d.cap(name, v, device, ov, fmt.Sprintf("%s %d", what, device))
}

// bufferCount: every posted receive and every in-flight send holds a buffer,
// on every connection; within the memory budget.
func (d *deriver) bufferCount() {
	s := spec(FlagBufferCount)
	buf := int64(d.f.BufferSize)
	want := d.p.ConnectionsPerPod * int64(d.f.SQSize+d.f.RQSize)
	v, ov := d.wanted(FlagBufferCount, max(want, s.Min))
	v = d.cap(FlagBufferCount, v, s.Max, ov, fmt.Sprintf("flag maximum %d", s.Max))
	if d.p.MemoryBudget > 0 {
		// bufferSize already made sure MinBufferCount buffers fit.
		v = d.cap(FlagBufferCount, v, d.p.MemoryBudget/buf, ov,
			fmt.Sprintf("memoryBudget %d holds %d buffers of %d bytes", d.p.MemoryBudget, d.p.MemoryBudget/buf, buf))
	}
	d.f.BufferCount = int(v)
	// A connection takes urma_rq_size buffers from the pool when it is set
	// up, or falls back to TCP, and its sends take more: a pool that cannot
	// hold one connection's queues would carry no connection at all (or
	// leave its writers waiting on themselves). The queues shrink to fit.
	d.fitQueues(v,
		fmt.Sprintf("a pool of %d buffers must hold one connection's sq + rq", v),
		fmt.Sprintf("the pool (%d buffers) cannot hold one connection's minimum queues (%%d + %%d): connections fall back to TCP (resource_allocation_failed) or their writers wait; raise memoryBudget or urma_buffer_count", v))
	if want := d.p.ConnectionsPerPod * int64(d.f.SQSize+d.f.RQSize); v < want && !ov {
		d.warnings = append(d.warnings, fmt.Sprintf("the pool (%d buffers) is smaller than the queues need (%d): writers will wait for free buffers, and a connection that finds fewer than urma_rq_size free buffers falls back to TCP", v, want))
	}
}

// preparedJetties: one per expected connection, never more than the budget.
func (d *deriver) preparedJetties() {
	s := spec(FlagPreparedJettyCnt)
	v, ov := d.wanted(FlagPreparedJettyCnt, d.p.ConnectionsPerPod)
	v = d.cap(FlagPreparedJettyCnt, v, d.p.JettyBudget, ov, fmt.Sprintf("jettyBudget %d", d.p.JettyBudget))
	v = d.cap(FlagPreparedJettyCnt, v, s.Max, ov, fmt.Sprintf("flag maximum %d", s.Max))
	d.f.PreparedJettyCnt = int(v)
	if d.p.ConnectionsPerPod > d.p.JettyBudget {
		d.warnings = append(d.warnings, fmt.Sprintf("connectionsPerPod %d exceeds jettyBudget %d: connections beyond the budget fall back to TCP", d.p.ConnectionsPerPod, d.p.JettyBudget))
	}
}

// completion: polling for latency (no wake-up on the path), events otherwise
// (no core spent spinning). Batch size follows the objective.
func (d *deriver) completion() {
	polling := d.p.Completion == CompletionPolling ||
		(d.p.Completion == CompletionAuto && d.p.Objective == Latency)
	if v, ok := d.wanted(FlagUsePolling, b2i(polling)); ok {
		polling = v == 1
	}
	d.f.UsePolling = polling

	pollers := min(MaxPollers, ceilDiv(d.p.ConnectionsPerPod, ConnectionsPerPoller))
	if !polling {
		pollers = 1 // unused in event mode; keep brpc's default
	}
	pollers, _ = d.wanted(FlagPollerNum, pollers)
	d.f.PollerNum = int(pollers)

	// Balanced profiles share the core; Latency and Throughput keep it.
	yield := polling && d.p.Objective == Balanced
	if v, ok := d.wanted(FlagPollerYield, b2i(yield)); ok {
		yield = v == 1
	}
	d.f.PollerYield = yield

	batch := int64(32)
	switch d.p.Objective {
	case Latency:
		batch = 16
	case Throughput:
		batch = 64
	}
	batch, _ = d.wanted(FlagCQEPollOnce, batch)
	d.f.CQEPollOnce = int(batch)
}

// zerocopy: latency profiles copy small receives so the buffer is reposted
// (and its credit returned) at once; others keep brpc's 512-byte threshold.
func (d *deriver) zerocopy() {
	on, _ := d.wanted(FlagRecvZerocopy, 1)
	d.f.RecvZerocopy = on == 1
	threshold := int64(512)
	if d.p.Objective == Latency {
		threshold = min(LatencyCopyThreshold, int64(d.f.BufferSize))
	}
	threshold, _ = d.wanted(FlagZerocopyMinSize, threshold)
	d.f.ZerocopyMinSize = int(threshold)
}

func (d *deriver) passThrough() {
	hv := d.p.HandshakeVersion
	if hv == 0 {
		hv = 2
	}
	hv, _ = d.wanted(FlagHandshake, hv)
	d.f.ClientHandshakeVersion = int(hv)
	mode, _ := d.wanted(FlagBondingMode, d.p.BondingMode)
	level, _ := d.wanted(FlagBondingLevel, d.p.BondingLevel)
	d.f.BondingMode, d.f.BondingLevel = int(mode), int(level)
}

// otherOverrides applies overrides of flags no rule derives (urma_device,
// urma_max_sge, urma_disable_bthread, ...), as given.
func (d *deriver) otherOverrides() {
	for _, name := range sortedKeys(d.o) {
		if d.used[name] {
			continue
		}
		if err := d.f.Set(name, d.o[name]); err != nil {
			// ValidateOverrides accepted it; unreachable.
			d.warnings = append(d.warnings, err.Error())
		}
	}
}

func (d *deriver) hardwareWarnings() {
	if d.lim.JettiesPerDevice > 0 && d.lim.DeviceCount > 0 &&
		d.p.JettyBudget > d.lim.JettiesPerDevice*d.lim.DeviceCount {
		d.warnings = append(d.warnings, fmt.Sprintf("jettyBudget %d exceeds a node's jetties (%d devices x %d): pods requesting it cannot be scheduled",
			d.p.JettyBudget, d.lim.DeviceCount, d.lim.JettiesPerDevice))
	}
	if d.p.MemoryBudget == 0 && int64(d.f.BufferSize)*int64(d.f.BufferCount) > LargeRegistrationBytes {
		d.warnings = append(d.warnings, fmt.Sprintf("each pod registers %d bytes and no memoryBudget caps it: the pod's RLIMIT_MEMLOCK must allow it",
			int64(d.f.BufferSize)*int64(d.f.BufferCount)))
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// nextPow2 is the smallest power of two >= v (v > 0), saturating at 2^62.
func nextPow2(v int64) int64 {
	if v <= 1 {
		return 1
	}
	if v > 1<<62 {
		return 1 << 62
	}
	return 1 << bits.Len64(uint64(v-1))
}

// prevPow2 is the largest power of two <= v, or 0 when v < 1.
func prevPow2(v int64) int64 {
	if v < 1 {
		return 0
	}
	return 1 << (bits.Len64(uint64(v)) - 1)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
