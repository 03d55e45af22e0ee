package webhook

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/pkg/nodefacts"
)

func basePod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{v1alpha1.LabelEndpoint: "ep"}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "init"}},
			Containers:     []corev1.Container{{Name: "app"}, {Name: "side"}},
		},
	}
}

func TestInject(t *testing.T) {
	three := resource.MustParse("3")
	cases := []struct {
		name   string
		mutate func(*corev1.Pod)
		hash   string
		check  func(*testing.T, *corev1.Pod)
	}{
		{name: "bare pod gets everything", hash: "abc", check: func(t *testing.T, p *corev1.Pod) {
			if len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].ConfigMap == nil || p.Spec.Volumes[0].ConfigMap.Name != "ep-urma-flags" {
				t.Errorf("volumes %+v", p.Spec.Volumes)
			}
			for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
				if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/etc/urma" || !c.VolumeMounts[0].ReadOnly {
					t.Errorf("%s mounts %+v", c.Name, c.VolumeMounts)
				}
				if len(c.Env) != 1 || c.Env[0] != (corev1.EnvVar{Name: "URMA_FLAGS_FILE", Value: "/etc/urma/urma.flags"}) {
					t.Errorf("%s env %+v", c.Name, c.Env)
				}
			}
			app := p.Spec.Containers[0].Resources
			if q := app.Requests[nodefacts.ResourceName]; q.Cmp(three) != 0 {
				t.Errorf("request %s", q.String())
			}
			if q := app.Limits[nodefacts.ResourceName]; q.Cmp(three) != 0 {
				t.Errorf("limit %s", q.String())
			}
			if len(p.Spec.Containers[1].Resources.Requests) != 0 {
				t.Error("second container got a request")
			}
			if p.Annotations[v1alpha1.AnnotationFlagsHash] != "abc" {
				t.Errorf("annotations %v", p.Annotations)
			}
		}},
		{name: "unknown hash: no annotation", hash: "", check: func(t *testing.T, p *corev1.Pod) {
			if _, ok := p.Annotations[v1alpha1.AnnotationFlagsHash]; ok {
				t.Errorf("annotation set without a hash: %v", p.Annotations)
			}
		}},
		{name: "existing settings kept", hash: "abc", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "URMA_FLAGS_FILE", Value: "/mine"}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "own", MountPath: "/etc/urma"}}
			p.Spec.InitContainers[0].Resources.Limits = corev1.ResourceList{nodefacts.ResourceName: resource.MustParse("1")}
		}, check: func(t *testing.T, p *corev1.Pod) {
			c := p.Spec.Containers[0]
			if len(c.Env) != 1 || c.Env[0].Value != "/mine" {
				t.Errorf("env overwritten: %+v", c.Env)
			}
			if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "own" {
				t.Errorf("mount overwritten: %+v", c.VolumeMounts)
			}
			if _, ok := c.Resources.Requests[nodefacts.ResourceName]; ok {
				t.Error("jetty request added though an init container asks for jetties")
			}
		}},
		{name: "no containers: no resource, no panic", hash: "abc", mutate: func(p *corev1.Pod) {
			p.Spec.Containers, p.Spec.InitContainers = nil, nil
		}, check: func(t *testing.T, p *corev1.Pod) {
			if len(p.Spec.Volumes) != 1 {
				t.Errorf("volumes %+v", p.Spec.Volumes)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := basePod()
			if c.mutate != nil {
				c.mutate(p)
			}
			Inject(p, "ep", c.hash, 3)
			c.check(t, p)
			again := p.DeepCopy()
			Inject(again, "ep", c.hash, 3)
			a, _ := json.Marshal(p)
			b, _ := json.Marshal(again)
			if string(a) != string(b) {
				t.Errorf("Inject is not idempotent:\n%s\n%s", a, b)
			}
		})
	}
}

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func endpoint() *v1alpha1.UrmaEndpoint {
	return &v1alpha1.UrmaEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ep", UID: "uid-1"},
		Spec: v1alpha1.UrmaEndpointSpec{JettyBudget: 40, Profile: v1alpha1.TrafficProfile{
			MessageSize: resource.MustParse("4Ki"), ConnectionsPerPod: 2, InflightPerConnection: 100}},
	}
}

func hwNode(name string, jfs uint32) *corev1.Node {
	f := nodefacts.Facts{DeviceCount: 1, MaxJFSDepth: jfs, MaxJFRDepth: 4096, MaxJFCDepth: 8192, MaxMsgSize: 1 << 20, JettiesPerDevice: 512, JettiesPerUnit: 16}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: f.Annotations()}}
}

func ownedConfigMap(ep *v1alpha1.UrmaEndpoint, hash string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ep.Namespace, Name: v1alpha1.ConfigMapName(ep.Name),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "UrmaEndpoint",
				Name: ep.Name, UID: ep.UID, Controller: ptr.To(true)}}},
		Data: map[string]string{v1alpha1.ConfigMapKeyHash: hash},
	}
}

func podRequest(t *testing.T, p *corev1.Pod) admission.Request {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Namespace: p.Namespace, Object: runtime.RawExtension{Raw: raw},
		Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
	}}
}

// applyPatch applies the response's JSON patch the way the API server does.
func applyPatch(t *testing.T, orig *corev1.Pod, resp admission.Response) *corev1.Pod {
	t.Helper()
	raw, err := json.Marshal(orig)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatalf("decode patch: %v", err)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("apply patch: %v", err)
	}
	var patched corev1.Pod
	if err := json.Unmarshal(out, &patched); err != nil {
		t.Fatal(err)
	}
	return &patched
}

func TestPodInjectorHandle(t *testing.T) {
	ep := endpoint()
	cases := []struct {
		name      string
		objs      []client.Object
		pod       func() *corev1.Pod
		allowed   bool
		mutated   bool
		hash      string
		units     string
		warning   string
		errorCode int32
	}{
		{name: "rendered endpoint", objs: []client.Object{ep, ownedConfigMap(ep, "h1"), hwNode("n1", 4096)}, pod: basePod,
			allowed: true, mutated: true, hash: "h1", units: "3"},
		{name: "not rendered yet", objs: []client.Object{ep, hwNode("n1", 4096)}, pod: basePod,
			allowed: true, mutated: true, units: "3", warning: "not rendered yet"},
		{name: "ConfigMap owned by someone else", objs: []client.Object{ep, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ep-urma-flags"}}},
			pod: basePod, allowed: true, mutated: true, units: "40", warning: "not rendered yet"},
		{name: "unknown endpoint", objs: nil, pod: basePod, allowed: true, mutated: false, warning: "UrmaEndpoint ns/ep (label urma.openeuler.org/endpoint) does not exist"},
		{name: "unlabelled pod", objs: []client.Object{ep}, pod: func() *corev1.Pod { p := basePod(); p.Labels = nil; return p },
			allowed: true, mutated: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := scheme(t)
			cl := fake.NewClientBuilder().WithScheme(s).WithObjects(c.objs...).Build()
			h := &PodInjector{Reader: cl, Decoder: admission.NewDecoder(s)}
			p := c.pod()
			resp := h.Handle(context.Background(), podRequest(t, p))
			if resp.Allowed != c.allowed {
				t.Fatalf("allowed %v (%+v), want %v", resp.Allowed, resp.Result, c.allowed)
			}
			if got := len(resp.Patches) > 0; got != c.mutated {
				t.Fatalf("mutated %v, want %v (patches %+v)", got, c.mutated, resp.Patches)
			}
			if c.warning != "" && !strings.Contains(strings.Join(resp.Warnings, "\n"), c.warning) {
				t.Errorf("warnings %q, want one containing %q", resp.Warnings, c.warning)
			}
			if c.warning == "" && len(resp.Warnings) > 0 {
				t.Errorf("unexpected warnings %q", resp.Warnings)
			}
			if !c.mutated {
				return
			}
			got := applyPatch(t, p, resp)
			if got.Annotations[v1alpha1.AnnotationFlagsHash] != c.hash {
				t.Errorf("hash annotation %q, want %q", got.Annotations[v1alpha1.AnnotationFlagsHash], c.hash)
			}
			if q := got.Spec.Containers[0].Resources.Requests[nodefacts.ResourceName]; q.String() != c.units {
				t.Errorf("jetty request %s, want %s", q.String(), c.units)
			}
		})
	}
}

func TestPodInjectorRejectsGarbage(t *testing.T) {
	s := scheme(t)
	h := &PodInjector{Reader: fake.NewClientBuilder().WithScheme(s).Build(), Decoder: admission.NewDecoder(s)}
	resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Object: runtime.RawExtension{Raw: []byte("{not json")}}})
	if resp.Allowed || resp.Result == nil || resp.Result.Code != 400 {
		t.Errorf("garbage pod: %+v", resp.Result)
	}
}

func TestEndpointValidator(t *testing.T) {
	cases := []struct {
		name     string
		mutate   func(*v1alpha1.UrmaEndpoint)
		nodes    []client.Object
		wantErr  string
		warnings []string
	}{
		{name: "fits: no warnings", nodes: []client.Object{hwNode("n1", 4096)}},
		{name: "clamped by device", nodes: []client.Object{hwNode("n1", 64)},
			warnings: []string{"clamped: urma_sq_size 103 -> 64 (device maxJfsDepth 64)"}},
		{name: "node groups differ", nodes: []client.Object{hwNode("n1", 4096), hwNode("n2", 64)},
			warnings: []string{"clamped: urma_sq_size 103 -> 64", "NodeGroupsDiffer: 2 node groups"}},
		{name: "no facts", warnings: []string{"NoNodeFacts: "}},
		{name: "bad override value", mutate: func(ep *v1alpha1.UrmaEndpoint) {
			ep.Spec.Overrides = map[string]v1alpha1.FlagValue{"urma_poller_num": "100", "urma_use_polling": "sometimes"}
		}, wantErr: "spec.overrides: flag urma_poller_num: 100 is out of range (want 1..64); flag urma_use_polling"},
		{name: "unknown override", mutate: func(ep *v1alpha1.UrmaEndpoint) {
			ep.Spec.Overrides = map[string]v1alpha1.FlagValue{"urma_nope": "1"}
		}, wantErr: `spec.overrides: unknown flag "urma_nope"`},
		{name: "bad profile", mutate: func(ep *v1alpha1.UrmaEndpoint) {
			m := resource.MustParse("1Ki")
			ep.Spec.Profile.MaxMessageSize = &m
		}, wantErr: "spec.profile: messageSize 4096 is above maxMessageSize 1024"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(c.nodes...).Build()
			v := &EndpointValidator{Reader: cl}
			ep := endpoint()
			if c.mutate != nil {
				c.mutate(ep)
			}
			w, err := v.ValidateCreate(context.Background(), ep)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			w2, err := v.ValidateUpdate(context.Background(), endpoint(), ep)
			if err != nil || strings.Join(w, "|") != strings.Join(w2, "|") {
				t.Errorf("update differs from create: %q %v", w2, err)
			}
			if len(w) != len(c.warnings) {
				t.Fatalf("warnings %q, want %d", w, len(c.warnings))
			}
			for i, sub := range c.warnings {
				if !strings.Contains(w[i], sub) {
					t.Errorf("warning %d %q, want it to contain %q", i, w[i], sub)
				}
				if len(w[i]) > MaxWarningLen {
					t.Errorf("warning %d longer than %d", i, MaxWarningLen)
				}
			}
		})
	}
	if w, err := (&EndpointValidator{}).ValidateDelete(context.Background(), endpoint()); err != nil || w != nil {
		t.Errorf("delete: %v %v", w, err)
	}
}
