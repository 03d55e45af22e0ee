package chart_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/openeuler/urma-k8s/internal/dra/dratest"
	draslices "github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

const draName = releaseName + "-urma-k8s-dra-driver"

// Denials of the chart's ResourceSlice policy (templates/dra/admissionpolicy.yaml).
const (
	denyOtherNode   = "may change only ResourceSlices of that node"
	denyOtherDriver = "may change only ResourceSlices of driver " + slicefacts.DriverName
	denyNoNode      = "this request's token names none"
)

// TestDRASlicePolicyOnTheAPIServer installs the chart's DRA driver RBAC and
// ResourceSlice admission policy into a real kube-apiserver (envtest) and
// acts as the driver's ServiceAccount, impersonated with and without the
// node claim its pod-bound token carries (TestNodePolicyOnTheAPIServer shows
// real tokens carry it): the driver may create, update and delete its own
// node's slices of its own driver and nothing else; other users are not
// affected; and the helper's slice controller, publishing what the driver
// publishes, gets everything it does admitted.
func TestDRASlicePolicyOnTheAPIServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg, admin := policyServer(ctx, t, "--set", "driver=dra")
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	driverA := asServiceAccount(t, cfg, draName, "node-a")
	noNode := asServiceAccount(t, cfg, draName, "")

	// Policies take effect once the API server has loaded them: wait until
	// the driver is refused another node's slice (a dry run, so that nothing
	// is created while the policy is not yet in force).
	eventually.Succeeds(t, "the policy to refuse another node's slice", time.Minute, func() error {
		_, err := driverA.ResourceV1().ResourceSlices().Create(ctx, testSlice("probe", "node-b", slicefacts.DriverName), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return errors.New("creating a slice of node-b was allowed")
		}
		if !strings.Contains(err.Error(), denyOtherNode) {
			return fmt.Errorf("creating a slice of node-b failed otherwise: %w", err)
		}
		return nil
	})

	const (
		create = "create"
		update = "update"
		del    = "delete"
	)
	cases := []struct {
		name   string
		as     kubernetes.Interface
		op     string
		node   string // "" = allNodes
		driver string // "" = ours
		deny   string // "" = allowed
	}{
		{name: "driver creates its nodes slice", as: driverA, op: create, node: "node-a"},
		{name: "driver updates its nodes slice", as: driverA, op: update, node: "node-a"},
		{name: "driver deletes its nodes stale slice", as: driverA, op: del, node: "node-a"},
		{name: "driver creates another nodes slice", as: driverA, op: create, node: "node-b", deny: denyOtherNode},
		{name: "driver updates another nodes slice", as: driverA, op: update, node: "node-b", deny: denyOtherNode},
		{name: "driver deletes another nodes slice", as: driverA, op: del, node: "node-b", deny: denyOtherNode},
		{name: "driver creates a slice for all nodes", as: driverA, op: create, deny: denyOtherNode},
		{name: "driver deletes a slice for all nodes", as: driverA, op: del, deny: denyOtherNode},
		{name: "driver creates another drivers slice on its node", as: driverA, op: create, node: "node-a", driver: "gpu.example.com", deny: denyOtherDriver},
		{name: "driver updates another drivers slice on its node", as: driverA, op: update, node: "node-a", driver: "gpu.example.com", deny: denyOtherDriver},
		{name: "driver deletes another drivers slice on its node", as: driverA, op: del, node: "node-a", driver: "gpu.example.com", deny: denyOtherDriver},
		{name: "token without a node creates", as: noNode, op: create, node: "node-a", deny: denyNoNode},
		{name: "token without a node updates", as: noNode, op: update, node: "node-a", deny: denyNoNode},
		{name: "token without a node deletes", as: noNode, op: del, node: "node-a", deny: denyNoNode},
		{name: "admin creates any slice", as: admin, op: create, node: "node-b"},
		{name: "admin updates any slice", as: admin, op: update, node: "node-b"},
		{name: "admin deletes any slice", as: admin, op: del, node: "node-b"},
		{name: "admin creates a slice for all nodes", as: admin, op: create},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			driver := tc.driver
			if driver == "" {
				driver = slicefacts.DriverName
			}
			slice := testSlice(fmt.Sprintf("case-%d", i), tc.node, driver)
			slices := tc.as.ResourceV1().ResourceSlices()
			if tc.op != create {
				// The slice exists already, made by someone allowed to.
				if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
					t.Fatalf("admin creating %s: %v", slice.Name, err)
				}
			}
			var err error
			switch tc.op {
			case create:
				_, err = slices.Create(ctx, slice, metav1.CreateOptions{})
			case update:
				var cur *resourceapi.ResourceSlice
				if cur, err = slices.Get(ctx, slice.Name, metav1.GetOptions{}); err != nil {
					t.Fatalf("get %s: %v", slice.Name, err)
				}
				cur.Spec.Pool.Generation++
				_, err = slices.Update(ctx, cur, metav1.UpdateOptions{})
			case del:
				err = slices.Delete(ctx, slice.Name, metav1.DeleteOptions{})
			}
			switch {
			case tc.deny == "" && err != nil:
				t.Fatalf("%s refused: %v", tc.op, err)
			case tc.deny != "" && (err == nil || !strings.Contains(err.Error(), tc.deny)):
				t.Fatalf("%s: error %v, want a denial saying %q", tc.op, err, tc.deny)
			}
			// What the API server holds now says the same.
			got, err := admin.ResourceV1().ResourceSlices().Get(ctx, slice.Name, metav1.GetOptions{})
			switch {
			case tc.op == del && tc.deny == "":
				if !apierrors.IsNotFound(err) {
					t.Errorf("deleted slice %s still there (err %v)", slice.Name, err)
				}
			case tc.op == create && tc.deny != "":
				if !apierrors.IsNotFound(err) {
					t.Errorf("refused slice %s exists (err %v)", slice.Name, err)
				}
			case err != nil:
				t.Errorf("get %s: %v", slice.Name, err)
			case tc.op == update && (got.Spec.Pool.Generation == 2) != (tc.deny == ""):
				t.Errorf("slice %s at generation %d after the update (denied: %t)", slice.Name, got.Spec.Pool.Generation, tc.deny != "")
			}
		})
	}

	// The driver uses neither verb, and RBAC can no more than the policy
	// narrow them to one node: the ClusterRole does not grant them.
	t.Run("driver may not patch or delete collections", func(t *testing.T) {
		if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, testSlice("patch-target", "node-a", slicefacts.DriverName), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := driverA.ResourceV1().ResourceSlices().Patch(ctx, "patch-target", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `cannot patch resource "resourceslices"`) {
			t.Errorf("patch: error %v, want RBAC's refusal", err)
		}
		err = driverA.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `cannot deletecollection resource "resourceslices"`) {
			t.Errorf("deletecollection: error %v, want RBAC's refusal", err)
		}
	})

	t.Run("the drivers own slice controller", func(t *testing.T) {
		// A node of its own: the controller owns every slice of its node and
		// driver, and would delete the cases' slices of node-a.
		publishLikeTheDriver(ctx, t, admin, asServiceAccount(t, cfg, draName, "node-c"), "node-c")
	})
}

// testSlice is a one-device slice of a node ("" = all nodes) and driver.
func testSlice(name, node, driver string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:  driver,
			Pool:    resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "dev0"}},
		},
	}
	if node == "" {
		s.Spec.AllNodes = ptr.To(true)
	} else {
		s.Spec.NodeName = ptr.To(node)
	}
	return s
}

// publishLikeTheDriver runs the kubelet plugin helper's ResourceSlice
// controller as the driver does (node owner, the driver's own
// draslices.Resources) and walks it through creating two slices, updating
// one and deleting the stale other, and deleting the last: the policy must
// admit all of it.
func publishLikeTheDriver(ctx context.Context, t *testing.T, admin, driver kubernetes.Interface, node string) {
	var devs []sysfstest.Device
	for i := range 70 { // more than one slice holds
		devs = append(devs, sysfstest.DefaultDevice(fmt.Sprintf("udma%02d", i)))
	}
	policy := draslices.DefaultRequestPolicy()
	many := draslices.Resources(node, dratest.Snapshot(t, dratest.Config(0), devs...), policy)
	few := draslices.Resources(node, dratest.Snapshot(t, dratest.Config(0), devs[:3]...), policy)
	none := draslices.Resources(node, &inventory.Snapshot{}, policy)

	var mu sync.Mutex
	var failures []error
	ctrl, err := resourceslice.StartController(klog.NewContext(ctx, testr.New(t)), resourceslice.Options{
		DriverName: slicefacts.DriverName,
		KubeClient: driver,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node},
		Resources:  &many,
		SyncDelay:  ptr.To(100 * time.Millisecond),
		ErrorHandler: func(_ context.Context, err error, msg string) {
			// Fields of features the API server has off are not ours to judge.
			var dropped *resourceslice.DroppedFieldsError
			if errors.As(err, &dropped) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			failures = append(failures, fmt.Errorf("%s: %w", msg, err))
		},
	})
	if err != nil {
		t.Fatalf("starting the slice controller: %v", err)
	}
	defer ctrl.Stop()

	for _, step := range []struct {
		name      string
		resources resourceslice.DriverResources
		slices    int
	}{
		{"publish two slices", many, 2},
		{"shrink to one slice, deleting the stale one", few, 1},
		{"publish nothing", none, 0},
	} {
		if got := len(step.resources.Pools[node].Slices); got != step.slices {
			t.Fatalf("%s: the driver's resources have %d slices, want %d", step.name, got, step.slices)
		}
		wantDevices := devicesOf(step.resources, node)
		ctrl.Update(&step.resources)
		eventually.Succeeds(t, step.name, time.Minute, func() error {
			mu.Lock()
			refused := errors.Join(failures...)
			mu.Unlock()
			if refused != nil {
				t.Fatalf("%s: the slice controller failed: %v", step.name, refused)
			}
			list, err := admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
				FieldSelector: "spec.nodeName=" + node + ",spec.driver=" + slicefacts.DriverName,
			})
			if err != nil {
				return fmt.Errorf("listing the slices of %s: %w", node, err)
			}
			devices := 0
			for _, s := range list.Items {
				devices += len(s.Spec.Devices)
			}
			if len(list.Items) != step.slices || devices != wantDevices {
				return fmt.Errorf("%d slices with %d devices, want %d with %d", len(list.Items), devices, step.slices, wantDevices)
			}
			return nil
		})
	}
}

func devicesOf(res resourceslice.DriverResources, pool string) int {
	n := 0
	for _, s := range res.Pools[pool].Slices {
		n += len(s.Devices)
	}
	return n
}
