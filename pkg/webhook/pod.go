// Package webhook holds the operator's admission webhooks: the pod mutator
// that gives pods labelled urma.openeuler.org/endpoint=<name> their flags,
// jetty request and flags hash, and the UrmaEndpoint validator that rejects
// bad overrides and warns about what the hardware will clamp.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers/plan"
	"github.com/openeuler/urma-k8s/pkg/nodefacts"
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
	Reader  client.Reader
	Decoder admission.Decoder
}

// Handle injects the endpoint's flags into a pod. An unknown endpoint is
// allowed with a warning: blocking the pod would not make it work.
func (p *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	var pod corev1.Pod
	if err := p.Decoder.Decode(req, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode pod: %w", err))
	}
	name := pod.Labels[v1alpha1.LabelEndpoint]
	if name == "" {
		return admission.Allowed("pod names no UrmaEndpoint")
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	var ep v1alpha1.UrmaEndpoint
	err := p.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ep)
	if apierrors.IsNotFound(err) {
		return admission.Allowed("").WithWarnings(fmt.Sprintf(
			"UrmaEndpoint %s/%s (label %s) does not exist: the pod gets no URMA flags", ns, name, v1alpha1.LabelEndpoint))
	}
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("get UrmaEndpoint %s/%s: %w", ns, name, err))
	}
	obs, err := plan.Observe(ctx, p.Reader, &ep)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	var warnings []string
	hash := ""
	if cm := obs.ConfigMap; cm != nil && metav1.IsControlledBy(cm, &ep) {
		hash = cm.Data[v1alpha1.ConfigMapKeyHash]
	} else {
		warnings = append(warnings, fmt.Sprintf(
			"the flags of UrmaEndpoint %s/%s are not rendered yet: the pod waits for ConfigMap %s and is not counted as on the current flags",
			ns, name, v1alpha1.ConfigMapName(name)))
	}
	mutated := pod.DeepCopy()
	Inject(mutated, ep.Name, hash, plan.JettyUnits(obs.Input))
	raw, err := json.Marshal(mutated)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encode pod: %w", err))
	}
	log.FromContext(ctx).V(1).Info("injected URMA flags", "endpoint", name, "hash", hash)
	return admission.PatchResponseFromRaw(req.Object.Raw, raw).WithWarnings(warnings...)
}

// Inject gives a pod what it needs to run an endpoint's flags; it keeps
// anything the pod already set and is idempotent:
//   - volume VolumeName from the endpoint's ConfigMap, mounted read-only at
//     /etc/urma in every container (init containers too: they may talk URMA);
//   - URMA_FLAGS_FILE=/etc/urma/urma.flags in those containers;
//   - jettyUnits of urma.openeuler.org/jetty (request = limit, as extended
//     resources require) on the first container, unless a container already
//     asks for some;
//   - the flags-hash annotation, when the hash is known.
func Inject(pod *corev1.Pod, endpoint, hash string, jettyUnits int64) {
	if !hasVolume(pod, VolumeName) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name: VolumeName,
			VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.ConfigMapName(endpoint)},
			}},
		})
	}
	flagsFile := path.Join(v1alpha1.FlagsMountPath, v1alpha1.ConfigMapKeyFlags)
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			c := &list[i]
			if !hasMount(c) {
				c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{
					Name: VolumeName, MountPath: v1alpha1.FlagsMountPath, ReadOnly: true,
				})
			}
			if !hasEnv(c, v1alpha1.EnvFlagsFile) {
				c.Env = append(c.Env, corev1.EnvVar{Name: v1alpha1.EnvFlagsFile, Value: flagsFile})
			}
		}
	}
	if len(pod.Spec.Containers) > 0 && !requestsJetties(pod) {
		q := *resource.NewQuantity(jettyUnits, resource.DecimalSI)
		res := &pod.Spec.Containers[0].Resources
		if res.Requests == nil {
			res.Requests = corev1.ResourceList{}
		}
		if res.Limits == nil {
			res.Limits = corev1.ResourceList{}
		}
		res.Requests[nodefacts.ResourceName] = q
		res.Limits[nodefacts.ResourceName] = q
	}
	if hash != "" {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[v1alpha1.AnnotationFlagsHash] = hash
	}
}

func hasVolume(pod *corev1.Pod, name string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

func hasMount(c *corev1.Container) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == VolumeName || m.MountPath == v1alpha1.FlagsMountPath {
			return true
		}
	}
	return false
}

func hasEnv(c *corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return true
		}
	}
	return false
}

func requestsJetties(pod *corev1.Pod) bool {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if _, ok := c.Resources.Requests[nodefacts.ResourceName]; ok {
				return true
			}
			if _, ok := c.Resources.Limits[nodefacts.ResourceName]; ok {
				return true
			}
		}
	}
	return false
}
