package webhook

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
	"github.com/openeuler/urma-k8s/internal/operator/tuning"
)

// MaxWarningLen keeps each admission warning short: the API server drops
// or truncates long ones.
const MaxWarningLen = 250

// The validator is advisory beyond what the CRD's own rules reject, so it
// fails open: while the operator is down, endpoints are still accepted and
// the reconciler reports problems in status.
//
// +kubebuilder:webhook:path=/validate-urma-openeuler-org-v1alpha1-urmaendpoint,mutating=false,failurePolicy=ignore,sideEffects=None,groups=urma.openeuler.org,resources=urmaendpoints,verbs=create;update,versions=v1alpha1,name=urmaendpoints.urma.openeuler.org,admissionReviewVersions=v1,timeoutSeconds=5,serviceName=urma-operator-webhook,serviceNamespace=urma-system
// +kubebuilder:webhookconfiguration:mutating=false,name=urma-operator-validating

// EndpointValidator rejects overrides that pkg/transport/flags refuses (the
// CRD's CEL rules cover only the most common ones) and warns about every
// value the current nodes' devices will clamp.
type EndpointValidator struct {
	Reader client.Reader
	// FallbackJettiesPerUnit: see PodInjector.
	FallbackJettiesPerUnit int64
	// Driver: see PodInjector.
	Driver plan.Driver
}

var _ admission.Validator[*v1alpha1.UrmaEndpoint] = &EndpointValidator{}

// ValidateCreate checks a new endpoint.
func (v *EndpointValidator) ValidateCreate(ctx context.Context, ep *v1alpha1.UrmaEndpoint) (admission.Warnings, error) {
	return v.validate(ctx, ep)
}

// ValidateUpdate checks a changed endpoint. An update that leaves the spec
// as stored is never refused, only warned about: a spec accepted while this
// webhook was down (failure policy Ignore) or before an upgrade narrowed a
// range would otherwise block every metadata update, among them the garbage
// collector removing its foregroundDeletion or orphan finalizer, and the
// endpoint would never finish deleting.
func (v *EndpointValidator) ValidateUpdate(ctx context.Context, old, ep *v1alpha1.UrmaEndpoint) (admission.Warnings, error) {
	w, err := v.validate(ctx, ep)
	if err != nil && equality.Semantic.DeepEqual(old.Spec, ep.Spec) {
		return append(w, short("the spec is invalid (allowed because this update does not change it): "+err.Error())), nil
	}
	return w, err
}

// ValidateDelete allows every deletion.
func (v *EndpointValidator) ValidateDelete(context.Context, *v1alpha1.UrmaEndpoint) (admission.Warnings, error) {
	return nil, nil
}

func (v *EndpointValidator) validate(ctx context.Context, ep *v1alpha1.UrmaEndpoint) (admission.Warnings, error) {
	if err := tuning.ValidateOverrides(plan.Overrides(ep.Spec)); err != nil {
		return nil, fmt.Errorf("spec.%w", err)
	}
	if err := tuning.ValidateProfile(plan.Profile(ep.Spec)); err != nil {
		return nil, fmt.Errorf("spec.%w", err)
	}
	if err := plan.ValidateNodeSelector(ep.Spec.NodeSelector); err != nil {
		return nil, fmt.Errorf("spec.%w", err)
	}
	obs, err := plan.Observe(ctx, v.Reader, ep, v.Driver)
	if err != nil {
		// Warnings are a courtesy; never refuse an endpoint because a read failed.
		return admission.Warnings{"could not read the cluster's node facts to check this endpoint: " + err.Error()}, nil
	}
	obs.Input.FallbackJettiesPerUnit = v.FallbackJettiesPerUnit
	pl, err := plan.Make(obs.Input)
	if errors.Is(err, tuning.ErrInvalid) {
		return nil, fmt.Errorf("spec: %w", err)
	}
	if err != nil {
		return admission.Warnings{"could not check this endpoint against the nodes: " + err.Error()}, nil
	}
	var w admission.Warnings
	for _, c := range pl.Result.Clamps {
		w = append(w, short("clamped: "+c.String()))
	}
	for _, p := range pl.Problems {
		w = append(w, short(p.Reason+": "+p.Message))
	}
	return w, nil
}

func short(s string) string {
	if len(s) <= MaxWarningLen {
		return s
	}
	return s[:MaxWarningLen-3] + "..."
}
