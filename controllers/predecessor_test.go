package controllers_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
)

// TestPredecessorsObjectAwaitsGarbageCollection: an endpoint deleted and
// created again with the same name finds the ConfigMap or
// ResourceClaimTemplate of its predecessor (controlled by the old UID) until
// the garbage collector deletes it. That is no conflict: no Warning event,
// no ConfigMapConflict/ClaimTemplateConflict ("delete or rename it"), as the
// webhook counts it as not rendered yet; the object is not touched (it is
// not the endpoint's), and the endpoint looks again shortly, not after
// ConflictRetry. Once it is gone, the endpoint's own is created.
func TestPredecessorsObjectAwaitsGarbageCollection(t *testing.T) {
	earlier := []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "UrmaEndpoint",
		Name: "ep", UID: "uid-earlier", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	labels := map[string]string{controllers.LabelManagedBy: controllers.ManagerName, v1alpha1.LabelEndpoint: "ep"}
	for _, c := range []struct {
		name   string
		driver plan.Driver
		obj    client.Object
	}{
		{name: "ConfigMap", obj: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v1alpha1.ConfigMapName("ep"),
			Labels: labels, OwnerReferences: earlier}, Data: map[string]string{v1alpha1.ConfigMapKeyHash: "old"}}},
		{name: "ResourceClaimTemplate", driver: plan.DriverDRA, obj: &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: v1alpha1.ClaimTemplateName("ep"), Labels: labels, OwnerReferences: earlier}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := newEndpoint("ns", "ep", "g")
			ep.UID = "uid-now"
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"urma-test/group": "g"},
				Annotations: hw(1024, 4096, 8192).Annotations()}}
			cl := fake.NewClientBuilder().WithScheme(env.scheme).WithObjects(ep, node, c.obj).
				WithStatusSubresource(&v1alpha1.UrmaEndpoint{}).Build()
			rec := events.NewFakeRecorder(20)
			r := &controllers.UrmaEndpointReconciler{Client: cl, APIReader: cl, Scheme: env.scheme, Recorder: rec, Driver: c.driver}
			req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}
			key := client.ObjectKeyFromObject(c.obj)
			before := c.obj.DeepCopyObject().(client.Object)
			if err := cl.Get(ctx(), key, before); err != nil {
				t.Fatal(err)
			}

			res, err := r.Reconcile(ctx(), req)
			if err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			if res.RequeueAfter <= 0 || res.RequeueAfter >= controllers.ConflictRetry {
				t.Errorf("requeue after %v, want a short retry (under %v)", res.RequeueAfter, controllers.ConflictRetry)
			}
			for len(rec.Events) > 0 {
				// (Under the DRA driver the node's facts are in slices, which
				// this test has none of: Degraded is expected.)
				if e := <-rec.Events; strings.HasPrefix(e, corev1.EventTypeWarning+" ") &&
					!strings.HasPrefix(e, corev1.EventTypeWarning+" "+controllers.EventDegraded+" ") {
					t.Errorf("event %q for an object the garbage collector is deleting", e)
				}
			}
			got := getFake(t, cl)
			if ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady); ready != nil &&
				(ready.Reason == v1alpha1.ReasonConfigMapConflict || ready.Reason == v1alpha1.ReasonClaimTemplateConflict) {
				t.Errorf("Ready %+v: a conflict for an object the garbage collector is deleting", ready)
			}
			after := c.obj.DeepCopyObject().(client.Object)
			if err := cl.Get(ctx(), key, after); err != nil {
				t.Fatal(err)
			}
			if after.GetResourceVersion() != before.GetResourceVersion() {
				t.Errorf("the earlier endpoint's %s was modified: %+v", c.name, after)
			}

			// The garbage collector deletes it: the endpoint's own follows.
			if err := cl.Delete(ctx(), after); err != nil {
				t.Fatal(err)
			}
			if res, err := r.Reconcile(ctx(), req); err != nil || res.RequeueAfter != 0 {
				t.Fatalf("after the earlier %s is gone: %+v, %v", c.name, res, err)
			}
			got = getFake(t, cl)
			if ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady); ready == nil || ready.Reason != v1alpha1.ReasonRendered {
				t.Errorf("Ready %+v, want Rendered", ready)
			}
			own := c.obj.DeepCopyObject().(client.Object)
			if err := cl.Get(ctx(), key, own); err != nil || !metav1.IsControlledBy(own, got) {
				t.Errorf("the endpoint's own %s: %+v, %v", c.name, own.GetOwnerReferences(), err)
			}
		})
	}
}
