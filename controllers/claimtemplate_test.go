package controllers_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
	"github.com/openeuler/urma-k8s/controllers/plan"
	draslices "github.com/openeuler/urma-k8s/pkg/dra/slices"
)

// With the DRA driver the operator keeps a ResourceClaimTemplate per
// endpoint asking for its jettyBudget, replaces it when the budget changes
// and leaves a template it does not own alone.
func TestClaimTemplateUnderTheDRADriver(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	ep := newEndpoint("ns", "ep", "g")
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(ep).WithStatusSubresource(ep).Build()
	r := &controllers.UrmaEndpointReconciler{Client: c, Scheme: s, Recorder: events.NewFakeRecorder(20), Driver: plan.DriverDRA}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}
	key := client.ObjectKey{Namespace: "ns", Name: v1alpha1.ClaimTemplateName("ep")}
	jetties := func() (int64, *resourceapi.ResourceClaimTemplate) {
		t.Helper()
		var tmpl resourceapi.ResourceClaimTemplate
		if err := c.Get(ctx(), key, &tmpl); err != nil {
			t.Fatalf("template: %v", err)
		}
		req := tmpl.Spec.Spec.Devices.Requests[0].Exactly
		q := req.Capacity.Requests[draslices.CapacityJetties]
		if req.DeviceClassName != draslices.DriverName || req.Count != 1 {
			t.Fatalf("template request %+v", req)
		}
		return q.Value(), &tmpl
	}

	if _, err := r.Reconcile(ctx(), req); err != nil {
		t.Fatal(err)
	}
	n, tmpl := jetties()
	if n != 8 || !metav1.IsControlledBy(tmpl, getFake(t, c)) {
		t.Fatalf("template asks for %d jetties, controlled %v; want 8, by the endpoint", n, metav1.IsControlledBy(tmpl, getFake(t, c)))
	}
	// Settled: a second pass changes nothing.
	if _, err := r.Reconcile(ctx(), req); err != nil {
		t.Fatal(err)
	}
	if _, again := jetties(); again.UID != tmpl.UID {
		t.Fatal("a settled template was replaced")
	}

	cur := getFake(t, c)
	cur.Spec.JettyBudget = 100
	if err := c.Update(ctx(), cur); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx(), req); err != nil {
		t.Fatal(err)
	}
	if n, _ := jetties(); n != 100 {
		t.Fatalf("after the budget changed: %d jetties, want 100", n)
	}

	// A template of that name someone else owns is not touched.
	other := newEndpoint("ns", "other", "g")
	foreign := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v1alpha1.ClaimTemplateName("other")}}
	c2 := fake.NewClientBuilder().WithScheme(s).WithObjects(other, foreign).WithStatusSubresource(other).Build()
	r2 := &controllers.UrmaEndpointReconciler{Client: c2, Scheme: s, Recorder: events.NewFakeRecorder(20), Driver: plan.DriverDRA}
	if _, err := r2.Reconcile(ctx(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "other"}}); err == nil {
		t.Fatal("a foreign template was not reported")
	}
	var still resourceapi.ResourceClaimTemplate
	if err := c2.Get(ctx(), client.ObjectKeyFromObject(foreign), &still); err != nil || len(still.Spec.Spec.Devices.Requests) != 0 {
		t.Fatalf("the foreign template was changed: %+v, %v", still.Spec, err)
	}
}

func getFake(t *testing.T, c client.Client) *v1alpha1.UrmaEndpoint {
	t.Helper()
	var ep v1alpha1.UrmaEndpoint
	if err := c.Get(ctx(), client.ObjectKey{Namespace: "ns", Name: "ep"}, &ep); err != nil {
		t.Fatal(err)
	}
	return &ep
}
