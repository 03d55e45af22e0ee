// Package controllers holds the UrmaEndpoint reconciler: it renders each
// endpoint's tuned flags into a ConfigMap the endpoint owns and reports in
// status what was rendered, what was clamped and how many pods run it.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
)

// Labels the operator puts on the ConfigMaps it renders; its cache only
// holds ConfigMaps carrying them.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagerName    = "urma-operator"
)

// Event reasons.
const (
	EventFlagsRendered = "FlagsRendered"
	EventClamped       = "Clamped"
	EventDegraded      = "Degraded"
	EventInvalidSpec   = "InvalidSpec"
	EventConflict      = "ConfigMapConflict"
	// EventClaimTemplateConflict matches the Ready reason of a foreign
	// ResourceClaimTemplate, so that events and status name the same object.
	EventClaimTemplateConflict = "ClaimTemplateConflict"
	EventApplyFailed           = "ApplyFailed"
)

// +kubebuilder:rbac:groups=urma.openeuler.org,resources=urmaendpoints,verbs=get;list;watch
// +kubebuilder:rbac:groups=urma.openeuler.org,resources=urmaendpoints/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// UrmaEndpointReconciler renders UrmaEndpoints into ConfigMaps.
type UrmaEndpointReconciler struct {
	Client client.Client
	// APIReader reads from the API server, not the cache: when creating
	// the ConfigMap finds its name taken, it tells the ConfigMap the cache
	// has not seen yet (the one the previous reconcile created) from
	// someone else's. Nil: Client is used.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	// FallbackJettiesPerUnit is the device plugin's jetties per unit
	// assumed before any node publishes facts; 0 means the plugin's default.
	FallbackJettiesPerUnit int64
	// Driver is the node agent: with plan.DriverDRA node facts come from
	// ResourceSlices and each endpoint gets a ResourceClaimTemplate for its
	// pods' jetties.
	Driver plan.Driver
	// Reconciled, when set, is called as each reconcile returns, with what
	// it returned: tests use it to see that a settled endpoint asks for no
	// further work.
	Reconciled func(ctrl.Request, ctrl.Result, error)
}

// CacheOptions scopes the manager's cache: only pods that name an endpoint
// and only ConfigMaps this operator manages are cached, so the operator's
// memory does not grow with the cluster's unrelated pods and ConfigMaps.
func CacheOptions() cache.Options {
	hasEndpoint, _ := labels.NewRequirement(v1alpha1.LabelEndpoint, selection.Exists, nil) // constant, valid
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:       {Label: labels.NewSelector().Add(*hasEndpoint)},
		&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagerName})},
	}}
}

// Reconcile reads the endpoint and its world, renders the ConfigMap and
// writes status when it changed.
func (r *UrmaEndpointReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	if r.Reconciled != nil {
		defer func() { r.Reconciled(req, result, err) }()
	}
	return r.reconcile(ctx, req)
}

func (r *UrmaEndpointReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ep v1alpha1.UrmaEndpoint
	if err := r.Client.Get(ctx, req.NamespacedName, &ep); err != nil {
		// Gone: its ConfigMap goes with it (ownerReference).
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !ep.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	obs, err := plan.Observe(ctx, r.Client, &ep, r.Driver)
	if err != nil {
		// A failed read changes nothing: no ConfigMap write, no status reset.
		return ctrl.Result{}, fmt.Errorf("reconcile %s: %w", req, err)
	}
	obs.Input.FallbackJettiesPerUnit = r.FallbackJettiesPerUnit
	var templateErr error
	templateConflict := false
	if r.Driver == plan.DriverDRA {
		templateErr = r.applyClaimTemplate(ctx, &ep)
		if apierrors.IsAlreadyExists(templateErr) {
			// Someone else's template: like a foreign ConfigMap, reported in
			// status and looked at again later (its deletion sends the
			// endpoint no event), not retried as an error.
			templateErr, templateConflict = nil, true
		}
	}
	status, result, applyErr := r.render(ctx, &ep, obs, templateConflict)
	if templateConflict && result.RequeueAfter == 0 {
		result.RequeueAfter = ConflictRetry
	}
	if apierrors.IsConflict(applyErr) {
		// The cached ConfigMap is older than the stored one (the previous
		// reconcile's update not seen yet): the cache is behind, nothing
		// failed. Report nothing and look again once it has caught up.
		log.FromContext(ctx).V(1).Info("ConfigMap conflict; retrying", "error", applyErr.Error())
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err := r.writeStatus(ctx, &ep, status); err != nil {
		if apierrors.IsConflict(err) {
			// The cache was behind our own last write; the newer version's
			// status-only event is filtered out, so look again shortly.
			log.FromContext(ctx).V(1).Info("status conflict; retrying", "error", err.Error())
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reconcile %s: %w", req, err)
	}
	if applyErr != nil {
		return ctrl.Result{}, fmt.Errorf("reconcile %s: %w", req, applyErr)
	}
	if errors.Is(templateErr, errAwaitingGC) {
		log.FromContext(ctx).V(1).Info("an earlier endpoint's ResourceClaimTemplate awaits garbage collection; retrying", "error", templateErr.Error())
		return ctrl.Result{RequeueAfter: GarbageCollectionRetry}, nil
	}
	if errors.Is(templateErr, errCacheBehind) {
		log.FromContext(ctx).V(1).Info("ResourceClaimTemplate not in the cache yet; retrying", "error", templateErr.Error())
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if templateErr != nil {
		return ctrl.Result{}, fmt.Errorf("reconcile %s: %w", req, templateErr)
	}
	return result, nil
}

// ConflictRetry is how often an endpoint whose ConfigMap or
// ResourceClaimTemplate name is taken by someone else looks again (a
// foreign object's deletion sends the endpoint no event).
const ConflictRetry = 2 * time.Minute

// GarbageCollectionRetry is how soon an endpoint whose ConfigMap or
// ResourceClaimTemplate name is still held by the object of an earlier
// endpoint of its name looks again. That object's deletion usually wakes
// the endpoint first (owned objects map to their owner by name).
const GarbageCollectionRetry = 5 * time.Second

// errAwaitingGC marks an object of the endpoint's name controlled by an
// earlier endpoint of that name: the garbage collector deletes it, so it
// is not rendered yet rather than a conflict, and it is not touched.
var errAwaitingGC = errors.New("an earlier UrmaEndpoint of this name controls it; waiting for the garbage collector to delete it")

// render applies the ConfigMap and returns the status that describes it.
// Whatever goes wrong, the existing ConfigMap is left as it is.
// templateConflict (DRA driver) says the endpoint's ResourceClaimTemplate
// name is taken by someone else's: rendered flags are then not Ready.
func (r *UrmaEndpointReconciler) render(ctx context.Context, ep *v1alpha1.UrmaEndpoint, obs plan.Observation, templateConflict bool) (v1alpha1.UrmaEndpointStatus, ctrl.Result, error) {
	st := *ep.Status.DeepCopy()
	st.ObservedGeneration = ep.Generation
	st.ConfigMapName = v1alpha1.ConfigMapName(ep.Name)

	pl, err := makePlan(obs)
	if err != nil {
		msg := err.Error() + "; the ConfigMap keeps the last valid flags"
		if setCondition(&st, ep, v1alpha1.ConditionReady, false, v1alpha1.ReasonInvalidSpec, msg) {
			r.event(ep, nil, corev1.EventTypeWarning, EventInvalidSpec, "Tune", "%s", msg)
		}
		countPods(&st, obs.Pods)
		return st, ctrl.Result{}, nil // retrying cannot fix the spec; the next edit will
	}

	var result ctrl.Result
	applyErr := r.applyConfigMap(ctx, ep, obs.ConfigMap, pl)
	if obs.ConfigMap == nil && apierrors.IsAlreadyExists(applyErr) {
		pl, applyErr = r.applyUncached(ctx, ep, obs)
	}
	switch {
	case apierrors.IsAlreadyExists(applyErr):
		setCondition(&st, ep, v1alpha1.ConditionReady, false, v1alpha1.ReasonConfigMapConflict, fmt.Sprintf(
			"ConfigMap %s exists and is not managed by this endpoint; delete or rename it", st.ConfigMapName))
		applyErr, result = nil, ctrl.Result{RequeueAfter: ConflictRetry}
	case errors.Is(applyErr, errAwaitingGC):
		// Not rendered yet, as the webhook tells the pods: nothing for
		// the user to delete or rename.
		log.FromContext(ctx).V(1).Info("an earlier endpoint's ConfigMap awaits garbage collection; retrying", "error", applyErr.Error())
		applyErr, result = nil, ctrl.Result{RequeueAfter: GarbageCollectionRetry}
	case applyErr != nil:
		setCondition(&st, ep, v1alpha1.ConditionReady, false, v1alpha1.ReasonApplyFailed, applyErr.Error())
	default:
		ready, reason, msg := true, v1alpha1.ReasonRendered, fmt.Sprintf("ConfigMap %s holds flags %s", st.ConfigMapName, pl.Hash)
		if templateConflict {
			ready, reason, msg = false, v1alpha1.ReasonClaimTemplateConflict, fmt.Sprintf(
				"ResourceClaimTemplate %s exists and is not managed by this endpoint, so pods get no jetty claim; delete or rename it (%s)",
				v1alpha1.ClaimTemplateName(ep.Name), msg)
		}
		setCondition(&st, ep, v1alpha1.ConditionReady, ready, reason, msg)
		st.FlagsHash = pl.Hash
		st.Effective = effective(pl)
		st.DeviceLimits = plan.ToAPI(pl.Limits)
		st.LimitsSource = pl.Source
		st.NodeGroups = pl.Groups
		st.RegisteredBytesPerPod = pl.Result.RegisteredBytes
		st.JettyUnitsPerPod = pl.JettyUnits
		r.setClamped(&st, ep, pl)
		r.setDegraded(&st, ep, pl)
	}
	countPods(&st, obs.Pods)
	return st, result, applyErr
}

// makePlan is plan.Make with the problem of unreadable recorded limits.
func makePlan(obs plan.Observation) (plan.Plan, error) {
	pl, err := plan.Make(obs.Input)
	if err != nil {
		return plan.Plan{}, err
	}
	if obs.LastKnownErr != nil {
		pl.Problems = append(pl.Problems, plan.Problem{Reason: v1alpha1.ReasonInvalidNodeFacts, Message: obs.LastKnownErr.Error()})
	}
	return pl, nil
}

// applyUncached runs when creating the ConfigMap found its name taken. The
// cache only holds ConfigMaps this operator manages, so either the name is
// someone else's or the cache has not yet seen the ConfigMap the previous
// reconcile created. It reads the ConfigMap from the API server, plans
// again with the limits it records (the first plan saw none), and applies
// against it: a ConfigMap this endpoint controls is updated if needed, a
// foreign one is left alone and reported (AlreadyExists).
func (r *UrmaEndpointReconciler) applyUncached(ctx context.Context, ep *v1alpha1.UrmaEndpoint, obs plan.Observation) (plan.Plan, error) {
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	if err := plan.ObserveConfigMap(ctx, reader, ep, &obs); err != nil {
		return plan.Plan{}, err
	}
	if obs.ConfigMap == nil {
		// Deleted since (or the fallback reader is the cache): not a
		// conflict; the error retries with backoff. Not the AlreadyExists
		// error wrapped, which would report one.
		return plan.Plan{}, fmt.Errorf("create ConfigMap %s: the name is taken but no such ConfigMap can be read; retrying",
			v1alpha1.ConfigMapName(ep.Name))
	}
	pl, err := makePlan(obs)
	if err != nil {
		return plan.Plan{}, fmt.Errorf("plan against ConfigMap %s: %w", v1alpha1.ConfigMapName(ep.Name), err)
	}
	return pl, r.applyConfigMap(ctx, ep, obs.ConfigMap, pl)
}

// applyConfigMap creates or updates the endpoint's ConfigMap when its content
// differs from the plan. It returns an AlreadyExists error when current
// belongs to someone else, or when current is nil and creating finds the
// name taken (see applyUncached).
func (r *UrmaEndpointReconciler) applyConfigMap(ctx context.Context, ep *v1alpha1.UrmaEndpoint, current *corev1.ConfigMap, pl plan.Plan) error {
	name := v1alpha1.ConfigMapName(ep.Name)
	if current != nil && v1alpha1.ControlledByPredecessor(current, ep) {
		return fmt.Errorf("ConfigMap %s: %w", name, errAwaitingGC)
	}
	if current != nil && !metav1.IsControlledBy(current, ep) {
		r.event(ep, nil, corev1.EventTypeWarning, EventConflict, "Render",
			"ConfigMap %s is not controlled by this endpoint; not touching it", name)
		return apierrors.NewAlreadyExists(corev1.Resource("configmaps"), name)
	}
	desired := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ep.Namespace, Name: name}}
	if current != nil {
		desired = current.DeepCopy()
	}
	oldHash := desired.Data[v1alpha1.ConfigMapKeyHash]
	if desired.Labels == nil {
		desired.Labels = map[string]string{}
	}
	desired.Labels[LabelManagedBy] = ManagerName
	desired.Labels[v1alpha1.LabelEndpoint] = ep.Name
	if desired.Annotations == nil {
		desired.Annotations = map[string]string{}
	}
	desired.Annotations[v1alpha1.AnnotationFlagsHash] = pl.Hash
	// Record limits that came from nodes, so an empty read later keeps them;
	// assumed software limits are not worth keeping over anything.
	if pl.Source == v1alpha1.LimitsSoftware {
		delete(desired.Annotations, v1alpha1.AnnotationDeviceLimits)
	} else {
		desired.Annotations[v1alpha1.AnnotationDeviceLimits] = plan.EncodeLimits(pl.Limits)
	}
	desired.Data = map[string]string{
		v1alpha1.ConfigMapKeyFlags: pl.Rendered,
		v1alpha1.ConfigMapKeyHash:  pl.Hash,
	}
	if err := controllerutil.SetControllerReference(ep, desired, r.Scheme); err != nil {
		return fmt.Errorf("own ConfigMap %s: %w", name, err)
	}
	if current != nil && equality.Semantic.DeepEqual(current, desired) {
		return nil
	}
	if current == nil {
		if err := r.Client.Create(ctx, desired); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Someone else's, or ours and not yet in the cache: the
				// caller looks (applyUncached) before reporting anything.
				return err
			}
			r.event(ep, nil, corev1.EventTypeWarning, EventApplyFailed, "Render", "create ConfigMap %s: %v", name, err)
			return fmt.Errorf("create ConfigMap %s: %w", name, err)
		}
		r.event(ep, desired, corev1.EventTypeNormal, EventFlagsRendered, "Render",
			"created ConfigMap %s with flags %s", name, pl.Hash)
		return nil
	}
	if err := r.Client.Update(ctx, desired); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("update ConfigMap %s: %w", name, err) // the cache is behind; reconcile retries quietly
		}
		r.event(ep, desired, corev1.EventTypeWarning, EventApplyFailed, "Render", "update ConfigMap %s: %v", name, err)
		return fmt.Errorf("update ConfigMap %s: %w", name, err)
	}
	if oldHash != pl.Hash {
		r.event(ep, desired, corev1.EventTypeNormal, EventFlagsRendered, "Render",
			"flags changed %s -> %s; pods started earlier keep the old flags until restarted", oldHash, pl.Hash)
	}
	return nil
}

func (r *UrmaEndpointReconciler) setClamped(st *v1alpha1.UrmaEndpointStatus, ep *v1alpha1.UrmaEndpoint, pl plan.Plan) {
	if len(pl.Result.Clamps) == 0 {
		setCondition(st, ep, v1alpha1.ConditionClamped, false, v1alpha1.ReasonNoClamps, "every value is what the rules and overrides asked for")
		return
	}
	parts := make([]string, len(pl.Result.Clamps))
	for i, c := range pl.Result.Clamps {
		parts[i] = c.String()
	}
	msg := strings.Join(parts, "; ")
	if changed := setCondition(st, ep, v1alpha1.ConditionClamped, true, v1alpha1.ReasonValuesClamped, msg); changed {
		r.event(ep, nil, corev1.EventTypeWarning, EventClamped, "Tune", "%s", msg)
	}
}

func (r *UrmaEndpointReconciler) setDegraded(st *v1alpha1.UrmaEndpointStatus, ep *v1alpha1.UrmaEndpoint, pl plan.Plan) {
	if len(pl.Problems) == 0 {
		setCondition(st, ep, v1alpha1.ConditionDegraded, false, v1alpha1.ReasonAsExpected, "tuned against the device limits of every relevant node")
		return
	}
	msgs := make([]string, len(pl.Problems))
	for i, p := range pl.Problems {
		msgs[i] = p.Reason + ": " + p.Message
	}
	msg := strings.Join(msgs, "; ")
	if changed := setCondition(st, ep, v1alpha1.ConditionDegraded, true, pl.Problems[0].Reason, msg); changed {
		r.event(ep, nil, corev1.EventTypeWarning, EventDegraded, "Tune", "%s", msg)
	}
}

// MaxEventNote is the longest note the events.k8s.io API accepts; it
// refuses the whole event when the note is longer.
const MaxEventNote = 1024

// event records an event whose note is cut to MaxEventNote bytes: long
// clamp and degradation lists would otherwise lose the event altogether
// (the condition keeps the full message).
func (r *UrmaEndpointReconciler) event(regarding, related runtime.Object, eventtype, reason, action, format string, args ...any) {
	note := fmt.Sprintf(format, args...)
	if len(note) > MaxEventNote {
		const more = " ... (see the endpoint's conditions)"
		cut := MaxEventNote - len(more)
		for cut > 0 && !utf8.RuneStart(note[cut]) {
			cut--
		}
		note = note[:cut] + more
	}
	r.Recorder.Eventf(regarding, related, eventtype, reason, action, "%s", note)
}

// setCondition sets one condition and reports whether its status, reason or
// message changed (LastTransitionTime only moves when the status does).
func setCondition(st *v1alpha1.UrmaEndpointStatus, ep *v1alpha1.UrmaEndpoint, typ string, status bool, reason, msg string) bool {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	// The API limits a condition message to 32768 bytes.
	if len(msg) > 32000 {
		msg = msg[:32000] + " ..."
	}
	old := meta.FindStatusCondition(st.Conditions, typ)
	changed := old == nil || old.Status != s || old.Reason != reason || old.Message != msg
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: ep.Generation,
	})
	return changed
}

func effective(pl plan.Plan) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(pl.Rendered), "\n") {
		name, value, ok := strings.Cut(strings.TrimPrefix(line, "--"), "=")
		if ok {
			out[name] = value
		}
	}
	return out
}

func countPods(st *v1alpha1.UrmaEndpointStatus, pods []corev1.Pod) {
	st.MatchedPods, st.PodsOnCurrentFlags = int32(len(pods)), 0
	for _, p := range pods {
		if st.FlagsHash != "" && p.Annotations[v1alpha1.AnnotationFlagsHash] == st.FlagsHash {
			st.PodsOnCurrentFlags++
		}
	}
}

// writeStatus writes status only when it differs from what is stored, so a
// settled endpoint causes no writes (and so no further events).
func (r *UrmaEndpointReconciler) writeStatus(ctx context.Context, ep *v1alpha1.UrmaEndpoint, st v1alpha1.UrmaEndpointStatus) error {
	if equality.Semantic.DeepEqual(ep.Status, st) {
		return nil
	}
	ep = ep.DeepCopy()
	ep.Status = st
	if err := r.Client.Status().Update(ctx, ep); err != nil {
		return fmt.Errorf("update status: %w", err)
	}
	log.FromContext(ctx).V(1).Info("status updated", "hash", st.FlagsHash, "pods", st.MatchedPods, "current", st.PodsOnCurrentFlags)
	return nil
}

// SetupWithManager watches endpoints, their ConfigMaps, their pods and the
// nodes' device facts.
func (r *UrmaEndpointReconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.UrmaEndpoint{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.ConfigMap{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToEndpoint), builder.WithPredicates(podChanged())).
		Watches(nodeMetadata(), handler.EnqueueRequestsFromMapFunc(r.allEndpoints),
			builder.OnlyMetadata, builder.WithPredicates(nodeFactsChanged()))
	if r.Driver == plan.DriverDRA {
		// The DRA driver's facts are in its slices; a slice changes with
		// health and hot-plug, which is exactly what retunes endpoints.
		b = b.Owns(&resourceapi.ResourceClaimTemplate{}).
			Watches(&resourceapi.ResourceSlice{}, handler.EnqueueRequestsFromMapFunc(r.allEndpoints),
				builder.WithPredicates(ownDriverSlices()))
	}
	return b.Named("urmaendpoint").Complete(r)
}
