// Package slices describes the URMA devices the device plugin's inventory
// holds as DRA devices for ResourceSlices: one device per advertised URMA
// device, with its facts as attributes and its jetty budget as the
// consumable capacity "jetties", shared by many claims.
//
// It is pure: a snapshot in, API objects out. Publishing them (the
// kubeletplugin helper's ResourceSlice controller) is the caller's job.
package slices

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Liburma is which liburma the driver injects: the host's for UB devices,
// the software one for software devices.
type Liburma struct{ Host, Soft bool }

// MarkLiburma sets every device's liburma attribute in res: what a
// container given it gets, by the device's software attribute.
func MarkLiburma(res resourceslice.DriverResources, libs Liburma) {
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			for i := range s.Devices {
				d := &s.Devices[i]
				soft := d.Attributes[slicefacts.AttrSoftware].BoolValue
				v := slicefacts.LiburmaNone
				switch {
				case soft != nil && *soft && libs.Soft:
					v = slicefacts.LiburmaSoft
				case (soft == nil || !*soft) && libs.Host:
					v = slicefacts.LiburmaHost
				}
				d.Attributes[slicefacts.AttrLiburma] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
			}
		}
	}
}

// Taint keys. Taints have effect NoSchedule: the scheduler allocates nothing
// new on the device, and pods already using it keep running, as with the
// device plugin's Unhealthy (a flapping port must not kill workloads; an
// admin who wants eviction adds a NoExecute DeviceTaintRule).
const (
	// TaintUnhealthy marks a device failing the health rule; its value is
	// a short reason code (see ReasonCode).
	TaintUnhealthy = slicefacts.DriverName + "/unhealthy"
	// TaintNoBudget marks a device whose jetty budget cannot satisfy the
	// request policy (not even one minimum request fits).
	TaintNoBudget = slicefacts.DriverName + "/no-budget"
)

// maxDevicesPerSlice is the API's limit for slices whose devices carry
// taints (ResourceSliceMaxDevicesWithAdvancedFeatures); any device may be
// tainted at any time, so every slice keeps to it.
const maxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// maxStringAttr is the API's limit for a string attribute value.
const maxStringAttr = resourceapi.DeviceAttributeMaxValueLength

// RequestPolicy is how claims consume "jetties": a request that names no
// amount gets Default (an extended-resource request of k units gets k
// allocations of Default, so Default should equal the device plugin's
// jetties per unit); a request is rounded up to Min + n*Step.
type RequestPolicy struct {
	Default int64
	Min     int64
	Step    int64
}

// DefaultRequestPolicy matches the device plugin's default unit of 16
// jetties, with any amount from one jetty up.
func DefaultRequestPolicy() RequestPolicy { return RequestPolicy{Default: 16, Min: 1, Step: 1} }

// Validate rejects a policy no device could offer.
func (p RequestPolicy) Validate() error {
	var errs []error
	if p.Min < 1 {
		errs = append(errs, fmt.Errorf("jetty request minimum %d: must be at least 1", p.Min))
	}
	if p.Step < 1 {
		errs = append(errs, fmt.Errorf("jetty request step %d: must be at least 1", p.Step))
	}
	if p.Default < p.Min {
		errs = append(errs, fmt.Errorf("jetty request default %d: below the minimum %d", p.Default, p.Min))
	} else if p.Step > 0 && (p.Default-p.Min)%p.Step != 0 {
		errs = append(errs, fmt.Errorf("jetty request default %d: not minimum %d plus a multiple of step %d", p.Default, p.Min, p.Step))
	}
	return errors.Join(errs...)
}

// fits reports whether a device with capacity jetties can carry the policy:
// the API requires min+step and default within the capacity.
func (p RequestPolicy) fits(capacity int64) bool {
	return p.Min+p.Step <= capacity && p.Default <= capacity
}

// Device turns one inventory device into a DRA device. Its name is
// DeviceName(d.Name). Unhealthy devices, devices the last scan did not find
// and devices without room for one default request are tainted
// (NoSchedule) rather than left out, so that
// the claims already allocated on them stay consistent and the reason is
// visible in the slice.
func Device(d *inventory.Device, policy RequestPolicy) resourceapi.Device {
	capacity := int64(d.Budget.Available)
	out := resourceapi.Device{
		Name:                     DeviceName(d.Name),
		Attributes:               attributes(d),
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			slicefacts.CapacityJetties: {Value: *resource.NewQuantity(capacity, resource.DecimalSI)},
		},
	}
	if policy.fits(capacity) {
		c := out.Capacity[slicefacts.CapacityJetties]
		c.RequestPolicy = &resourceapi.CapacityRequestPolicy{
			Default: resource.NewQuantity(policy.Default, resource.DecimalSI),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{
				Min:  resource.NewQuantity(policy.Min, resource.DecimalSI),
				Step: resource.NewQuantity(policy.Step, resource.DecimalSI),
			},
		}
		out.Capacity[slicefacts.CapacityJetties] = c
	} else {
		out.Taints = append(out.Taints, resourceapi.DeviceTaint{
			Key:    TaintNoBudget,
			Value:  fmt.Sprintf("jetties-%d", capacity),
			Effect: resourceapi.DeviceTaintEffectNoSchedule,
		})
	}
	if ok, _ := d.Usable(); !ok {
		out.Taints = append(out.Taints, UnhealthyTaint(d))
	}
	return out
}

// UnhealthyTaint is the taint an unusable device carries in the slices;
// Prepare checks a claim's tolerations against this same taint.
func UnhealthyTaint(d *inventory.Device) resourceapi.DeviceTaint {
	return resourceapi.DeviceTaint{
		Key:    TaintUnhealthy,
		Value:  ReasonCode(d),
		Effect: resourceapi.DeviceTaintEffectNoSchedule,
	}
}

func attributes(d *inventory.Device) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	num := func(n int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: ptr.To(n)} }
	flag := func(b bool) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{BoolValue: ptr.To(b)} }
	info := &d.Info
	caps := &info.Caps
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		slicefacts.AttrDevice:           str(d.Name),
		slicefacts.AttrDriver:           str(info.Driver),
		slicefacts.AttrTransport:        str(info.TransportType.String()),
		slicefacts.AttrEIDCount:         num(int64(len(info.EIDs))),
		slicefacts.AttrBonding:          flag(d.Bonding),
		slicefacts.AttrSoftware:         flag(d.Software),
		slicefacts.AttrMaxJetty:         num(int64(caps.MaxJetty)),
		slicefacts.AttrMaxJFSDepth:      num(int64(caps.MaxJFSDepth)),
		slicefacts.AttrMaxJFRDepth:      num(int64(caps.MaxJFRDepth)),
		slicefacts.AttrMaxJFCDepth:      num(int64(caps.MaxJFCDepth)),
		slicefacts.AttrMaxJFSSge:        num(int64(caps.MaxJFSSge)),
		slicefacts.AttrMaxJFRSge:        num(int64(caps.MaxJFRSge)),
		slicefacts.AttrMaxJFSInlineSize: num(int64(caps.MaxJFSInlineSize)),
		// A uint64 beyond int64 cannot be an attribute; no device's
		// message limit is near 8 EiB, so saturate rather than wrap.
		slicefacts.AttrMaxMsgSize: num(int64(min(caps.MaxMsgSize, 1<<63-1))),
	}
	if d.EID != "" {
		a[slicefacts.AttrEID] = str(d.EID)
	}
	if eids := joinFitting(info.EIDs, maxStringAttr); eids != "" {
		a[slicefacts.AttrEIDs] = str(eids)
	}
	if d.NUMANode >= 0 {
		a[slicefacts.AttrNUMANode] = num(int64(d.NUMANode))
	}
	if d.VendorID != "" {
		a[slicefacts.AttrPCIVendor] = str(d.VendorID)
	}
	if d.DeviceID != "" {
		a[slicefacts.AttrPCIDevice] = str(d.DeviceID)
	}
	if info.GUID != "" { // sysfs admits only EID text or a 64-bit number
		a[slicefacts.AttrGUID] = str(info.GUID)
	}
	return a
}

// joinFitting joins the EIDs in index order, as many whole ones as fit in
// limit bytes.
func joinFitting(eids []urma.EIDEntry, limit int) string {
	sorted := slices.Clone(eids)
	slices.SortFunc(sorted, func(a, b urma.EIDEntry) int { return a.Index - b.Index })
	var b strings.Builder
	sep := ""
	for _, e := range sorted {
		text := e.EID.String()
		if b.Len()+len(sep)+len(text) > limit {
			break
		}
		b.WriteString(sep)
		b.WriteString(text)
		sep = ","
	}
	return b.String()
}

// Reason codes: taint values (label values) standing for the health rule's
// reasons. The full text is in the driver's log.
const (
	ReasonVanished     = "vanished"
	ReasonPortDown     = "port-down"
	ReasonNoDeviceNode = "no-device-node"
	ReasonNoEID        = "no-eid"
	ReasonSysfs        = "sysfs-problem"
)

// ReasonCode condenses an unhealthy device's reason into a taint value:
// the code of every cause in it, in a fixed order, joined by "_", e.g.
// "port-down_no-eid". Parts of the reason that name no known cause are
// malformed or unreadable sysfs files (ReasonSysfs).
func ReasonCode(d *inventory.Device) string {
	if d.Vanished {
		return ReasonVanished
	}
	if ok, why := d.Usable(); !ok && why == inventory.ReasonNoDevNode {
		// Still healthy: its reason is empty.
		return ReasonNoDeviceNode
	}
	found := map[string]bool{}
	for _, part := range strings.Split(d.Reason, "; ") {
		switch {
		case strings.HasPrefix(part, "no usable port"):
			found[ReasonPortDown] = true
		case strings.HasPrefix(part, "device node "):
			found[ReasonNoDeviceNode] = true
		case part == "no EID":
			found[ReasonNoEID] = true
		default:
			found[ReasonSysfs] = true
		}
	}
	var codes []string
	for _, c := range []string{ReasonPortDown, ReasonNoDeviceNode, ReasonNoEID, ReasonSysfs} {
		if found[c] {
			codes = append(codes, c)
		}
	}
	return strings.Join(codes, "_")
}

// DeviceName is the DRA device name of a URMA device: the name itself when
// it is a DNS label (udma0, soft1), else a DNS label made of it plus a hash
// of the original, so that distinct URMA names never meet
// (bonding_dev_0 -> bonding-dev-0-<8 hex>).
func DeviceName(urmaName string) string {
	if len(validation.IsDNS1123Label(urmaName)) == 0 {
		return urmaName
	}
	var b strings.Builder
	for _, r := range strings.ToLower(urmaName) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	sum := sha256.Sum256([]byte(urmaName))
	suffix := hex.EncodeToString(sum[:4])
	base := strings.Trim(b.String(), "-")
	base = strings.TrimRight(base[:min(len(base), validation.DNS1123LabelMaxLength-len(suffix)-1)], "-")
	if base == "" {
		return "dev-" + suffix
	}
	return base + "-" + suffix
}

// Resources is what the driver publishes for a node: one pool named after
// the node, its devices in slices of at most 64, in name order. A snapshot
// without devices gives a pool without slices, which removes the node's
// old slices.
func Resources(nodeName string, snap *inventory.Snapshot, policy RequestPolicy) resourceslice.DriverResources {
	var pool resourceslice.Pool
	for chunk := range slices.Chunk(snap.Devices, maxDevicesPerSlice) {
		var s resourceslice.Slice
		for i := range chunk {
			s.Devices = append(s.Devices, Device(&chunk[i], policy))
		}
		pool.Slices = append(pool.Slices, s)
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: pool}}
}

// ExtendedResourceName is the device plugin's resource; the DeviceClass maps
// it onto this driver's devices (KEP-5004), so pods that request it keep
// working when a node runs the DRA driver instead.
const ExtendedResourceName = nodefacts.ResourceName

// DeviceClass is the class every claim for URMA jetties names: all devices
// of this driver, and the extended resource mapped onto them. The chart
// installs the same object (charts/urma-k8s/files/dra/deviceclass.yaml; a
// test keeps the two equal).
func DeviceClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: slicefacts.DriverName},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{
				CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + slicefacts.DriverName + `"`},
			}},
			ExtendedResourceName: ptr.To(ExtendedResourceName),
		},
	}
}
