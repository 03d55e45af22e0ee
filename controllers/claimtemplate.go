package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaimtemplates,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices,verbs=get;list;watch

// ClaimTemplateSpec is what an endpoint's pods claim under the DRA driver:
// one request of jettyBudget jetties on one URMA device, the same budget a
// container got as units from the device plugin, without rounding.
func ClaimTemplateSpec(ep *v1alpha1.UrmaEndpoint) resourceapi.ResourceClaimTemplateSpec {
	return resourceapi.ResourceClaimTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.LabelEndpoint: ep.Name}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "jetties",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: slicefacts.DriverName,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           1,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					slicefacts.CapacityJetties: *resource.NewQuantity(int64(ep.Spec.JettyBudget), resource.DecimalSI),
				}},
			},
		}}}},
	}
}

// applyClaimTemplate keeps the endpoint's ResourceClaimTemplate equal to
// ClaimTemplateSpec. A template's spec cannot be changed, so a new budget
// replaces it (claims already made from it keep theirs). A template of
// that name the endpoint does not control is left alone and reported.
func (r *UrmaEndpointReconciler) applyClaimTemplate(ctx context.Context, ep *v1alpha1.UrmaEndpoint) error {
	name := v1alpha1.ClaimTemplateName(ep.Name)
	want := ClaimTemplateSpec(ep)
	var cur resourceapi.ResourceClaimTemplate
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ep.Namespace, Name: name}, &cur)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("get ResourceClaimTemplate %s: %w", name, err)
	case v1alpha1.ControlledByPredecessor(&cur, ep):
		return fmt.Errorf("ResourceClaimTemplate %s: %w", name, errAwaitingGC)
	case !metav1.IsControlledBy(&cur, ep):
		r.event(ep, nil, corev1.EventTypeWarning, EventClaimTemplateConflict, "Render",
			"ResourceClaimTemplate %s is not controlled by this endpoint; not touching it", name)
		return apierrors.NewAlreadyExists(resourceapi.Resource("resourceclaimtemplates"), name)
	case equality.Semantic.DeepEqual(cur.Spec.Spec, want.Spec):
		return nil
	default:
		err := r.Client.Delete(ctx, &cur, client.Preconditions{UID: &cur.UID})
		if apierrors.IsConflict(err) {
			// The UID is not the stored one: the cache still has a template
			// the previous reconcile replaced.
			return fmt.Errorf("replace ResourceClaimTemplate %s: %w: %w", name, errCacheBehind, err)
		}
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("replace ResourceClaimTemplate %s: %w", name, err)
		}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ep.Namespace, Name: name, Labels: map[string]string{
			LabelManagedBy: ManagerName, v1alpha1.LabelEndpoint: ep.Name,
		}},
		Spec: want,
	}
	if err := controllerutil.SetControllerReference(ep, tmpl, r.Scheme); err != nil {
		return fmt.Errorf("own ResourceClaimTemplate %s: %w", name, err)
	}
	if err := r.Client.Create(ctx, tmpl); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// The cache has not seen the template the previous reconcile
			// created yet (someone else's would have been in it, and is
			// reported above once the cache has it).
			return fmt.Errorf("create ResourceClaimTemplate %s: %w: %w", name, errCacheBehind, err)
		}
		return fmt.Errorf("create ResourceClaimTemplate %s: %w", name, err)
	}
	return nil
}

// errCacheBehind marks a write that failed only because the cache had not
// seen the previous reconcile's write yet: retried shortly, not reported.
var errCacheBehind = errors.New("the cache is behind")
