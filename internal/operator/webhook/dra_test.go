package webhook

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
	"github.com/openeuler/urma-k8s/internal/podenv"
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
	in := Injection{Endpoint: "ep", ClaimTemplate: "ep-urma-jetties", JettyClaims: map[string]bool{"mine": true}}
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
		if lastEnv(&c, podenv.FlagsFile) == nil {
			t.Errorf("%s lost its flags", c.Name)
		}
	}
	// Idempotent: a second pass adds nothing.
	Inject(p, in)
	if len(p.Spec.ResourceClaims) != 1 || len(p.Spec.Containers[0].Resources.Claims) != 1 {
		t.Fatalf("second Inject duplicated claims: %+v", p.Spec.ResourceClaims)
	}
}

// Only a URMA claim stands in for the endpoint's: a container that lists
// a claim for another device (a GPU's) still gets its jetties.
func TestInjectClaimsBesideOtherDevices(t *testing.T) {
	cases := []struct {
		name   string
		claims []string // the app container's claims
		urma   map[string]bool
		want   string // the app container's claims after Inject
	}{
		{name: "none", want: "urma-app"},
		{name: "a GPU claim", claims: []string{"gpu"}, want: "gpu,urma-app"},
		{name: "a URMA claim of its own", claims: []string{"mine"}, urma: map[string]bool{"mine": true}, want: "mine"},
		{name: "a GPU and a URMA claim", claims: []string{"gpu", "mine"}, urma: map[string]bool{"gpu": false, "mine": true}, want: "gpu,mine"},
		{name: "a claim named urma-*", claims: []string{"urma-own"}, want: "urma-own"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := basePod()
			p.Spec.InitContainers, p.Spec.Containers = nil, p.Spec.Containers[:1]
			for _, n := range tc.claims {
				p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: n})
			}
			Inject(p, Injection{Endpoint: "ep", ClaimTemplate: "ep-urma-jetties", JettyClaims: tc.urma})
			if got := strings.Join(containerClaims(p.Spec.Containers[0]), ","); got != tc.want {
				t.Errorf("app lists claims %q, want %q", got, tc.want)
			}
			_, added := podClaims(p)["urma-app"]
			if wantAdded := strings.Contains(tc.want, "urma-app"); added != wantAdded {
				t.Errorf("pod claim urma-app added: %v, want %v", added, wantAdded)
			}
		})
	}
}

// An init container that is not a sidecar runs alone, before the app
// containers, so it shares a jetty claim instead of holding one of its own
// for the pod's whole life; a sidecar runs beside them and gets its own.
func TestInjectClaimsForInitContainers(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	cases := []struct {
		name  string
		pod   func(p *corev1.Pod)
		names []string          // the endpoint's containers; none: all
		urma  map[string]bool   // JettyClaims
		want  map[string]string // each container's claims after Inject
		added []string          // the pod claims Inject adds
	}{
		{
			name:  "shares the first app containers claim",
			want:  map[string]string{"init": "urma-app", "app": "urma-app", "side": "urma-side"},
			added: []string{"urma-app", "urma-side"},
		},
		{
			name: "init containers in turn share one",
			pod: func(p *corev1.Pod) {
				p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "migrate"})
			},
			want:  map[string]string{"init": "urma-app", "migrate": "urma-app", "app": "urma-app", "side": "urma-side"},
			added: []string{"urma-app", "urma-side"},
		},
		{
			name: "a sidecar gets its own",
			pod: func(p *corev1.Pod) {
				p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "proxy", RestartPolicy: &always})
			},
			want:  map[string]string{"init": "urma-app", "proxy": "urma-proxy", "app": "urma-app", "side": "urma-side"},
			added: []string{"urma-app", "urma-side", "urma-proxy"},
		},
		{
			name: "shares an app containers own URMA claim",
			pod: func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}, {Name: "jetties"}}
			},
			urma:  map[string]bool{"jetties": true},
			want:  map[string]string{"init": "jetties", "app": "gpu,jetties", "side": "urma-side"},
			added: []string{"urma-side"},
		},
		{
			name: "only init containers use URMA - the first ones claim",
			pod: func(p *corev1.Pod) {
				p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "migrate"})
			},
			names: []string{"init", "migrate"},
			want:  map[string]string{"init": "urma-init", "migrate": "urma-init", "app": "", "side": ""},
			added: []string{"urma-init"},
		},
		{
			name: "app containers on units - its own",
			pod: func(p *corev1.Pod) {
				p.Spec.Containers = p.Spec.Containers[:1]
				p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{nodefacts.ResourceName: resource.MustParse("2")}
			},
			want:  map[string]string{"init": "urma-init", "app": ""},
			added: []string{"urma-init"},
		},
		{
			name: "an init containers own claim stays",
			pod: func(p *corev1.Pod) {
				p.Spec.InitContainers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "urma-mine"}}
			},
			want:  map[string]string{"init": "urma-mine", "app": "urma-app", "side": "urma-side"},
			added: []string{"urma-app", "urma-side"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := basePod()
			if tc.pod != nil {
				tc.pod(p)
			}
			in := Injection{Endpoint: "ep", ClaimTemplate: "ep-urma-jetties", Containers: tc.names, JettyClaims: tc.urma}
			Inject(p, in)
			check := func(pass string) {
				for _, c := range allContainers(p) {
					if got := strings.Join(containerClaims(c), ","); got != tc.want[c.Name] {
						t.Errorf("%s: %s lists claims %q, want %q", pass, c.Name, got, tc.want[c.Name])
					}
				}
				var added []string
				for _, rc := range p.Spec.ResourceClaims {
					added = append(added, rc.Name)
				}
				if !slices.Equal(added, tc.added) {
					t.Errorf("%s: pod claims %v, want %v", pass, added, tc.added)
				}
			}
			check("first Inject")
			Inject(p, in)
			check("second Inject")
		})
	}
}

func claimTemplate(name, class string) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}},
		}}},
	}
}

func TestRequestsJettyClass(t *testing.T) {
	exact := func(class string) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: "r", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}
	}
	alternatives := func(classes ...string) resourceapi.DeviceRequest {
		r := resourceapi.DeviceRequest{Name: "r"}
		for _, c := range classes {
			r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{Name: "s", DeviceClassName: c})
		}
		return r
	}
	const gpu = "gpu.example.com"
	cases := []struct {
		name     string
		requests []resourceapi.DeviceRequest
		want     bool
	}{
		{name: "no request"},
		{name: "a GPU", requests: []resourceapi.DeviceRequest{exact(gpu)}},
		{name: "URMA", requests: []resourceapi.DeviceRequest{exact(slicefacts.DriverName)}, want: true},
		{name: "a GPU and URMA", requests: []resourceapi.DeviceRequest{exact(gpu), exact(slicefacts.DriverName)}, want: true},
		{name: "GPU alternatives", requests: []resourceapi.DeviceRequest{alternatives(gpu, "other.example.com")}},
		{name: "URMA second among alternatives", requests: []resourceapi.DeviceRequest{alternatives(gpu, slicefacts.DriverName)}, want: true},
		{name: "URMA first among alternatives", requests: []resourceapi.DeviceRequest{alternatives(slicefacts.DriverName, gpu)}, want: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: tc.requests}}
			if got := requestsJettyClass(&spec); got != tc.want {
				t.Errorf("requestsJettyClass = %v, want %v", got, tc.want)
			}
		})
	}
}

// The webhook reads the templates of a pod's claims to tell URMA claims
// from others, and refuses the pod when it cannot read one.
func TestPodInjectorDRAModeReadsClaimTemplates(t *testing.T) {
	s := scheme(t)
	ep := endpoint()
	alt := claimTemplate("urma-alt", "")
	alt.Spec.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "dev", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "a", DeviceClassName: "gpu.example.com"}, {Name: "b", DeviceClassName: slicefacts.DriverName},
	}}
	objs := []client.Object{ep, ownedConfigMap(ep, "h1"),
		claimTemplate("gpu-template", "gpu.example.com"), claimTemplate("my-urma", slicefacts.DriverName), alt}
	pod := func() *corev1.Pod {
		p := basePod()
		p.Spec.InitContainers = nil
		p.Spec.Containers = []corev1.Container{{Name: "app"}, {Name: "side"}, {Name: "third"}}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{
			{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")},
			{Name: "jetties", ResourceClaimTemplateName: ptr.To("my-urma")},
			{Name: "either", ResourceClaimTemplateName: ptr.To("urma-alt")},
		}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		p.Spec.Containers[1].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}, {Name: "jetties"}}
		p.Spec.Containers[2].Resources.Claims = []corev1.ResourceClaim{{Name: "either"}}
		return p
	}
	cl := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	h := &PodInjector{Reader: cl, APIReader: cl, Decoder: admission.NewDecoder(s), Driver: plan.DriverDRA}
	got := admitted(t, h, pod())
	want := map[string]string{"app": "gpu,urma-app", "side": "gpu,jetties", "third": "either"}
	for _, c := range got.Spec.Containers {
		if claims := strings.Join(containerClaims(c), ","); claims != want[c.Name] {
			t.Errorf("%s lists claims %q, want %q", c.Name, claims, want[c.Name])
		}
	}

	broken := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*resourceapi.ResourceClaimTemplate); ok && key.Name == "gpu-template" {
				return errors.New("etcd is down")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	h.Reader, h.APIReader = broken, broken
	resp := h.Handle(context.Background(), podRequest(t, pod()))
	if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, "get ResourceClaimTemplate ns/gpu-template of pod claim gpu: etcd is down") {
		t.Fatalf("a template that cannot be read: %+v, want the pod refused naming the template", resp.Result)
	}
}

// admitted is p as the injector lets it in, its patch applied.
func admitted(t *testing.T, h *PodInjector, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	resp := h.Handle(context.Background(), podRequest(t, p))
	if !resp.Allowed {
		t.Fatalf("refused: %+v", resp.Result)
	}
	return applyPatch(t, p, resp)
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
	got := admitted(t, h, basePod())
	want := v1alpha1.ClaimTemplateName("ep")
	if c := podClaims(got); len(c) != 2 || c["urma-app"] != want || c["urma-side"] != want {
		t.Fatalf("pod claims %v, want one per app container from %s", c, want)
	}
	if c := containerClaims(got.Spec.InitContainers[0]); len(c) != 1 || c[0] != "urma-app" {
		t.Errorf("init container lists claims %v, want the first app container's urma-app", c)
	}
	for _, c := range allContainers(got) {
		if q, _ := jettyRequest(c); q != "" {
			t.Errorf("%s asks for %s units in DRA mode", c.Name, q)
		}
	}
}

// A ResourceClaimTemplate of the endpoint's name that the endpoint does not
// control is someone else's (it may ask for any device): the pod claims
// nothing from it, asks for no units either, and the warning names the
// conflict. One controlled by the endpoint, or by an earlier endpoint of
// its name (the garbage collector's to delete), is claimed from as usual.
func TestPodInjectorDRAModeForeignClaimTemplate(t *testing.T) {
	s := scheme(t)
	ep := endpoint()
	name := v1alpha1.ClaimTemplateName("ep")
	owned := func(owner *v1alpha1.UrmaEndpoint) *resourceapi.ResourceClaimTemplate {
		tmpl := claimTemplate(name, slicefacts.DriverName)
		tmpl.OwnerReferences = ownedConfigMap(owner, "").OwnerReferences
		return tmpl
	}
	for _, c := range []struct {
		name        string
		tmpl        *resourceapi.ResourceClaimTemplate
		wantClaims  bool
		wantWarning string
	}{
		{name: "someone elses template", tmpl: claimTemplate(name, "gpu.example.com"),
			wantWarning: "ResourceClaimTemplate ns/ep-urma-jetties is not controlled by UrmaEndpoint ns/ep: the pod claims no URMA jetties"},
		{name: "the endpoints template", tmpl: owned(ep), wantClaims: true},
		{name: "an earlier endpoints template", tmpl: owned(predecessor(ep)), wantClaims: true},
		{name: "no template yet", wantClaims: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs := []client.Object{ep, ownedConfigMap(ep, "h1")}
			if c.tmpl != nil {
				objs = append(objs, c.tmpl)
			}
			cl := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
			h := &PodInjector{Reader: cl, APIReader: cl, Decoder: admission.NewDecoder(s), Driver: plan.DriverDRA}
			p := basePod()
			resp := h.Handle(context.Background(), podRequest(t, p))
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			warnings := strings.Join(resp.Warnings, "\n")
			if c.wantWarning != "" && !strings.Contains(warnings, c.wantWarning) {
				t.Errorf("warnings %q, want one containing %q", resp.Warnings, c.wantWarning)
			}
			if c.wantWarning == "" && warnings != "" {
				t.Errorf("unexpected warnings %q", resp.Warnings)
			}
			got := applyPatch(t, p, resp)
			if claimed := len(got.Spec.ResourceClaims) > 0; claimed != c.wantClaims {
				t.Errorf("pod claims %v, want claims: %v", podClaims(got), c.wantClaims)
			}
			for _, ctr := range allContainers(got) {
				if q, _ := jettyRequest(ctr); q != "" {
					t.Errorf("%s asks for %s units in DRA mode", ctr.Name, q)
				}
				if claims := containerClaims(ctr); (len(claims) > 0) != c.wantClaims {
					t.Errorf("%s lists claims %v, want claims: %v", ctr.Name, claims, c.wantClaims)
				}
				if lastEnv(&ctr, podenv.FlagsFile) == nil {
					t.Errorf("%s lost its flags", ctr.Name)
				}
			}
		})
	}
}
