package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
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
