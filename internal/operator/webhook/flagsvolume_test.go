package webhook

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

// ownFlagsVolume gives the pod its own VolumeName volume from the
// endpoint's ConfigMap, projecting only items (all keys when none).
func ownFlagsVolume(items ...corev1.KeyToPath) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: VolumeName, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.ConfigMapName("ep")}, Items: items}}}}
	}
}

// projectedFlagsVolume gives the pod its own VolumeName volume of the
// projected kind, from these sources.
func projectedFlagsVolume(sources ...corev1.VolumeProjection) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: VolumeName, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}}}
	}
}

// cmSource projects ConfigMap name, only items (all keys when none).
func cmSource(name string, items ...corev1.KeyToPath) corev1.VolumeProjection {
	return corev1.VolumeProjection{ConfigMap: &corev1.ConfigMapProjection{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Items: items}}
}

// secretSource projects Secret name, only items (all keys when none).
func secretSource(name string, items ...corev1.KeyToPath) corev1.VolumeProjection {
	return corev1.VolumeProjection{Secret: &corev1.SecretProjection{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Items: items}}
}

// Sources a projected volume commonly mixes with the flags.
var (
	podInfoSource = corev1.VolumeProjection{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
		{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}
	tokenSource = corev1.VolumeProjection{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}
)

// container returns the pod's container or init container of that name.
func container(p *corev1.Pod, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func flagsFileEnv(c *corev1.Container) string {
	for _, e := range c.Env {
		if e.Name == podenv.FlagsFile {
			return e.Value
		}
	}
	return ""
}

// A pod may bring its own urma-flags volume, and mount it its own way.
// URMA_FLAGS_FILE must name the file the container really sees (the
// volume's items may move or leave out the key; a subPath mount may show
// one file, or a directory of the volume), and the flags hash, which counts
// the pod as on the current flags, only goes on a pod one of whose URMA
// containers sees the flags.
func TestInjectFollowsThePodsOwnFlagsVolume(t *testing.T) {
	mounts := func(name string, m ...corev1.VolumeMount) func(*corev1.Pod) {
		return func(p *corev1.Pod) { container(p, name).VolumeMounts = m }
	}
	renamed := ownFlagsVolume(
		corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyFlags, Path: "conf/else.conf"},
		corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: "hash"})
	cases := []struct {
		name   string
		mutate []func(*corev1.Pod)
		// env is each container's URMA_FLAGS_FILE, "" none.
		env    map[string]string
		hashed bool
	}{
		{name: "items move urma.flags - the webhooks mount at /etc/urma shows it there",
			mutate: []func(*corev1.Pod){renamed},
			env:    map[string]string{"init": "/etc/urma/conf/else.conf", "app": "/etc/urma/conf/else.conf", "side": "/etc/urma/conf/else.conf"},
			hashed: true},
		{name: "items move urma.flags - the pods own mounts, of the whole volume, of the file, of its directory",
			mutate: []func(*corev1.Pod){renamed,
				mounts("app", corev1.VolumeMount{Name: VolumeName, MountPath: "/opt/f/"}),
				mounts("side", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/u.conf", SubPath: "conf/else.conf"}),
				mounts("init", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg", SubPath: "conf/"})},
			env:    map[string]string{"app": "/opt/f/conf/else.conf", "side": "/cfg/u.conf", "init": "/cfg/else.conf"},
			hashed: true},
		{name: "items move urma.flags - a subPath of the keys name shows nothing",
			mutate: []func(*corev1.Pod){renamed,
				mounts("app", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/urma.flags", SubPath: "urma.flags"}),
				mounts("side", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/urma.flags", SubPath: "urma.flags"}),
				mounts("init", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "hash"})},
			env: map[string]string{"app": "", "side": "", "init": ""}},
		{name: "items without urma.flags - no file to name, no hash",
			mutate: []func(*corev1.Pod){ownFlagsVolume(corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: "hash"})},
			env:    map[string]string{"init": "", "app": "", "side": ""}},
		{name: "every URMA container mounts only another key, subPath - no hash",
			mutate: []func(*corev1.Pod){
				mounts("app", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "hash"}),
				mounts("side", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "./hash"}),
				mounts("init", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/x", SubPathExpr: "$(POD_NAME)"})},
			env: map[string]string{"app": "", "side": "", "init": ""}},
		{name: "one container mounts another key, then the whole volume - the file under the second",
			mutate: []func(*corev1.Pod){
				mounts("app", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "hash"},
					corev1.VolumeMount{Name: VolumeName, MountPath: "/opt/f"}),
				mounts("side", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "hash"}),
				mounts("init", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "hash"})},
			env:    map[string]string{"app": "/opt/f/urma.flags", "side": "", "init": ""},
			hashed: true},
		{name: "projected - the endpoints ConfigMap beside a token and pod info, urma.flags under its name",
			mutate: []func(*corev1.Pod){projectedFlagsVolume(tokenSource, cmSource(v1alpha1.ConfigMapName("ep")), podInfoSource),
				mounts("side", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/u.conf", SubPath: "urma.flags"})},
			env:    map[string]string{"init": "/etc/urma/urma.flags", "app": "/etc/urma/urma.flags", "side": "/cfg/u.conf"},
			hashed: true},
		{name: "projected - items move urma.flags, the pods own mounts, of the whole volume, of the file, of its directory",
			mutate: []func(*corev1.Pod){projectedFlagsVolume(podInfoSource,
				cmSource(v1alpha1.ConfigMapName("ep"), corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyFlags, Path: "conf/p.conf"}), tokenSource),
				mounts("side", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg/u.conf", SubPath: "conf/p.conf"}),
				mounts("init", corev1.VolumeMount{Name: VolumeName, MountPath: "/cfg", SubPath: "conf"})},
			env:    map[string]string{"app": "/etc/urma/conf/p.conf", "side": "/cfg/u.conf", "init": "/cfg/p.conf"},
			hashed: true},
		{name: "projected - items of the endpoints ConfigMap leave urma.flags out",
			mutate: []func(*corev1.Pod){projectedFlagsVolume(podInfoSource,
				cmSource(v1alpha1.ConfigMapName("ep"), corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: "urma.flags"}))},
			env: map[string]string{"init": "", "app": "", "side": ""}},
		{name: "projected - no source is the endpoints ConfigMap",
			mutate: []func(*corev1.Pod){projectedFlagsVolume(podInfoSource, tokenSource, cmSource("mine"))},
			env:    map[string]string{"init": "", "app": "", "side": ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := basePod()
			for _, m := range c.mutate {
				m(p)
			}
			Inject(p, Injection{Endpoint: "ep", Hash: "h1", JettyUnits: 3})
			for name, want := range c.env {
				if got := flagsFileEnv(container(p, name)); got != want {
					t.Errorf("%s: %s=%q, want %q (mounts %+v)", name, podenv.FlagsFile, got, want, container(p, name).VolumeMounts)
				}
			}
			if got := p.Annotations[v1alpha1.AnnotationFlagsHash] == "h1"; got != c.hashed {
				t.Errorf("hash stamped %v, want %v", got, c.hashed)
			}
		})
	}
}

// The pod is admitted as it is, but the warning names the volume and the
// containers that do not see the flags through it, so that a pod missing
// from podsOnCurrentFlags (or running on the transport's defaults) says why.
func TestPodInjectorWarnsOfContainersTheFlagsVolumeMisses(t *testing.T) {
	ep := endpoint()
	s := scheme(t)
	cl := fake.NewClientBuilder().WithScheme(s).WithObjects(ep, ownedConfigMap(ep, "h1"), hwNode("n1", 4096)).Build()
	h := &PodInjector{Reader: cl, APIReader: cl, Decoder: admission.NewDecoder(s)}
	cases := []struct {
		name    string
		ep      *v1alpha1.UrmaEndpoint
		mutate  func(*corev1.Pod)
		warning string
		hash    string
	}{
		{name: "items without urma.flags",
			mutate:  ownFlagsVolume(corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: "hash"}),
			warning: "volume urma-flags does not show key urma.flags to containers app, side, init"},
		{name: "one container mounts only another key", hash: "h1",
			mutate: func(p *corev1.Pod) {
				container(p, "init").VolumeMounts = []corev1.VolumeMount{{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "hash"}}
			},
			warning: "volume urma-flags does not show key urma.flags to containers init ("},
		{name: "a container that is not a URMA container is none of the webhooks business", hash: "h1",
			ep: withContainers(ep, "app"),
			mutate: func(p *corev1.Pod) {
				container(p, "init").VolumeMounts = []corev1.VolumeMount{{Name: VolumeName, MountPath: "/cfg/hash", SubPath: "hash"}}
			}},
		{name: "items move urma.flags - every container sees it", hash: "h1",
			mutate: ownFlagsVolume(corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyFlags, Path: "a.conf"})},
		{name: "projected - the endpoints ConfigMap, items move urma.flags - every container sees it", hash: "h1",
			mutate: projectedFlagsVolume(tokenSource, cmSource(v1alpha1.ConfigMapName("ep"), corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyFlags, Path: "a.conf"}))},
		{name: "projected - a Secret without items beside the endpoints urma.flags may hide it", hash: "h1",
			mutate:  projectedFlagsVolume(cmSource(v1alpha1.ConfigMapName("ep")), secretSource("s")),
			warning: "projected volume urma-flags holds the endpoint's urma.flags at urma.flags, but its sources[1] (Secret s) may put a file there too"},
		{name: "projected without the endpoints urma.flags",
			mutate:  projectedFlagsVolume(tokenSource, podInfoSource, cmSource(v1alpha1.ConfigMapName("ep"), corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: "hash"})),
			warning: "volume urma-flags does not show key urma.flags to containers app, side, init"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := h
			if c.ep != nil {
				h = &PodInjector{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(c.ep, ownedConfigMap(ep, "h1"), hwNode("n1", 4096)).Build(),
					Decoder: admission.NewDecoder(s)}
			}
			p := basePod()
			c.mutate(p)
			resp := h.Handle(context.Background(), podRequest(t, p))
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			var got []string
			for _, w := range resp.Warnings {
				if strings.Contains(w, VolumeName) {
					got = append(got, w)
				}
			}
			if c.warning == "" && len(got) > 0 || c.warning != "" && (len(got) != 1 || !strings.Contains(got[0], c.warning)) {
				t.Errorf("warnings %q, want one containing %q", resp.Warnings, c.warning)
			}
			if stamped := applyPatch(t, p, resp).Annotations[v1alpha1.AnnotationFlagsHash]; stamped != c.hash {
				t.Errorf("hash %q, want %q", stamped, c.hash)
			}
		})
	}
}

func TestFlagsVolume(t *testing.T) {
	key := v1alpha1.ConfigMapKeyFlags
	ours := v1alpha1.ConfigMapName("ep")
	cm := func(name string, items ...corev1.KeyToPath) corev1.VolumeSource {
		return corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Items: items}}
	}
	projected := func(sources ...corev1.VolumeProjection) corev1.VolumeSource {
		return corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}
	}
	for _, c := range []struct {
		name      string
		vol       *corev1.Volume
		want      string
		endpoints bool
	}{
		{name: "no volume", want: ""},
		{name: "every key", vol: &corev1.Volume{VolumeSource: cm(ours)}, want: key, endpoints: true},
		{name: "another ConfigMaps every key", vol: &corev1.Volume{VolumeSource: cm("mine")}, want: key},
		{name: "items move the key", vol: &corev1.Volume{VolumeSource: cm(ours, corev1.KeyToPath{Key: "hash", Path: "h"}, corev1.KeyToPath{Key: key, Path: "conf//a.conf"})},
			want: "conf/a.conf", endpoints: true},
		{name: "items leave the key out", vol: &corev1.Volume{VolumeSource: cm(ours, corev1.KeyToPath{Key: "hash", Path: key})}, want: "", endpoints: true},
		{name: "a Secrets items move the key", vol: &corev1.Volume{VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			Items: []corev1.KeyToPath{{Key: key, Path: "s.conf"}}}}}, want: "s.conf"},
		{name: "another kind - taken to hold it under its name", vol: &corev1.Volume{VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}, want: key},
		{name: "projected - the endpoints ConfigMap among other sources", vol: &corev1.Volume{VolumeSource: projected(tokenSource, cmSource(ours), podInfoSource)},
			want: key, endpoints: true},
		{name: "projected - items move the key", vol: &corev1.Volume{VolumeSource: projected(podInfoSource, cmSource(ours, corev1.KeyToPath{Key: key, Path: "./conf/p.conf"}))},
			want: "conf/p.conf", endpoints: true},
		{name: "projected - a later source of the endpoints ConfigMap has the key", vol: &corev1.Volume{VolumeSource: projected(
			cmSource(ours, corev1.KeyToPath{Key: "hash", Path: "h"}), cmSource(ours, corev1.KeyToPath{Key: key, Path: "f"}))},
			want: "f", endpoints: true},
		{name: "projected - items leave the key out", vol: &corev1.Volume{VolumeSource: projected(cmSource(ours, corev1.KeyToPath{Key: "hash", Path: key}), podInfoSource)}},
		{name: "projected - only another ConfigMap, a Secret and pod info", vol: &corev1.Volume{VolumeSource: projected(cmSource("mine"),
			corev1.VolumeProjection{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: ours}}}, podInfoSource)}},
		{name: "projected - no sources", vol: &corev1.Volume{VolumeSource: projected()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := basePod()
			p.Spec.Volumes = []corev1.Volume{{Name: "other", VolumeSource: cm(ours, corev1.KeyToPath{Key: key, Path: "other"})}}
			if c.vol != nil {
				v := *c.vol
				v.Name = VolumeName
				p.Spec.Volumes = append(p.Spec.Volumes, v)
			}
			if got, endpoints := flagsVolume(p, "ep"); got != c.want || endpoints != c.endpoints {
				t.Errorf("flagsVolume = %q, %v, want %q, %v", got, endpoints, c.want, c.endpoints)
			}
		})
	}
}

func TestMountedFile(t *testing.T) {
	for _, c := range []struct {
		mount, subPath, subPathExpr, inVolume, want string
	}{
		{mount: "/etc/urma", inVolume: "urma.flags", want: "/etc/urma/urma.flags"},
		{mount: "/etc/urma/", subPath: ".", inVolume: "conf/a.conf", want: "/etc/urma/conf/a.conf"},
		{mount: "/cfg/f", subPath: "urma.flags", inVolume: "urma.flags", want: "/cfg/f"},
		{mount: "/cfg/f/", subPath: "./conf/a.conf", inVolume: "conf/a.conf", want: "/cfg/f"},
		{mount: "/cfg", subPath: "conf/", inVolume: "conf/a.conf", want: "/cfg/a.conf"},
		{mount: "/cfg", subPath: "con", inVolume: "conf/a.conf", want: ""},
		{mount: "/cfg", subPath: "urma.flags", inVolume: "conf/a.conf", want: ""},
		{mount: "/cfg", subPath: "hash", inVolume: "urma.flags", want: ""},
		{mount: "/cfg", subPathExpr: "$(POD)", inVolume: "urma.flags", want: ""},
		{mount: "/etc/urma", inVolume: "", want: ""},
	} {
		m := corev1.VolumeMount{Name: VolumeName, MountPath: c.mount, SubPath: c.subPath, SubPathExpr: c.subPathExpr}
		if got := mountedFile(m, c.inVolume); got != c.want {
			t.Errorf("mount %q subPath %q subPathExpr %q, file %q in the volume: %q, want %q",
				c.mount, c.subPath, c.subPathExpr, c.inVolume, got, c.want)
		}
	}
}

// A projected urma-flags volume's other sources may put a file where it
// holds the endpoint's flags: the kubelet writes them all into one
// directory, and one file hides the other.
func TestInjectReportsProjectedCollisions(t *testing.T) {
	key := v1alpha1.ConfigMapKeyFlags
	ours := cmSource(v1alpha1.ConfigMapName("ep"))
	moved := cmSource(v1alpha1.ConfigMapName("ep"), corev1.KeyToPath{Key: key, Path: "conf/u.conf"})
	at := func(p string) corev1.KeyToPath { return corev1.KeyToPath{Key: "k", Path: p} }
	downward := func(p string) corev1.VolumeProjection {
		return corev1.VolumeProjection{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
			{Path: p, FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}
	}
	for _, c := range []struct {
		name    string
		sources []corev1.VolumeProjection
		want    []string
	}{
		{name: "a token and pod info elsewhere", sources: []corev1.VolumeProjection{ours, tokenSource, podInfoSource}},
		{name: "another ConfigMap and a Secret without items, before and after",
			sources: []corev1.VolumeProjection{cmSource("mine"), ours, secretSource("s")},
			want:    []string{"sources[0] (ConfigMap mine)", "sources[2] (Secret s)"}},
		{name: "with items elsewhere", sources: []corev1.VolumeProjection{ours, cmSource("mine", at("a")), secretSource("s", at("conf/urma.flags"))}},
		{name: "items at the same path, spelled otherwise",
			sources: []corev1.VolumeProjection{ours, cmSource("mine", at("./urma.flags")), secretSource("s", at("x"), at("urma.flags"))},
			want:    []string{"sources[1] (ConfigMap mine)", "sources[2] (Secret s)"}},
		{name: "pod info and a token at the same path",
			sources: []corev1.VolumeProjection{downward("urma.flags"), ours,
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "urma.flags"}}},
			want: []string{"sources[0] (downwardAPI)", "sources[2] (serviceAccountToken)"}},
		{name: "the endpoints ConfigMap again - the same file", sources: []corev1.VolumeProjection{ours, ours}},
		{name: "the endpoints ConfigMap again, another key at the path",
			sources: []corev1.VolumeProjection{ours, cmSource(v1alpha1.ConfigMapName("ep"), corev1.KeyToPath{Key: v1alpha1.ConfigMapKeyHash, Path: key})},
			want:    []string{"sources[1] (ConfigMap ep-urma-flags)"}},
		{name: "flags moved into a directory - no key reaches it", sources: []corev1.VolumeProjection{secretSource("s"), moved, cmSource("mine")}},
		{name: "flags moved into a directory - an item reaches it",
			sources: []corev1.VolumeProjection{moved, downward("conf//u.conf")},
			want:    []string{"sources[1] (downwardAPI)"}},
		{name: "flags moved - the endpoints every key again, none of that name",
			sources: []corev1.VolumeProjection{cmSource(v1alpha1.ConfigMapName("ep"), corev1.KeyToPath{Key: key, Path: "f"}), ours}},
		{name: "flags moved to the hash keys name - the endpoints every key again holds the hash there",
			sources: []corev1.VolumeProjection{cmSource(v1alpha1.ConfigMapName("ep"), corev1.KeyToPath{Key: key, Path: v1alpha1.ConfigMapKeyHash}), ours},
			want:    []string{"sources[1] (ConfigMap ep-urma-flags)"}},
		{name: "no source shows the endpoints flags - nothing to hide", sources: []corev1.VolumeProjection{cmSource("mine"), secretSource("s")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := basePod()
			projectedFlagsVolume(c.sources...)(p)
			if got := Inject(p, Injection{Endpoint: "ep", Hash: "h1"}).Collisions; !slices.Equal(got, c.want) {
				t.Errorf("collisions %q, want %q", got, c.want)
			}
		})
	}
}
