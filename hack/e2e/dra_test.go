//go:build linux

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openeuler/urma-k8s/internal/node/discover"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

func TestExpectedDRADevicesAreTheAdvertisedBudgetsBeforeUnits(t *testing.T) {
	found := []discover.Device{
		// 1024 - 4 reserved = 1020: the device plugin rounds it to 63 units
		// of 16 (1008); the DRA driver publishes all 1020.
		{Name: "udma0", Advertised: true, Caps: discover.Caps{MaxJetty: 1024}, ReservedJetty: discover.Range{Min: 0, Max: 3},
			Budget: discover.Budget{Jetties: 1008, Units: 63}},
		{Name: "udma1", Advertised: true, Caps: discover.Caps{MaxJetty: 100}, ReservedJetty: discover.Range{Min: 1, Max: 0}},
		{Name: "udma2", Advertised: false, Caps: discover.Caps{MaxJetty: 1024}},
	}
	got := expectedDRADevices(found)
	if len(got) != 2 || got["udma0"] != 1020 || got["udma1"] != 100 {
		t.Errorf("expectedDRADevices = %v, want udma0 1020 and udma1 100 (no reserved range), not udma2", got)
	}
}

func slice(node, driver string, devs ...resourcev1.Device) resourcev1.ResourceSlice {
	return resourcev1.ResourceSlice{Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: &node, Devices: devs}}
}

func device(name, urmaName, eid string, jetties int64) resourcev1.Device {
	return resourcev1.Device{
		Name: name,
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			slicefacts.AttrDevice: {StringValue: &urmaName},
			slicefacts.AttrEID:    {StringValue: &eid},
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			slicefacts.CapacityJetties: {Value: *resource.NewQuantity(jetties, resource.DecimalSI)},
		},
	}
}

func TestPublishedDRADevicesReadsOnlyThisDriverOnThisNode(t *testing.T) {
	got := publishedDRADevices([]resourcev1.ResourceSlice{
		slice(nodeName, slicefacts.DriverName, device("udma0", "udma0", "eid-a", 1020)),
		slice("other-node", slicefacts.DriverName, device("udma9", "udma9", "", 5)),
		slice(nodeName, "gpu.example.com", device("gpu0", "", "", 0)),
	})
	if len(got) != 1 || got["udma0"] != (draDevice{urmaName: "udma0", eid: "eid-a", jetties: 1020}) {
		t.Errorf("publishedDRADevices = %+v, want only udma0", got)
	}
}

func TestSameDevices(t *testing.T) {
	want := map[string]int64{"udma0": 1020, "udma1": 100}
	ok := map[string]draDevice{"udma0": {urmaName: "udma0", jetties: 1020}, "udma1": {urmaName: "udma1", jetties: 100}}
	if err := sameDevices(want, ok); err != nil {
		t.Errorf("sameDevices(equal) = %v", err)
	}
	for _, tc := range []struct {
		name string
		got  map[string]draDevice
		msg  string
	}{
		{"missing", map[string]draDevice{"udma0": ok["udma0"]}, "udma1 missing"},
		{"capacity", map[string]draDevice{"udma0": {urmaName: "udma0", jetties: 1008}, "udma1": ok["udma1"]}, "udma0 has 1008 jetties, want 1020"},
		{"attribute", map[string]draDevice{"udma0": {urmaName: "soft0", jetties: 1020}, "udma1": ok["udma1"]}, `udma0 has attribute device "soft0"`},
		{"extra", map[string]draDevice{"udma0": ok["udma0"], "udma1": ok["udma1"], "soft0": {}}, "soft0 not expected"},
	} {
		if err := sameDevices(want, tc.got); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: sameDevices = %v, want %q", tc.name, err, tc.msg)
		}
	}
}

func TestClaimResult(t *testing.T) {
	pod := types.UID("pod-uid")
	good := func() *resourcev1.ResourceClaim {
		return &resourcev1.ResourceClaim{Status: resourcev1.ResourceClaimStatus{
			Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
				Results: []resourcev1.DeviceRequestAllocationResult{{Request: "jetties", Driver: slicefacts.DriverName, Pool: nodeName, Device: "udma0"}},
			}},
			ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: pod}},
		}}
	}
	if res, err := claimResult(good(), pod); err != nil || res.Device != "udma0" {
		t.Errorf("claimResult(good) = %+v, %v", res, err)
	}
	for _, tc := range []struct {
		name  string
		spoil func(*resourcev1.ResourceClaim)
		msg   string
	}{
		{"unallocated", func(c *resourcev1.ResourceClaim) { c.Status.Allocation = nil }, "not allocated"},
		{"two devices", func(c *resourcev1.ResourceClaim) {
			r := &c.Status.Allocation.Devices.Results
			*r = append(*r, (*r)[0])
		}, "allocated 2 devices"},
		{"other pool", func(c *resourcev1.ResourceClaim) { c.Status.Allocation.Devices.Results[0].Pool = "other" }, "pool other"},
		{"not reserved", func(c *resourcev1.ResourceClaim) { c.Status.ReservedFor = nil }, "not reserved for the pod"},
	} {
		c := good()
		tc.spoil(c)
		if _, err := claimResult(c, pod); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: claimResult = %v, want %q", tc.name, err, tc.msg)
		}
	}
}

func TestCtrReturnsStdoutOnly(t *testing.T) {
	bin := t.TempDir()
	ctr := filepath.Join(bin, "containerd", "ctr")
	// What containerd 2.x's ctr does on a cgroup v1 host: a warning on
	// stderr, the answer on stdout; and an error exit with its reason.
	script := "#!/bin/sh\necho 'level=warning msg=\"DEPRECATION: cgroup v1\"' >&2\n" +
		"if [ \"$5\" = fail ]; then echo 'no such image' >&2; exit 1; fi\necho e2e.local/urma-k8s/pause:e2e\n"
	if err := writeFile(ctr, []byte(script)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &run{o: options{binDir: bin}, paths: paths{containerdSock: filepath.Join(bin, "containerd.sock")}}
	out, err := r.ctr(context.Background(), "images")
	if err != nil || string(out) != "e2e.local/urma-k8s/pause:e2e\n" {
		t.Errorf("ctr images = %q, %v; want only stdout", out, err)
	}
	if _, err := r.ctr(context.Background(), "fail"); err == nil || !strings.Contains(err.Error(), "no such image") {
		t.Errorf("ctr fail = %v, want the error with ctr's stderr", err)
	}
}

func TestURMAEnv(t *testing.T) {
	env := map[string]string{"URMA_JETTY_BUDGET": "32", "PATH": "/bin", "URMA_DEVICE": "udma0", "URMA_SHM_DIR": "/var/run/urma-k8s/shm"}
	if got := urmaEnv(env); got != "URMA_DEVICE=udma0 URMA_JETTY_BUDGET=32 URMA_SHM_DIR=/var/run/urma-k8s/shm" {
		t.Errorf("urmaEnv = %q", got)
	}
}
