package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/openeuler/urma-k8s/internal/dra/checkpoint"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

// The checkpoint is the driver's record of the claims it prepared; when it
// is missing or unusable, the record is rebuilt from two witnesses that
// outlive it: the CDI specs on disk (the driver writes one per prepared
// claim and removes it at unprepare, so a spec says "prepared here") and
// the API server (the claim's allocation says which devices, shares and
// jetties). A claim is restored when it has both: a spec, and an allocation
// of this driver's devices on this node, reserved for a pod. A spec without
// that is a claim the driver cannot account for; it is unprepared (the
// spec removed), which running containers do not notice (the runtime reads
// a spec when it creates a container) and which kubelet's own unprepare,
// should it come, finds done. A claim allocated here without a spec was not
// prepared here: kubelet prepares it when a pod needs it, with every check.

// DefaultRebuildRetry is the first wait before RebuildUntilDone tries again;
// it doubles up to maxRebuildRetry.
const (
	DefaultRebuildRetry = time.Second
	maxRebuildRetry     = time.Minute
)

// ClaimLister lists the ResourceClaims of every namespace (a client's
// ResourceV1().ResourceClaims("").List, every page).
type ClaimLister interface {
	ListClaims(ctx context.Context) ([]resourceapi.ResourceClaim, error)
}

// loadCheckpoint restores the prepared claims from the checkpoint. A
// checkpoint that is unusable is moved aside; with it, or without one, the
// claims are known at once when no CDI spec of the driver's is on disk
// (nothing was prepared), and otherwise only once Rebuild has run.
func (p *Plugin) loadCheckpoint() error {
	path := p.checkpointPath()
	if err := checkpoint.RemoveLeftovers(path); err != nil {
		p.log.Error(err, "removing temporary files an interrupted checkpoint write left")
	}
	prepared, err := checkpoint.Load(path)
	switch {
	case err == nil:
		p.log.Info("prepared claims restored from the checkpoint", "claims", len(prepared))
		p.settle(prepared, false)
		return nil
	case errors.Is(err, fs.ErrNotExist):
		p.log.Info("no checkpoint: the prepared claims are rebuilt from the CDI specs on disk and the API server", "checkpoint", path)
	default:
		aside, moveErr := checkpoint.MoveAside(path, time.Now())
		if aside == "" {
			// Not even a rename in its directory works: neither would the
			// next Save.
			return fmt.Errorf("%w; %w", err, moveErr)
		}
		p.log.Error(err, "the checkpoint cannot be used: moved aside for inspection; the prepared claims are rebuilt from the CDI specs on disk and the API server", "movedTo", aside)
		if moveErr != nil {
			p.log.Error(moveErr, "removing checkpoints moved aside earlier")
		}
	}
	uids, err := p.specs.ClaimUIDs()
	if err != nil {
		p.log.Error(err, "listing the CDI specs of prepared claims; tried again when rebuilding")
		return nil
	}
	if len(uids) == 0 {
		p.log.Info("no CDI spec of a prepared claim on disk: no claim is prepared on this node")
		p.settle(checkpoint.Claims{}, false)
	}
	return nil
}

// settle makes prepared the known set, saved to the checkpoint when save
// is set, and lets the calls waiting for it go on. The caller holds mu or
// runs before the plugin is shared.
func (p *Plugin) settle(prepared checkpoint.Claims, save bool) {
	if save {
		if err := checkpoint.Save(p.checkpointPath(), prepared); err != nil {
			// The set is known in memory; the next prepare or unprepare
			// saves it again.
			p.log.Error(err, "saving the rebuilt checkpoint")
		}
	}
	p.prepared = prepared
	p.unpreparedEarly = nil
	close(p.settled)
}

func (p *Plugin) isSettled() bool {
	select {
	case <-p.settled:
		return true
	default:
		return false
	}
}

// waitSettled waits until the prepared claims are known, or ctx ends; the
// error then says why the rebuild has not finished.
func (p *Plugin) waitSettled(ctx context.Context) error {
	select {
	case <-p.settled:
		return nil
	default:
	}
	select {
	case <-p.settled:
		return nil
	case <-ctx.Done():
	}
	p.mu.Lock()
	last := p.lastRebuildErr
	p.mu.Unlock()
	if last == nil {
		last = errors.New("it has not finished yet")
	}
	return fmt.Errorf("the driver's checkpoint was missing or unusable and rebuilding its prepared claims from the API server and the CDI specs failed: %w: %w", last, ctx.Err())
}

// RebuildUntilDone runs Rebuild until it succeeds or ctx ends, waiting
// retry (0: DefaultRebuildRetry), then twice as long each time up to a
// minute, after each failure, which it logs.
func (p *Plugin) RebuildUntilDone(ctx context.Context, claims ClaimLister, retry time.Duration) {
	if retry <= 0 {
		retry = DefaultRebuildRetry
	}
	for {
		err := p.Rebuild(ctx, claims)
		if err == nil || ctx.Err() != nil {
			return
		}
		p.log.Error(err, "rebuilding the prepared claims; trying again", "in", retry)
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		retry = min(2*retry, maxRebuildRetry)
	}
}

// Rebuild rebuilds the prepared claims when they are not known yet (the
// checkpoint was missing or unusable); otherwise it does nothing. It waits
// for the first device scan (a claim's DRA devices are matched to URMA
// devices by it), lists the claims from the API server and the CDI specs
// on disk, restores the claims that have both, unprepares the specs it
// cannot account for, saves the checkpoint and logs what it did. When a
// list fails it changes nothing and returns the error.
func (p *Plugin) Rebuild(ctx context.Context, claims ClaimLister) error {
	if p.isSettled() {
		return nil
	}
	err := p.rebuild(ctx, claims)
	if err != nil {
		p.mu.Lock()
		p.lastRebuildErr = err
		p.mu.Unlock()
	}
	return err
}

func (p *Plugin) rebuild(ctx context.Context, claims ClaimLister) error {
	snap, ok := p.inv.WaitScanned(ctx)
	if !ok {
		return fmt.Errorf("waiting for the first device scan: %w", ctx.Err())
	}
	uids, err := p.specs.ClaimUIDs()
	if err != nil {
		return err
	}
	list, err := claims.ListClaims(ctx)
	if err != nil {
		return fmt.Errorf("list ResourceClaims: %w", err)
	}
	byUID := make(map[string]*resourceapi.ResourceClaim, len(list))
	for i := range list {
		byUID[string(list[i].UID)] = &list[i]
	}

	rebuilt := checkpoint.Claims{}
	unaccounted := map[string]string{} // UID: why
	for _, uid := range uids {
		c, ok := byUID[uid]
		if !ok {
			unaccounted[uid] = "no ResourceClaim of this UID in the API server"
			continue
		}
		claim, why := p.restore(c, snap)
		if why != "" {
			unaccounted[uid] = fmt.Sprintf("claim %s/%s: %s", c.Namespace, c.Name, why)
			continue
		}
		rebuilt[uid] = claim
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isSettled() {
		return nil // another Rebuild finished first
	}
	for uid := range p.unpreparedEarly {
		// Kubelet unprepared it since the specs were listed.
		delete(rebuilt, uid)
		delete(unaccounted, uid)
	}
	var failed []string
	for _, uid := range slices.Sorted(maps.Keys(unaccounted)) {
		if err := p.specs.Remove(uid); err != nil {
			p.log.Error(err, "cannot unprepare a claim the driver cannot account for", "uid", uid, "reason", unaccounted[uid])
			failed = append(failed, uid)
			continue
		}
		p.log.Info("unprepared a claim the driver cannot account for: its CDI spec is removed", "uid", uid, "reason", unaccounted[uid])
	}
	for _, uid := range slices.Sorted(maps.Keys(rebuilt)) {
		c := rebuilt[uid]
		p.log.Info("prepared claim restored from its CDI spec and the API server", "claim", c.Namespace+"/"+c.Name, "uid", uid, "shares", len(c.Devices))
	}
	p.log.Info("prepared claims rebuilt", "restored", len(rebuilt), "unprepared", len(unaccounted)-len(failed), "notUnprepared", len(failed))
	p.settle(rebuilt, true)
	return nil
}

// restore rebuilds the record of a claim that has a CDI spec on disk from
// its allocation, as prepare made it, or says why it cannot.
func (p *Plugin) restore(c *resourceapi.ResourceClaim, snap *inventory.Snapshot) (checkpoint.Claim, string) {
	if c.Status.Allocation == nil {
		return checkpoint.Claim{}, "not allocated"
	}
	if len(c.Status.ReservedFor) == 0 {
		return checkpoint.Claim{}, "reserved for no pod"
	}
	uid := string(c.UID)
	var shares []checkpoint.Device
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != slicefacts.DriverName {
			continue
		}
		if r.Pool != p.cfg.NodeName {
			return checkpoint.Claim{}, fmt.Sprintf("request %s: device %s/%s is in another node's pool", r.Request, r.Pool, r.Device)
		}
		q, ok := r.ConsumedCapacity[slicefacts.CapacityJetties]
		if !ok || q.Value() <= 0 {
			// Prepare refuses such a result: it was never prepared.
			return checkpoint.Claim{}, fmt.Sprintf("request %s: the allocation consumed no jetties of device %s", r.Request, r.Device)
		}
		d := lookupDRA(snap, r.Device)
		if d == nil {
			return checkpoint.Claim{}, fmt.Sprintf("request %s: device %s is not on this node", r.Request, r.Device)
		}
		share := checkpoint.Device{
			Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, URMADevice: d.Name,
			Jetties: q.Value(), AdminAccess: ptr.Deref(r.AdminAccess, false),
		}
		if r.ShareID != nil {
			share.ShareID = string(*r.ShareID)
		}
		share.CDIDeviceIDs = []string{p.specs.DeviceID(uid, shareName(share))}
		shares = append(shares, share)
	}
	if len(shares) == 0 {
		return checkpoint.Claim{}, "no device of " + slicefacts.DriverName + " in its allocation"
	}
	return checkpoint.Claim{Namespace: c.Namespace, Name: c.Name, Devices: shares}, ""
}
