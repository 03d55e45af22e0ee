// Package plugin is the DRA driver's node side, behind the kubeletplugin
// helper (k8s.io/dynamic-resource-allocation/kubeletplugin), which serves
// kubelet's gRPC API: NodePrepareResources writes a CDI spec per claim for
// the URMA devices and jetties the scheduler allocated, and
// NodeUnprepareResources removes it, both idempotent and checkpointed, so a
// restarted driver answers as before. A checkpoint that is missing or
// unusable is rebuilt from the API server and the CDI specs on disk (see
// Rebuild). It also publishes the node's
// ResourceSlices whenever the inventory changes (health included) and
// reports device health to kubelet.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/openeuler/urma-k8s/internal/dra/checkpoint"
	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	draslices "github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/node/devpath"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

// DefaultStaleClaimCheck is how often prepared claims are checked against
// the API server for ones kubelet will never unprepare.
const DefaultStaleClaimCheck = 10 * time.Minute

// DefaultHealthResend is how often the device health is re-sent to kubelet
// without a change; kubelet treats a device as Unknown after
// HealthCheckTimeout (HealthTimeoutResends times this) without a report.
const DefaultHealthResend = 10 * time.Second

// HealthTimeoutResends is how many resend intervals kubelet is told to keep
// a health report: one lost or late report does not turn devices Unknown.
const HealthTimeoutResends = 3

// MaxHealthResend is the longest resend interval accepted. The resend is
// what makes a stalled driver's devices decay to Unknown in kubelet, so 1h
// (health vouched for 3h after the driver stopped) is already far past any
// use, while a bound on the interval itself keeps the timeout's product
// from overflowing (3 × an interval above ~854015h wrapped negative, and
// kubelet took that for "use your 30s default").
const MaxHealthResend = time.Hour

// The timeout of the longest interval fits a Duration: raising
// MaxHealthResend to where it overflows fails the build here.
const _ = HealthTimeoutResends * MaxHealthResend

// Config configures the plugin.
type Config struct {
	// NodeName is the node, and the name of the pool of its devices.
	NodeName string
	// DataDir holds the checkpoint (the plugin data directory).
	DataDir string
	// DevRoot is where the driver sees the host's /dev; specs name /dev/...
	DevRoot string
	// Policy is the jetty request policy published with every device.
	Policy draslices.RequestPolicy
	// HealthResend is how often health is re-sent unchanged; 0 means
	// DefaultHealthResend. At most MaxHealthResend.
	HealthResend time.Duration
	// StaleClaimCheck is how often DropStaleClaims runs in
	// CleanStaleClaims; 0 means DefaultStaleClaimCheck.
	StaleClaimCheck time.Duration
	// Liburma is which liburma the devices' containers get (the devices'
	// liburma attribute).
	Liburma draslices.Liburma
}

// ClaimGetter reads a ResourceClaim from the API server (a client's
// ResourceV1().ResourceClaims(namespace).Get); a claim that does not exist
// is an error for which apierrors.IsNotFound holds.
type ClaimGetter interface {
	GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
}

// Publisher publishes ResourceSlices (the kubeletplugin helper).
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// Plugin implements kubeletplugin.DRAPlugin over an inventory.
type Plugin struct {
	cfg   Config
	inv   *inventory.Inventory
	specs *claimspec.Writer
	log   logr.Logger
	fatal func(error)

	mu       sync.Mutex
	prepared checkpoint.Claims
	// settled is closed once prepared is known: loaded from the checkpoint
	// or rebuilt (Rebuild). Until then prepare waits, and unprepare
	// records in unpreparedEarly what the rebuild must leave out.
	settled         chan struct{}
	unpreparedEarly map[string]bool
	lastRebuildErr  error
}

var _ kubeletplugin.DRAPlugin = (*Plugin)(nil)

// New loads the checkpoint and returns the plugin; fatal is called with
// errors that retrying cannot fix (the caller stops the driver).
func New(cfg Config, inv *inventory.Inventory, specs *claimspec.Writer, log logr.Logger, fatal func(error)) (*Plugin, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("node name is empty (set NODE_NAME)")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	if cfg.HealthResend <= 0 {
		cfg.HealthResend = DefaultHealthResend
	}
	// Compared before multiplying: the product is what could overflow.
	if cfg.HealthResend > MaxHealthResend {
		return nil, fmt.Errorf("health resend interval %s is above the maximum %s", cfg.HealthResend, MaxHealthResend)
	}
	if cfg.StaleClaimCheck <= 0 {
		cfg.StaleClaimCheck = DefaultStaleClaimCheck
	}
	if specs == nil {
		return nil, errors.New("no CDI spec writer")
	}
	p := &Plugin{cfg: cfg, inv: inv, specs: specs, log: log, fatal: fatal, settled: make(chan struct{}), unpreparedEarly: map[string]bool{}}
	if err := p.loadCheckpoint(); err != nil {
		return nil, err
	}
	return p, nil
}

// HelperOptions are the kubeletplugin options the plugin must be served
// with. The helper's own serialization is off: the plugin guards its state
// itself, and with the helper's lock a prepare waiting for the first scan
// would hold up every unprepare (and every other prepare) until kubelet's
// deadline, although unprepare needs no devices.
func HelperOptions() []kubeletplugin.Option {
	return []kubeletplugin.Option{kubeletplugin.Serialize(false)}
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin. Kubelet may
// call it as soon as the helper registers, before discovery has finished
// its first scan: it waits for that scan (or ctx), because judging claims by
// the empty unscanned snapshot would refuse every claim as "no such device".
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	// Wait before taking mu, so that Unprepare is not held up meanwhile
	// (nor by the helper: see HelperOptions).
	if snap, _ := p.inv.Current(); !snap.Scanned {
		p.log.Info("waiting for the first device scan before preparing claims", "claims", len(claims))
	}
	if _, ok := p.inv.WaitScanned(ctx); !ok {
		return nil, fmt.Errorf("prepare claims: no device scan has finished yet, so there are no devices to check them against: %w", ctx.Err())
	}
	if err := p.waitSettled(ctx); err != nil {
		return nil, fmt.Errorf("prepare claims: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Read after taking mu: the newest snapshot, scanned since no later
	// snapshot is unscanned.
	snap, _ := p.inv.Current()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devs, err := p.prepare(claim, snap)
		if err != nil {
			p.log.Error(err, "claim not prepared", "claim", claim.Namespace+"/"+claim.Name, "uid", claim.UID)
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devs}
	}
	return out, nil
}

func (p *Plugin) prepare(claim *resourceapi.ResourceClaim, snap *inventory.Snapshot) ([]kubeletplugin.Device, error) {
	uid := string(claim.UID)
	saved, ok := p.prepared[uid]
	if ok && claim.Status.Allocation != nil && missingShare(claim.Status.Allocation, saved) != nil {
		// Prepared for an allocation the claim no longer holds: kubelet
		// never unprepared it (its state was wiped) and the claim was
		// allocated anew. Prepare the new allocation; the old entry is
		// not counted and is replaced below.
		p.log.Info("claim prepared before for another allocation; preparing its new one", "claim", claim.Namespace+"/"+claim.Name, "uid", uid)
		ok = false
	}
	if ok {
		// Prepared before (perhaps by an earlier process): the same answer.
		if !p.specs.Exists(uid) {
			if err := p.writeSpec(uid, saved.Devices, snap); err != nil {
				return nil, err
			}
		} else if err := p.specs.EnsureShmDir(); err != nil {
			// The spec mounts it: kubelet is preparing the claim for a
			// container about to start.
			return nil, fmt.Errorf("claim %s: %w", uid, err)
		}
		return resultOf(saved.Devices), nil
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var shares []checkpoint.Device
	inUse := p.jettiesInUse(uid)
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != slicefacts.DriverName {
			continue
		}
		share, err := p.share(claim, r, snap, inUse)
		if err != nil {
			return nil, err
		}
		if !share.AdminAccess {
			inUse[share.URMADevice] += share.Jetties
		}
		shares = append(shares, share)
	}
	if len(shares) == 0 {
		return nil, nil
	}
	if err := p.writeSpec(uid, shares, snap); err != nil {
		return nil, err
	}
	for i := range shares {
		shares[i].CDIDeviceIDs = []string{p.specs.DeviceID(uid, shareName(shares[i]))}
	}
	next := maps.Clone(p.prepared)
	next[uid] = checkpoint.Claim{Namespace: claim.Namespace, Name: claim.Name, Devices: shares}
	if err := checkpoint.Save(p.checkpointPath(), next); err != nil {
		// Without the record, Unprepare after a restart still finds the
		// spec by UID, but the jetty accounting would forget this claim:
		// refuse rather than prepare half.
		if rerr := p.specs.Remove(uid); rerr != nil {
			p.log.Error(rerr, "removing the CDI spec of a claim whose checkpoint failed", "uid", uid)
		}
		return nil, err
	}
	p.prepared = next
	p.log.Info("claim prepared", "claim", claim.Namespace+"/"+claim.Name, "uid", uid, "shares", len(shares))
	return resultOf(shares), nil
}

// share checks one allocation result against the node's devices.
func (p *Plugin) share(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, snap *inventory.Snapshot, inUse map[string]int64) (checkpoint.Device, error) {
	where := fmt.Sprintf("claim %s/%s request %s: device %s/%s", claim.Namespace, claim.Name, r.Request, r.Pool, r.Device)
	if r.Pool != p.cfg.NodeName {
		return checkpoint.Device{}, fmt.Errorf("%s: allocated from pool %q, but this node's pool is %q", where, r.Pool, p.cfg.NodeName)
	}
	d := lookupDRA(snap, r.Device)
	if d == nil {
		return checkpoint.Device{}, fmt.Errorf("%s: no such device on this node (removed since it was allocated?)", where)
	}
	// A device the last scan missed, or found without its node, is refused
	// whatever the claim tolerates and whatever its (debounced) health says:
	// the container could not get the node. Kubelet retries a refusal,
	// which succeeds if the device comes back.
	if d.Vanished || (!d.Software && d.DevNode == "") {
		_, why := d.Usable()
		return checkpoint.Device{}, fmt.Errorf("%s: device %s: %s", where, d.Name, why)
	}
	if !d.Healthy && !tolerated(r.Tolerations, draslices.UnhealthyTaint(d)) {
		return checkpoint.Device{}, fmt.Errorf("%s: device %s is unhealthy: %s", where, d.Name, d.Reason)
	}
	q, ok := r.ConsumedCapacity[slicefacts.CapacityJetties]
	if !ok {
		// An API server or scheduler without consumable capacity drops the
		// slices' capacity fields and allocates whole devices: every claim
		// ends here, and this is the one place a user sees why.
		return checkpoint.Device{}, fmt.Errorf("%s: the allocation consumed no jetties: capacity %q is missing from the result, "+
			"so the cluster allocated the device without consumable capacity (is the DRAConsumableCapacity feature gate off on the API server or the scheduler?)",
			where, slicefacts.CapacityJetties)
	}
	if q.Value() <= 0 {
		return checkpoint.Device{}, fmt.Errorf("%s: the allocation consumed no jetties (%s of capacity %q)", where, q.String(), slicefacts.CapacityJetties)
	}
	jetties := q.Value()
	// The last line of defense against over-allocation: the scheduler
	// accounts capacity, but a device that shrank or a stale allocation
	// must not push the node past its budget. It accounts as the scheduler
	// does, which does not count admin-access results: counting them would
	// refuse claims the scheduler placed beside them.
	admin := ptr.Deref(r.AdminAccess, false)
	if budget := int64(d.Budget.Available); !admin && inUse[d.Name]+jetties > budget {
		return checkpoint.Device{}, fmt.Errorf("%s: %d jetties requested, %d of %d already prepared on %s", where, jetties, inUse[d.Name], budget, d.Name)
	}
	share := checkpoint.Device{
		Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, URMADevice: d.Name, Jetties: jetties, AdminAccess: admin,
	}
	if r.ShareID != nil {
		share.ShareID = string(*r.ShareID)
	}
	return share, nil
}

// tolerated reports whether one of the tolerations tolerates the taint, by
// Kubernetes' rules (the scheduler's own): operator Equal (or empty) must
// match the value too, Exists matches any value, an empty effect any effect.
func tolerated(ts []resourceapi.DeviceToleration, taint resourceapi.DeviceTaint) bool {
	return slices.ContainsFunc(ts, func(t resourceapi.DeviceToleration) bool {
		return resourceclaim.ToleratesTaint(t, taint)
	})
}

// shareName names a share uniquely within its claim: the DRA device and
// the request (two requests may share one device).
func shareName(s checkpoint.Device) string {
	return s.Device + "." + strings.ReplaceAll(strings.Join(s.Requests, "."), "/", ".")
}

func (p *Plugin) writeSpec(uid string, shares []checkpoint.Device, snap *inventory.Snapshot) error {
	devs := make([]claimspec.Device, 0, len(shares))
	for _, s := range shares {
		d, ok := snap.Lookup(s.URMADevice)
		if !ok {
			return fmt.Errorf("claim %s: device %s is not on this node any more; cannot rewrite its CDI spec", uid, s.URMADevice)
		}
		cd := claimspec.Device{Name: shareName(s), URMADevice: d.Name, EID: d.EID, Jetties: s.Jetties, Software: d.Software}
		if !d.Software {
			for _, local := range []string{d.DevNode, snap.UMMUNode} {
				if host := devpath.ToHost(p.cfg.DevRoot, local); host != "" {
					cd.DevNodes = append(cd.DevNodes, host)
				}
			}
		}
		devs = append(devs, cd)
	}
	_, err := p.specs.Write(uid, devs)
	return err
}

func resultOf(shares []checkpoint.Device) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(shares))
	for _, s := range shares {
		d := kubeletplugin.Device{
			Requests: slices.Clone(s.Requests), PoolName: s.Pool, DeviceName: s.Device,
			CDIDeviceIDs: slices.Clone(s.CDIDeviceIDs),
		}
		if s.ShareID != "" {
			id := types.UID(s.ShareID)
			d.ShareID = &id
		}
		out = append(out, d)
	}
	return out
}

// jettiesInUse sums the prepared jetties per URMA device, but for the
// claim except (which is being prepared anew) and admin-access shares.
func (p *Plugin) jettiesInUse(except string) map[string]int64 {
	out := map[string]int64{}
	for uid, c := range p.prepared {
		if uid == except {
			continue
		}
		for _, d := range c.Devices {
			if !d.AdminAccess {
				out[d.URMADevice] += d.Jetties
			}
		}
	}
	return out
}

func lookupDRA(snap *inventory.Snapshot, draName string) *inventory.Device {
	for i := range snap.Devices {
		if draslices.DeviceName(snap.Devices[i].Name) == draName {
			return &snap.Devices[i]
		}
	}
	return nil
}

func (p *Plugin) checkpointPath() string { return filepath.Join(p.cfg.DataDir, checkpoint.FileName) }

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin. A claim that
// is not prepared is not an error: kubelet may ask twice.
// It does not wait for a rebuild: the claims it unprepares meanwhile are left
// out of the rebuilt set.
func (p *Plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = p.unprepare(c)
	}
	return out, nil
}

func (p *Plugin) unprepare(c kubeletplugin.NamespacedObject) error {
	uid := string(c.UID)
	// The spec is named by UID, so it goes even if the checkpoint never
	// heard of the claim.
	if err := p.specs.Remove(uid); err != nil {
		return err
	}
	if p.unpreparedEarly != nil {
		// Rebuilding: the claim's spec is gone now, so the rebuild will
		// not find it; recorded in case the rebuild listed the specs
		// before.
		p.unpreparedEarly[uid] = true
	}
	if _, ok := p.prepared[uid]; !ok {
		return nil
	}
	next := maps.Clone(p.prepared)
	delete(next, uid)
	if err := checkpoint.Save(p.checkpointPath(), next); err != nil {
		return err
	}
	p.prepared = next
	p.log.Info("claim unprepared", "claim", c.Namespace+"/"+c.Name, "uid", uid)
	return nil
}

// CleanStaleClaims runs DropStaleClaims now and every StaleClaimCheck until
// ctx ends. Failures are logged and retried at the next round.
// It starts once the prepared claims are known (see Rebuild).
func (p *Plugin) CleanStaleClaims(ctx context.Context, claims ClaimGetter) {
	if p.waitSettled(ctx) != nil {
		return
	}
	t := time.NewTicker(p.cfg.StaleClaimCheck)
	defer t.Stop()
	for {
		if _, err := p.DropStaleClaims(ctx, claims); err != nil && ctx.Err() == nil {
			p.log.Error(err, "checking prepared claims against the API server")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// DropStaleClaims forgets the prepared claims that kubelet will never
// unprepare because no pod can use them any more: kubelet unprepares only
// the claims it remembers, so one whose own state was wiped leaves entries
// here that would count against the jetty budget forever. A claim is stale
// when the API server says it does not exist, exists under another UID (a
// new claim of the same name), or no longer holds the allocation prepared
// here (deallocated, or allocated again: share IDs are new per allocation).
// A claim that still holds that allocation is kept whatever else, and so is
// every claim whose lookup fails otherwise. Its CDI spec goes with it.
// It returns the UIDs it dropped. Before the prepared claims are known it
// does nothing.
func (p *Plugin) DropStaleClaims(ctx context.Context, claims ClaimGetter) ([]string, error) {
	if !p.isSettled() {
		return nil, nil
	}
	p.mu.Lock()
	prepared := p.prepared
	p.mu.Unlock()
	// The API server is asked without holding mu, so that kubelet's calls
	// are not held up; p.prepared is replaced, never modified, so reading
	// this copy is safe.
	var stale []string
	var errs []error
	for uid, c := range prepared {
		why, err := p.staleness(ctx, claims, uid, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if why != "" {
			p.log.Info("dropping a prepared claim kubelet will not unprepare", "claim", c.Namespace+"/"+c.Name, "uid", uid, "reason", why)
			stale = append(stale, uid)
		}
	}
	if len(stale) == 0 {
		return nil, errors.Join(errs...)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	next := maps.Clone(p.prepared)
	var dropped []string
	for _, uid := range stale {
		// Unprepared (and perhaps prepared again for a new allocation)
		// meanwhile: not the entry that was judged.
		if c, ok := next[uid]; !ok || !sameClaim(c, prepared[uid]) {
			continue
		}
		if err := p.specs.Remove(uid); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(next, uid)
		dropped = append(dropped, uid)
	}
	if len(dropped) == 0 {
		return nil, errors.Join(errs...)
	}
	if err := checkpoint.Save(p.checkpointPath(), next); err != nil {
		return nil, errors.Join(append(errs, fmt.Errorf("drop stale claims from the checkpoint: %w", err))...)
	}
	p.prepared = next
	return dropped, errors.Join(errs...)
}

// staleness says why a prepared claim is stale, or "" if it is not.
func (p *Plugin) staleness(ctx context.Context, claims ClaimGetter, uid string, c checkpoint.Claim) (string, error) {
	claim, err := claims.GetClaim(ctx, c.Namespace, c.Name)
	switch {
	case apierrors.IsNotFound(err):
		return "the claim no longer exists", nil
	case err != nil:
		return "", fmt.Errorf("get claim %s/%s (uid %s): %w", c.Namespace, c.Name, uid, err)
	case string(claim.UID) != uid:
		return fmt.Sprintf("the claim of this name is another one now (uid %s)", claim.UID), nil
	case claim.Status.Allocation == nil:
		return "the claim is no longer allocated", nil
	}
	if d := missingShare(claim.Status.Allocation, c); d != nil {
		return fmt.Sprintf("the claim's allocation no longer holds device %s/%s for request %v", d.Pool, d.Device, d.Requests), nil
	}
	return "", nil
}

// missingShare returns a share of a prepared claim that the allocation does
// not hold, nil if it holds them all.
func missingShare(alloc *resourceapi.AllocationResult, c checkpoint.Claim) *checkpoint.Device {
	for i := range c.Devices {
		if !slices.ContainsFunc(alloc.Devices.Results, func(r resourceapi.DeviceRequestAllocationResult) bool {
			return holds(r, c.Devices[i])
		}) {
			return &c.Devices[i]
		}
	}
	return nil
}

// holds reports whether an allocation result is the one a share was
// prepared for.
func holds(r resourceapi.DeviceRequestAllocationResult, d checkpoint.Device) bool {
	share := ""
	if r.ShareID != nil {
		share = string(*r.ShareID)
	}
	return r.Driver == slicefacts.DriverName && r.Pool == d.Pool && r.Device == d.Device &&
		share == d.ShareID && slices.Contains(d.Requests, r.Request)
}

func sameClaim(a, b checkpoint.Claim) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && slices.EqualFunc(a.Devices, b.Devices, func(x, y checkpoint.Device) bool {
		return x.Pool == y.Pool && x.Device == y.Device && x.ShareID == y.ShareID && x.Jetties == y.Jetties && slices.Equal(x.Requests, y.Requests)
	})
}

// HandleError implements kubeletplugin.DRAPlugin: errors the helper meets in
// the background are logged; those that are not recoverable stop the
// driver, so that its pod restarts and says why.
func (p *Plugin) HandleError(ctx context.Context, err error, msg string) {
	// The API server stored the slices without fields of features that are
	// off: retrying cannot fix that, nor can restarting, but the admin must
	// hear which gate and what it breaks before claims start failing.
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		p.log.Error(err, droppedFieldsMessage(dropped.DisabledFeatures()), "pool", dropped.PoolName, "slice", dropped.SliceIndex)
		return
	}
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		p.log.Error(err, msg)
		return
	}
	p.log.Error(err, msg+"; stopping")
	if p.fatal != nil {
		p.fatal(fmt.Errorf("%s: %w", msg, err))
	}
}

// droppedFieldsMessage says what the features the API server does not
// serve mean for this driver.
func droppedFieldsMessage(features []string) string {
	var why []string
	for _, f := range features {
		switch f {
		case "DRAConsumableCapacity":
			why = append(why, "the API server dropped the devices' consumable capacity (allowMultipleAllocations, the jetties request policy): "+
				"the DRAConsumableCapacity feature gate is off on the API server; each device is then allocated whole to a single claim "+
				"and every claim is refused at prepare for consuming no jetties, until the gate is on (on the API server and the scheduler)")
		case "DRADeviceTaints":
			why = append(why, "the API server dropped the devices' taints: the DRADeviceTaints feature gate is off on the API server; "+
				"the scheduler then allocates unhealthy devices (prepare still refuses them)")
		}
	}
	if len(why) == 0 {
		return "the API server dropped fields of the published ResourceSlices (features off: " + strings.Join(features, ", ") + ")"
	}
	return strings.Join(why, "; ")
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: every device's
// debounced health, from the first scan on, on every change and every
// HealthResend. Before the first scan it says nothing: an empty report
// would tell kubelet that the devices its pods hold are gone.
func (p *Plugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	t := time.NewTicker(p.cfg.HealthResend)
	defer t.Stop()
	for {
		snap, changed := p.inv.Current()
		if snap.Scanned {
			report := p.healthReport(snap, time.Now())
			select {
			case <-ctx.Done():
				return nil
			case reports <- report:
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-t.C:
		}
	}
}

func (p *Plugin) healthReport(snap *inventory.Snapshot, now time.Time) kubeletplugin.DeviceHealthReport {
	r := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(snap.Devices))}
	for _, d := range snap.Devices {
		h := kubeletplugin.DeviceHealth{
			PoolName: p.cfg.NodeName, DeviceName: draslices.DeviceName(d.Name),
			Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now, HealthCheckTimeout: HealthTimeoutResends * p.cfg.HealthResend,
		}
		// A device the last scan missed too: what Prepare refuses and the
		// slices taint, kubelet hears.
		if ok, why := d.Usable(); !ok {
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, why
		}
		r.Devices = append(r.Devices, h)
	}
	return r
}

// Publish publishes the node's slices after the first scan and again on
// every inventory change, until ctx ends (which is no error, even when it
// ends a publication under way). It never publishes before the first scan:
// an empty set then would delete what a previous process published.
func (p *Plugin) Publish(ctx context.Context, pub Publisher) error {
	var last uint64
	for {
		snap, changed := p.inv.Current()
		if snap.Scanned && snap.Generation != last {
			res := draslices.Resources(p.cfg.NodeName, snap, p.cfg.Policy)
			draslices.MarkLiburma(res, p.cfg.Liburma)
			if err := pub.PublishResources(ctx, res); err != nil {
				if ctx.Err() != nil {
					// Stopped while the helper was starting its slice
					// controller: a shutdown, not a failure.
					return nil
				}
				return fmt.Errorf("publish ResourceSlices: %w", err)
			}
			last = snap.Generation
			p.log.Info("ResourceSlices updated", "devices", len(snap.Devices), "generation", snap.Generation)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
