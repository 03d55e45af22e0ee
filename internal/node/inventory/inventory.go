// Package inventory holds the set of devices the plugin advertises and turns
// each discovery scan into a new, debounced version of it.
//
// A Builder applies selection, the budget rule and health debouncing to a
// scan; an Inventory publishes the resulting Snapshot to every consumer
// (ListAndWatch streams, Allocate, metrics, the node labeller, the CDI
// writer), each of which waits on a channel closed at the next change.
package inventory

import (
	"context"
	"slices"
	"sync"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Device is one advertised device.
type Device struct {
	Name string
	// Software marks a software-provider device (--soft-devices).
	Software bool
	// NUMANode is the device's NUMA node, -1 when unknown.
	NUMANode int
	// Healthy is the debounced health; Reason says why not.
	Healthy bool
	Reason  string
	// Budget is what the device offers; Budget.Units IDs are advertised.
	Budget budget.Budget
	// Info is the device's description from the last scan that saw it.
	Info urma.DeviceInfo
	// DevNode is the device node's path as the plugin sees it (under the
	// dev root), "" when missing or for software devices.
	DevNode string
	// EID is the device's lowest-index EID in text form, "" when none.
	EID string
	// Vanished reports that the last scan did not see the device; it stays
	// listed, with its debounced health, until its absence is debounced
	// too, so that a driver reload does not make the counts jump. Its node
	// is gone meanwhile: see Usable.
	Vanished bool
	// VendorID and DeviceID are the PCI ids (e.g. "0x19e5"), "" when the
	// device has none (bonding and software devices). Bonding marks a
	// bonding (aggregate) device. The DRA driver publishes them as attributes.
	VendorID, DeviceID string
	Bonding            bool
}

// ReasonNoDevNode is why a hardware device whose node the last scan did not
// find takes no new work while its health still says otherwise.
const ReasonNoDevNode = "device node missing (the device turns unhealthy if that lasts beyond the health debounce)"

// Usable reports whether new work may go to the device, and if not why:
// it is unhealthy, the last scan did not see it, or (hardware) it has no
// device node now. Whatever its health still says: the health debounce
// keeps a device Healthy for a while after it or its node disappears, and a
// container given it then would start without the node (or, with CDI, name
// a device the rewritten spec no longer has).
func (d *Device) Usable() (ok bool, why string) {
	switch {
	case d.Vanished:
		return false, ReasonVanished
	case !d.Healthy:
		return false, d.Reason
	case !d.Software && d.DevNode == "":
		return false, ReasonNoDevNode
	}
	return true, ""
}

// Snapshot is one version of the advertised set. It is immutable once
// published: consumers may keep and share it.
type Snapshot struct {
	// Devices are sorted by name.
	Devices []Device
	// JettiesPerUnit is the N of the budget rule.
	JettiesPerUnit uint32
	// UMMUNode is the path of /dev/ummu/tid under the dev root, "" if absent.
	UMMUNode string
	// Missing says what discovery is waiting for (driver not loaded, device
	// nodes absent); empty when nothing is.
	Missing []string
	// Scanned is true for every snapshot built from a discovery scan and
	// false for the initial empty one, so consumers can wait for the first
	// scan rather than act on "no devices yet" (publishing an empty set
	// would delete what a previous process published).
	Scanned bool
	// Generation increases with every published change.
	Generation uint64
}

// Lookup finds a device by name.
func (s *Snapshot) Lookup(name string) (*Device, bool) {
	i, ok := slices.BinarySearchFunc(s.Devices, name, func(d Device, n string) int {
		switch {
		case d.Name < n:
			return -1
		case d.Name > n:
			return 1
		}
		return 0
	})
	if !ok {
		return nil, false
	}
	return &s.Devices[i], true
}

// sameContent compares everything but Generation.
func sameContent(a, b *Snapshot) bool {
	if a.Scanned != b.Scanned || a.JettiesPerUnit != b.JettiesPerUnit || a.UMMUNode != b.UMMUNode ||
		!slices.Equal(a.Missing, b.Missing) || len(a.Devices) != len(b.Devices) {
		return false
	}
	for i := range a.Devices {
		if !sameDevice(&a.Devices[i], &b.Devices[i]) {
			return false
		}
	}
	return true
}

func sameDevice(a, b *Device) bool {
	return a.Name == b.Name && a.Software == b.Software && a.NUMANode == b.NUMANode &&
		a.Healthy == b.Healthy && a.Reason == b.Reason && a.Budget == b.Budget &&
		a.DevNode == b.DevNode && a.EID == b.EID && a.Vanished == b.Vanished &&
		a.VendorID == b.VendorID && a.DeviceID == b.DeviceID && a.Bonding == b.Bonding &&
		sameInfo(&a.Info, &b.Info)
}

func sameInfo(a, b *urma.DeviceInfo) bool {
	return a.Name == b.Name && a.Driver == b.Driver && a.TransportType == b.TransportType &&
		a.GUID == b.GUID && a.Caps == b.Caps && a.ReservedJetty == b.ReservedJetty &&
		slices.Equal(a.Ports, b.Ports) && slices.Equal(a.EIDs, b.EIDs)
}

// Inventory publishes snapshots. The zero value is not usable; use New.
type Inventory struct {
	mu      sync.Mutex
	snap    *Snapshot
	changed chan struct{}
}

// New returns an inventory holding an empty snapshot.
func New(jettiesPerUnit uint32) *Inventory {
	return &Inventory{
		snap:    &Snapshot{JettiesPerUnit: jettiesPerUnit},
		changed: make(chan struct{}),
	}
}

// Current returns the current snapshot and a channel closed when a newer
// one is published.
func (inv *Inventory) Current() (*Snapshot, <-chan struct{}) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.snap, inv.changed
}

// Publish replaces the snapshot if its content differs from the current
// one, stamping a new Generation, and reports whether it did.
func (inv *Inventory) Publish(s Snapshot) bool {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if sameContent(&s, inv.snap) {
		return false
	}
	s.Generation = inv.snap.Generation + 1
	inv.snap = &s
	close(inv.changed)
	inv.changed = make(chan struct{})
	return true
}

// WaitScanned blocks until a snapshot built from a scan is published and
// returns it; ok is false when ctx ended first.
func (inv *Inventory) WaitScanned(ctx context.Context) (snap *Snapshot, ok bool) {
	for {
		snap, changed := inv.Current()
		if snap.Scanned {
			return snap, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, false
		}
	}
}
