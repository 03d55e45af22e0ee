package webhook

import (
	"context"
	"encoding/json"
	"slices"
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
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/podenv"
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

// jettyRequest is a container's urma.openeuler.org/jetty request and
// whether request and limit are both set and equal.
func jettyRequest(c corev1.Container) (string, bool) {
	req, okReq := c.Resources.Requests[nodefacts.ResourceName]
	lim, okLim := c.Resources.Limits[nodefacts.ResourceName]
	if !okReq && !okLim {
		return "", true
	}
	return req.String(), okReq && okLim && req.Cmp(lim) == 0
}

func allContainers(p *corev1.Pod) []corev1.Container {
	return append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
}

func TestInject(t *testing.T) {
	cases := []struct {
		name       string
		mutate     func(*corev1.Pod)
		hash       string
		containers []string
		// want maps each container to its jetty request ("" none) and
		// whether it gets the flags.
		want    map[string]string
		flags   map[string]bool
		missing []string
		check   func(*testing.T, *corev1.Pod)
	}{
		{name: "bare pod - every container gets the flags and its own request", hash: "abc",
			want:  map[string]string{"init": "3", "app": "3", "side": "3"},
			flags: map[string]bool{"init": true, "app": true, "side": true},
			check: func(t *testing.T, p *corev1.Pod) {
				if len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].ConfigMap == nil || p.Spec.Volumes[0].ConfigMap.Name != "ep-urma-flags" {
					t.Errorf("volumes %+v", p.Spec.Volumes)
				}
				if p.Annotations[v1alpha1.AnnotationFlagsHash] != "abc" {
					t.Errorf("annotations %v", p.Annotations)
				}
			}},
		{name: "spec.containers picks the URMA containers", hash: "abc", containers: []string{"app", "init"},
			want:  map[string]string{"init": "3", "app": "3", "side": ""},
			flags: map[string]bool{"init": true, "app": true, "side": false}},
		{name: "names the pod lacks are reported", hash: "abc", containers: []string{"side", "ghost", "spirit"},
			want:    map[string]string{"init": "", "app": "", "side": "3"},
			flags:   map[string]bool{"init": false, "app": false, "side": true},
			missing: []string{"ghost", "spirit"}},
		{name: "no container named is in the pod - no hash, so not counted on the flags", hash: "abc", containers: []string{"ghost"},
			want:    map[string]string{"init": "", "app": "", "side": ""},
			flags:   map[string]bool{"init": false, "app": false, "side": false},
			missing: []string{"ghost"},
			check: func(t *testing.T, p *corev1.Pod) {
				if _, ok := p.Annotations[v1alpha1.AnnotationFlagsHash]; ok {
					t.Errorf("flags hash stamped on a pod none of whose containers got the flags: %v", p.Annotations)
				}
			}},
		{name: "unknown hash - no annotation", hash: "",
			want:  map[string]string{"init": "3", "app": "3", "side": "3"},
			flags: map[string]bool{"init": true, "app": true, "side": true},
			check: func(t *testing.T, p *corev1.Pod) {
				if _, ok := p.Annotations[v1alpha1.AnnotationFlagsHash]; ok {
					t.Errorf("annotation set without a hash: %v", p.Annotations)
				}
			}},
		{name: "existing settings kept, a containers own request wins", hash: "abc", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "URMA_FLAGS_FILE", Value: "/mine"}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "own", MountPath: "/etc/urma"}}
			p.Spec.InitContainers[0].Resources.Limits = corev1.ResourceList{nodefacts.ResourceName: resource.MustParse("1")}
			p.Spec.Containers[1].Resources.Requests = corev1.ResourceList{nodefacts.ResourceName: resource.MustParse("7")}
			p.Spec.Containers[1].Resources.Limits = corev1.ResourceList{nodefacts.ResourceName: resource.MustParse("7")}
		}, want: map[string]string{"app": "3", "side": "7"},
			check: func(t *testing.T, p *corev1.Pod) {
				c := p.Spec.Containers[0]
				if len(c.Env) != 1 || c.Env[0].Value != "/mine" {
					t.Errorf("env overwritten: %+v", c.Env)
				}
				if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "own" {
					t.Errorf("mount overwritten: %+v", c.VolumeMounts)
				}
				init := p.Spec.InitContainers[0].Resources
				if _, ok := init.Requests[nodefacts.ResourceName]; ok {
					t.Errorf("init container's own limit-only request changed: %+v", init)
				}
			}},
		{name: "a container with other mounts still gets the flags mount", hash: "abc", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		}, want: map[string]string{"app": "3"},
			check: func(t *testing.T, p *corev1.Pod) {
				m := p.Spec.Containers[0].VolumeMounts
				if len(m) != 2 || m[0].Name != "data" || m[1].Name != VolumeName || m[1].MountPath != "/etc/urma" {
					t.Errorf("mounts %+v, want data and the flags", m)
				}
			}},
		{name: "a mount at /etc/urma/ is the one at /etc/urma - no second mount, the flags file under it", hash: "abc", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "own", MountPath: "/etc/urma/"}}
		}, want: map[string]string{"app": "3"},
			check: func(t *testing.T, p *corev1.Pod) {
				c := p.Spec.Containers[0]
				if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "own" {
					t.Errorf("mounts %+v, want only the pod's own at /etc/urma/", c.VolumeMounts)
				}
				if len(c.Env) != 1 || c.Env[0].Value != "/etc/urma/urma.flags" {
					t.Errorf("env %+v, want URMA_FLAGS_FILE=/etc/urma/urma.flags", c.Env)
				}
			}},
		{name: "the flags volume mounted elsewhere - URMA_FLAGS_FILE names the file there", hash: "abc", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: VolumeName, MountPath: "/opt/flags/", ReadOnly: true}}
			p.Spec.Containers[1].VolumeMounts = []corev1.VolumeMount{{Name: VolumeName, MountPath: "/cfg/urma.flags", SubPath: "urma.flags"}}
			p.Spec.InitContainers[0].VolumeMounts = []corev1.VolumeMount{{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "hash"}}
		}, want: map[string]string{"init": "3", "app": "3", "side": "3"},
			check: func(t *testing.T, p *corev1.Pod) {
				for _, c := range []struct {
					ctr  corev1.Container
					want []corev1.EnvVar
				}{
					{p.Spec.Containers[0], []corev1.EnvVar{{Name: "URMA_FLAGS_FILE", Value: "/opt/flags/urma.flags"}}},
					{p.Spec.Containers[1], []corev1.EnvVar{{Name: "URMA_FLAGS_FILE", Value: "/cfg/urma.flags"}}},
					// Another key of the volume: no flags file to name.
					{p.Spec.InitContainers[0], nil},
				} {
					if len(c.ctr.VolumeMounts) != 1 {
						t.Errorf("%s: mounts %+v, want only the pod's own", c.ctr.Name, c.ctr.VolumeMounts)
					}
					if !slices.Equal(c.ctr.Env, c.want) {
						t.Errorf("%s: env %+v, want %+v", c.ctr.Name, c.ctr.Env, c.want)
					}
				}
				if p.Annotations[v1alpha1.AnnotationFlagsHash] != "abc" {
					t.Errorf("annotations %v", p.Annotations)
				}
			}},
		{name: "a container that only requests jetties is left as it is", hash: "abc", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[1].Resources.Requests = corev1.ResourceList{nodefacts.ResourceName: resource.MustParse("2")}
		}, want: map[string]string{"init": "3", "app": "3"},
			check: func(t *testing.T, p *corev1.Pod) {
				side := p.Spec.Containers[1].Resources
				if q := side.Requests[nodefacts.ResourceName]; q.Cmp(resource.MustParse("2")) != 0 || len(side.Requests) != 1 || len(side.Limits) != 0 {
					t.Errorf("the container's own request was changed: %+v", side)
				}
			}},
		{name: "no containers - no resource, no panic", hash: "abc", mutate: func(p *corev1.Pod) {
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
			in := Injection{Endpoint: "ep", Hash: c.hash, JettyUnits: 3, Containers: c.containers}
			missing := Inject(p, in).Missing
			if !slices.Equal(missing, c.missing) {
				t.Errorf("missing %v, want %v", missing, c.missing)
			}
			for _, ctr := range allContainers(p) {
				if want, ok := c.want[ctr.Name]; ok {
					if got, paired := jettyRequest(ctr); got != want || !paired {
						t.Errorf("%s: jetty request %q (request = limit: %v), want %q", ctr.Name, got, paired, want)
					}
				}
				if want, ok := c.flags[ctr.Name]; ok {
					mounted := len(ctr.VolumeMounts) == 1 && ctr.VolumeMounts[0].Name == VolumeName &&
						ctr.VolumeMounts[0].MountPath == "/etc/urma" && ctr.VolumeMounts[0].ReadOnly
					env := len(ctr.Env) == 1 && ctr.Env[0] == (corev1.EnvVar{Name: "URMA_FLAGS_FILE", Value: "/etc/urma/urma.flags"})
					if mounted != want || env != want {
						t.Errorf("%s: flags mounted %v, env %v; want %v (mounts %+v, env %+v)", ctr.Name, mounted, env, want, ctr.VolumeMounts, ctr.Env)
					}
				}
			}
			if c.check != nil {
				c.check(t, p)
			}
			checkIdempotent(t, p, in)
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

func withContainers(ep *v1alpha1.UrmaEndpoint, names ...string) *v1alpha1.UrmaEndpoint {
	ep = ep.DeepCopy()
	ep.Spec.Containers = names
	return ep
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

// foreignConfigMap is a ConfigMap of the endpoint's name that the
// endpoint does not control; managed says whether it carries the label
// that puts it in the operator's cache.
func foreignConfigMap(managed bool) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ep-urma-flags"},
		Data: map[string]string{v1alpha1.ConfigMapKeyFlags: "--urma_sq_size=16\n", v1alpha1.ConfigMapKeyHash: "theirs"}}
	if managed {
		cm.Labels = map[string]string{"app.kubernetes.io/managed-by": "urma-operator"}
	}
	return cm
}

// predecessor is an endpoint of ep's name deleted before ep was created.
func predecessor(ep *v1alpha1.UrmaEndpoint) *v1alpha1.UrmaEndpoint {
	old := ep.DeepCopy()
	old.UID = "uid-earlier"
	return old
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
		// api holds objects only the API server has (not the cache yet).
		api          []client.Object
		fallbackUnit int64
		// reqNamespace, when set, is the request's namespace (else the pod's).
		reqNamespace string
		// noFlags: the pod must get neither the flags volume nor the
		// flags file's variable.
		noFlags bool
	}{
		{name: "rendered endpoint", objs: []client.Object{ep, ownedConfigMap(ep, "h1"), hwNode("n1", 4096)}, pod: basePod,
			allowed: true, mutated: true, hash: "h1", units: "3"},
		{name: "not rendered yet", objs: []client.Object{ep, hwNode("n1", 4096)}, pod: basePod,
			allowed: true, mutated: true, units: "3", warning: "not rendered yet"},
		{name: "ConfigMap of someone elses the cache has, managed-by label, no node facts yet - the plugins default unit",
			objs: []client.Object{ep, foreignConfigMap(true)},
			pod:  basePod, allowed: true, mutated: true, units: "3", noFlags: true,
			warning: "ConfigMap ns/ep-urma-flags is not controlled by UrmaEndpoint ns/ep (ConfigMapConflict): the pod does not mount it"},
		{name: "ConfigMap of someone elses only the API server has, the cache holds managed ones only",
			objs: []client.Object{ep, hwNode("n1", 4096)}, api: []client.Object{foreignConfigMap(false)},
			pod: basePod, allowed: true, mutated: true, units: "3", noFlags: true,
			warning: "ConfigMap ns/ep-urma-flags is not controlled by UrmaEndpoint ns/ep (ConfigMapConflict)"},
		{name: "ConfigMap of an earlier endpoint of this name, the garbage collectors to delete - not rendered yet",
			objs: []client.Object{ep, hwNode("n1", 4096), ownedConfigMap(predecessor(ep), "old")},
			pod:  basePod, allowed: true, mutated: true, units: "3", warning: "not rendered yet"},
		{name: "own ConfigMap the cache has not seen yet - read from the API server",
			objs: []client.Object{ep, hwNode("n1", 4096)}, api: []client.Object{ownedConfigMap(ep, "h1")},
			pod: basePod, allowed: true, mutated: true, hash: "h1", units: "3"},
		{name: "no node facts yet, the plugin runs 32 jetties per unit", objs: []client.Object{ep}, fallbackUnit: 32,
			pod: basePod, allowed: true, mutated: true, units: "2", warning: "not rendered yet"},
		{name: "endpoint not in the cache yet - read from the API server", objs: []client.Object{hwNode("n1", 4096)}, api: []client.Object{ep},
			pod: basePod, allowed: true, mutated: true, units: "3", warning: "not rendered yet"},
		{name: "spec.containers names a container the pod lacks",
			objs: []client.Object{withContainers(ep, "app", "sidecar"), ownedConfigMap(ep, "h1"), hwNode("n1", 4096)},
			pod:  basePod, allowed: true, mutated: true, hash: "h1", units: "3", warning: "names containers this pod does not have: sidecar"},
		{name: "pod object without a namespace - the requests is used",
			objs: []client.Object{ep, ownedConfigMap(ep, "h1"), hwNode("n1", 4096)},
			pod:  func() *corev1.Pod { p := basePod(); p.Namespace = ""; return p }, reqNamespace: "ns",
			allowed: true, mutated: true, hash: "h1", units: "3"},
		{name: "unknown endpoint", objs: nil, pod: basePod, allowed: true, mutated: false, warning: "UrmaEndpoint ns/ep (label urma.openeuler.org/endpoint) does not exist"},
		{name: "unlabelled pod", objs: []client.Object{ep}, pod: func() *corev1.Pod { p := basePod(); p.Labels = nil; return p },
			allowed: true, mutated: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := scheme(t)
			cl := fake.NewClientBuilder().WithScheme(s).WithObjects(c.objs...).Build()
			api := fake.NewClientBuilder().WithScheme(s).WithObjects(append(append([]client.Object{}, c.objs...), c.api...)...).Build()
			h := &PodInjector{Reader: cl, APIReader: api, Decoder: admission.NewDecoder(s), FallbackJettiesPerUnit: c.fallbackUnit}
			p := c.pod()
			req := podRequest(t, p)
			if c.reqNamespace != "" {
				req.Namespace = c.reqNamespace
			}
			resp := h.Handle(context.Background(), req)
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
			if hasVolume(got, VolumeName) == c.noFlags {
				t.Errorf("flags volume %v, want %v (volumes %+v)", hasVolume(got, VolumeName), !c.noFlags, got.Spec.Volumes)
			}
			if got.Annotations[v1alpha1.AnnotationFlagsHash] != c.hash {
				t.Errorf("hash annotation %q, want %q", got.Annotations[v1alpha1.AnnotationFlagsHash], c.hash)
			}
			if q := got.Spec.Containers[0].Resources.Requests[nodefacts.ResourceName]; q.String() != c.units {
				t.Errorf("jetty request %s, want %s", q.String(), c.units)
			}
			var ep v1alpha1.UrmaEndpoint
			if err := api.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "ep"}, &ep); err != nil {
				t.Fatal(err)
			}
			for _, ctr := range allContainers(got) {
				urma := len(ep.Spec.Containers) == 0 || slices.Contains(ep.Spec.Containers, ctr.Name)
				if q, _ := jettyRequest(ctr); (q == c.units) != urma {
					t.Errorf("%s: jetty request %q; URMA container %v", ctr.Name, q, urma)
				}
				if flags := urma && !c.noFlags; (lastEnv(&ctr, podenv.FlagsFile) != nil) != flags || hasMount(&ctr) != flags {
					t.Errorf("%s: flags file variable %v, mount %v; want %v", ctr.Name, lastEnv(&ctr, podenv.FlagsFile) != nil, hasMount(&ctr), flags)
				}
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
		{name: "fits - no warnings", nodes: []client.Object{hwNode("n1", 4096)}},
		{name: "clamped by device", nodes: []client.Object{hwNode("n1", 64)},
			warnings: []string{"clamped: urma_sq_size 103 -> 64 (device maxJfsDepth 64)"}},
		{name: "node groups differ", nodes: []client.Object{hwNode("n1", 4096), hwNode("n2", 64)},
			warnings: []string{"clamped: urma_sq_size 103 -> 64", "NodeGroupsDiffer: 2 node groups"}},
		{name: "no facts", warnings: []string{"NoNodeFacts: "}},
		{name: "bad override value", mutate: func(ep *v1alpha1.UrmaEndpoint) {
			ep.Spec.Overrides = map[string]v1alpha1.FlagValue{"urma_poller_num": "100", "urma_use_polling": "sometimes"}
		}, wantErr: "spec.overrides: flag urma_poller_num: 100 is out of range (want 1..64); flag urma_use_polling"},
		{name: "override value injecting a flags-file line", mutate: func(ep *v1alpha1.UrmaEndpoint) {
			ep.Spec.Overrides = map[string]v1alpha1.FlagValue{"urma_device": "udma0\n--urma_sq_size=99999"}
		}, wantErr: `spec.overrides: flag urma_device: value "udma0\n--urma_sq_size=99999" contains a newline at byte 5`},
		{name: "unknown override", mutate: func(ep *v1alpha1.UrmaEndpoint) {
			ep.Spec.Overrides = map[string]v1alpha1.FlagValue{"urma_nope": "1"}
		}, wantErr: `spec.overrides: unknown flag "urma_nope"`},
		{name: "bad nodeSelector", mutate: func(ep *v1alpha1.UrmaEndpoint) {
			ep.Spec.NodeSelector = map[string]string{"zone a": "x"}
		}, wantErr: `spec.nodeSelector: key "zone a": name part must consist of`},
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

func TestShortKeepsWarningsUpToTheLimit(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"clamped", "clamped"},
		{strings.Repeat("w", MaxWarningLen), strings.Repeat("w", MaxWarningLen)},
		{strings.Repeat("w", MaxWarningLen+1), strings.Repeat("w", MaxWarningLen-3) + "..."},
	} {
		if got := short(tc.in); got != tc.want {
			t.Errorf("short(%d bytes) = %d bytes %q..., want %d bytes", len(tc.in), len(got), got[:min(len(got), 10)], len(tc.want))
		}
	}
}

// An endpoint whose stored spec the validator would refuse (accepted while
// the webhook was down, its failure policy being Ignore, or before an
// upgrade narrowed a range) must still take updates that leave the spec as
// it is: the garbage collector removing the foregroundDeletion or orphan
// finalizer, a label. Refusing them leaves the endpoint stuck terminating.
// An update that changes the spec is still checked.
func TestEndpointValidatorAllowsUpdatesThatKeepAnInvalidSpec(t *testing.T) {
	invalid := endpoint()
	invalid.Spec.Overrides = map[string]v1alpha1.FlagValue{"urma_poller_num": "100"}
	deleting := invalid.DeepCopy()
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	deleting.Finalizers = []string{metav1.FinalizerDeleteDependents}
	finalizerRemoved := deleting.DeepCopy()
	finalizerRemoved.Finalizers = nil
	relabelled := invalid.DeepCopy()
	relabelled.Labels = map[string]string{"team": "storage"}
	stillInvalid := invalid.DeepCopy()
	stillInvalid.Spec.Overrides["urma_poller_num"] = "200"

	for _, c := range []struct {
		name     string
		old, new *v1alpha1.UrmaEndpoint
		wantErr  string
	}{
		{name: "garbage collector removes the foreground finalizer", old: deleting, new: finalizerRemoved},
		{name: "label added", old: invalid, new: relabelled},
		{name: "spec changed and still invalid", old: invalid, new: stillInvalid, wantErr: "urma_poller_num: 200 is out of range"},
		{name: "valid spec made invalid", old: endpoint(), new: invalid, wantErr: "urma_poller_num: 100 is out of range"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := &EndpointValidator{Reader: fake.NewClientBuilder().WithScheme(scheme(t)).Build()}
			w, err := v.ValidateUpdate(context.Background(), c.old, c.new)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("update that keeps the stored spec refused: %v", err)
			}
			if !slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, "urma_poller_num") }) {
				t.Errorf("warnings %q do not say the spec is invalid", w)
			}
		})
	}
}

// checkIdempotent checks that Inject, run again on the pod it mutated (as
// the API server's reinvocation does), changes nothing.
func checkIdempotent(t *testing.T, p *corev1.Pod, in Injection) {
	t.Helper()
	again := p.DeepCopy()
	Inject(again, in)
	a, _ := json.Marshal(p)
	b, _ := json.Marshal(again)
	if string(a) != string(b) {
		t.Errorf("Inject is not idempotent:\n%s\n%s", a, b)
	}
}
