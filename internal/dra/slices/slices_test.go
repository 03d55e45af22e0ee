package slices_test

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/openeuler/urma-k8s/internal/dra/dratest"
	"github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/selection"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// attr returns attribute name of d through get, failing when it is
// missing or of another type.
func attr[T any](t *testing.T, d resourceapi.Device, name resourceapi.QualifiedName, get func(resourceapi.DeviceAttribute) *T) T {
	t.Helper()
	a, ok := d.Attributes[name]
	if !ok || get(a) == nil {
		t.Fatalf("device %s: attribute %s missing or of another type: %+v", d.Name, name, a)
	}
	return *get(a)
}

func str(t *testing.T, d resourceapi.Device, name resourceapi.QualifiedName) string {
	t.Helper()
	return attr(t, d, name, func(a resourceapi.DeviceAttribute) *string { return a.StringValue })
}

func num(t *testing.T, d resourceapi.Device, name resourceapi.QualifiedName) int64 {
	t.Helper()
	return attr(t, d, name, func(a resourceapi.DeviceAttribute) *int64 { return a.IntValue })
}

func flag(t *testing.T, d resourceapi.Device, name resourceapi.QualifiedName) bool {
	t.Helper()
	return attr(t, d, name, func(a resourceapi.DeviceAttribute) *bool { return a.BoolValue })
}

func only(t *testing.T, snap *inventory.Snapshot, name string) *inventory.Device {
	t.Helper()
	d, ok := snap.Lookup(name)
	if !ok {
		t.Fatalf("no device %s in the snapshot", name)
	}
	return d
}

func TestDeviceAttributes(t *testing.T) {
	dev := sysfstest.DefaultDevice("udma0")
	numa := 1
	dev.NUMANode = &numa
	dev.EIDs = []string{"0000:0000:0000:0000:0000:ffff:0a00:0001", "", "0000:0000:0000:0000:0000:ffff:0a00:0009"}
	snap := dratest.Snapshot(t, dratest.Config(0), dev)
	d := slices.Device(only(t, snap, "udma0"), slices.DefaultRequestPolicy())

	if d.Name != "udma0" {
		t.Errorf("name %q, want udma0", d.Name)
	}
	for attr, want := range map[resourceapi.QualifiedName]string{
		slicefacts.AttrDevice:    "udma0",
		slicefacts.AttrDriver:    "udma",
		slicefacts.AttrTransport: "UB",
		slicefacts.AttrEID:       "::ffff:10.0.0.1",
		slicefacts.AttrEIDs:      "::ffff:10.0.0.1,::ffff:10.0.0.9",
		slicefacts.AttrPCIVendor: "0x19e5",
		slicefacts.AttrPCIDevice: "0xa001",
		slicefacts.AttrGUID:      dev.GUID,
	} {
		if got := str(t, d, attr); got != want {
			t.Errorf("%s = %q, want %q", attr, got, want)
		}
	}
	c := dev.Caps
	for attr, want := range map[resourceapi.QualifiedName]int64{
		slicefacts.AttrNUMANode:         1,
		slicefacts.AttrEIDCount:         2,
		slicefacts.AttrMaxJetty:         int64(c.MaxJetty),
		slicefacts.AttrMaxJFSDepth:      int64(c.MaxJFSDepth),
		slicefacts.AttrMaxJFRDepth:      int64(c.MaxJFRDepth),
		slicefacts.AttrMaxJFCDepth:      int64(c.MaxJFCDepth),
		slicefacts.AttrMaxJFSSge:        int64(c.MaxJFSSge),
		slicefacts.AttrMaxJFRSge:        int64(c.MaxJFRSge),
		slicefacts.AttrMaxMsgSize:       int64(c.MaxMsgSize),
		slicefacts.AttrMaxJFSInlineSize: int64(c.MaxJFSInlineSize),
	} {
		if got := num(t, d, attr); got != want {
			t.Errorf("%s = %d, want %d", attr, got, want)
		}
	}
	if flag(t, d, slicefacts.AttrBonding) || flag(t, d, slicefacts.AttrSoftware) {
		t.Error("a plain hardware device is marked bonding or software")
	}
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Error("the device is not shareable (AllowMultipleAllocations)")
	}
	if len(d.Taints) != 0 {
		t.Errorf("a healthy device is tainted: %+v", d.Taints)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		t.Errorf("%d attributes and capacities, the API allows %d", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	}
	for name, a := range d.Attributes {
		if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
			t.Errorf("attribute %s is %d bytes long", name, len(*a.StringValue))
		}
		if errs := validation.IsCIdentifier(string(name)); len(errs) > 0 {
			t.Errorf("attribute name %q: %v", name, errs)
		}
	}
}

func TestDeviceWithoutNUMAOrPCI(t *testing.T) {
	bond := sysfstest.DefaultDevice("bonding_dev_0")
	bond.Bonding = true
	snap := dratest.Snapshot(t, dratest.Config(0), bond)
	d := slices.Device(only(t, snap, "bonding_dev_0"), slices.DefaultRequestPolicy())
	for _, attr := range []resourceapi.QualifiedName{slicefacts.AttrNUMANode, slicefacts.AttrPCIVendor, slicefacts.AttrPCIDevice} {
		if _, ok := d.Attributes[attr]; ok {
			t.Errorf("attribute %s set for a bonding device without a parent", attr)
		}
	}
	if !flag(t, d, slicefacts.AttrBonding) {
		t.Error("bonding device not marked bonding")
	}
	if str(t, d, slicefacts.AttrDevice) != "bonding_dev_0" {
		t.Error("the device attribute must keep the URMA name")
	}
}

func TestEIDsAttributeKeepsWholeEntries(t *testing.T) {
	dev := sysfstest.DefaultDevice("udma0")
	dev.EIDs = []string{
		"1111:2222:3333:4444:5555:6666:7777:8888",
		"1111:2222:3333:4444:5555:6666:7777:8889",
		"1111:2222:3333:4444:5555:6666:7777:888a",
	}
	snap := dratest.Snapshot(t, dratest.Config(0), dev)
	d := slices.Device(only(t, snap, "udma0"), slices.DefaultRequestPolicy())
	got := str(t, d, slicefacts.AttrEIDs)
	if got != "1111:2222:3333:4444:5555:6666:7777:8888" {
		t.Errorf("eids %q: want only the first EID (two do not fit 64 bytes)", got)
	}
	if num(t, d, slicefacts.AttrEIDCount) != 3 {
		t.Error("eidCount must count every EID")
	}
}

func TestJettyCapacityIsTheBudget(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxJetty    uint32
		reserved    urma.Range
		noReserved  bool
		hostReserve uint32
		want        int64
	}{
		{"reserved range", 1024, urma.Range{Min: 0, Max: 15}, false, 0, 1008},
		{"host reserve", 1024, urma.Range{Min: 0, Max: 15}, false, 8, 1000},
		// No rounding to units and no 1024-unit cap: every jetty counts.
		{"odd size", 1037, urma.Range{Min: 0, Max: 15}, false, 0, 1021},
		{"beyond the unit cap", 40000, urma.Range{Min: 0, Max: 15}, false, 0, 39984},
		{"all reserved", 16, urma.Range{Min: 0, Max: 15}, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := sysfstest.DefaultDevice("udma0")
			dev.Caps.MaxJetty, dev.Reserved, dev.NoReserved = tc.maxJetty, tc.reserved, tc.noReserved
			snap := dratest.Snapshot(t, dratest.Config(tc.hostReserve), dev)
			d := slices.Device(only(t, snap, "udma0"), slices.DefaultRequestPolicy())
			c := d.Capacity[slicefacts.CapacityJetties]
			if got := c.Value.Value(); got != tc.want {
				t.Fatalf("jetties capacity %d, want %d", got, tc.want)
			}
		})
	}
}

func TestRequestPolicy(t *testing.T) {
	snap := dratest.Snapshot(t, dratest.Config(0), sysfstest.DefaultDevice("udma0"))
	d := slices.Device(only(t, snap, "udma0"), slices.RequestPolicy{Default: 32, Min: 8, Step: 4})
	p := d.Capacity[slicefacts.CapacityJetties].RequestPolicy
	if p == nil || p.Default == nil || p.ValidRange == nil || p.ValidRange.Min == nil || p.ValidRange.Step == nil {
		t.Fatalf("request policy incomplete: %+v", p)
	}
	if p.Default.Value() != 32 || p.ValidRange.Min.Value() != 8 || p.ValidRange.Step.Value() != 4 || p.ValidRange.Max != nil {
		t.Errorf("policy default %s min %s step %s max %v, want 32, 8, 4, none", p.Default, p.ValidRange.Min, p.ValidRange.Step, p.ValidRange.Max)
	}
}

func TestRequestPolicyValidate(t *testing.T) {
	for _, ok := range []slices.RequestPolicy{slices.DefaultRequestPolicy(), {Default: 10, Min: 2, Step: 8}, {Default: 8, Min: 8, Step: 8}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for _, tc := range []struct {
		p    slices.RequestPolicy
		want string
	}{
		{slices.RequestPolicy{Default: 16, Min: 0, Step: 1}, "minimum 0"},
		{slices.RequestPolicy{Default: 16, Min: 1, Step: 0}, "step 0"},
		{slices.RequestPolicy{Default: 4, Min: 8, Step: 1}, "below the minimum"},
		{slices.RequestPolicy{Default: 17, Min: 8, Step: 4}, "multiple of step"},
		{slices.RequestPolicy{Default: 9, Min: 3, Step: 4}, "multiple of step"},
	} {
		err := tc.p.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate = %v, want an error about %q", tc.p, err, tc.want)
		}
	}
}

func taint(d resourceapi.Device, key string) (resourceapi.DeviceTaint, bool) {
	for _, tn := range d.Taints {
		if tn.Key == key {
			return tn, true
		}
	}
	return resourceapi.DeviceTaint{}, false
}

func TestTooSmallBudgetIsTaintedWithoutPolicy(t *testing.T) {
	for _, maxJetty := range []uint32{16, 17, 31} { // capacity 0, 1, 15 < default 16
		dev := sysfstest.DefaultDevice("udma0")
		dev.Caps.MaxJetty = maxJetty
		snap := dratest.Snapshot(t, dratest.Config(0), dev)
		d := slices.Device(only(t, snap, "udma0"), slices.DefaultRequestPolicy())
		if d.Capacity[slicefacts.CapacityJetties].RequestPolicy != nil {
			t.Errorf("max_jetty %d: a request policy the API would refuse", maxJetty)
		}
		tn, ok := taint(d, slices.TaintNoBudget)
		if !ok || tn.Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("max_jetty %d: taints %+v, want %s NoSchedule", maxJetty, d.Taints, slices.TaintNoBudget)
		}
	}
	// Exactly enough for the default: untainted.
	dev := sysfstest.DefaultDevice("udma0")
	dev.Caps.MaxJetty = 32
	snap := dratest.Snapshot(t, dratest.Config(0), dev)
	if d := slices.Device(only(t, snap, "udma0"), slices.DefaultRequestPolicy()); len(d.Taints) != 0 {
		t.Errorf("16 jetties with default 16: tainted %+v", d.Taints)
	}
}

func TestUnhealthyDevicesAreTaintedWithReason(t *testing.T) {
	down := sysfstest.DefaultDevice("udma1")
	down.Ports = []urma.PortState{urma.PortDown}
	noNode := sysfstest.DefaultDevice("udma2")
	noNode.NoDevNode = true
	noEID := sysfstest.DefaultDevice("udma3")
	noEID.EIDs = nil
	both := sysfstest.DefaultDevice("udma4")
	both.Ports = []urma.PortState{urma.PortDown}
	both.EIDs = nil
	tree := sysfstest.New(t)
	for _, d := range []sysfstest.Device{down, noNode, noEID, both, sysfstest.DefaultDevice("udma5")} {
		tree.Add(t, d)
	}
	tree.WriteFile(t, "udma5", "max_jfs_depth", "garbage")
	snap := dratest.SnapshotOfTree(t, dratest.Config(0), tree)
	for name, want := range map[string]string{
		"udma1": slices.ReasonPortDown,
		"udma2": slices.ReasonNoDeviceNode,
		"udma3": slices.ReasonNoEID,
		"udma4": slices.ReasonPortDown + "_" + slices.ReasonNoEID,
		"udma5": slices.ReasonSysfs,
	} {
		inv := only(t, snap, name)
		d := slices.Device(inv, slices.DefaultRequestPolicy())
		tn, ok := taint(d, slices.TaintUnhealthy)
		if !ok || tn.Value != want || tn.Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("%s (%s): taints %+v, want %s=%s NoSchedule", name, inv.Reason, d.Taints, slices.TaintUnhealthy, want)
		}
		if errs := validation.IsValidLabelValue(tn.Value); len(errs) > 0 {
			t.Errorf("%s: taint value %q: %v", name, tn.Value, errs)
		}
	}
	vanished := inventory.Device{Name: "udma9", Vanished: true, Reason: "device no longer discovered"}
	if got := slices.ReasonCode(&vanished); got != slices.ReasonVanished {
		t.Errorf("vanished device: reason code %q", got)
	}
	// A node that disappeared since the last health verdict: still Healthy
	// during the debounce, but no new claim may land on it.
	nodeGone := *only(t, snap, "udma5")
	nodeGone.Healthy, nodeGone.Reason, nodeGone.DevNode = true, "", ""
	d := slices.Device(&nodeGone, slices.DefaultRequestPolicy())
	if tn, ok := taint(d, slices.TaintUnhealthy); !ok || tn.Value != slices.ReasonNoDeviceNode {
		t.Errorf("healthy device without its node: taints %+v, want %s=%s", d.Taints, slices.TaintUnhealthy, slices.ReasonNoDeviceNode)
	}
}

func TestDeviceName(t *testing.T) {
	for _, tc := range []struct{ in, prefix string }{
		{"udma0", "udma0"},
		{"soft12", "soft12"},
		{"bonding_dev_0", "bonding-dev-0-"},
		{"UDMA0", "udma0-"},
		{"_x_", "x-"},
		{"AZ_09", "az-09-"},
		{"a" + strings.Repeat("_", 60) + "b", "a-"}, // cut at 54, dashes trimmed
		{strings.Repeat("a", 80), strings.Repeat("a", 54) + "-"},
	} {
		got := slices.DeviceName(tc.in)
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("DeviceName(%q) = %q: %v", tc.in, got, errs)
		}
		if !strings.HasPrefix(got, tc.prefix) || (tc.prefix == tc.in) != (got == tc.in) {
			t.Errorf("DeviceName(%q) = %q, want prefix %q", tc.in, got, tc.prefix)
		}
	}
	if slices.DeviceName("bonding_dev_0") == slices.DeviceName("bonding-dev-0") ||
		slices.DeviceName("a_b") == slices.DeviceName("a.b") {
		t.Error("distinct URMA names map to one DRA name")
	}
}

func TestResourcesChunksIntoSlices(t *testing.T) {
	var devs []sysfstest.Device
	for i := range 70 {
		devs = append(devs, sysfstest.DefaultDevice("udma"+string(rune('a'+i/26))+string(rune('a'+i%26))))
	}
	snap := dratest.Snapshot(t, dratest.Config(0), devs...)
	res := slices.Resources("node-1", snap, slices.DefaultRequestPolicy())
	pool, ok := res.Pools["node-1"]
	if !ok || len(res.Pools) != 1 {
		t.Fatalf("pools %v, want one named after the node", res.Pools)
	}
	if len(pool.Slices) != 2 || len(pool.Slices[0].Devices) != 64 || len(pool.Slices[1].Devices) != 6 {
		t.Fatalf("slices of %v devices, want 64 + 6", sliceSizes(pool.Slices))
	}
	if pool.Slices[0].Devices[0].Name != "udmaaa" || pool.Slices[1].Devices[5].Name != "udmacr" {
		t.Error("devices are not in name order")
	}
	empty := slices.Resources("node-1", &inventory.Snapshot{}, slices.DefaultRequestPolicy())
	if p := empty.Pools["node-1"]; len(p.Slices) != 0 {
		t.Errorf("no devices: %d slices, want none (which removes old ones)", len(p.Slices))
	}
}

func TestSelectionAppliesToSlices(t *testing.T) {
	cfg := dratest.Config(0)
	cfg.Selection = selection.Policy{Exclude: []string{"udma1"}}
	snap := dratest.Snapshot(t, cfg, sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("udma1"))
	res := slices.Resources("n", snap, slices.DefaultRequestPolicy())
	devs := res.Pools["n"].Slices[0].Devices
	if len(devs) != 1 || devs[0].Name != "udma0" {
		t.Fatalf("devices %v, want only udma0 (udma1 excluded)", devs)
	}
}

func sliceSizes(ss []resourceslice.Slice) []int {
	var n []int
	for _, s := range ss {
		n = append(n, len(s.Devices))
	}
	return n
}

func TestDeviceClass(t *testing.T) {
	dc := slices.DeviceClass()
	if dc.Name != slicefacts.DriverName || dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != "urma.openeuler.org/jetty" {
		t.Fatalf("device class %+v", dc)
	}
	if len(dc.Spec.Selectors) != 1 || !strings.Contains(dc.Spec.Selectors[0].CEL.Expression, `"urma.openeuler.org"`) {
		t.Fatalf("selectors %+v", dc.Spec.Selectors)
	}
}

// The API refuses a policy whose min + step or default exceeds the
// capacity: such a device gets no policy and the no-budget taint.
func TestPolicyMustFitTheCapacity(t *testing.T) {
	for _, tc := range []struct {
		maxJetty uint32 // capacity = maxJetty - 16 reserved
		policy   slices.RequestPolicy
		fits     bool
	}{
		{18, slices.RequestPolicy{Default: 2, Min: 1, Step: 1}, true},  // min+step == capacity
		{18, slices.RequestPolicy{Default: 2, Min: 1, Step: 2}, false}, // min+step > capacity
		{19, slices.RequestPolicy{Default: 1, Min: 1, Step: 4}, false}, // 1+4 > 3
		{20, slices.RequestPolicy{Default: 4, Min: 1, Step: 1}, true},  // default == capacity
		{20, slices.RequestPolicy{Default: 5, Min: 1, Step: 1}, false},
	} {
		dev := sysfstest.DefaultDevice("udma0")
		dev.Caps.MaxJetty = tc.maxJetty
		snap := dratest.Snapshot(t, dratest.Config(0), dev)
		d := slices.Device(only(t, snap, "udma0"), tc.policy)
		_, tainted := taint(d, slices.TaintNoBudget)
		hasPolicy := d.Capacity[slicefacts.CapacityJetties].RequestPolicy != nil
		if hasPolicy != tc.fits || tainted == tc.fits {
			t.Errorf("capacity %d, policy %+v: policy %v, no-budget taint %v; want fits=%v", tc.maxJetty-16, tc.policy, hasPolicy, tainted, tc.fits)
		}
	}
}

func TestHugeMessageSizeSaturates(t *testing.T) {
	dev := sysfstest.DefaultDevice("udma0")
	dev.Caps.MaxMsgSize = 1<<64 - 1
	snap := dratest.Snapshot(t, dratest.Config(0), dev)
	d := slices.Device(only(t, snap, "udma0"), slices.DefaultRequestPolicy())
	if got := num(t, d, slicefacts.AttrMaxMsgSize); got != 1<<63-1 {
		t.Fatalf("maxMsgSize %d, want the largest int64", got)
	}
}

func TestEIDsAttributeOrderAndEdge(t *testing.T) {
	eid := func(s string) urma.EID {
		e, err := urma.ParseEID(s)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	long, short := "1111:2222:3333:4444:5555:6666:7777:8888", "1111:2222:3333:4444::123"
	if len(long)+1+len(short) != 64 {
		t.Fatal("test EIDs must fill 64 bytes exactly")
	}
	d := inventory.Device{Name: "udma0", Healthy: true, Info: urma.DeviceInfo{EIDs: []urma.EIDEntry{
		{Index: 5, EID: eid(short)}, {Index: 2, EID: eid(long)},
	}}}
	got := str(t, slices.Device(&d, slices.DefaultRequestPolicy()), slicefacts.AttrEIDs)
	if got != long+","+short {
		t.Fatalf("eids %q, want both, in index order, filling 64 bytes", got)
	}
	// One byte more and the second no longer fits, separator included.
	d.Info.EIDs[0].EID = eid(short + "4")
	if got := str(t, slices.Device(&d, slices.DefaultRequestPolicy()), slicefacts.AttrEIDs); got != long {
		t.Fatalf("eids %q, want only %q (65 bytes do not fit)", got, long)
	}
}

// A device the last scan did not find is published until its absence is
// debounced, still healthy by the debounced verdict; it is tainted at once,
// so that the scheduler puts no new claim on a device whose node is gone
// (the driver would refuse to prepare it), while claims already on it stay
// consistent and untouched (NoSchedule).
func TestVanishedDeviceIsTainted(t *testing.T) {
	d := dratest.Snapshot(t, dratest.Config(0), sysfstest.DefaultDevice("udma0")).Devices[0]
	d.Vanished = true
	if !d.Healthy {
		t.Fatalf("fixture: want a healthy device, got %+v", d)
	}
	got := slices.Device(&d, slices.DefaultRequestPolicy())
	tn, ok := taint(got, slices.TaintUnhealthy)
	if !ok || tn.Value != slices.ReasonVanished || tn.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("vanished device: taints %+v, want %s=%s NoSchedule", got.Taints, slices.TaintUnhealthy, slices.ReasonVanished)
	}
}

// Each device says which liburma a container given it gets.
func TestMarkLiburma(t *testing.T) {
	cfg := dratest.Config(0)
	cfg.SoftDevices = 1
	snap := dratest.Snapshot(t, cfg, sysfstest.DefaultDevice("udma0"))
	for _, tc := range []struct {
		libs         slices.Liburma
		udma0, soft0 string
	}{
		{slices.Liburma{Host: true, Soft: true}, slicefacts.LiburmaHost, slicefacts.LiburmaSoft},
		{slices.Liburma{Soft: true}, slicefacts.LiburmaNone, slicefacts.LiburmaSoft},
		{slices.Liburma{Host: true}, slicefacts.LiburmaHost, slicefacts.LiburmaNone},
		{slices.Liburma{}, slicefacts.LiburmaNone, slicefacts.LiburmaNone},
	} {
		res := slices.Resources("n", snap, slices.DefaultRequestPolicy())
		slices.MarkLiburma(res, tc.libs)
		got := map[string]string{}
		for _, d := range res.Pools["n"].Slices[0].Devices {
			got[d.Name] = str(t, d, slicefacts.AttrLiburma)
		}
		if got["udma0"] != tc.udma0 || got["soft0"] != tc.soft0 || len(got) != 2 {
			t.Errorf("%+v: liburma attributes %v, want udma0 %s, soft0 %s", tc.libs, got, tc.udma0, tc.soft0)
		}
	}
}
