package controllers

import (
	"context"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

// podToEndpoint maps a pod to the endpoint its label names.
func podToEndpoint(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[v1alpha1.LabelEndpoint]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// podChanged passes the pod events that can change an endpoint's status or
// node set: creation, deletion, and updates to its endpoint label, flags
// hash, node, termination or phase. Status churn (probes, IPs) is dropped.
func podChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Pod)
			n, ok2 := e.ObjectNew.(*corev1.Pod)
			if !ok1 || !ok2 {
				return true
			}
			return o.Labels[v1alpha1.LabelEndpoint] != n.Labels[v1alpha1.LabelEndpoint] ||
				o.Annotations[v1alpha1.AnnotationFlagsHash] != n.Annotations[v1alpha1.AnnotationFlagsHash] ||
				o.Spec.NodeName != n.Spec.NodeName ||
				(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) ||
				o.Status.Phase != n.Status.Phase
		},
	}
}

// A label change moves a pod from one endpoint to another: both need to
// recount. EnqueueRequestsFromMapFunc maps old and new objects on update.

func nodeMetadata() *metav1.PartialObjectMetadata {
	n := &metav1.PartialObjectMetadata{}
	n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return n
}

// nodeFactsChanged passes node creation, deletion and updates that change an
// URMA annotation or any label (node selectors match labels).
func nodeFactsChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) ||
				!maps.Equal(urmaAnnotations(e.ObjectOld), urmaAnnotations(e.ObjectNew))
		},
	}
}

func urmaAnnotations(o client.Object) map[string]string {
	out := map[string]string{}
	for k, v := range o.GetAnnotations() {
		if strings.HasPrefix(k, nodefacts.Prefix) {
			out[k] = v
		}
	}
	return out
}

// allEndpoints maps a node event to every endpoint: any of them may tune
// against that node.
func (r *UrmaEndpointReconciler) allEndpoints(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1alpha1.UrmaEndpointList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "list UrmaEndpoints for a node change; they catch up on their next event")
		return nil
	}
	out := make([]reconcile.Request, len(list.Items))
	for i, ep := range list.Items {
		out[i] = reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ep.Namespace, Name: ep.Name}}
	}
	return out
}

// ownDriverSlices passes the events of the URMA DRA driver's ResourceSlices
// only: each one wakes every endpoint, and other drivers' slices (a GPU
// driver's change with every health update) say nothing about URMA devices.
// A slice's driver cannot change, so old and new agree on updates.
func ownDriverSlices() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		s, ok := o.(*resourceapi.ResourceSlice)
		return ok && s.Spec.Driver == slicefacts.DriverName
	})
}
