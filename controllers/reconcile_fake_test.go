package controllers_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
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
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

// TestInvalidSpecKeepsLastFlags drives Reconcile directly with a fake
// client, which (unlike the API server and the validating webhook) lets an
// out-of-range override through, as happens when the webhook is down.
func TestInvalidSpecKeepsLastFlags(t *testing.T) {
	ep := newEndpoint("ns", "ep", "none")
	c := fake.NewClientBuilder().WithScheme(env.scheme).WithObjects(ep).
		WithStatusSubresource(&v1alpha1.UrmaEndpoint{}).Build()
	rec := events.NewFakeRecorder(10)
	r := &controllers.UrmaEndpointReconciler{Client: c, Scheme: env.scheme, Recorder: rec}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}
	reconcile := func() {
		t.Helper()
		if _, err := r.Reconcile(context.Background(), req); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
	}
	reconcile()
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "ep-urma-flags"}, &cm); err != nil {
		t.Fatalf("first render: %v", err)
	}

	var got v1alpha1.UrmaEndpoint
	if err := c.Get(context.Background(), req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	got.Spec.Overrides = map[string]v1alpha1.FlagValue{"urma_poller_num": "100"}
	got.Generation++
	if err := c.Update(context.Background(), &got); err != nil {
		t.Fatal(err)
	}
	reconcile()
	if err := c.Get(context.Background(), req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
	if ready == nil || ready.Status != "False" || ready.Reason != v1alpha1.ReasonInvalidSpec || !strings.Contains(ready.Message, "urma_poller_num") {
		t.Errorf("Ready = %+v, want False InvalidSpec naming urma_poller_num", ready)
	}
	var after corev1.ConfigMap
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(&cm), &after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != cm.ResourceVersion || got.Status.FlagsHash != cm.Data[v1alpha1.ConfigMapKeyHash] {
		t.Errorf("invalid spec changed the flags: ConfigMap %s -> %s, status hash %s", cm.ResourceVersion, after.ResourceVersion, got.Status.FlagsHash)
	}
	found := false
	for len(rec.Events) > 0 {
		if e := <-rec.Events; strings.Contains(e, controllers.EventInvalidSpec) {
			found = true
		}
	}
	if !found {
		t.Error("no InvalidSpec event")
	}
	// Reconciling again changes nothing and repeats no event.
	rv := got.ResourceVersion
	reconcile()
	if err := c.Get(context.Background(), req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != rv || len(rec.Events) != 0 {
		t.Errorf("second reconcile wrote status (%s -> %s) or emitted %d events", rv, got.ResourceVersion, len(rec.Events))
	}
}

// TestPodNodeLosingFactsKeepsFlags: the endpoint's pod runs on a hardware
// node whose device plugin restarts and, until the driver loads, publishes
// device-count=0 (or nothing at all). The reconciler must keep the flags
// and the recorded device limits: re-tuning against the software
// provider's limits would give pods admitted meanwhile queues their device
// refuses, and dropping the annotation would lose the limits for good.
func TestPodNodeLosingFactsKeepsFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		ann  map[string]string
	}{
		{"device-count=0 while the driver loads", nodefacts.Facts{}.Annotations()},
		{"annotations gone", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := newEndpoint("ns", "ep", "g")
			ep.Spec.Profile.InflightPerConnection = 100 // deeper than the device: clamped to 64
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"urma-test/group": "g"},
				Annotations: hw(64, 4096, 8192).Annotations()}}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{v1alpha1.LabelEndpoint: "ep"}},
				Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			cl := fake.NewClientBuilder().WithScheme(env.scheme).WithObjects(ep, node, pod).
				WithStatusSubresource(&v1alpha1.UrmaEndpoint{}).Build()
			r := &controllers.UrmaEndpointReconciler{Client: cl, Scheme: env.scheme, Recorder: events.NewFakeRecorder(20)}
			req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}
			cmKey := client.ObjectKey{Namespace: "ns", Name: v1alpha1.ConfigMapName("ep")}
			if _, err := r.Reconcile(ctx(), req); err != nil {
				t.Fatal(err)
			}
			var before corev1.ConfigMap
			if err := cl.Get(ctx(), cmKey, &before); err != nil {
				t.Fatal(err)
			}
			recorded := before.Annotations[v1alpha1.AnnotationDeviceLimits]
			if recorded == "" {
				t.Fatal("limits from the node were not recorded")
			}

			if err := cl.Get(ctx(), client.ObjectKeyFromObject(node), node); err != nil {
				t.Fatal(err)
			}
			node.Annotations = c.ann
			if err := cl.Update(ctx(), node); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Reconcile(ctx(), req); err != nil {
				t.Fatal(err)
			}
			var after corev1.ConfigMap
			if err := cl.Get(ctx(), cmKey, &after); err != nil {
				t.Fatal(err)
			}
			if after.ResourceVersion != before.ResourceVersion || after.Annotations[v1alpha1.AnnotationDeviceLimits] != recorded {
				t.Errorf("ConfigMap rewritten (resourceVersion %s -> %s), device limits %q -> %q",
					before.ResourceVersion, after.ResourceVersion, recorded, after.Annotations[v1alpha1.AnnotationDeviceLimits])
			}
			var got v1alpha1.UrmaEndpoint
			if err := cl.Get(ctx(), req.NamespacedName, &got); err != nil {
				t.Fatal(err)
			}
			if got.Status.LimitsSource != v1alpha1.LimitsLastKnown || got.Status.FlagsHash != before.Data[v1alpha1.ConfigMapKeyHash] ||
				got.Status.Effective["urma_sq_size"] != "64" {
				t.Errorf("status: limitsSource %s hash %s urma_sq_size %s; want LastKnown, %s, 64",
					got.Status.LimitsSource, got.Status.FlagsHash, got.Status.Effective["urma_sq_size"], before.Data[v1alpha1.ConfigMapKeyHash])
			}
		})
	}
}

// TestConfigMapNotYetInCache: a reconcile that runs before the operator's
// cache has seen the ConfigMap the previous one created finds the name
// taken when it creates it. That ConfigMap is the endpoint's own: no
// ConfigMapConflict ("delete or rename it"), no Warning, no two-minute
// wait; it is brought up to date against the API server's copy and the
// limits that copy records. A ConfigMap that is someone else's (never in
// the cache, which only holds the operator's) is still a conflict.
func TestConfigMapNotYetInCache(t *testing.T) {
	cases := []struct {
		name string
		// apiReader: the reconciler has an uncached reader; without one
		// it reads through Client again.
		apiReader bool
		// foreign: the ConfigMap is someone else's, created beforehand.
		foreign bool
		// change runs between the two reconciles.
		change func(t *testing.T, c client.Client)
		// source is the limits source the second render reports.
		source v1alpha1.LimitsSource
	}{
		{name: "cache behind, uncached reader", apiReader: true, source: v1alpha1.LimitsFromNodes},
		{name: "cache behind, no uncached reader", source: v1alpha1.LimitsFromNodes},
		{name: "cache behind, spec changed meanwhile - updated", apiReader: true, source: v1alpha1.LimitsFromNodes,
			change: func(t *testing.T, c client.Client) {
				var ep v1alpha1.UrmaEndpoint
				if err := c.Get(ctx(), client.ObjectKey{Namespace: "ns", Name: "ep"}, &ep); err != nil {
					t.Fatal(err)
				}
				ep.Spec.Profile.Objective = v1alpha1.ObjectiveThroughput
				ep.Generation++
				if err := c.Update(ctx(), &ep); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "cache behind, node facts gone meanwhile - recorded limits kept", apiReader: true, source: v1alpha1.LimitsLastKnown,
			change: func(t *testing.T, c client.Client) {
				var n corev1.Node
				if err := c.Get(ctx(), client.ObjectKey{Name: "n1"}, &n); err != nil {
					t.Fatal(err)
				}
				n.Annotations = nil
				if err := c.Update(ctx(), &n); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "someone elses ConfigMap", apiReader: true, foreign: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ep := newEndpoint("ns", "ep", "g")
			ep.Spec.Profile.InflightPerConnection = 100
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"urma-test/group": "g"},
				Annotations: hw(64, 4096, 8192).Annotations()}}
			objs := []client.Object{ep, node}
			cmKey := client.ObjectKey{Namespace: "ns", Name: v1alpha1.ConfigMapName("ep")}
			if c.foreign {
				objs = append(objs, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: cmKey.Name},
					Data: map[string]string{"mine": "yes"}})
			}
			base := fake.NewClientBuilder().WithScheme(env.scheme).WithObjects(objs...).
				WithStatusSubresource(&v1alpha1.UrmaEndpoint{}).Build()
			// misses is how many ConfigMap Gets through the reconciler's
			// Client answer NotFound although it exists (-1: all of them,
			// as the cache does for a ConfigMap not labelled as ours).
			misses := 0
			if c.foreign {
				misses = -1
			}
			cl := interceptor.NewClient(base, interceptor.Funcs{Get: func(ctx context.Context, w client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if _, ok := obj.(*corev1.ConfigMap); ok && misses != 0 {
					if misses > 0 {
						misses--
					}
					return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
				}
				return w.Get(ctx, key, obj, opts...)
			}})
			rec := events.NewFakeRecorder(20)
			r := &controllers.UrmaEndpointReconciler{Client: cl, Scheme: env.scheme, Recorder: rec}
			if c.apiReader {
				r.APIReader = base
			}
			req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}
			var before corev1.ConfigMap
			if !c.foreign {
				if _, err := r.Reconcile(ctx(), req); err != nil {
					t.Fatal(err)
				}
				if err := base.Get(ctx(), cmKey, &before); err != nil {
					t.Fatalf("first render: %v", err)
				}
				for len(rec.Events) > 0 {
					<-rec.Events
				}
				if c.change != nil {
					c.change(t, base)
				}
				misses = 1 // the cache has not seen the ConfigMap yet
			} else if err := base.Get(ctx(), cmKey, &before); err != nil {
				t.Fatal(err)
			}

			res, err := r.Reconcile(ctx(), req)
			if err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			var got v1alpha1.UrmaEndpoint
			if err := base.Get(ctx(), req.NamespacedName, &got); err != nil {
				t.Fatal(err)
			}
			var after corev1.ConfigMap
			if err := base.Get(ctx(), cmKey, &after); err != nil {
				t.Fatal(err)
			}
			ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
			var warnings []string
			for len(rec.Events) > 0 {
				e := <-rec.Events
				if c.source == v1alpha1.LimitsLastKnown && strings.HasPrefix(e, corev1.EventTypeWarning+" "+controllers.EventDegraded+" ") {
					continue // facts gone: Degraded, as it should be
				}
				if strings.HasPrefix(e, corev1.EventTypeWarning+" ") {
					warnings = append(warnings, e)
				}
			}
			if c.foreign {
				if ready == nil || ready.Reason != v1alpha1.ReasonConfigMapConflict || res.RequeueAfter != controllers.ConflictRetry {
					t.Errorf("Ready %+v, requeue %v; want ConfigMapConflict, %v", ready, res.RequeueAfter, controllers.ConflictRetry)
				}
				if len(warnings) != 1 || !strings.Contains(warnings[0], controllers.EventConflict) {
					t.Errorf("warnings %q, want one %s", warnings, controllers.EventConflict)
				}
				if after.ResourceVersion != before.ResourceVersion || len(after.OwnerReferences) != 0 {
					t.Errorf("someone else's ConfigMap was modified: %+v", after)
				}
				return
			}
			if ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != v1alpha1.ReasonRendered || res.RequeueAfter != 0 {
				t.Errorf("Ready %+v, requeue %v; want True Rendered, no requeue", ready, res.RequeueAfter)
			}
			if len(warnings) != 0 {
				t.Errorf("warnings %q, want none", warnings)
			}
			if got.Status.FlagsHash != after.Data[v1alpha1.ConfigMapKeyHash] || got.Status.LimitsSource != c.source {
				t.Errorf("status hash %s source %s; ConfigMap hash %s; want source %s",
					got.Status.FlagsHash, got.Status.LimitsSource, after.Data[v1alpha1.ConfigMapKeyHash], c.source)
			}
			changed := got.Generation != ep.Generation
			if rewritten := after.ResourceVersion != before.ResourceVersion; rewritten != changed {
				t.Errorf("ConfigMap rewritten: %v (resourceVersion %s -> %s), want %v", rewritten, before.ResourceVersion, after.ResourceVersion, changed)
			}
			if after.Annotations[v1alpha1.AnnotationDeviceLimits] == "" {
				t.Error("recorded device limits dropped")
			}
		})
	}
}

// TestStaleConfigMapConflictIsRetriedQuietly: a reconcile that runs before
// the cache has seen the ConfigMap update of the previous one (a pod event
// queued meanwhile) reads the older copy and its update conflicts. That is
// the cache being behind, not a failure: the endpoint must not flip to
// Ready=False ApplyFailed with a Warning event, only look again shortly.
func TestStaleConfigMapConflictIsRetriedQuietly(t *testing.T) {
	ep := newEndpoint("ns", "ep", "g")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"urma-test/group": "g"},
		Annotations: hw(1024, 4096, 8192).Annotations()}}
	base := fake.NewClientBuilder().WithScheme(env.scheme).WithObjects(ep, node).
		WithStatusSubresource(&v1alpha1.UrmaEndpoint{}).Build()
	cmKey := client.ObjectKey{Namespace: "ns", Name: v1alpha1.ConfigMapName("ep")}
	// stale, when set, is what the next ConfigMap Get answers, once.
	var stale *corev1.ConfigMap
	cl := interceptor.NewClient(base, interceptor.Funcs{Get: func(ctx context.Context, w client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if cm, ok := obj.(*corev1.ConfigMap); ok && stale != nil {
			stale.DeepCopyInto(cm)
			stale = nil
			return nil
		}
		return w.Get(ctx, key, obj, opts...)
	}})
	rec := events.NewFakeRecorder(20)
	r := &controllers.UrmaEndpointReconciler{Client: cl, Scheme: env.scheme, Recorder: rec}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}
	if _, err := r.Reconcile(ctx(), req); err != nil {
		t.Fatal(err)
	}
	var first corev1.ConfigMap
	if err := base.Get(ctx(), cmKey, &first); err != nil {
		t.Fatalf("first render: %v", err)
	}
	var cur v1alpha1.UrmaEndpoint
	if err := base.Get(ctx(), req.NamespacedName, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Profile.Objective = v1alpha1.ObjectiveThroughput
	cur.Generation++
	if err := base.Update(ctx(), &cur); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx(), req); err != nil {
		t.Fatal(err)
	}
	var settled v1alpha1.UrmaEndpoint
	if err := base.Get(ctx(), req.NamespacedName, &settled); err != nil {
		t.Fatal(err)
	}
	if settled.Status.FlagsHash == first.Data[v1alpha1.ConfigMapKeyHash] {
		t.Fatal("the spec change did not change the flags")
	}
	for len(rec.Events) > 0 {
		<-rec.Events
	}

	stale = &first // the cache has not seen the update yet
	res, err := r.Reconcile(ctx(), req)
	if err != nil {
		t.Errorf("Reconcile with a stale ConfigMap: %v", err)
	}
	if res.RequeueAfter <= 0 {
		t.Errorf("result %+v, want a requeue", res)
	}
	var got v1alpha1.UrmaEndpoint
	if err := base.Get(ctx(), req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady); got.ResourceVersion != settled.ResourceVersion ||
		ready == nil || ready.Status != metav1.ConditionTrue {
		t.Errorf("status rewritten (resourceVersion %s -> %s), Ready %+v; want unchanged, True", settled.ResourceVersion, got.ResourceVersion, ready)
	}
	for len(rec.Events) > 0 {
		if e := <-rec.Events; strings.HasPrefix(e, corev1.EventTypeWarning+" ") {
			t.Errorf("event %q for a stale cache", e)
		}
	}

	// With the cache caught up, nothing is left to do.
	if res, err := r.Reconcile(ctx(), req); err != nil || res.RequeueAfter != 0 {
		t.Errorf("settled reconcile: %+v, %v", res, err)
	}
	if err := base.Get(ctx(), req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != settled.ResourceVersion {
		t.Errorf("settled reconcile wrote status")
	}
}
