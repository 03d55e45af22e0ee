package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
)

// With the DRA driver the operator keeps a ResourceClaimTemplate per
// endpoint asking for its jettyBudget, replaces it when the budget changes
// and leaves a template it does not own alone.
func TestClaimTemplateUnderTheDRADriver(t *testing.T) {
	s := env.scheme
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
		q := req.Capacity.Requests[slicefacts.CapacityJetties]
		if req.DeviceClassName != slicefacts.DriverName || req.Count != 1 {
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
}

// A template of the endpoint's name that someone else owns is not touched.
// It is a conflict like a foreign ConfigMap: reported in status
// (Ready=False, ClaimTemplateConflict; the rendered flags still in status)
// and looked at again every ConflictRetry, not returned as an error, which
// retries within milliseconds, backs off to a quarter of an hour and says
// nothing in status. A settled conflict writes no status; once the template
// is gone the endpoint's own is created and it is Ready.
func TestForeignClaimTemplateIsAConflictInStatus(t *testing.T) {
	s := env.scheme
	ep := newEndpoint("ns", "ep", "g")
	foreign := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: v1alpha1.ClaimTemplateName("ep")}}
	statusWrites := 0
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(ep, foreign).WithStatusSubresource(ep).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			statusWrites++
			return c.SubResource(sub).Update(ctx, obj, opts...)
		}}).Build()
	recorder := events.NewFakeRecorder(20)
	r := &controllers.UrmaEndpointReconciler{Client: c, Scheme: s, Recorder: recorder, Driver: plan.DriverDRA}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}

	for pass := 1; pass <= 2; pass++ {
		res, err := r.Reconcile(ctx(), req)
		if err != nil || res.RequeueAfter != controllers.ConflictRetry {
			t.Fatalf("pass %d: %+v, %v; want no error and a retry after %v", pass, res, err, controllers.ConflictRetry)
		}
		got := getFake(t, c)
		ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != v1alpha1.ReasonClaimTemplateConflict ||
			!strings.Contains(ready.Message, "ResourceClaimTemplate ep-urma-jetties exists and is not managed by this endpoint") {
			t.Fatalf("pass %d: Ready %+v, want False, ClaimTemplateConflict", pass, ready)
		}
		if got.Status.FlagsHash == "" {
			t.Errorf("pass %d: the rendered flags are not in status", pass)
		}
	}
	if statusWrites != 1 {
		t.Errorf("%d status writes, want 1: a settled conflict must not write status", statusWrites)
	}
	// The event names the conflict as the condition does, not the ConfigMap's.
	conflictEvents := 0
	for len(recorder.Events) > 0 {
		e := <-recorder.Events
		if strings.Contains(e, controllers.EventConflict) {
			t.Errorf("event %q names a ConfigMap conflict; the ConfigMap is the endpoint's", e)
		}
		if strings.HasPrefix(e, "Warning "+controllers.EventClaimTemplateConflict+" ") {
			conflictEvents++
		}
	}
	if conflictEvents == 0 {
		t.Errorf("no %s warning event", controllers.EventClaimTemplateConflict)
	}
	var still resourceapi.ResourceClaimTemplate
	if err := c.Get(ctx(), client.ObjectKeyFromObject(foreign), &still); err != nil || len(still.Spec.Spec.Devices.Requests) != 0 || len(still.OwnerReferences) != 0 {
		t.Fatalf("the foreign template was changed: %+v, %v", still, err)
	}

	if err := c.Delete(ctx(), &still); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Reconcile(ctx(), req); err != nil || res.RequeueAfter != 0 {
		t.Fatalf("after the foreign template is gone: %+v, %v", res, err)
	}
	if ready := meta.FindStatusCondition(getFake(t, c).Status.Conditions, v1alpha1.ConditionReady); ready == nil || ready.Reason != v1alpha1.ReasonRendered {
		t.Errorf("Ready %+v, want Rendered", ready)
	}
	var own resourceapi.ResourceClaimTemplate
	if err := c.Get(ctx(), client.ObjectKeyFromObject(foreign), &own); err != nil || !metav1.IsControlledBy(&own, getFake(t, c)) {
		t.Errorf("the endpoint's own template: %+v, %v", own.OwnerReferences, err)
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

// TestClaimTemplateCacheBehindIsRetriedQuietly: right after the reconciler
// creates or replaces the endpoint's ResourceClaimTemplate, the next
// reconcile may run before the cache has seen it: it finds no template (and
// its create finds the name taken) or the replaced one (and its delete
// fails the UID precondition). That is the cache behind, not an error to
// log and count: the reconcile looks again shortly.
func TestClaimTemplateCacheBehindIsRetriedQuietly(t *testing.T) {
	s := env.scheme
	key := client.ObjectKey{Namespace: "ns", Name: v1alpha1.ClaimTemplateName("ep")}
	for _, c := range []struct {
		name string
		// stale is what the cache answers for the template once, given the
		// stored one after the first reconcile; nil means NotFound.
		stale func(stored *resourceapi.ResourceClaimTemplate) *resourceapi.ResourceClaimTemplate
	}{
		{name: "template not in the cache yet", stale: func(*resourceapi.ResourceClaimTemplate) *resourceapi.ResourceClaimTemplate { return nil }},
		{name: "replaced template still in the cache", stale: func(stored *resourceapi.ResourceClaimTemplate) *resourceapi.ResourceClaimTemplate {
			old := stored.DeepCopy()
			old.UID = "replaced"
			old.Spec.Spec.Devices.Requests[0].Exactly.Count = 2 // differs from what is wanted
			return old
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := fake.NewClientBuilder().WithScheme(s).WithObjects(newEndpoint("ns", "ep", "g")).
				WithStatusSubresource(&v1alpha1.UrmaEndpoint{}).Build()
			var stale func() error
			cl := interceptor.NewClient(base, interceptor.Funcs{Get: func(ctx context.Context, w client.WithWatch, k client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if tmpl, ok := obj.(*resourceapi.ResourceClaimTemplate); ok && stale != nil {
					defer func() { stale = nil }()
					var stored resourceapi.ResourceClaimTemplate
					if err := w.Get(ctx, k, &stored); err != nil {
						return err
					}
					old := c.stale(&stored)
					if old == nil {
						return apierrors.NewNotFound(resourceapi.Resource("resourceclaimtemplates"), k.Name)
					}
					old.DeepCopyInto(tmpl)
					return nil
				}
				return w.Get(ctx, k, obj, opts...)
			}, Delete: func(ctx context.Context, w client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				// The fake client ignores a UID precondition; the API server
				// refuses the delete with a conflict.
				do := &client.DeleteOptions{}
				do.ApplyOptions(opts)
				if do.Preconditions != nil && do.Preconditions.UID != nil {
					var stored resourceapi.ResourceClaimTemplate
					if err := w.Get(ctx, client.ObjectKeyFromObject(obj), &stored); err == nil && stored.UID != *do.Preconditions.UID {
						return apierrors.NewConflict(resourceapi.Resource("resourceclaimtemplates"), obj.GetName(),
							fmt.Errorf("precondition failed: UID in precondition: %s, UID in object meta: %s", *do.Preconditions.UID, stored.UID))
					}
				}
				return w.Delete(ctx, obj, opts...)
			}})
			r := &controllers.UrmaEndpointReconciler{Client: cl, Scheme: s, Recorder: events.NewFakeRecorder(20), Driver: plan.DriverDRA}
			req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}
			if _, err := r.Reconcile(ctx(), req); err != nil {
				t.Fatal(err)
			}
			var first resourceapi.ResourceClaimTemplate
			if err := base.Get(ctx(), key, &first); err != nil {
				t.Fatal(err)
			}
			stale = func() error { return nil }
			res, err := r.Reconcile(ctx(), req)
			if err != nil || res.RequeueAfter <= 0 {
				t.Errorf("reconcile with the cache behind: %+v, %v; want a quiet requeue", res, err)
			}
			var after resourceapi.ResourceClaimTemplate
			if err := base.Get(ctx(), key, &after); err != nil || after.UID != first.UID {
				t.Errorf("template replaced or gone (%v): uid %s -> %s", err, first.UID, after.UID)
			}
			if res, err := r.Reconcile(ctx(), req); err != nil || res.RequeueAfter != 0 {
				t.Errorf("reconcile with the cache caught up: %+v, %v", res, err)
			}
		})
	}
}
