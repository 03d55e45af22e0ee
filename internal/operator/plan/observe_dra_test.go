package plan

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/dra/dratest"
	draslices "github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// With the DRA driver, node facts come from each node's ResourceSlices,
// and the device plugin's annotations are ignored.
func TestObserveFactsFromResourceSlices(t *testing.T) {
	s := testScheme(t)
	objs := []client.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dra-node"}},
		// Annotations of a device plugin: must not count in DRA mode.
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plugin-node", Annotations: nodefacts.Facts{
			DeviceCount: 1, MaxJFSDepth: 1, MaxJFRDepth: 1, MaxJFCDepth: 1, MaxMsgSize: 1, JettiesPerDevice: 1, JettiesPerUnit: 1,
		}.Annotations()}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bad-node"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "publishing-node"}},
	}
	dev := sysfstest.DefaultDevice("udma0")
	snap := dratest.Snapshot(t, dratest.Config(0), dev)
	for _, sl := range dratest.ResourceSlices(slicefacts.DriverName, "dra-node", draslices.Resources("dra-node", snap, draslices.DefaultRequestPolicy())) {
		objs = append(objs, sl)
	}
	bad := dratest.ResourceSlices(slicefacts.DriverName, "bad-node", draslices.Resources("bad-node", snap, draslices.DefaultRequestPolicy()))[0]
	delete(bad.Spec.Devices[0].Attributes, slicefacts.AttrMaxJFSDepth)
	objs = append(objs, bad)
	// One of two slices published so far: facts not known yet, not malformed.
	half := dratest.ResourceSlices(slicefacts.DriverName, "publishing-node", draslices.Resources("publishing-node", snap, draslices.DefaultRequestPolicy()))[0]
	half.Spec.Pool.ResourceSliceCount = 2
	objs = append(objs, half)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	ep := &v1alpha1.UrmaEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ep"}}

	obs, err := Observe(context.Background(), c, ep, DriverDRA)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]Node{}
	for _, n := range obs.Input.Nodes {
		nodes[n.Name] = n
	}
	dn := nodes["dra-node"]
	if dn.Limits == nil || dn.Limits.JettiesPerDevice != 1008 || dn.Limits.MaxJFSDepth != int64(dev.Caps.MaxJFSDepth) || dn.JettiesPerUnit != 16 {
		t.Errorf("dra-node: %+v limits %+v, want the slice's facts", dn, dn.Limits)
	}
	if pn := nodes["plugin-node"]; pn.Limits != nil || pn.FactsErr != nil {
		t.Errorf("plugin-node in DRA mode: %+v, want no facts (no slices)", pn)
	}
	if pn := nodes["publishing-node"]; pn.Limits != nil || pn.FactsErr != nil {
		t.Errorf("publishing-node: %+v limits %+v, want no facts yet (its pool is incomplete)", pn, pn.Limits)
	}
	if bn := nodes["bad-node"]; bn.FactsErr == nil || !strings.Contains(bn.FactsErr.Error(), "maxJfsDepth") {
		t.Errorf("bad-node: %+v, want an error about its malformed slice", bn)
	}

	// The device plugin's mode reads the annotations as before.
	obs, err = Observe(context.Background(), c, ep, DriverDevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range obs.Input.Nodes {
		if (n.Limits != nil) != (n.Name == "plugin-node") {
			t.Errorf("device plugin mode: %s has limits %v", n.Name, n.Limits)
		}
	}
}

// testScheme knows the built-in kinds and UrmaEndpoint.
func testScheme(tb testing.TB) *runtime.Scheme {
	tb.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		tb.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		tb.Fatal(err)
	}
	return s
}

func TestParseDriver(t *testing.T) {
	for in, want := range map[string]Driver{"": DriverDevicePlugin, "devicePlugin": DriverDevicePlugin, "dra": DriverDRA} {
		if got, err := ParseDriver(in); err != nil || got != want {
			t.Errorf("ParseDriver(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseDriver("DRA"); err == nil || !strings.Contains(err.Error(), "devicePlugin or dra") {
		t.Errorf("ParseDriver(DRA) = %v", err)
	}
}
