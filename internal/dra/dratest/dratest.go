// Package dratest helps tests of the DRA driver: inventory snapshots from
// fake sysfs trees (the real discovery, selection, budget and health code
// run on them) and ResourceSlice objects as the helper's controller would
// store them.
package dratest

import (
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// Config is an inventory configuration with the given host reserve, the
// device plugin's defaults otherwise and no health debounce.
func Config(hostReserve uint32) inventory.Config {
	b := budget.Default()
	b.HostReserve = hostReserve
	return inventory.Config{Budget: b}
}

// Snapshot writes devs into a fake tree, discovers them and builds one
// snapshot with cfg.
func Snapshot(t testing.TB, cfg inventory.Config, devs ...sysfstest.Device) *inventory.Snapshot {
	t.Helper()
	tree := sysfstest.New(t)
	for _, d := range devs {
		tree.Add(t, d)
	}
	return SnapshotOfTree(t, cfg, tree)
}

// SnapshotOfTree discovers the devices of a fake tree and builds one
// snapshot with cfg.
func SnapshotOfTree(t testing.TB, cfg inventory.Config, tree *sysfstest.Tree) *inventory.Snapshot {
	t.Helper()
	found, err := sysfs.Discover(tree.Options())
	if err != nil {
		t.Fatalf("discovering the fake devices: %v", err)
	}
	snap, _, _ := inventory.NewBuilder(cfg).Build(inventory.Scan{Devices: found, UMMUNode: sysfs.UMMUNode(tree.Options())}, time.Now())
	return &snap
}

// Device is sysfstest.DefaultDevice with the given max_jetty and NUMA node
// (-1: none).
func Device(name string, maxJetty uint32, numa int) sysfstest.Device {
	d := sysfstest.DefaultDevice(name)
	d.Caps.MaxJetty = maxJetty
	if numa < 0 {
		d.NUMANode = nil
	} else {
		d.NUMANode = &numa
	}
	return d
}

// ResourceSlices turns published resources into the ResourceSlice objects
// the helper's controller stores for a node.
func ResourceSlices(driver, nodeName string, res resourceslice.DriverResources) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for poolName, pool := range res.Pools {
		for i, s := range pool.Slices {
			out = append(out, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", nodeName, poolName, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:   driver,
					Pool:     resourceapi.ResourcePool{Name: poolName, Generation: pool.Generation, ResourceSliceCount: int64(len(pool.Slices))},
					NodeName: &nodeName,
					Devices:  s.Devices,
				},
			})
		}
	}
	return out
}
