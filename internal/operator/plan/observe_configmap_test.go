package plan

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/operator/tuning"
)

// ObserveConfigMap takes the limits recorded on the endpoint's own
// ConfigMap as the last known ones, reports a malformed record instead of
// using it, and ignores a record on a ConfigMap the endpoint does not own.
func TestObserveConfigMapLastKnown(t *testing.T) {
	s := testScheme(t)
	ep := &v1alpha1.UrmaEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ep", UID: "ep-uid"}}
	recorded := tuning.Limits{MaxJFSDepth: 100, MaxJFRDepth: 100, MaxJFCDepth: 400, MaxMsgSize: 4096}
	owned := []metav1.OwnerReference{*metav1.NewControllerRef(ep, v1alpha1.GroupVersion.WithKind("UrmaEndpoint"))}
	configMap := func(owners []metav1.OwnerReference, limits string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: v1alpha1.ConfigMapName("ep"), OwnerReferences: owners,
			Annotations: map[string]string{v1alpha1.AnnotationDeviceLimits: limits},
		}}
	}
	tests := []struct {
		name          string
		cm            *corev1.ConfigMap
		wantConfigMap bool
		wantLastKnown *tuning.Limits
		wantErr       bool
	}{
		{name: "no ConfigMap"},
		{name: "recorded", cm: configMap(owned, EncodeLimits(recorded)), wantConfigMap: true, wantLastKnown: &recorded},
		{name: "malformed record", cm: configMap(owned, `{"maxJFSDepth":`), wantConfigMap: true, wantErr: true},
		{name: "not the endpoints", cm: configMap(nil, EncodeLimits(recorded)), wantConfigMap: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := fake.NewClientBuilder().WithScheme(s)
			if tc.cm != nil {
				b = b.WithObjects([]client.Object{tc.cm}...)
			}
			// What an earlier observation left must not survive this one.
			obs := Observation{LastKnownErr: context.Canceled, Input: Input{LastKnown: &tuning.Limits{MaxMsgSize: 1}}}
			if err := ObserveConfigMap(context.Background(), b.Build(), ep, &obs); err != nil {
				t.Fatal(err)
			}
			if (obs.ConfigMap != nil) != tc.wantConfigMap {
				t.Errorf("ConfigMap %v, want one: %v", obs.ConfigMap, tc.wantConfigMap)
			}
			switch {
			case tc.wantLastKnown == nil && obs.Input.LastKnown != nil:
				t.Errorf("last known limits %+v, want none", *obs.Input.LastKnown)
			case tc.wantLastKnown != nil && (obs.Input.LastKnown == nil || *obs.Input.LastKnown != *tc.wantLastKnown):
				t.Errorf("last known limits %v, want %+v", obs.Input.LastKnown, *tc.wantLastKnown)
			}
			if (obs.LastKnownErr != nil) != tc.wantErr {
				t.Errorf("LastKnownErr %v, want an error: %v", obs.LastKnownErr, tc.wantErr)
			}
		})
	}
}
