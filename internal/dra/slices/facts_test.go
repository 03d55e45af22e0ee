package slices_test

import (
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/openeuler/urma-k8s/internal/dra/dratest"
	"github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

func published(t *testing.T, policy slices.RequestPolicy, devs ...sysfstest.Device) []resourceapi.ResourceSlice {
	t.Helper()
	snap := dratest.Snapshot(t, dratest.Config(0), devs...)
	var out []resourceapi.ResourceSlice
	for _, s := range dratest.ResourceSlices(slicefacts.DriverName, "n", slices.Resources("n", snap, policy)) {
		out = append(out, *s)
	}
	return out
}

func TestFactsFromSlices(t *testing.T) {
	a := sysfstest.DefaultDevice("udma0")
	b := sysfstest.DefaultDevice("udma1")
	b.Caps.MaxJFSDepth, b.Caps.MaxMsgSize, b.Caps.MaxJetty = 1024, 1<<20, 512
	down := sysfstest.DefaultDevice("udma2") // unhealthy: its tiny limits must not count
	down.Ports = []urma.PortState{urma.PortDown}
	down.Caps.MaxJFRDepth = 1
	got, err := slicefacts.Facts(published(t, slices.RequestPolicy{Default: 32, Min: 1, Step: 1}, a, b, down))
	if err != nil {
		t.Fatal(err)
	}
	want := nodefacts.Facts{
		DeviceCount: 2, MaxJFSDepth: 1024, MaxJFRDepth: a.Caps.MaxJFRDepth, MaxJFCDepth: a.Caps.MaxJFCDepth,
		MaxMsgSize: 1 << 20, JettiesPerDevice: 512 - 16, JettiesPerUnit: 32,
	}
	if got != want {
		t.Fatalf("facts %+v, want %+v", got, want)
	}
}

func TestFactsOfSoftwareAndEmptyNodes(t *testing.T) {
	none, err := slicefacts.Facts(nil)
	if err != nil || none.Present() {
		t.Fatalf("no slices: %+v, %v", none, err)
	}
	cfg := dratest.Config(0)
	cfg.SoftDevices, cfg.SoftJetties = 1, 64
	snap := dratest.Snapshot(t, cfg)
	var ss []resourceapi.ResourceSlice
	for _, s := range dratest.ResourceSlices(slicefacts.DriverName, "n", slices.Resources("n", snap, slices.DefaultRequestPolicy())) {
		ss = append(ss, *s)
	}
	f, err := slicefacts.Facts(ss)
	if err != nil || !f.Software || f.DeviceCount != 1 || f.JettiesPerDevice != 64 {
		t.Fatalf("software node: %+v, %v", f, err)
	}
}

func TestFactsIgnoreOtherDriversAndOldGenerations(t *testing.T) {
	ss := published(t, slices.DefaultRequestPolicy(), sysfstest.DefaultDevice("udma0"))
	other := ss[0]
	other.Spec.Driver = "gpu.example.com"
	other.Spec.Devices = []resourceapi.Device{{Name: "gpu0"}}
	// Another driver's pool of the same name is further on: its generation
	// says nothing about which of ours is current.
	other.Spec.Pool.Generation += 5
	old := ss[0]
	old.Spec.Pool.Generation = -1
	old.Spec.Devices = []resourceapi.Device{{Name: "stale"}}
	f, err := slicefacts.Facts(append(ss, other, old))
	if err != nil || f.DeviceCount != 1 {
		t.Fatalf("facts %+v, %v; want the one current device", f, err)
	}
}

// A pool of more than 64 devices spans several slices, written one by one:
// a reader that sees only some of the newest generation's slices used to
// take their devices for all of the node's. As DRA's allocator, Facts now
// takes such a pool as not known yet.
func TestFactsOfIncompletePools(t *testing.T) {
	cfg := dratest.Config(0)
	cfg.SoftDevices, cfg.SoftJetties = 70, 64
	snap := dratest.Snapshot(t, cfg)
	var pool []resourceapi.ResourceSlice // slices of 64 and 6 devices
	for _, s := range dratest.ResourceSlices(slicefacts.DriverName, "n", slices.Resources("n", snap, slices.DefaultRequestPolicy())) {
		pool = append(pool, *s)
	}
	if len(pool) != 2 {
		t.Fatalf("%d slices for 70 devices, want 2", len(pool))
	}
	at := func(gen int64, ss ...resourceapi.ResourceSlice) []resourceapi.ResourceSlice {
		out := make([]resourceapi.ResourceSlice, 0, len(ss))
		for _, s := range ss {
			s.Spec.Pool.Generation = gen
			out = append(out, s)
		}
		return out
	}
	otherDriver := pool[0]
	otherDriver.Spec.Driver = "gpu.example.com"
	otherDriver.Spec.Pool.ResourceSliceCount = 3
	for _, tc := range []struct {
		name       string
		slices     []resourceapi.ResourceSlice
		incomplete bool
	}{
		{"all published", at(1, pool...), false},
		{"first slice only", at(1, pool[0]), true},
		{"second slice only", at(1, pool[1]), true},
		// The complete older generation is stale: the newer replaces it.
		{"newer generation partly published", append(at(1, pool...), at(2, pool[0])...), true},
		{"older generation partly left", append(at(1, pool[1]), at(2, pool...)...), false},
		{"one slice more than the count", at(1, pool[0], pool[1], pool[1]), true},
		{"another driver's pool incomplete", append(at(1, pool...), otherDriver), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := slicefacts.Facts(tc.slices)
			if tc.incomplete {
				if !errors.Is(err, slicefacts.ErrPoolIncomplete) || f.Present() {
					t.Fatalf("Facts = %+v, %v; want no facts and ErrPoolIncomplete", f, err)
				}
				return
			}
			if err != nil || f.DeviceCount != 70 {
				t.Fatalf("Facts = %+v, %v; want 70 devices", f, err)
			}
		})
	}
}

func TestFactsRejectMalformedDevices(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(*resourceapi.Device)
		want    string
	}{
		{"missing depth", func(d *resourceapi.Device) { delete(d.Attributes, slicefacts.AttrMaxJFSDepth) }, "maxJfsDepth"},
		{"negative depth", func(d *resourceapi.Device) {
			d.Attributes[slicefacts.AttrMaxJFRDepth] = resourceapi.DeviceAttribute{IntValue: ptr.To[int64](-1)}
		}, "maxJfrDepth"},
		{"string msg size", func(d *resourceapi.Device) {
			d.Attributes[slicefacts.AttrMaxMsgSize] = resourceapi.DeviceAttribute{StringValue: ptr.To("big")}
		}, "maxMsgSize"},
		{"no software flag", func(d *resourceapi.Device) { delete(d.Attributes, slicefacts.AttrSoftware) }, "software"},
		{"no policy", func(d *resourceapi.Device) {
			c := d.Capacity[slicefacts.CapacityJetties]
			c.RequestPolicy = nil
			d.Capacity[slicefacts.CapacityJetties] = c
		}, "request policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := published(t, slices.DefaultRequestPolicy(), sysfstest.DefaultDevice("udma0"))
			tc.breakIt(&ss[0].Spec.Devices[0])
			_, err := slicefacts.Facts(ss)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "udma0") {
				t.Fatalf("Facts = %v, want an error naming udma0 and %s", err, tc.want)
			}
		})
	}
}

// Each range check at its edge: the last good value passes, the next is an
// error naming the device.
func TestFactsRangeEdges(t *testing.T) {
	setInt := func(name resourceapi.QualifiedName, v int64) func(*resourceapi.Device) {
		return func(d *resourceapi.Device) { d.Attributes[name] = resourceapi.DeviceAttribute{IntValue: ptr.To(v)} }
	}
	setCap := func(jetties, unit int64) func(*resourceapi.Device) {
		return func(d *resourceapi.Device) {
			c := d.Capacity[slicefacts.CapacityJetties]
			c.Value = *resource.NewQuantity(jetties, resource.DecimalSI)
			c.RequestPolicy.Default = resource.NewQuantity(unit, resource.DecimalSI)
			d.Capacity[slicefacts.CapacityJetties] = c
		}
	}
	for _, tc := range []struct {
		name string
		set  func(*resourceapi.Device)
		ok   bool
	}{
		{"depth 1", setInt(slicefacts.AttrMaxJFSDepth, 1), true},
		{"depth 0", setInt(slicefacts.AttrMaxJFSDepth, 0), false},
		{"depth 2^32-1", setInt(slicefacts.AttrMaxJFRDepth, 1<<32-1), true},
		{"depth 2^32", setInt(slicefacts.AttrMaxJFCDepth, 1<<32), false},
		{"message size 1", setInt(slicefacts.AttrMaxMsgSize, 1), true},
		{"message size 0", setInt(slicefacts.AttrMaxMsgSize, 0), false},
		{"one jetty, unit 1", setCap(1, 1), true},
		{"no jetties", setCap(0, 1), false},
		{"2^32-1 jetties", setCap(1<<32-1, 16), true},
		{"2^32 jetties", setCap(1<<32, 16), false},
		{"unit == capacity", setCap(16, 16), true},
		{"unit > capacity", setCap(16, 17), false},
		{"unit 0", setCap(16, 0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := published(t, slices.DefaultRequestPolicy(), sysfstest.DefaultDevice("udma0"))
			tc.set(&ss[0].Spec.Devices[0])
			_, err := slicefacts.Facts(ss)
			if (err == nil) != tc.ok {
				t.Fatalf("Facts = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "udma0") {
				t.Fatalf("error %v does not name the device", err)
			}
		})
	}
}
