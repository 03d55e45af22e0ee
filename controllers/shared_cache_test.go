package controllers_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
)

// plan.Observe lists pods and nodes without deep copies, so the reconciler
// holds the cache's own maps and pointers: rendering, counting pods and
// writing status must leave them as they were. The fake client always
// copies, so Lists that ask for no copy are served here from shared
// objects, as controller-runtime's cache serves them.
func TestReconcileLeavesListedObjectsUnchanged(t *testing.T) {
	ep := newEndpoint("ns", "ep", "a")
	var stored []client.Object
	var pods []*corev1.Pod
	var nodes []*metav1.PartialObjectMetadata
	for i := range 3 {
		n := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i),
			Labels: map[string]string{"urma-test/group": "a"}, Annotations: hw(1024, 1024, 2048).Annotations()}}
		n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
		nodes = append(nodes, n)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i),
			Labels:      map[string]string{v1alpha1.LabelEndpoint: "ep"},
			Annotations: map[string]string{v1alpha1.AnnotationFlagsHash: "old"}},
			Spec:   corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		pods = append(pods, p)
		stored = append(stored, n, p)
	}
	before := make([]client.Object, len(stored))
	for i, o := range stored {
		before[i] = o.DeepCopyObject().(client.Object)
	}
	shared := 0
	base := fake.NewClientBuilder().WithScheme(env.scheme).WithObjects(ep).WithStatusSubresource(&v1alpha1.UrmaEndpoint{}).Build()
	c := interceptor.NewClient(base, interceptor.Funcs{List: func(ctx context.Context, w client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		if o := (&client.ListOptions{}).ApplyOptions(opts).UnsafeDisableDeepCopy; o == nil || !*o {
			return w.List(ctx, list, opts...)
		}
		shared++
		switch l := list.(type) {
		case *corev1.PodList:
			l.Items = nil
			for _, p := range pods {
				l.Items = append(l.Items, *p)
			}
		case *metav1.PartialObjectMetadataList:
			l.Items = nil
			for _, n := range nodes {
				l.Items = append(l.Items, *n)
			}
		default:
			return w.List(ctx, list, opts...)
		}
		return nil
	}})
	r := &controllers.UrmaEndpointReconciler{Client: c, Scheme: env.scheme, Recorder: events.NewFakeRecorder(10)}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ep"}}
	// Twice: creating the ConfigMap, then against the ConfigMap it created.
	for range 2 {
		if _, err := r.Reconcile(context.Background(), req); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
	}
	if shared == 0 {
		t.Fatal("Observe listed nothing without deep copies; this test checks nothing")
	}
	var got v1alpha1.UrmaEndpoint
	if err := c.Get(context.Background(), req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.MatchedPods != 3 || got.Status.FlagsHash == "" {
		t.Errorf("status: %d pods, hash %q; want the 3 shared pods and rendered flags", got.Status.MatchedPods, got.Status.FlagsHash)
	}
	for i, o := range stored {
		if !reflect.DeepEqual(o, before[i]) {
			t.Errorf("%T %s changed in the cache", o, client.ObjectKeyFromObject(o))
		}
	}
}
