// Package webhook holds the operator's admission webhooks: the pod mutator
// that gives pods labelled urma.openeuler.org/endpoint=<name> their flags,
// jetty request and flags hash, and the UrmaEndpoint validator that rejects
// bad overrides and warns about what the hardware will clamp.
package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

// Names the pod webhook uses.
const (
	PodWebhookPath = "/mutate-v1-pod"
	// VolumeName is the pod volume holding the endpoint's ConfigMap.
	VolumeName = "urma-flags"
)

// Pods never reach this webhook unless they carry the endpoint label (the
// objectSelector), so other pods are never blocked by it. For labelled pods
// the failure policy is Fail: a pod that asked for URMA flags must not start
// silently without them (and without its jetty request) while the operator
// is down; its controller retries the creation.
//
// +kubebuilder:webhook:path=/mutate-v1-pod,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=pods.urma.openeuler.org,admissionReviewVersions=v1,timeoutSeconds=5,reinvocationPolicy=IfNeeded,serviceName=urma-operator-webhook,serviceNamespace=urma-system,patch=`{"objectSelector":{"matchExpressions":[{"key":"urma.openeuler.org/endpoint","operator":"Exists"}]}}`
// +kubebuilder:webhookconfiguration:mutating=true,name=urma-operator-mutating
// +kubebuilder:rbac:groups=urma.openeuler.org,resources=urmaendpoints,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// PodInjector is the pod mutating webhook.
type PodInjector struct {
	// Reader reads endpoints, ConfigMaps, pods and node metadata (the
	// manager's cache).
	Reader client.Reader
	// APIReader reads an endpoint the cache does not have yet, straight
	// from the API server (the manager's API reader); nil skips that.
	APIReader client.Reader
	Decoder   admission.Decoder
	// FallbackJettiesPerUnit is the device plugin's jetties per unit assumed
	// before any node publishes facts; 0 means the plugin's default.
	FallbackJettiesPerUnit int64
	// Driver is the node agent (plan.DriverDevicePlugin when empty); with
	// plan.DriverDRA each URMA container gets a ResourceClaim for the
	// endpoint's jettyBudget instead of urma.openeuler.org/jetty units.
	Driver plan.Driver
}

// Handle injects the endpoint's flags into a pod. An unknown endpoint is
// allowed with a warning: blocking the pod would not make it work. So is a
// ConfigMap or ResourceClaimTemplate of the endpoint's name that someone
// else controls: the pod is not given it, and the warning says why; and a
// pod whose own urma-flags volume or mounts hide the flags from a URMA
// container: kept as the pod set them, with a warning naming the container.
// The warnings also name a container whose envFrom sources may set
// URMA_FLAGS_FILE (the webhook's env entry overrides them), and another
// source of a projected urma-flags volume that may write where the flags
// are (Report).
func (p *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	var pod corev1.Pod
	if err := p.Decoder.Decode(req, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode pod: %w", err))
	}
	name := pod.Labels[v1alpha1.LabelEndpoint]
	if name == "" {
		return admission.Allowed("pod names no UrmaEndpoint")
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		// The kubelet runs the static pod from its manifest; a patch here
		// reaches no container, and would only make the mirror pod show
		// flags, jetty units (which the scheduler counts against the node)
		// or claims the static pod does not have.
		return admission.Allowed("mirror pod of a static pod: the webhook cannot change what the kubelet runs")
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	ep, err := p.endpoint(ctx, client.ObjectKey{Namespace: ns, Name: name})
	if apierrors.IsNotFound(err) {
		return admission.Allowed("").WithWarnings(fmt.Sprintf(
			"UrmaEndpoint %s/%s (label %s) does not exist: the pod gets no URMA flags", ns, name, v1alpha1.LabelEndpoint))
	}
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("get UrmaEndpoint %s/%s: %w", ns, name, err))
	}
	obs, err := plan.Observe(ctx, p.Reader, ep, p.Driver)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	obs.Input.FallbackJettiesPerUnit = p.FallbackJettiesPerUnit
	var warnings []string
	in := Injection{Endpoint: ep.Name, Containers: ep.Spec.Containers}
	// The cache holds only the ConfigMaps this operator manages: one of the
	// endpoint's name it lacks may be someone else's, so look it up.
	cm, cmFound := obs.ConfigMap, obs.ConfigMap != nil
	if !cmFound {
		cm = &corev1.ConfigMap{}
		if cmFound, err = p.uncached(ctx, "ConfigMap", client.ObjectKey{Namespace: ns, Name: v1alpha1.ConfigMapName(name)}, cm); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
	}
	switch ownership(cm, cmFound, ep) {
	case controlled:
		in.Hash = cm.Data[v1alpha1.ConfigMapKeyHash]
	case foreign:
		// Its data are not this endpoint's flags: the pod mounts nothing
		// rather than run on them (the endpoint reports ConfigMapConflict).
		in.NoFlags = true
		warnings = append(warnings, short(fmt.Sprintf(
			"ConfigMap %s/%s is not controlled by UrmaEndpoint %s/%s (ConfigMapConflict): the pod does not mount it and gets no URMA flags; delete or rename it, then restart the pod",
			ns, v1alpha1.ConfigMapName(name), ns, name)))
	default:
		warnings = append(warnings, fmt.Sprintf(
			"the flags of UrmaEndpoint %s/%s are not rendered yet: the pod waits for ConfigMap %s and is not counted as on the current flags",
			ns, name, v1alpha1.ConfigMapName(name)))
	}
	mutated := pod.DeepCopy()
	if p.Driver == plan.DriverDRA {
		tmplName := v1alpha1.ClaimTemplateName(ep.Name)
		var tmpl resourceapi.ResourceClaimTemplate
		tmplFound, err := p.cachedOrUncached(ctx, "ResourceClaimTemplate", client.ObjectKey{Namespace: ns, Name: tmplName}, &tmpl)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if ownership(&tmpl, tmplFound, ep) == foreign {
			// Someone else's template may ask for any device: the pod
			// claims nothing from it (and so gets no URMA device).
			warnings = append(warnings, short(fmt.Sprintf(
				"ResourceClaimTemplate %s/%s is not controlled by UrmaEndpoint %s/%s: the pod claims no URMA jetties from it; delete or rename it, then restart the pod",
				ns, tmplName, ns, name)))
		} else {
			in.ClaimTemplate = tmplName
		}
		if in.JettyClaims, err = p.jettyClaims(ctx, ns, &pod, in.ClaimTemplate); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
	} else {
		in.JettyUnits = plan.JettyUnits(obs.Input)
	}
	r := Inject(mutated, in)
	if missing := r.Missing; len(missing) > 0 {
		warnings = append(warnings, short(fmt.Sprintf("spec.containers of UrmaEndpoint %s/%s names containers this pod does not have: %s",
			ns, name, strings.Join(missing, ", "))))
	}
	if blind := r.Blind; len(blind) > 0 {
		warnings = append(warnings, short(fmt.Sprintf(
			"the pod's volume %s does not show key %s to containers %s (its items or projected sources, or their subPath, leave it out): no %s is set for them, and they do not count the pod as on the current flags",
			VolumeName, v1alpha1.ConfigMapKeyFlags, strings.Join(blind, ", "), podenv.FlagsFile)))
	}
	if ownEnv := r.OwnEnv; len(ownEnv) > 0 {
		warnings = append(warnings, short(fmt.Sprintf(
			"containers %s set their own %s, not the file where volume %s shows them key %s (if any): their value is kept, and they do not count the pod as on the current flags",
			strings.Join(ownEnv, ", "), podenv.FlagsFile, VolumeName, v1alpha1.ConfigMapKeyFlags)))
	}
	if len(r.EnvFrom) > 0 {
		warnings = append(warnings, short(fmt.Sprintf(
			"containers %s take envFrom sources the webhook cannot read: its %s in env overrides one they may set; to use another file, set %s in env",
			strings.Join(r.EnvFrom, ", "), podenv.FlagsFile, podenv.FlagsFile)))
	}
	if len(r.Collisions) > 0 {
		warnings = append(warnings, short(fmt.Sprintf(
			"projected volume %s holds the endpoint's %s at %s, but its %s may put a file there too, hiding it: give them items that leave %s out",
			VolumeName, v1alpha1.ConfigMapKeyFlags, r.FlagsPath, strings.Join(r.Collisions, ", "), r.FlagsPath)))
	}
	raw, err := json.Marshal(mutated)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encode pod: %w", err))
	}
	log.FromContext(ctx).V(1).Info("injected URMA flags", "endpoint", name, "hash", in.Hash)
	return admission.PatchResponseFromRaw(req.Object.Raw, raw).WithWarnings(warnings...)
}

// endpoint reads the pod's endpoint from the cache and, when the cache does
// not have it, from the API server: an endpoint created just before its
// pods (one `kubectl apply` of both) may not have reached the cache yet,
// and a pod admitted without its flags stays so.
func (p *PodInjector) endpoint(ctx context.Context, key client.ObjectKey) (*v1alpha1.UrmaEndpoint, error) {
	var ep v1alpha1.UrmaEndpoint
	err := p.Reader.Get(ctx, key, &ep)
	if apierrors.IsNotFound(err) && p.APIReader != nil {
		err = p.APIReader.Get(ctx, key, &ep)
		if err == nil {
			log.FromContext(ctx).V(1).Info("UrmaEndpoint not in the cache yet; read it from the API server", "endpoint", key.String())
		}
	}
	if err != nil {
		return nil, err
	}
	return &ep, nil
}

// Ownership of an object named after an endpoint, as the reconciler sees it.
type objectOwnership int

const (
	// absent: not there (yet); the reconciler creates it.
	absent objectOwnership = iota
	// controlled by the endpoint: what the reconciler rendered.
	controlled
	// foreign: someone else's; the reconciler never touches it.
	foreign
)

// ownership says whose obj is (found false: absent). The reconciler only
// writes objects the endpoint controls (metav1.IsControlledBy: the
// controller ownerReference carries the endpoint's UID). One controlled by
// an earlier UrmaEndpoint of the same name (deleted and created again)
// counts as absent: the garbage collector deletes it, and the reconciler,
// woken by that deletion, renders the endpoint's own.
func ownership(obj client.Object, found bool, ep *v1alpha1.UrmaEndpoint) objectOwnership {
	switch {
	case !found:
		return absent
	case metav1.IsControlledBy(obj, ep):
		return controlled
	case v1alpha1.ControlledByPredecessor(obj, ep):
		return absent
	}
	return foreign
}

// cachedOrUncached reads key into obj from the cache and, when the cache
// does not have it, from the API server (APIReader, when set). It reports
// whether either had it.
func (p *PodInjector) cachedOrUncached(ctx context.Context, kind string, key client.ObjectKey, obj client.Object) (bool, error) {
	err := p.Reader.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return p.uncached(ctx, kind, key, obj)
	}
	if err != nil {
		return false, fmt.Errorf("get %s %s: %w", kind, key, err)
	}
	return true, nil
}

// uncached reads key into obj from the API server (APIReader, when set)
// and reports whether it is there.
func (p *PodInjector) uncached(ctx context.Context, kind string, key client.ObjectKey, obj client.Object) (bool, error) {
	if p.APIReader == nil {
		return false, nil
	}
	err := p.APIReader.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get %s %s from the API server: %w", kind, key, err)
	}
	return true, nil
}

// Injection is what Inject gives a pod.
type Injection struct {
	// Endpoint names the UrmaEndpoint (and so its ConfigMap).
	Endpoint string
	// Hash is the flags hash, "" when not rendered yet.
	Hash string
	// NoFlags leaves the endpoint's ConfigMap out (no volume, mount or
	// URMA_FLAGS_FILE): a ConfigMap of its name is someone else's.
	NoFlags bool
	// JettyUnits is each URMA container's urma.openeuler.org/jetty request;
	// 0 (with no ClaimTemplate) asks for none.
	JettyUnits int64
	// Containers names the URMA containers; empty means all of them.
	Containers []string
	// ClaimTemplate, when set (DRA driver), replaces JettyUnits: each URMA
	// container gets its own pod claim from this ResourceClaimTemplate,
	// which asks for the endpoint's jettyBudget jetties, except init
	// containers that are not sidecars, which share one (shareClaim).
	ClaimTemplate string
	// JettyClaims names the pod's spec.resourceClaims entries that already
	// claim URMA jetties (see PodInjector.jettyClaims). A container listing
	// one, or a claim named urma-*, keeps it and gets none from
	// ClaimTemplate; its other claims (a GPU's) do not count.
	JettyClaims map[string]bool
}

// Report is what Inject leaves undone, or cannot vouch for, for the
// admission warnings.
type Report struct {
	// Missing: the names in Injection.Containers the pod does not have.
	Missing []string
	// Blind: the URMA containers that mount the VolumeName volume but see
	// no flags file through it (the pod's own volume's items or projected
	// sources, or the container's subPath, leave it out): they get no
	// URMA_FLAGS_FILE.
	Blind []string
	// OwnEnv: those that mount it but set URMA_FLAGS_FILE themselves (its
	// last entry, which the kubelet uses) to another file, through
	// valueFrom, or with a $(NAME) reference only the kubelet resolves:
	// their value is kept, and they do not count as seeing the flags.
	OwnEnv []string
	// EnvFrom: the URMA containers given URMA_FLAGS_FILE that also take
	// variables from envFrom sources which may hold it, each with those
	// sources ("app (ConfigMap cfg, Secret s)"). The kubelet lets env
	// override envFrom, so the webhook's value is the one they run with.
	EnvFrom []string
	// Collisions: the other sources of the pod's projected VolumeName
	// volume that may put a file where it holds the endpoint's flags
	// (see collisions), each "sources[i] (kind name)".
	Collisions []string
	// FlagsPath is where the VolumeName volume holds the flags key, for
	// the Collisions warning.
	FlagsPath string
}

// Inject gives a pod what it needs to run an endpoint's flags; it keeps
// anything the pod already set and is idempotent:
//   - volume VolumeName from the endpoint's ConfigMap (not with NoFlags);
//   - in each URMA container (the named ones, init containers included, or
//     every container when none are named): the volume mounted read-only
//     at /etc/urma, unless it mounts that volume or anything at /etc/urma
//     already, and URMA_FLAGS_FILE naming the file the container sees
//     (flagsFile: /etc/urma/urma.flags by default; none when the pod's own
//     volume's items or projected sources (flagsPath) or the mount's
//     subPath leave the key out; not with NoFlags) unless the container
//     sets its own, and JettyUnits of urma.openeuler.org/jetty (request =
//     limit, as extended resources require) unless the container already
//     asks for some. Kubelet
//     allocates devices per container, so each needs its own request;
//     with a ClaimTemplate (DRA driver) instead a pod claim of its own from
//     that template, listed in the container's resources.claims, unless
//     the container already asks for units or lists a URMA claim
//     (JettyClaims); an init container that is not a sidecar lists the
//     first app container's URMA claim instead (shareClaim);
//   - the flags-hash annotation, when the hash is known and some URMA
//     container sees the endpoint's flags file.
//
// It reports what the pod keeps from it (see Report).
func Inject(pod *corev1.Pod, in Injection) (r Report) {
	if !in.NoFlags && !hasVolume(pod, VolumeName) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name: VolumeName,
			VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.ConfigMapName(in.Endpoint)},
			}},
		})
	}
	found := map[string]bool{}
	// inVolume: where the pod's VolumeName volume holds the flags;
	// endpoints: they are the endpoint's ConfigMap's (not the pod's own
	// volume of our name from other flags, kept as anything the pod set).
	inVolume, endpoints := flagsVolume(pod, in.Endpoint)
	if endpoints {
		r.FlagsPath = inVolume
		r.Collisions = collisions(pod, in.Endpoint, inVolume)
	}
	// seen: some URMA container sees the flags file through the
	// VolumeName volume (the webhook's, or one the pod brought).
	seen := false
	// The app containers come first, so that the init containers that run
	// alone know the claim they share (DRA).
	shared := ""
	for _, group := range []struct {
		list []corev1.Container
		init bool
	}{{pod.Spec.Containers, false}, {pod.Spec.InitContainers, true}} {
		for i := range group.list {
			c := &group.list[i]
			if len(in.Containers) > 0 && !slices.Contains(in.Containers, c.Name) {
				continue
			}
			found[c.Name] = true
			if !in.NoFlags && !hasMount(c) {
				c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{
					Name: VolumeName, MountPath: v1alpha1.FlagsMountPath, ReadOnly: true,
				})
			}
			file, own := flagsFile(c, inVolume)
			mounted := slices.ContainsFunc(c.VolumeMounts, isFlagsVolume)
			switch e := lastEnvIndex(c, podenv.FlagsFile); {
			case e < 0:
				if file != "" && !own {
					seen = true
				} else if mounted && !in.NoFlags {
					r.Blind = append(r.Blind, c.Name)
				}
				if !in.NoFlags && file != "" {
					c.Env = append(c.Env, corev1.EnvVar{Name: podenv.FlagsFile, Value: file})
					// An envFrom source's value of it is overridden
					// by this entry: the pod reads what the webhook
					// says, but the user may have meant another file.
					if src := envFromSources(c, podenv.FlagsFile); len(src) > 0 {
						r.EnvFrom = append(r.EnvFrom, c.Name+" ("+strings.Join(src, ", ")+")")
					}
				}
			case file != "" && !own && ownValueIs(c, e, file):
				// Its own value names the file the webhook would have
				// (or is the webhook's, on reinvocation).
				seen = true
			case mounted && !in.NoFlags:
				// Its own value wins (a second entry would override it),
				// but it names no file the webhook knows to be the flags.
				r.OwnEnv = append(r.OwnEnv, c.Name)
			}
			if in.ClaimTemplate != "" {
				sidecar := group.init && isSidecar(c)
				if group.init && !sidecar && shared != "" {
					shareClaim(c, shared, in.JettyClaims)
				} else {
					claimJetties(pod, c, in.ClaimTemplate, in.JettyClaims)
					if shared == "" && !sidecar {
						shared = jettyClaim(c, in.JettyClaims)
					}
				}
			} else if in.JettyUnits > 0 && !requestsJetties(c) {
				q := *resource.NewQuantity(in.JettyUnits, resource.DecimalSI)
				if c.Resources.Requests == nil {
					c.Resources.Requests = corev1.ResourceList{}
				}
				if c.Resources.Limits == nil {
					c.Resources.Limits = corev1.ResourceList{}
				}
				c.Resources.Requests[nodefacts.ResourceName] = q
				c.Resources.Limits[nodefacts.ResourceName] = q
			}
		}
	}
	for _, name := range in.Containers {
		if !found[name] {
			r.Missing = append(r.Missing, name)
		}
	}
	// The hash says the pod runs on these flags (the endpoint's
	// podsOnCurrentFlags counts it): not when no container sees them, nor
	// when the pod's own volume of our name holds other flags. It is the
	// webhook's word alone: one the pod brought (a template copied from a
	// pod that had it) would count a pod that reads no flags.
	if in.Hash != "" && seen && endpoints {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[v1alpha1.AnnotationFlagsHash] = in.Hash
	} else {
		delete(pod.Annotations, v1alpha1.AnnotationFlagsHash)
	}
	return r
}

// ownValueIs reports whether c's env entry i names file: its value, with
// the $(NAME) references the kubelet would expand expanded (envValue),
// is that path. One the webhook cannot know (valueFrom, a reference to a
// name no earlier entry defines) is not.
func ownValueIs(c *corev1.Container, i int, file string) bool {
	v, known := envValue(c, i)
	return known && path.Clean(v) == file
}

func hasVolume(pod *corev1.Pod, name string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

// hasMount reports whether c mounts the VolumeName volume, or anything at
// FlagsMountPath. Paths are compared cleaned: "/etc/urma/" is the same
// mount point, which the API server (comparing strings) lets through twice,
// so the container would get two mounts there, one hiding the other.
func hasMount(c *corev1.Container) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == VolumeName || path.Clean(m.MountPath) == v1alpha1.FlagsMountPath {
			return true
		}
	}
	return false
}

// flagsVolume is where the pod's VolumeName volume holds the flags key,
// and whether that file is the endpoint's (see flagsPath); "" when the pod
// has no such volume.
func flagsVolume(pod *corev1.Pod, endpoint string) (inVolume string, endpoints bool) {
	for i := range pod.Spec.Volumes {
		if v := &pod.Spec.Volumes[i]; v.Name == VolumeName {
			return flagsPath(v, v1alpha1.ConfigMapName(endpoint))
		}
	}
	return "", false
}

// flagsPath is where volume v holds the flags key (a cleaned path in the
// volume; "" when it holds none), and whether that is the key of ConfigMap
// cm, the endpoint's. A ConfigMap or Secret volume holds it under its name,
// or the path its items give it. A projected volume holds it only through
// a source of ConfigMap cm: its other sources (a token, pod info, another
// ConfigMap) may put any file there, not the endpoint's flags. A volume of
// another kind (the pod's own flags, kept) is taken to hold it under its
// name, as a mount at FlagsMountPath is.
func flagsPath(v *corev1.Volume, cm string) (inVolume string, endpoints bool) {
	switch {
	case v.ConfigMap != nil:
		return keyPath(v.ConfigMap.Items), v.ConfigMap.Name == cm
	case v.Secret != nil:
		return keyPath(v.Secret.Items), false
	case v.Projected != nil:
		if i := flagsSource(v.Projected, cm); i >= 0 {
			return keyPath(v.Projected.Sources[i].ConfigMap.Items), true
		}
		return "", false
	}
	return v1alpha1.ConfigMapKeyFlags, false
}

// flagsSource is the index of the first source of projected volume p that
// shows the flags key of ConfigMap cm, -1 when none does.
func flagsSource(p *corev1.ProjectedVolumeSource, cm string) int {
	for i, s := range p.Sources {
		if s.ConfigMap != nil && s.ConfigMap.Name == cm && keyPath(s.ConfigMap.Items) != "" {
			return i
		}
	}
	return -1
}

// collisions names the other sources of the pod's projected VolumeName
// volume that may put a file at inVolume, where it holds the endpoint's
// flags: the kubelet writes every source's files into one directory, a
// later one replacing an earlier one's file of the same path. A ConfigMap
// or Secret without items projects every key it has, which the webhook
// does not read (a Secret's it may not, and either may change before the
// pod starts): one of them may be a key of inVolume's name (a key has no
// "/", so only a file at the volume's top). An item or a path any source
// gives inVolume surely does (the API server refuses only a path spelled
// the same as another). The endpoint's ConfigMap showing its flags key
// there again is the same file.
func collisions(pod *corev1.Pod, endpoint, inVolume string) []string {
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == VolumeName })
	if i < 0 || pod.Spec.Volumes[i].Projected == nil {
		return nil
	}
	p := pod.Spec.Volumes[i].Projected
	cm := v1alpha1.ConfigMapName(endpoint)
	own := flagsSource(p, cm)
	topLevel := !strings.Contains(inVolume, "/")
	at := func(paths ...string) bool {
		return slices.ContainsFunc(paths, func(s string) bool { return s != "" && path.Clean(s) == inVolume })
	}
	// items: whether items put a file at inVolume; the keys of ConfigMap
	// cm that are its flags key are the endpoint's own file.
	items := func(list []corev1.KeyToPath, ours bool) bool {
		return slices.ContainsFunc(list, func(it corev1.KeyToPath) bool {
			return at(it.Path) && (!ours || it.Key != v1alpha1.ConfigMapKeyFlags)
		})
	}
	var out []string
	for j, s := range p.Sources {
		if j == own {
			continue
		}
		var what string
		switch {
		case s.ConfigMap != nil:
			ours := s.ConfigMap.Name == cm
			// Every key of the endpoint's own, which the operator
			// writes: its flags key is the same file, its hash key
			// not.
			all := topLevel && !ours || ours && inVolume == v1alpha1.ConfigMapKeyHash
			if len(s.ConfigMap.Items) == 0 && all || items(s.ConfigMap.Items, ours) {
				what = "ConfigMap " + s.ConfigMap.Name
			}
		case s.Secret != nil:
			if len(s.Secret.Items) == 0 && topLevel || items(s.Secret.Items, false) {
				what = "Secret " + s.Secret.Name
			}
		case s.DownwardAPI != nil:
			if slices.ContainsFunc(s.DownwardAPI.Items, func(f corev1.DownwardAPIVolumeFile) bool { return at(f.Path) }) {
				what = "downwardAPI"
			}
		case s.ServiceAccountToken != nil:
			if at(s.ServiceAccountToken.Path) {
				what = "serviceAccountToken"
			}
		case s.ClusterTrustBundle != nil:
			if at(s.ClusterTrustBundle.Path) {
				what = "clusterTrustBundle"
			}
		case s.PodCertificate != nil:
			if c := s.PodCertificate; at(c.CredentialBundlePath, c.KeyPath, c.CertificateChainPath) {
				what = "podCertificate"
			}
		}
		if what != "" {
			out = append(out, fmt.Sprintf("sources[%d] (%s)", j, what))
		}
	}
	return out
}

// keyPath is where items put the flags key: under its name when there are
// no items (every key), "" when they leave it out.
func keyPath(items []corev1.KeyToPath) string {
	if len(items) == 0 {
		return v1alpha1.ConfigMapKeyFlags
	}
	for _, it := range items {
		if it.Key == v1alpha1.ConfigMapKeyFlags {
			return path.Clean(it.Path)
		}
	}
	return ""
}

// mountedFile is where mount m of the VolumeName volume shows the file at
// inVolume (a cleaned path in the volume): under MountPath, at MountPath
// itself when the mount's subPath is that file, or under MountPath when the
// subPath is a directory holding it. It is "" when the mount shows another
// part of the volume, or one only the kubelet resolves (subPathExpr).
func mountedFile(m corev1.VolumeMount, inVolume string) string {
	if inVolume == "" || m.SubPathExpr != "" {
		return ""
	}
	sub := path.Clean(m.SubPath)
	switch sub {
	case ".":
		return path.Join(m.MountPath, inVolume)
	case inVolume:
		return path.Clean(m.MountPath)
	}
	if rest, ok := strings.CutPrefix(inVolume, sub+"/"); ok {
		return path.Join(m.MountPath, rest)
	}
	return ""
}

// flagsFile is where container c (after the mount is added) finds the
// flags, given where the VolumeName volume holds them (flagsVolume):
// through its first mount of that volume that shows them; else, when it
// mounts something else at FlagsMountPath, the pod's own flags there (own).
// It is "" when c mounts the volume but sees no flags through it (its
// items or the mount's subPath leave them out), or mounts neither.
func flagsFile(c *corev1.Container, inVolume string) (file string, own bool) {
	for _, m := range c.VolumeMounts {
		if !isFlagsVolume(m) {
			continue
		}
		if f := mountedFile(m, inVolume); f != "" {
			return f, false
		}
	}
	if !slices.ContainsFunc(c.VolumeMounts, isFlagsVolume) && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return path.Clean(m.MountPath) == v1alpha1.FlagsMountPath
	}) {
		return path.Join(v1alpha1.FlagsMountPath, v1alpha1.ConfigMapKeyFlags), true
	}
	return "", false
}

func isFlagsVolume(m corev1.VolumeMount) bool { return m.Name == VolumeName }

// lastEnvIndex is the index in c.Env of the entry of env var name that
// takes effect, the last one (the kubelet lets a later entry override an
// earlier one); -1 when none.
func lastEnvIndex(c *corev1.Container, name string) int {
	for i := len(c.Env) - 1; i >= 0; i-- {
		if c.Env[i].Name == name {
			return i
		}
	}
	return -1
}

// envFromSources names c's envFrom sources that may set variable name: the
// webhook cannot read their keys (a Secret's, or a ConfigMap that may
// change before the pod starts), only see whether their prefix allows it.
func envFromSources(c *corev1.Container, name string) []string {
	var out []string
	for _, s := range c.EnvFrom {
		if !strings.HasPrefix(name, s.Prefix) {
			continue
		}
		var src string
		switch {
		case s.ConfigMapRef != nil:
			src = "ConfigMap " + s.ConfigMapRef.Name
		case s.SecretRef != nil:
			src = "Secret " + s.SecretRef.Name
		default:
			continue
		}
		if s.Prefix != "" {
			src += " (prefix " + s.Prefix + ")"
		}
		out = append(out, src)
	}
	return out
}

func requestsJetties(c *corev1.Container) bool {
	_, req := c.Resources.Requests[nodefacts.ResourceName]
	_, lim := c.Resources.Limits[nodefacts.ResourceName]
	return req || lim
}

// claimJetties gives container c its own pod claim from template (see
// ClaimName), unless it already asks for units or lists a URMA claim (the
// user's own placement wins, as with units). Claims for other devices do
// not count: a GPU and URMA container is the common case.
func claimJetties(pod *corev1.Pod, c *corev1.Container, template string, jettyClaims map[string]bool) {
	if requestsJetties(c) || jettyClaim(c, jettyClaims) != "" {
		return
	}
	name := ClaimName(c.Name)
	if !slices.ContainsFunc(pod.Spec.ResourceClaims, func(r corev1.PodResourceClaim) bool { return r.Name == name }) {
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, corev1.PodResourceClaim{
			Name: name, ResourceClaimTemplateName: &template,
		})
	}
	c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: name})
}

// shareClaim lists claim in init container c, unless c already asks for
// units or lists a URMA claim. An init container that is not a sidecar
// runs alone, before the app containers start: a claim of its own would
// hold its jetties for the pod's whole life (DRA allocates a pod's claims
// until it ends), where kubelet hands a device plugin's init units on to
// the app containers. So it shares the first app container's jetty claim,
// or, in a pod whose app containers have none, the first such init
// container's.
func shareClaim(c *corev1.Container, claim string, jettyClaims map[string]bool) {
	if requestsJetties(c) || jettyClaim(c, jettyClaims) != "" {
		return
	}
	c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: claim})
}

// jettyClaim is the first URMA claim container c lists: one named urma-*,
// or one of jettyClaims; "" when none.
func jettyClaim(c *corev1.Container, jettyClaims map[string]bool) string {
	for _, rc := range c.Resources.Claims {
		if strings.HasPrefix(rc.Name, "urma-") || jettyClaims[rc.Name] {
			return rc.Name
		}
	}
	return ""
}

// isSidecar reports whether init container c is a sidecar (restartPolicy
// Always): it runs beside the app containers, so its jetties add up.
func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// jettyClaims finds the pod's claims that already ask for URMA jetties:
// those from the endpoint's template, and those from a template of the
// pod's namespace with a request of the URMA DeviceClass, read from the API
// server when the cache does not have it yet. A claim the pod
// names directly (resourceClaimName) is not read, since the operator may
// not read ResourceClaims: name its pod entry urma-* for it to count.
func (p *PodInjector) jettyClaims(ctx context.Context, ns string, pod *corev1.Pod, own string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, rc := range pod.Spec.ResourceClaims {
		t := rc.ResourceClaimTemplateName
		if t == nil {
			continue
		}
		if *t == own {
			out[rc.Name] = true
			continue
		}
		// A template applied with the pod's workload may not be in the
		// cache yet: read it from the API server then.
		var tmpl resourceapi.ResourceClaimTemplate
		key := client.ObjectKey{Namespace: ns, Name: *t}
		err := p.Reader.Get(ctx, key, &tmpl)
		found := err == nil
		if apierrors.IsNotFound(err) {
			found, err = p.uncached(ctx, "ResourceClaimTemplate", key, &tmpl)
		}
		if err != nil {
			return nil, fmt.Errorf("get ResourceClaimTemplate %s of pod claim %s: %w", key, rc.Name, err)
		}
		if !found {
			continue // the pod cannot start without it, whatever it asks for
		}
		out[rc.Name] = requestsJettyClass(&tmpl.Spec.Spec)
	}
	return out, nil
}

// requestsJettyClass reports whether a claim asks for a device of the URMA
// DeviceClass, in a request or any of its alternatives.
func requestsJettyClass(s *resourceapi.ResourceClaimSpec) bool {
	for _, r := range s.Devices.Requests {
		if r.Exactly != nil && r.Exactly.DeviceClassName == slicefacts.DriverName {
			return true
		}
		for _, sub := range r.FirstAvailable {
			if sub.DeviceClassName == slicefacts.DriverName {
				return true
			}
		}
	}
	return false
}

// ClaimName is the pod claim of a container's jetties: "urma-<container>",
// or "urma-" and a hash of the name when that would not be a DNS label.
func ClaimName(container string) string {
	if name := "urma-" + container; len(name) <= validation.DNS1123LabelMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(container))
	return "urma-" + hex.EncodeToString(sum[:8])
}
