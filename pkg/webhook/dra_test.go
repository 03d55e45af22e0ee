package webhook

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers/plan"
	"github.com/openeuler/urma-k8s/pkg/nodefacts"
)

func podClaims(p *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, c := range p.Spec.ResourceClaims {
		if c.ResourceClaimTemplateName != nil {
			out[c.Name] = *c.ResourceClaimTemplateName
		}
	}
	return out
}

func containerClaims(c corev1.Container) []string {
	var out []string
	for _, rc := range c.Resources.Claims {
		out = append(out, rc.Name)
	}
	return out
}

// With the DRA driver each URMA container gets a pod claim of its own from
// the endpoint's template, instead of urma.openeuler.org/jetty units.
func TestInjectClaims(t *testing.T) {
	p := basePod()
	p.Spec.Containers[1].Resources.Limits = corev1.ResourceList{nodefacts.ResourceName: resource.MustParse("2")} // side: its own units
	p.Spec.InitContainers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "mine"}}                           // init: its own claim
	in := Injection{Endpoint: "ep", ClaimTemplate: "ep-urma-jetties"}
	Inject(p, in)
	if got := podClaims(p); len(got) != 1 || got["urma-app"] != "ep-urma-jetties" {
		t.Fatalf("pod claims %v, want only urma-app from ep-urma-jetties", got)
	}
	for _, c := range allContainers(p) {
		got := strings.Join(containerClaims(c), ",")
		want := map[string]string{"init": "mine", "app": "urma-app", "side": ""}[c.Name]
		if got != want {
			t.Errorf("%s lists claims %q, want %q", c.Name, got, want)
		}
		if c.Name == "app" {
			if q, _ := jettyRequest(c); q != "" {
				t.Errorf("app got units %s besides its claim", q)
			}
		}
		if !hasEnv(&c, v1alpha1.EnvFlagsFile) {
			t.Errorf("%s lost its flags", c.Name)
		}
	}
	// Idempotent: a second pass adds nothing.
	Inject(p, in)
	if len(p.Spec.ResourceClaims) != 1 || len(p.Spec.Containers[0].Resources.Claims) != 1 {
		t.Fatalf("second Inject duplicated claims: %+v", p.Spec.ResourceClaims)
	}
}

func TestClaimName(t *testing.T) {
	if got := ClaimName("app"); got != "urma-app" {
		t.Errorf("ClaimName(app) = %s", got)
	}
	// "urma-" and 58 bytes is 63, the longest DNS label: kept as it is.
	if c := strings.Repeat("c", 58); ClaimName(c) != "urma-"+c {
		t.Errorf("ClaimName(58 chars) = %q, want it unhashed", ClaimName(c))
	}
	long := strings.Repeat("c", 63)
	got := ClaimName(long)
	if errs := validation.IsDNS1123Label(got); len(errs) > 0 || got == ClaimName(long[:62]+"d") {
		t.Errorf("ClaimName(63 chars) = %q: %v (or not distinct)", got, errs)
	}
}

func TestPodInjectorDRAMode(t *testing.T) {
	s := scheme(t)
	ep := endpoint()
	cl := fake.NewClientBuilder().WithScheme(s).WithObjects([]client.Object{ep, ownedConfigMap(ep, "h1")}...).Build()
	h := &PodInjector{Reader: cl, APIReader: cl, Decoder: admission.NewDecoder(s), Driver: plan.DriverDRA}
	p := basePod()
	resp := h.Handle(context.Background(), podRequest(t, p))
	if !resp.Allowed {
		t.Fatalf("refused: %+v", resp.Result)
	}
	got := applyPatch(t, p, resp)
	want := v1alpha1.ClaimTemplateName("ep")
	if c := podClaims(got); len(c) != 3 || c["urma-app"] != want || c["urma-side"] != want || c["urma-init"] != want {
		t.Fatalf("pod claims %v, want one per container from %s", c, want)
	}
	for _, c := range allContainers(got) {
		if q, _ := jettyRequest(c); q != "" {
			t.Errorf("%s asks for %s units in DRA mode", c.Name, q)
		}
	}
}
