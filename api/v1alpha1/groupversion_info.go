// Package v1alpha1 is the urma.openeuler.org/v1alpha1 API: the UrmaEndpoint
// kind, with which a workload declares its traffic so that the operator can
// render tuned urma_* transport flags for its pods.
//
// +kubebuilder:object:generate=true
// +groupName=urma.openeuler.org
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "urma.openeuler.org", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &UrmaEndpoint{}, &UrmaEndpointList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
