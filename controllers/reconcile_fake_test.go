package controllers_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
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
