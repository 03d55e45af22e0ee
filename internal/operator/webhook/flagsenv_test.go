package webhook

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

// flagsEnv sets the container's env to URMA_FLAGS_FILE entries of these
// values, in order.
func flagsEnv(name string, values ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		c := container(p, name)
		for _, v := range values {
			c.Env = append(c.Env, corev1.EnvVar{Name: podenv.FlagsFile, Value: v})
		}
	}
}

// withEnv appends a variable to the container's env.
func withEnv(name, key, value string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		c := container(p, name)
		c.Env = append(c.Env, corev1.EnvVar{Name: key, Value: value})
	}
}

// lastEnv is c's entry of env var name that takes effect (lastEnvIndex);
// nil when none.
func lastEnv(c *corev1.Container, name string) *corev1.EnvVar {
	if i := lastEnvIndex(c, name); i >= 0 {
		return &c.Env[i]
	}
	return nil
}

// withEnvFrom appends envFrom sources to the container.
func withEnvFrom(name string, sources ...corev1.EnvFromSource) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		c := container(p, name)
		c.EnvFrom = append(c.EnvFrom, sources...)
	}
}

func cmEnv(prefix, name string) corev1.EnvFromSource {
	return corev1.EnvFromSource{Prefix: prefix, ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
}

func secretEnv(prefix, name string) corev1.EnvFromSource {
	return corev1.EnvFromSource{Prefix: prefix, SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
}

// A container that sets URMA_FLAGS_FILE itself keeps its value, once: a
// second entry of the name would be the webhook overriding the user (the
// last entry wins). It reads the endpoint's flags, and so counts the pod
// as on them, only when its value names the file the webhook would have
// named; the kubelet uses the last of duplicate entries.
func TestInjectKeepsTheContainersOwnFlagsFile(t *testing.T) {
	renamed := ownFlagsVolume(corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyFlags, Path: "conf/a.conf"})
	cases := []struct {
		name   string
		mutate []func(*corev1.Pod)
		hashed bool
	}{
		{name: "another file", mutate: []func(*corev1.Pod){flagsEnv("app", "/mine")}},
		{name: "the file the webhook would name", hashed: true,
			mutate: []func(*corev1.Pod){flagsEnv("app", "/etc/urma/urma.flags")}},
		{name: "the same file, spelled otherwise", hashed: true,
			mutate: []func(*corev1.Pod){flagsEnv("app", "/etc/urma/./urma.flags")}},
		{name: "items move the key - the file they move it to", hashed: true,
			mutate: []func(*corev1.Pod){renamed, flagsEnv("app", "/etc/urma/conf/a.conf")}},
		{name: "items move the key - the file they moved it from",
			mutate: []func(*corev1.Pod){renamed, flagsEnv("app", "/etc/urma/urma.flags")}},
		{name: "items leave the key out",
			mutate: []func(*corev1.Pod){ownFlagsVolume(corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: "urma.flags"}), flagsEnv("app", "/etc/urma/urma.flags")}},
		{name: "duplicate entries - the last, another file, wins",
			mutate: []func(*corev1.Pod){flagsEnv("app", "/etc/urma/urma.flags", "/mine")}},
		{name: "duplicate entries - the last, the endpoints file, wins", hashed: true,
			mutate: []func(*corev1.Pod){flagsEnv("app", "/mine", "/etc/urma/urma.flags")}},
		{name: "its own value before other variables",
			mutate: []func(*corev1.Pod){flagsEnv("app", "/mine"), withEnv("app", "OTHER", "x")}},
		{name: "a reference to an earlier variable that names the file", hashed: true,
			mutate: []func(*corev1.Pod){withEnv("app", "DIR", "/etc/urma"), flagsEnv("app", "$(DIR)/urma.flags")}},
		{name: "a reference to an earlier variable that names another file",
			mutate: []func(*corev1.Pod){withEnv("app", "DIR", "/opt"), flagsEnv("app", "$(DIR)/urma.flags")}},
		{name: "a reference to a later variable - the kubelet does not expand it",
			mutate: []func(*corev1.Pod){flagsEnv("app", "$(DIR)/urma.flags"), withEnv("app", "DIR", "/etc/urma")}},
		{name: "a reference to an undefined variable - envFrom or a service may define it",
			mutate: []func(*corev1.Pod){flagsEnv("app", "$(DIR)/urma.flags")}},
		{name: "an escaped reference is literal",
			mutate: []func(*corev1.Pod){withEnv("app", "DIR", "/etc/urma"), flagsEnv("app", "$$(DIR)/urma.flags")}},
		{name: "a value from elsewhere the webhook cannot read",
			mutate: []func(*corev1.Pod){func(p *corev1.Pod) {
				container(p, "app").Env = []corev1.EnvVar{{Name: podenv.FlagsFile, ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['flags']"}}}}
			}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := basePod()
			for _, m := range c.mutate {
				m(p)
			}
			want := slices.Clone(container(p, "app").Env)
			// Only app is a URMA container: the hash is its doing alone.
			in := Injection{Endpoint: "ep", Hash: "h1", JettyUnits: 3, Containers: []string{"app"}}
			r := Inject(p, in)
			blind, ownEnv := r.Blind, r.OwnEnv
			// Every case mounts the volume: app is the warning's unless it
			// reads the endpoint's file, and is never one that gets none.
			if wantOwn := []string{"app"}; c.hashed && len(ownEnv) > 0 || !c.hashed && !slices.Equal(ownEnv, wantOwn) || len(blind) > 0 {
				t.Errorf("own env %q, blind %q; want own env %q (unless hashed), blind none", ownEnv, blind, wantOwn)
			}
			if got := container(p, "app").Env; !slices.EqualFunc(got, want, func(a, b corev1.EnvVar) bool {
				x, _ := json.Marshal(a)
				y, _ := json.Marshal(b)
				return string(x) == string(y)
			}) {
				t.Errorf("env %+v, want the container's own %+v", got, want)
			}
			if got := p.Annotations[v1alpha1.AnnotationFlagsHash] == "h1"; got != c.hashed {
				t.Errorf("hash stamped %v, want %v", got, c.hashed)
			}
			checkIdempotent(t, p, in)
		})
	}
}

// The warning names the containers whose own URMA_FLAGS_FILE is not the
// endpoint's flags file, and only them: not as containers that get no
// URMA_FLAGS_FILE (they have one), nor a container whose value is the file.
func TestPodInjectorWarnsOfContainersWithTheirOwnFlagsFile(t *testing.T) {
	ep := endpoint()
	s := scheme(t)
	cl := fake.NewClientBuilder().WithScheme(s).WithObjects(ep, ownedConfigMap(ep, "h1"), hwNode("n1", 4096)).Build()
	h := &PodInjector{Reader: cl, APIReader: cl, Decoder: admission.NewDecoder(s)}
	const own = "containers app set their own URMA_FLAGS_FILE"
	cases := []struct {
		name   string
		mutate []func(*corev1.Pod)
		// warnings are substrings of the warnings naming URMA_FLAGS_FILE,
		// one each, in order.
		warnings []string
		hash     string
	}{
		{name: "another file - the others still see the flags", hash: "h1",
			mutate:   []func(*corev1.Pod){flagsEnv("app", "/mine")},
			warnings: []string{own}},
		{name: "the endpoints file", hash: "h1",
			mutate: []func(*corev1.Pod){flagsEnv("app", "/etc/urma/urma.flags")}},
		{name: "items leave the key out - app has its own, the others none",
			mutate: []func(*corev1.Pod){ownFlagsVolume(corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: "hash"}),
				flagsEnv("app", "/etc/urma/urma.flags")},
			warnings: []string{"does not show key urma.flags to containers side, init (", own}},
		{name: "a reference the webhook expands to the endpoints file", hash: "h1",
			mutate: []func(*corev1.Pod){withEnv("app", "DIR", "/etc/urma/"), flagsEnv("app", "$(DIR)urma.flags")}},
		{name: "a reference only the kubelet may resolve", hash: "h1",
			mutate:   []func(*corev1.Pod){withEnvFrom("app", cmEnv("", "cfg")), flagsEnv("app", "$(DIR)/urma.flags")},
			warnings: []string{own}},
		{name: "envFrom sources that may set it - the webhooks value in env wins, and says so", hash: "h1",
			mutate:   []func(*corev1.Pod){withEnvFrom("app", cmEnv("", "cfg"), cmEnv("APP_", "other"), secretEnv("URMA_", "s"))},
			warnings: []string{"containers app (ConfigMap cfg, Secret s (prefix URMA_)) take envFrom sources the webhook cannot read: its URMA_FLAGS_FILE in env overrides"}},
		{name: "envFrom beside its own value in env - env wins, nothing to say", hash: "h1",
			mutate: []func(*corev1.Pod){withEnvFrom("app", cmEnv("", "cfg")), flagsEnv("app", "/etc/urma/urma.flags")}},
		{name: "an envFrom prefix that cannot make the name", hash: "h1",
			mutate: []func(*corev1.Pod){withEnvFrom("app", cmEnv("URMA_FLAGS_FILE_", "cfg"), secretEnv("X", "s"))}},
		{name: "its own flags mounted at /etc/urma - the pods business", hash: "h1",
			mutate: []func(*corev1.Pod){flagsEnv("app", "/etc/urma/mine.flags"), func(p *corev1.Pod) {
				container(p, "app").VolumeMounts = []corev1.VolumeMount{{Name: "mine", MountPath: v1alpha1.FlagsMountPath}}
			}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := basePod()
			for _, m := range c.mutate {
				m(p)
			}
			resp := h.Handle(context.Background(), podRequest(t, p))
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			var got []string
			for _, w := range resp.Warnings {
				if strings.Contains(w, podenv.FlagsFile) {
					got = append(got, w)
				}
			}
			if len(got) != len(c.warnings) {
				t.Fatalf("warnings %q, want %d naming %s: %q", resp.Warnings, len(c.warnings), podenv.FlagsFile, c.warnings)
			}
			for i, w := range c.warnings {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q, want it to contain %q", got[i], w)
				}
			}
			if stamped := applyPatch(t, p, resp).Annotations[v1alpha1.AnnotationFlagsHash]; stamped != c.hash {
				t.Errorf("hash %q, want %q", stamped, c.hash)
			}
		})
	}
}

// A flags-hash annotation the pod brought (its template copied from a pod
// that had one) is dropped unless the webhook stamps it: otherwise the
// endpoint would count a pod that reads no flags as on the current ones.
func TestInjectDropsAHashThePodBrought(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*corev1.Pod)
		in     Injection
		want   string // the annotation after Inject, "" for none
	}{
		{name: "the container reads the endpoints flags - the webhooks hash",
			mutate: func(*corev1.Pod) {}, in: Injection{Endpoint: "ep", Hash: "h1", Containers: []string{"app"}}, want: "h1"},
		{name: "the container names its own file",
			mutate: flagsEnv("app", "/mine"), in: Injection{Endpoint: "ep", Hash: "h1", Containers: []string{"app"}}},
		{name: "the pods volume leaves the key out",
			mutate: ownFlagsVolume(corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: "hash"}),
			in:     Injection{Endpoint: "ep", Hash: "h1", Containers: []string{"app"}}},
		{name: "no flags injected",
			mutate: func(*corev1.Pod) {}, in: Injection{Endpoint: "ep", Hash: "h1", NoFlags: true, Containers: []string{"app"}}},
		{name: "the hash is not known yet",
			mutate: func(*corev1.Pod) {}, in: Injection{Endpoint: "ep", Containers: []string{"app"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := basePod()
			c.mutate(p)
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[v1alpha1.AnnotationFlagsHash] = "h1" // brought
			p.Annotations["other"] = "kept"
			Inject(p, c.in)
			got, ok := p.Annotations[v1alpha1.AnnotationFlagsHash]
			if c.want == "" && ok || c.want != "" && got != c.want {
				t.Errorf("flags hash %q (present %v), want %q", got, ok, c.want)
			}
			if p.Annotations["other"] != "kept" {
				t.Errorf("annotations %v: the pod's own went missing", p.Annotations)
			}
		})
	}
}
