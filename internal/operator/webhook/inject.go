package webhook

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

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
