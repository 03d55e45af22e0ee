// Package v1alpha1 is the urma.openeuler.org/v1alpha1 API: the UrmaEndpoint
// kind, with which a workload declares its traffic so that the operator can
// render tuned urma_* transport flags for its pods.
//
// +kubebuilder:object:generate=true
// +groupName=urma.openeuler.org
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "urma.openeuler.org", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
