// Package slicefacts is the DRA driver's ResourceSlice schema as others
// read it: the driver's name (also its DeviceClass's), its device
// attributes and its consumable capacity, and Facts, which reads back from a
// node's slices the node facts (package nodefacts) the device plugin writes
// as annotations. It is the contract between the DRA driver, which
// publishes the slices (internal/dra/slices), and the operator, which tunes
// against them; it imports no part of either, so the operator links nothing
// of the node's device model.
package slicefacts

import (
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

// DriverName is the DRA driver's name; it is also the domain of the
// attributes and capacity and the name of the DeviceClass.
const DriverName = "urma.openeuler.org"

// CapacityJetties is the consumable capacity: the device's jetty budget.
const CapacityJetties resourceapi.QualifiedName = "jetties"

// Attribute names (in the driver's domain, e.g. urma.openeuler.org/numaNode
// in a CEL selector or a matchAttribute constraint).
const (
	AttrDevice           resourceapi.QualifiedName = "device"    // URMA device name, e.g. udma0
	AttrDriver           resourceapi.QualifiedName = "driver"    // kernel driver, e.g. udma
	AttrTransport        resourceapi.QualifiedName = "transport" // UB, IB, IP, HNS_UB
	AttrEID              resourceapi.QualifiedName = "eid"       // lowest-index EID (URMA_EID)
	AttrEIDs             resourceapi.QualifiedName = "eids"      // EIDs, comma-separated, as many as fit
	AttrEIDCount         resourceapi.QualifiedName = "eidCount"
	AttrNUMANode         resourceapi.QualifiedName = "numaNode" // absent when unknown
	AttrBonding          resourceapi.QualifiedName = "bonding"
	AttrSoftware         resourceapi.QualifiedName = "software"
	AttrPCIVendor        resourceapi.QualifiedName = "pciVendorID" // e.g. 0x19e5
	AttrPCIDevice        resourceapi.QualifiedName = "pciDeviceID"
	AttrGUID             resourceapi.QualifiedName = "guid"
	AttrMaxJetty         resourceapi.QualifiedName = "maxJetty"
	AttrMaxJFSDepth      resourceapi.QualifiedName = "maxJfsDepth"
	AttrMaxJFRDepth      resourceapi.QualifiedName = "maxJfrDepth"
	AttrMaxJFCDepth      resourceapi.QualifiedName = "maxJfcDepth"
	AttrMaxJFSSge        resourceapi.QualifiedName = "maxJfsSge"
	AttrMaxJFRSge        resourceapi.QualifiedName = "maxJfrSge"
	AttrMaxMsgSize       resourceapi.QualifiedName = "maxMsgSize"
	AttrMaxJFSInlineSize resourceapi.QualifiedName = "maxJfsInlineSize"
	// AttrLiburma is the liburma a container given the device gets for
	// its C programs: LiburmaHost, LiburmaSoft or LiburmaNone.
	AttrLiburma resourceapi.QualifiedName = "liburma"
)

// AttrLiburma's values.
const (
	LiburmaHost = "host" // the host's liburma and providers
	LiburmaSoft = "soft" // urma-k8s's liburma over the software provider
	LiburmaNone = "none" // none: the image must carry liburma
)

// ErrPoolIncomplete says a pool of this driver has, at its newest
// generation, another number of ResourceSlices than each says the pool has:
// the driver is publishing it (a pool of more than 64 devices spans several
// slices, written one by one), and its facts are not known yet.
var ErrPoolIncomplete = errors.New("ResourceSlice pool is being published")

// Facts reads back, from a node's ResourceSlices, the facts the device
// plugin writes as node annotations, so that the operator tunes the same
// way whichever driver a node runs: over the devices that can take claims
// (untainted), their number, whether all are software devices, the
// smallest of each queue limit, the smallest jetty capacity
// (JettiesPerDevice) and the request policy's default (JettiesPerUnit:
// what one unit of urma.openeuler.org/jetty stands for). Slices of other
// drivers, and of older generations of a pool, are ignored. A device of
// this driver whose attributes are missing or malformed is an error
// naming it, as malformed annotations are. While a pool's newest generation
// is not all published, the error wraps ErrPoolIncomplete.
func Facts(slices []resourceapi.ResourceSlice) (nodefacts.Facts, error) {
	latest := map[string]int64{}
	for _, s := range slices {
		if s.Spec.Driver == DriverName && s.Spec.Pool.Generation > latest[s.Spec.Pool.Name] {
			latest[s.Spec.Pool.Name] = s.Spec.Pool.Generation
		}
	}
	seen := map[string]int64{}
	for _, s := range slices {
		if s.Spec.Driver == DriverName && s.Spec.Pool.Generation == latest[s.Spec.Pool.Name] {
			seen[s.Spec.Pool.Name]++
		}
	}
	// As DRA's allocator does (it allocates nothing from such a pool):
	// every slice of the newest generation must be there, or the devices
	// not seen yet, perhaps with smaller limits, would be missed.
	for _, s := range slices {
		if s.Spec.Driver != DriverName || s.Spec.Pool.Generation != latest[s.Spec.Pool.Name] {
			continue
		}
		if n := seen[s.Spec.Pool.Name]; n != s.Spec.Pool.ResourceSliceCount {
			return nodefacts.Facts{}, fmt.Errorf("pool %s generation %d: %d of %d ResourceSlices seen: %w",
				s.Spec.Pool.Name, s.Spec.Pool.Generation, n, s.Spec.Pool.ResourceSliceCount, ErrPoolIncomplete)
		}
	}
	var f nodefacts.Facts
	for _, s := range slices {
		if s.Spec.Driver != DriverName || s.Spec.Pool.Generation != latest[s.Spec.Pool.Name] {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if len(d.Taints) > 0 {
				continue // takes no claims: must not lower the node's limits
			}
			df, err := deviceFacts(d)
			if err != nil {
				return nodefacts.Facts{}, fmt.Errorf("ResourceSlice %s device %s: %w", s.Name, d.Name, err)
			}
			if f.DeviceCount == 0 {
				f = df
				continue
			}
			f.DeviceCount++
			f.Software = f.Software && df.Software
			f.MaxJFSDepth = min(f.MaxJFSDepth, df.MaxJFSDepth)
			f.MaxJFRDepth = min(f.MaxJFRDepth, df.MaxJFRDepth)
			f.MaxJFCDepth = min(f.MaxJFCDepth, df.MaxJFCDepth)
			f.MaxMsgSize = min(f.MaxMsgSize, df.MaxMsgSize)
			f.JettiesPerDevice = min(f.JettiesPerDevice, df.JettiesPerDevice)
			f.JettiesPerUnit = min(f.JettiesPerUnit, df.JettiesPerUnit)
		}
	}
	if err := f.Validate(); err != nil {
		return nodefacts.Facts{}, err
	}
	return f, nil
}

func deviceFacts(d *resourceapi.Device) (nodefacts.Facts, error) {
	u32 := func(name resourceapi.QualifiedName) (uint32, error) {
		a, ok := d.Attributes[name]
		if !ok || a.IntValue == nil {
			return 0, fmt.Errorf("attribute %s missing or not an int", name)
		}
		if *a.IntValue <= 0 || *a.IntValue > 1<<32-1 {
			return 0, fmt.Errorf("attribute %s = %d is out of range", name, *a.IntValue)
		}
		return uint32(*a.IntValue), nil
	}
	f := nodefacts.Facts{DeviceCount: 1}
	var err error
	if f.MaxJFSDepth, err = u32(AttrMaxJFSDepth); err != nil {
		return f, err
	}
	if f.MaxJFRDepth, err = u32(AttrMaxJFRDepth); err != nil {
		return f, err
	}
	if f.MaxJFCDepth, err = u32(AttrMaxJFCDepth); err != nil {
		return f, err
	}
	msg, ok := d.Attributes[AttrMaxMsgSize]
	if !ok || msg.IntValue == nil || *msg.IntValue <= 0 {
		return f, fmt.Errorf("attribute %s missing or not a positive int", AttrMaxMsgSize)
	}
	f.MaxMsgSize = uint64(*msg.IntValue)
	if sw, ok := d.Attributes[AttrSoftware]; ok && sw.BoolValue != nil {
		f.Software = *sw.BoolValue
	} else {
		return f, fmt.Errorf("attribute %s missing or not a bool", AttrSoftware)
	}
	c, ok := d.Capacity[CapacityJetties]
	if !ok || c.RequestPolicy == nil || c.RequestPolicy.Default == nil {
		return f, fmt.Errorf("capacity %s or its request policy missing", CapacityJetties)
	}
	jetties, unit := c.Value.Value(), c.RequestPolicy.Default.Value()
	if jetties <= 0 || jetties > 1<<32-1 || unit <= 0 || unit > jetties {
		return f, fmt.Errorf("capacity %s = %d with default %d is out of range", CapacityJetties, jetties, unit)
	}
	f.JettiesPerDevice, f.JettiesPerUnit = uint32(jetties), uint32(unit)
	return f, nil
}
