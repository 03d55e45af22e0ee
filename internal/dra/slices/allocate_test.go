package slices_test

// Allocation is tested with the scheduler's own structured allocator
// (k8s.io/dynamic-resource-allocation/structured) against the slices the
// driver publishes, the way kube-scheduler's DRA plugin runs it: the
// allocated state is rebuilt from the results of earlier claims.

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/openeuler/urma-k8s/internal/dra/dratest"
	"github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

const nodeName = "node-1"

// features are those on by default at Kubernetes 1.37 that the driver's
// slices use.
var features = structured.Features{ConsumableCapacity: true, DeviceTaints: true, PrioritizedList: true}

type classLister []*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("device class %q not found", name)
}

// cluster is one node's published slices and the claims allocated so far.
type cluster struct {
	t         *testing.T
	slices    []*resourceapi.ResourceSlice
	allocated []resourceapi.AllocationResult
}

func newCluster(t *testing.T, devs ...sysfstest.Device) *cluster {
	t.Helper()
	snap := dratest.Snapshot(t, dratest.Config(0), devs...)
	res := slices.Resources(nodeName, snap, slices.DefaultRequestPolicy())
	return &cluster{t: t, slices: dratest.ResourceSlices(slicefacts.DriverName, nodeName, res)}
}

// state is what the scheduler derives from the allocated claims: shared
// devices by share ID with their consumed capacity, others by device.
func (c *cluster) state() structured.AllocatedState {
	s := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, a := range c.allocated {
		for _, r := range a.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				s.AllocatedDevices.Insert(id)
				continue
			}
			s.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			s.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	return s
}

// allocate runs the allocator for one claim and records a success; it
// returns nil when the claim does not fit.
func (c *cluster) allocate(claim *resourceapi.ResourceClaim) *resourceapi.AllocationResult {
	c.t.Helper()
	ctx := context.Background()
	alloc, err := structured.NewAllocator(ctx, features, c.state(), classLister{slices.DeviceClass()}, c.slices,
		cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		c.t.Fatalf("creating the allocator: %v", err)
	}
	results, err := alloc.Allocate(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		c.t.Fatalf("allocating %s: %v", claim.Name, err)
	}
	if len(results) == 0 {
		return nil
	}
	c.allocated = append(c.allocated, results[0])
	return &results[0]
}

var claimSeq int

// request asks for count devices of the class, each with jetties jetties
// (0: the request policy's default).
func request(name string, count, jetties int64, selectors ...string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: slicefacts.DriverName,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           count,
	}}
	if jetties > 0 {
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			slicefacts.CapacityJetties: *resource.NewQuantity(jetties, resource.DecimalSI),
		}}
	}
	for _, s := range selectors {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return r
}

func claimOf(reqs []resourceapi.DeviceRequest, constraints ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaim {
	claimSeq++
	name := fmt.Sprintf("claim-%d", claimSeq)
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs, Constraints: constraints}},
	}
}

func jettyClaim(jetties int64) *resourceapi.ResourceClaim {
	return claimOf([]resourceapi.DeviceRequest{request("jetties", 1, jetties)})
}

func consumed(t *testing.T, r resourceapi.DeviceRequestAllocationResult) int64 {
	t.Helper()
	q, ok := r.ConsumedCapacity[slicefacts.CapacityJetties]
	if !ok {
		t.Fatalf("result %+v consumed no jetties", r)
	}
	return q.Value()
}

func TestAllocateJettiesFromOneDevice(t *testing.T) {
	// udma0: max_jetty 1024, reserved 0-15: 1008 jetties.
	for _, tc := range []struct {
		name    string
		jetties int64
		fits    bool
	}{
		{"16 jetties", 16, true},
		{"100 jetties", 100, true},
		{"the whole budget", 1008, true},
		{"more than the device has", 1009, false},
		{"far more than the device has", 100000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, sysfstest.DefaultDevice("udma0"))
			res := c.allocate(jettyClaim(tc.jetties))
			if (res != nil) != tc.fits {
				t.Fatalf("allocated %v, want %v", res != nil, tc.fits)
			}
			if res == nil {
				return
			}
			r := res.Devices.Results[0]
			if r.Driver != slicefacts.DriverName || r.Pool != nodeName || r.Device != "udma0" || r.ShareID == nil {
				t.Errorf("result %+v, want a share of %s/%s/udma0", r, slicefacts.DriverName, nodeName)
			}
			if got := consumed(t, r); got != tc.jetties {
				t.Errorf("consumed %d jetties, want %d (no unit rounding)", got, tc.jetties)
			}
		})
	}
}

func TestAllocateDefaultAndRoundedRequests(t *testing.T) {
	c := newCluster(t, sysfstest.DefaultDevice("udma0"))
	res := c.allocate(jettyClaim(0))
	if res == nil || consumed(t, res.Devices.Results[0]) != slices.DefaultRequestPolicy().Default {
		t.Fatalf("a request naming no amount: %+v, want the policy default", res)
	}
	// A policy with a step rounds requests up.
	snap := dratest.Snapshot(t, dratest.Config(0), sysfstest.DefaultDevice("udma0"))
	res8 := slices.Resources(nodeName, snap, slices.RequestPolicy{Default: 8, Min: 8, Step: 8})
	c = &cluster{t: t, slices: dratest.ResourceSlices(slicefacts.DriverName, nodeName, res8)}
	if res := c.allocate(jettyClaim(10)); res == nil || consumed(t, res.Devices.Results[0]) != 16 {
		t.Fatalf("10 jetties with min 8 step 8: %+v, want 16 consumed", res)
	}
}

func TestManyClaimsShareADeviceUntilExhausted(t *testing.T) {
	c := newCluster(t, sysfstest.DefaultDevice("udma0"))
	// 1008 jetties: 10 claims of 100 fit, the 11th does not; 8 are left.
	for i := range 10 {
		if c.allocate(jettyClaim(100)) == nil {
			t.Fatalf("claim %d of 100 jetties did not fit", i+1)
		}
	}
	if res := c.allocate(jettyClaim(100)); res != nil {
		t.Fatalf("an 11th claim of 100 jetties fit into 1008: %+v", res.Devices.Results)
	}
	if c.allocate(jettyClaim(8)) == nil {
		t.Fatal("the remaining 8 jetties could not be claimed")
	}
	if c.allocate(jettyClaim(1)) != nil {
		t.Fatal("a jetty was allocated beyond the budget")
	}
	shares := sets.New[types.UID]()
	for _, a := range c.allocated {
		shares.Insert(*a.Devices.Results[0].ShareID)
	}
	if shares.Len() != 11 {
		t.Errorf("%d distinct share IDs for 11 claims", shares.Len())
	}
}

func TestClaimsSpreadOverDevices(t *testing.T) {
	c := newCluster(t, sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("udma1"))
	// 600 + 600 does not fit one device of 1008: the second lands on udma1.
	a, b := c.allocate(jettyClaim(600)), c.allocate(jettyClaim(600))
	if a == nil || b == nil {
		t.Fatal("two claims of 600 jetties did not fit two devices of 1008")
	}
	if a.Devices.Results[0].Device == b.Devices.Results[0].Device {
		t.Fatalf("both claims on %s", a.Devices.Results[0].Device)
	}
	if c.allocate(jettyClaim(600)) != nil {
		t.Fatal("a third claim of 600 fit")
	}
}

func TestNUMAAndDeviceConstraints(t *testing.T) {
	devs := []sysfstest.Device{dratest.Device("udma0", 1024, 0), dratest.Device("udma1", 1024, 1), dratest.Device("udma2", 1024, 1)}

	t.Run("selector on the NUMA node", func(t *testing.T) {
		c := newCluster(t, devs...)
		res := c.allocate(claimOf([]resourceapi.DeviceRequest{
			request("jetties", 1, 16, `device.attributes["urma.openeuler.org"].numaNode == 1`),
		}))
		if res == nil || res.Devices.Results[0].Device == "udma0" {
			t.Fatalf("NUMA 1 selector: %+v", res)
		}
	})
	t.Run("selector on the device name", func(t *testing.T) {
		c := newCluster(t, devs...)
		res := c.allocate(claimOf([]resourceapi.DeviceRequest{
			request("jetties", 1, 16, `device.attributes["urma.openeuler.org"].device == "udma2"`),
		}))
		if res == nil || res.Devices.Results[0].Device != "udma2" {
			t.Fatalf("device selector: %+v", res)
		}
	})
	t.Run("two requests on one NUMA node", func(t *testing.T) {
		c := newCluster(t, devs...)
		// Fill udma1 so that the pair must use udma2 for its second request
		// yet stay on NUMA node 1.
		numa := resourceapi.FullyQualifiedName("urma.openeuler.org/numaNode")
		distinct := resourceapi.FullyQualifiedName("urma.openeuler.org/device")
		res := c.allocate(claimOf(
			[]resourceapi.DeviceRequest{request("a", 1, 600), request("b", 1, 600)},
			resourceapi.DeviceConstraint{MatchAttribute: &numa},
			resourceapi.DeviceConstraint{DistinctAttribute: &distinct},
		))
		if res == nil {
			t.Fatal("two requests of 600 on one NUMA node did not fit (udma1 and udma2 share node 1)")
		}
		got := sets.New(res.Devices.Results[0].Device, res.Devices.Results[1].Device)
		if !got.Equal(sets.New("udma1", "udma2")) {
			t.Fatalf("devices %v, want udma1 and udma2 (NUMA node 1)", sets.List(got))
		}
	})
	t.Run("NUMA constraint that cannot hold", func(t *testing.T) {
		c := newCluster(t, devs[:2]...)
		numa := resourceapi.FullyQualifiedName("urma.openeuler.org/numaNode")
		res := c.allocate(claimOf(
			[]resourceapi.DeviceRequest{request("a", 1, 600), request("b", 1, 600)},
			resourceapi.DeviceConstraint{MatchAttribute: &numa},
		))
		if res != nil {
			t.Fatalf("1200 jetties on one NUMA node of 1008: %+v", res.Devices.Results)
		}
	})
}

func TestTaintedDevicesAreNotAllocated(t *testing.T) {
	down := sysfstest.DefaultDevice("udma0")
	down.Ports = []urma.PortState{urma.PortDown}
	c := newCluster(t, down)
	if res := c.allocate(jettyClaim(16)); res != nil {
		t.Fatalf("allocated on an unhealthy device: %+v", res.Devices.Results)
	}
	// An admin debugging the device can tolerate the taint.
	claim := jettyClaim(16)
	claim.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{
		Key: slices.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule,
	}}
	if c.allocate(claim) == nil {
		t.Fatal("a claim tolerating the unhealthy taint was refused")
	}
	small := dratest.Device("udma1", 20, 0) // 4 jetties: no room for the default of 16
	c = newCluster(t, small)
	if res := c.allocate(jettyClaim(1)); res != nil {
		t.Fatalf("allocated on a device whose budget is below the policy: %+v", res.Devices.Results)
	}
}

// An extended-resource request (urma.openeuler.org/jetty: k) becomes, in
// the claim the scheduler makes for it, one request of k devices of the
// class with no capacity: k allocations of the policy default, on k
// distinct devices (docs/dra.md says so).
func TestExtendedResourceStyleRequests(t *testing.T) {
	c := newCluster(t, sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("udma1"))
	res := c.allocate(claimOf([]resourceapi.DeviceRequest{request("container-0-request-0", 2, 0)}))
	if res == nil || len(res.Devices.Results) != 2 {
		t.Fatalf("jetty: 2 on two devices: %+v", res)
	}
	for _, r := range res.Devices.Results {
		if consumed(t, r) != slices.DefaultRequestPolicy().Default {
			t.Errorf("%s consumed %d, want the default", r.Device, consumed(t, r))
		}
	}
	if res.Devices.Results[0].Device == res.Devices.Results[1].Device {
		t.Error("one request's allocations share a device")
	}
	one := newCluster(t, sysfstest.DefaultDevice("udma0"))
	if res := one.allocate(claimOf([]resourceapi.DeviceRequest{request("container-0-request-0", 2, 0)})); res != nil {
		t.Fatalf("jetty: 2 on a node with one device: %+v (the allocator gives a request distinct devices)", res.Devices.Results)
	}
	if one.allocate(claimOf([]resourceapi.DeviceRequest{request("container-0-request-0", 1, 0)})) == nil {
		t.Fatal("jetty: 1 on a node with one device did not fit")
	}
}
