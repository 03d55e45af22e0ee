package webhook

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
)

// A ResourceClaimTemplate applied with its Deployment (one kubectl apply)
// may not be in the operator's cache when the first pods arrive. The
// webhook must still see that the pod's claim from it asks for URMA
// jetties, or the container gets a second jetty claim from the endpoint's
// template beside the one it asked for.
func TestPodInjectorDRAModeReadsAClaimTemplateTheCacheLacks(t *testing.T) {
	s := scheme(t)
	ep := endpoint()
	cached := []client.Object{ep, ownedConfigMap(ep, "h1")}
	cache := fake.NewClientBuilder().WithScheme(s).WithObjects(cached...).Build()
	api := fake.NewClientBuilder().WithScheme(s).WithObjects(append(cached, claimTemplate("my-urma", slicefacts.DriverName))...).Build()
	h := &PodInjector{Reader: cache, APIReader: api, Decoder: admission.NewDecoder(s), Driver: plan.DriverDRA}
	p := basePod()
	p.Spec.InitContainers = nil
	p.Spec.Containers = []corev1.Container{{Name: "app"}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "jetties", ResourceClaimTemplateName: ptr.To("my-urma")}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "jetties"}}
	got := admitted(t, h, p)
	if claims := strings.Join(containerClaims(got.Spec.Containers[0]), ","); claims != "jetties" {
		t.Errorf("app lists claims %q, want only its own URMA claim jetties", claims)
	}
	if c := podClaims(got); len(c) != 1 {
		t.Errorf("pod claims %v, want only jetties", c)
	}
}
