package controllers_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
	"github.com/openeuler/urma-k8s/internal/operator/tuning"
	"github.com/openeuler/urma-k8s/internal/podenv"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// expected derives what the operator should render for ep against facts.
func expected(t *testing.T, ep *v1alpha1.UrmaEndpoint, lim tuning.Limits) tuning.Result {
	t.Helper()
	r, err := tuning.Derive(plan.Profile(ep.Spec), plan.Overrides(ep.Spec), lim)
	if err != nil {
		t.Fatalf("derive expected flags: %v", err)
	}
	return r
}

func TestCreateRendersConfigMapAndStatus(t *testing.T) {
	ns := newNamespace(t)
	facts := hw(4096, 4096, 8192)
	node := newNode(t, "create", facts)
	create(t, newEndpoint(ns, "web", "create"))
	ep := settled(t, ns, "web", metav1.ConditionTrue)
	want := expected(t, ep, plan.LimitsFromFacts(*facts))

	cm := configMap(t, ns, "web")
	rendered := cm.Data[v1alpha1.ConfigMapKeyFlags]
	if rendered != want.Flags.Render() {
		t.Errorf("urma.flags:\n%s\nwant:\n%s", rendered, want.Flags.Render())
	}
	parsed, err := flags.Parse(strings.NewReader(rendered))
	if err != nil {
		t.Fatalf("rendered flags do not parse with pkg/transport/flags: %v", err)
	}
	// The file names every flag, so the parsed Flags also count each as
	// given (flags.Given); compare the values.
	if parsed.Render() != want.Flags.Render() {
		t.Errorf("parsed flags %+v, want %+v", parsed, want.Flags)
	}
	hash := plan.Hash(rendered)
	for what, got := range map[string]string{
		"data " + v1alpha1.ConfigMapKeyHash: cm.Data[v1alpha1.ConfigMapKeyHash],
		"ConfigMap annotation":              cm.Annotations[v1alpha1.AnnotationFlagsHash],
		"status.flagsHash":                  ep.Status.FlagsHash,
	} {
		if got != hash {
			t.Errorf("%s = %q, want %q", what, got, hash)
		}
	}
	if cm.Labels[controllers.LabelManagedBy] != controllers.ManagerName || cm.Labels[v1alpha1.LabelEndpoint] != "web" {
		t.Errorf("ConfigMap labels %v", cm.Labels)
	}
	if ep.Status.ConfigMapName != cm.Name {
		t.Errorf("status.configMapName %q, want %q", ep.Status.ConfigMapName, cm.Name)
	}
	if got := ep.Status.Effective["urma_sq_size"]; got != "35" {
		t.Errorf("status.effective.urma_sq_size = %q, want 35", got)
	}
	if len(ep.Status.Effective) != len(flags.Specs()) {
		t.Errorf("status.effective has %d flags, want all %d", len(ep.Status.Effective), len(flags.Specs()))
	}
	if ep.Status.LimitsSource != v1alpha1.LimitsFromNodes {
		t.Errorf("limitsSource %q, want NodeFacts", ep.Status.LimitsSource)
	}
	if g := ep.Status.NodeGroups; len(g) != 1 || g[0].NodeCount != 1 || len(g[0].Nodes) != 1 || g[0].Nodes[0] != node.Name {
		t.Errorf("nodeGroups %+v, want one group with %s", g, node.Name)
	}
	if ep.Status.JettyUnitsPerPod != 1 { // 8 jetties in units of 16
		t.Errorf("jettyUnitsPerPod %d, want 1", ep.Status.JettyUnitsPerPod)
	}
	if ep.Status.RegisteredBytesPerPod != want.RegisteredBytes {
		t.Errorf("registeredBytesPerPod %d, want %d", ep.Status.RegisteredBytesPerPod, want.RegisteredBytes)
	}
	for typ, st := range map[string]metav1.ConditionStatus{
		v1alpha1.ConditionReady: metav1.ConditionTrue, v1alpha1.ConditionClamped: metav1.ConditionFalse, v1alpha1.ConditionDegraded: metav1.ConditionFalse,
	} {
		if c := condition(t, ep, typ); c.Status != st {
			t.Errorf("%s = %s (%s: %s), want %s", typ, c.Status, c.Reason, c.Message, st)
		}
	}

	// The garbage collector (absent in envtest) deletes the ConfigMap with
	// its endpoint because of this reference.
	refs := cm.OwnerReferences
	if len(refs) != 1 {
		t.Fatalf("ownerReferences %+v, want one", refs)
	}
	ref := refs[0]
	if ref.UID != ep.UID || ref.Kind != "UrmaEndpoint" || ref.APIVersion != v1alpha1.GroupVersion.String() || ref.Name != ep.Name {
		t.Errorf("ownerReference %+v does not point at the endpoint (uid %s)", ref, ep.UID)
	}
	if ref.Controller == nil || !*ref.Controller || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("ownerReference controller=%v blockOwnerDeletion=%v, want both true", ref.Controller, ref.BlockOwnerDeletion)
	}

	eventually.Succeeds(t, "FlagsRendered event", 0, func() error {
		var evs eventsv1.EventList
		if err := env.c.List(ctx(), &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == controllers.EventFlagsRendered && e.Regarding.UID == ep.UID && strings.Contains(e.Note, hash) {
				return nil
			}
		}
		return fmt.Errorf("no %s event naming %s among %d events", controllers.EventFlagsRendered, hash, len(evs.Items))
	})
}

func TestUpdateRendersNewFlags(t *testing.T) {
	ns := newNamespace(t)
	facts := hw(4096, 4096, 8192)
	newNode(t, "update", facts)
	create(t, newEndpoint(ns, "api", "update"))
	before := settled(t, ns, "api", metav1.ConditionTrue)

	ep := before.DeepCopy()
	ep.Spec.Profile.Objective = v1alpha1.ObjectiveLatency
	if err := env.c.Update(ctx(), ep); err != nil {
		t.Fatal(err)
	}
	var after *v1alpha1.UrmaEndpoint
	eventually.Succeeds(t, "new flags for generation 2", 0, func() error {
		after = getEndpoint(t, ns, "api")
		if after.Status.ObservedGeneration != after.Generation || after.Status.FlagsHash == before.Status.FlagsHash {
			return fmt.Errorf("observedGeneration %d/%d hash %s", after.Status.ObservedGeneration, after.Generation, after.Status.FlagsHash)
		}
		return nil
	})
	want := expected(t, after, plan.LimitsFromFacts(*facts))
	cm := configMap(t, ns, "api")
	if cm.Data[v1alpha1.ConfigMapKeyFlags] != want.Flags.Render() {
		t.Errorf("ConfigMap not updated:\n%s", cm.Data[v1alpha1.ConfigMapKeyFlags])
	}
	if cm.Data[v1alpha1.ConfigMapKeyHash] != after.Status.FlagsHash {
		t.Errorf("ConfigMap hash %s, status %s", cm.Data[v1alpha1.ConfigMapKeyHash], after.Status.FlagsHash)
	}
	if after.Status.Effective["urma_use_polling"] != "true" {
		t.Errorf("Latency objective did not switch to polling: %v", after.Status.Effective)
	}
}

func TestConditions(t *testing.T) {
	cases := []struct {
		name       string
		nodes      []*nodefacts.Facts
		mutate     func(*v1alpha1.UrmaEndpoint)
		clamped    metav1.ConditionStatus
		clampedMsg string
		degraded   metav1.ConditionStatus
		reason     string
		reasonMsg  string
		source     v1alpha1.LimitsSource
		sq         string
		groups     int
		units      int64 // status.jettyUnitsPerPod, checked when set
	}{
		{
			name: "device depth clamps", nodes: []*nodefacts.Facts{hw(64, 4096, 8192)},
			mutate:  func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Profile.InflightPerConnection = 100 },
			clamped: metav1.ConditionTrue, clampedMsg: "urma_sq_size 103 -> 64 (device maxJfsDepth 64)",
			degraded: metav1.ConditionFalse, reason: v1alpha1.ReasonAsExpected, source: v1alpha1.LimitsFromNodes, sq: "64", groups: 1,
		},
		{
			name: "node groups differ", nodes: []*nodefacts.Facts{hw(4096, 4096, 8192), hw(256, 4096, 8192)},
			mutate:  func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Profile.InflightPerConnection = 1000 },
			clamped: metav1.ConditionTrue, clampedMsg: "urma_sq_size 1003 -> 256 (device maxJfsDepth 256)",
			degraded: metav1.ConditionTrue, reason: v1alpha1.ReasonNodeGroupsDiffer, reasonMsg: "2 node groups report different device limits",
			source: v1alpha1.LimitsFromNodes, sq: "256", groups: 2,
		},
		{
			name: "no node facts", nodes: nil,
			clamped: metav1.ConditionFalse, degraded: metav1.ConditionTrue, reason: v1alpha1.ReasonNoNodeFacts,
			reasonMsg: "software provider's limits", source: v1alpha1.LimitsSoftware, sq: "35", groups: 0,
		},
		{
			// Before any node publishes facts: the plugin's unit, not one
			// jetty per unit (8 jetties are 1 unit of 16, not 8 units).
			name: "no node facts yet - the plugins jetties per unit", nodes: nil,
			clamped: metav1.ConditionFalse, degraded: metav1.ConditionTrue, reason: v1alpha1.ReasonNoNodeFacts,
			reasonMsg: "no node facts yet", source: v1alpha1.LimitsSoftware, sq: "35", groups: 0, units: 1,
		},
		{
			name: "hardware warning", nodes: []*nodefacts.Facts{hw(4096, 4096, 8192)},
			mutate:  func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.JettyBudget = 5000 },
			clamped: metav1.ConditionFalse, degraded: metav1.ConditionTrue, reason: v1alpha1.ReasonHardwareWarnings,
			reasonMsg: "jettyBudget 5000 exceeds a node's jetties", source: v1alpha1.LimitsFromNodes, sq: "35", groups: 1,
		},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := newNamespace(t)
			group := fmt.Sprintf("conditions-%d", i)
			for _, f := range c.nodes {
				newNode(t, group, f)
			}
			ep := newEndpoint(ns, "ep", group)
			if c.mutate != nil {
				c.mutate(ep)
			}
			create(t, ep)
			got := settled(t, ns, "ep", metav1.ConditionTrue)
			cl := condition(t, got, v1alpha1.ConditionClamped)
			if cl.Status != c.clamped || !strings.Contains(cl.Message, c.clampedMsg) {
				t.Errorf("Clamped = %s %q, want %s containing %q", cl.Status, cl.Message, c.clamped, c.clampedMsg)
			}
			dg := condition(t, got, v1alpha1.ConditionDegraded)
			if dg.Status != c.degraded || dg.Reason != c.reason || !strings.Contains(dg.Message, c.reasonMsg) {
				t.Errorf("Degraded = %s %s %q, want %s %s containing %q", dg.Status, dg.Reason, dg.Message, c.degraded, c.reason, c.reasonMsg)
			}
			if got.Status.LimitsSource != c.source {
				t.Errorf("limitsSource %s, want %s", got.Status.LimitsSource, c.source)
			}
			if got.Status.Effective["urma_sq_size"] != c.sq {
				t.Errorf("urma_sq_size %s, want %s", got.Status.Effective["urma_sq_size"], c.sq)
			}
			if len(got.Status.NodeGroups) != c.groups {
				t.Errorf("nodeGroups %+v, want %d groups", got.Status.NodeGroups, c.groups)
			}
			if c.units != 0 && got.Status.JettyUnitsPerPod != c.units {
				t.Errorf("jettyUnitsPerPod %d, want %d", got.Status.JettyUnitsPerPod, c.units)
			}
		})
	}
}

func TestEmptyNodeReadKeepsLastLimits(t *testing.T) {
	ns := newNamespace(t)
	node := newNode(t, "transient", hw(64, 4096, 8192))
	ep := newEndpoint(ns, "keep", "transient")
	ep.Spec.Profile.InflightPerConnection = 100
	create(t, ep)
	before := settled(t, ns, "keep", metav1.ConditionTrue)
	cmBefore := configMap(t, ns, "keep")

	// The device plugin's annotations vanish (plugin restarting, node
	// relabelled): nothing is reset to other limits.
	n := node.DeepCopy()
	if err := env.c.Get(ctx(), client.ObjectKeyFromObject(node), n); err != nil {
		t.Fatal(err)
	}
	n.Annotations = nil
	if err := env.c.Update(ctx(), n); err != nil {
		t.Fatal(err)
	}
	eventually.Succeeds(t, "NoNodeFacts with last known limits", 0, func() error {
		got := getEndpoint(t, ns, "keep")
		if got.Status.LimitsSource != v1alpha1.LimitsLastKnown {
			return fmt.Errorf("limitsSource %s", got.Status.LimitsSource)
		}
		return nil
	})
	got := getEndpoint(t, ns, "keep")
	if dg := condition(t, got, v1alpha1.ConditionDegraded); dg.Reason != v1alpha1.ReasonNoNodeFacts {
		t.Errorf("Degraded reason %s, want NoNodeFacts", dg.Reason)
	}
	if got.Status.FlagsHash != before.Status.FlagsHash {
		t.Errorf("flags changed on an empty node read: %s -> %s", before.Status.FlagsHash, got.Status.FlagsHash)
	}
	if cm := configMap(t, ns, "keep"); cm.ResourceVersion != cmBefore.ResourceVersion {
		t.Errorf("ConfigMap rewritten on an empty node read (resourceVersion %s -> %s)", cmBefore.ResourceVersion, cm.ResourceVersion)
	}

	// A spec change while no node reports facts still tunes against the
	// kept limits (queue depth stays clamped to 64).
	got.Spec.Profile.Objective = v1alpha1.ObjectiveThroughput
	if err := env.c.Update(ctx(), got); err != nil {
		t.Fatal(err)
	}
	eventually.Succeeds(t, "throughput flags with kept limits", 0, func() error {
		e := getEndpoint(t, ns, "keep")
		if e.Status.ObservedGeneration != e.Generation || e.Status.Effective["urma_buffer_size"] != "65536" {
			return fmt.Errorf("generation %d/%d buffer %s", e.Status.ObservedGeneration, e.Generation, e.Status.Effective["urma_buffer_size"])
		}
		if e.Status.Effective["urma_sq_size"] != "64" {
			return fmt.Errorf("urma_sq_size %s, want 64 (kept limit)", e.Status.Effective["urma_sq_size"])
		}
		return nil
	})
}

func TestPodInjectionAndCounting(t *testing.T) {
	ns := newNamespace(t)
	newNode(t, "pods", hw(4096, 4096, 8192)) // 16 jetties per unit
	ep := newEndpoint(ns, "svc", "pods")
	ep.Spec.JettyBudget = 40 // 3 units
	create(t, ep)
	h1 := settled(t, ns, "svc", metav1.ConditionTrue).Status.FlagsHash
	wc, warn := warnClient(t)

	pod := func(name, endpoint string, mutate func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}, {Name: "sidecar", Image: "example.invalid/side"}}},
		}
		if endpoint != "" {
			p.Labels = map[string]string{v1alpha1.LabelEndpoint: endpoint}
		}
		if mutate != nil {
			mutate(p)
		}
		if err := wc.Create(ctx(), p); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		return p
	}

	p1 := pod("p1", "svc", nil)
	if got := p1.Annotations[v1alpha1.AnnotationFlagsHash]; got != h1 {
		t.Errorf("flags-hash annotation %q, want %q", got, h1)
	}
	var vol *corev1.Volume
	for i := range p1.Spec.Volumes {
		if p1.Spec.Volumes[i].Name == "urma-flags" {
			vol = &p1.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != v1alpha1.ConfigMapName("svc") {
		t.Errorf("volume urma-flags from ConfigMap %s missing: %+v", v1alpha1.ConfigMapName("svc"), p1.Spec.Volumes)
	}
	for _, c := range p1.Spec.Containers {
		mounted := false
		for _, m := range c.VolumeMounts {
			mounted = mounted || (m.Name == "urma-flags" && m.MountPath == "/etc/urma" && m.ReadOnly)
		}
		if !mounted {
			t.Errorf("container %s: no read-only mount at /etc/urma: %+v", c.Name, c.VolumeMounts)
		}
		env := ""
		for _, e := range c.Env {
			if e.Name == podenv.FlagsFile {
				env = e.Value
			}
		}
		if env != "/etc/urma/urma.flags" {
			t.Errorf("container %s: URMA_FLAGS_FILE=%q, want /etc/urma/urma.flags", c.Name, env)
		}
	}
	want := resource.MustParse("3")
	app := p1.Spec.Containers[0].Resources
	if q := app.Requests[nodefacts.ResourceName]; q.Cmp(want) != 0 {
		t.Errorf("jetty request %s, want 3 units", q.String())
	}
	if q := app.Limits[nodefacts.ResourceName]; q.Cmp(want) != 0 {
		t.Errorf("jetty limit %s, want 3 units", q.String())
	}
	// Kubelet allocates devices per container: without spec.containers
	// every container gets its own request.
	if q := p1.Spec.Containers[1].Resources.Requests[nodefacts.ResourceName]; q.Cmp(want) != 0 {
		t.Errorf("second container's jetty request %s, want its own 3 units", q.String())
	}

	// A container that asks for jetties itself keeps its request; the
	// others still get theirs.
	p2 := pod("p2", "svc", func(p *corev1.Pod) {
		one := resource.MustParse("1")
		p.Spec.Containers[1].Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{nodefacts.ResourceName: one}, Limits: corev1.ResourceList{nodefacts.ResourceName: one}}
	})
	if q := p2.Spec.Containers[0].Resources.Requests[nodefacts.ResourceName]; q.Cmp(want) != 0 {
		t.Errorf("first container's jetty request %s, want 3 units", q.String())
	}
	if q := p2.Spec.Containers[1].Resources.Requests[nodefacts.ResourceName]; q.String() != "1" {
		t.Errorf("container's own jetty request changed to %s", q.String())
	}

	// Unlabelled pods never reach the webhook (objectSelector).
	plain := pod("plain", "", nil)
	if len(plain.Spec.Volumes) != 0 || plain.Annotations[v1alpha1.AnnotationFlagsHash] != "" {
		t.Errorf("unlabelled pod was mutated: %+v", plain)
	}

	// An unknown endpoint is allowed, with a warning, and left alone.
	warn.take()
	stray := pod("stray", "nope", nil)
	if len(stray.Spec.Volumes) != 0 {
		t.Errorf("pod naming a missing endpoint was mutated: %+v", stray.Spec.Volumes)
	}
	if !warn.contain("UrmaEndpoint " + ns + "/nope") {
		t.Errorf("no warning about the missing endpoint: %q", warn.take())
	}

	counts := func(matched, current int32) func() error {
		return func() error {
			e := getEndpoint(t, ns, "svc")
			if e.Status.MatchedPods != matched || e.Status.PodsOnCurrentFlags != current {
				return fmt.Errorf("matchedPods %d podsOnCurrentFlags %d, want %d %d", e.Status.MatchedPods, e.Status.PodsOnCurrentFlags, matched, current)
			}
			return nil
		}
	}
	eventually.Succeeds(t, "both pods counted on current flags", 0, counts(2, 2))

	// spec.containers: only the named containers use URMA.
	updateEndpoint(t, ns, "svc", func(e *v1alpha1.UrmaEndpoint) { e.Spec.Containers = []string{"sidecar", "missing"} })
	eventually.Succeeds(t, "spec.containers in the webhook's cache", 0, func() error {
		var cached v1alpha1.UrmaEndpoint
		if err := env.cache.Get(ctx(), client.ObjectKey{Namespace: ns, Name: "svc"}, &cached); err != nil {
			return err
		}
		if len(cached.Spec.Containers) != 2 {
			return fmt.Errorf("cached containers %v", cached.Spec.Containers)
		}
		return nil
	})
	warn.take()
	named := pod("named", "svc", nil)
	if _, ok := named.Spec.Containers[0].Resources.Requests[nodefacts.ResourceName]; ok || len(named.Spec.Containers[0].VolumeMounts) != 0 {
		t.Errorf("container app is not in spec.containers but got %+v / %+v", named.Spec.Containers[0].Resources, named.Spec.Containers[0].VolumeMounts)
	}
	if q := named.Spec.Containers[1].Resources.Requests[nodefacts.ResourceName]; q.Cmp(want) != 0 || len(named.Spec.Containers[1].VolumeMounts) != 1 {
		t.Errorf("sidecar is in spec.containers but got request %s, mounts %+v", q.String(), named.Spec.Containers[1].VolumeMounts)
	}
	if !warn.contain("names containers this pod does not have: missing") {
		t.Errorf("no warning about the container the pod lacks: %q", warn.take())
	}
	if err := env.c.Delete(ctx(), named); err != nil {
		t.Fatal(err)
	}
	updateEndpoint(t, ns, "svc", func(e *v1alpha1.UrmaEndpoint) { e.Spec.Containers = nil })
	eventually.Succeeds(t, "pods counted again without the deleted one", 0, counts(2, 2))

	// New flags: the running pods are now on old flags; a new pod is current.
	updateEndpoint(t, ns, "svc", func(e *v1alpha1.UrmaEndpoint) { e.Spec.Profile.MessageSize = resource.MustParse("64Ki") })
	eventually.Succeeds(t, "pods on old flags after a change", 0, counts(2, 0))
	p3 := pod("p3", "svc", nil)
	if h := p3.Annotations[v1alpha1.AnnotationFlagsHash]; h == h1 || h != getEndpoint(t, ns, "svc").Status.FlagsHash {
		t.Errorf("new pod stamped %s; old hash %s, current %s", h, h1, getEndpoint(t, ns, "svc").Status.FlagsHash)
	}
	eventually.Succeeds(t, "new pod counted on current flags", 0, counts(3, 1))

	// Finished pods are not counted.
	p1.Status.Phase = corev1.PodSucceeded
	if err := env.c.Status().Update(ctx(), p1); err != nil {
		t.Fatal(err)
	}
	eventually.Succeeds(t, "finished pod dropped", 0, counts(2, 1))
}

// An endpoint and its Deployment applied in one file: the pod's admission
// may come before the endpoint reaches the webhook's cache. The webhook
// reads it from the API server then, so the pod gets its flags. Here the
// cache is usually quick enough anyway; internal/operator/webhook's
// TestPodInjectorHandle makes the miss certain with a stale cache.
func TestEndpointCreatedJustBeforeItsPod(t *testing.T) {
	ns := newNamespace(t)
	wc, _ := warnClient(t)
	for i := range 5 {
		name := fmt.Sprintf("fresh-%d", i)
		create(t, newEndpoint(ns, name, "fresh"))
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LabelEndpoint: name}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
		}
		if err := wc.Create(ctx(), p); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		if len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].ConfigMap == nil || p.Spec.Volumes[0].ConfigMap.Name != v1alpha1.ConfigMapName(name) {
			t.Errorf("pod %s created right after its endpoint has no flags volume: %+v", name, p.Spec.Volumes)
		}
		if _, ok := p.Spec.Containers[0].Resources.Requests[nodefacts.ResourceName]; !ok {
			t.Errorf("pod %s created right after its endpoint has no jetty request", name)
		}
	}
}

func TestInvalidEndpointsRejectedByAPIServer(t *testing.T) {
	ns := newNamespace(t)
	sq, _ := flags.Lookup("urma_sq_size")
	buf, _ := flags.Lookup("urma_buffer_size")
	q := resource.MustParse
	cases := []struct {
		name   string
		mutate func(*v1alpha1.UrmaEndpoint)
		want   string // empty: accepted
	}{
		{"sq below range", override("urma_sq_size", fmt.Sprint(sq.Min-1)), "spec.overrides.urma_sq_size must be an integer from 16 to 4096"},
		{"sq above range", override("urma_sq_size", fmt.Sprint(sq.Max+1)), "spec.overrides.urma_sq_size must be an integer from 16 to 4096"},
		{"sq not a number", override("urma_sq_size", "lots"), "spec.overrides.urma_sq_size must be an integer"},
		{"sq at minimum", override("urma_sq_size", fmt.Sprint(sq.Min)), ""},
		{"sq at maximum", override("urma_sq_size", fmt.Sprint(sq.Max)), ""},
		{"rq below range", override("urma_rq_size", "8"), "spec.overrides.urma_rq_size must be an integer from 16 to 4096"},
		{"rq above range", override("urma_rq_size", "5000"), "spec.overrides.urma_rq_size must be an integer from 16 to 4096"},
		{"buffer under 1024", override("urma_buffer_size", "512"), "spec.overrides.urma_buffer_size must be a power of two from 1024"},
		{"buffer not a power of two", override("urma_buffer_size", "3000"), "spec.overrides.urma_buffer_size must be a power of two"},
		{"buffer above range", override("urma_buffer_size", fmt.Sprint(buf.Max*2)), "spec.overrides.urma_buffer_size must be a power of two"},
		{"buffer at minimum", override("urma_buffer_size", fmt.Sprint(buf.Min)), ""},
		{"buffer at maximum", override("urma_buffer_size", fmt.Sprint(buf.Max)), ""},
		{"unknown flag", override("urma_turbo", "1"), "spec.overrides: unknown flag; the known flags are urma_bonding_level"},
		// One --flag=value per line: a newline would add flags of its own.
		{"value with a newline", override("urma_device", "udma0\n--urma_sq_size=99999"), "must be one word: no newline, other whitespace or control characters"},
		{"value with a space", override("urma_device", "udma 0"), "must be one word"},
		{"value with a control character", override("urma_device", "udma0\x1b"), "must be one word"},
		{"value with a no-break space", override("urma_device", "udma\u00a00"), "must be one word"},
		{"device name", override("urma_device", "bonding_dev_0"), ""},
		{"flag out of range without a CEL rule (validating webhook)", override("urma_poller_num", "100"), "urma_poller_num: 100 is out of range"},
		{"message above max message", func(ep *v1alpha1.UrmaEndpoint) {
			m := q("4Ki")
			ep.Spec.Profile.MessageSize, ep.Spec.Profile.MaxMessageSize = q("8Ki"), &m
		}, "spec.profile.messageSize must not exceed spec.profile.maxMessageSize"},
		{"message equal to max message", func(ep *v1alpha1.UrmaEndpoint) { m := q("4Ki"); ep.Spec.Profile.MaxMessageSize = &m }, ""},
		{"zero message", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Profile.MessageSize = q("0") }, "spec.profile.messageSize must be positive"},
		{"message above 1Ti", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Profile.MessageSize = q("2Ti") }, "spec.profile.messageSize must be at most 1Ti"},
		{"tiny memory budget", func(ep *v1alpha1.UrmaEndpoint) { m := q("1Ki"); ep.Spec.Profile.MemoryBudget = &m }, "spec.profile.memoryBudget must be at least 16Ki"},
		// Past int64 a quantity has no int64 value: it would read as no cap.
		{"memory budget past int64", func(ep *v1alpha1.UrmaEndpoint) { m := q("100E"); ep.Spec.Profile.MemoryBudget = &m }, "spec.profile.memoryBudget must be at most 1Ei"},
		{"memory budget above 1Ei", func(ep *v1alpha1.UrmaEndpoint) { m := q("1025Pi"); ep.Spec.Profile.MemoryBudget = &m }, "spec.profile.memoryBudget must be at most 1Ei"},
		{"memory budget at 1Ei", func(ep *v1alpha1.UrmaEndpoint) { m := q("1Ei"); ep.Spec.Profile.MemoryBudget = &m }, ""},
		{"unknown objective", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Profile.Objective = "Fast" }, `spec.profile.objective: Unsupported value: "Fast"`},
		{"unknown completion", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Completion = "Busy" }, `spec.completion: Unsupported value: "Busy"`},
		{"unknown bonding mode", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Bonding = &v1alpha1.Bonding{Mode: "Wild"} }, `spec.bonding.mode: Unsupported value: "Wild"`},
		{"unknown bonding level", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Bonding = &v1alpha1.Bonding{Level: "Rack"} }, `spec.bonding.level: Unsupported value: "Rack"`},
		{"unknown handshake", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.HandshakeVersion = 4 }, "spec.handshakeVersion: Unsupported value: 4"},
		{"inflight beyond any queue", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.Profile.InflightPerConnection = 4094 }, "spec.profile.inflightPerConnection"},
		{"no jetties", func(ep *v1alpha1.UrmaEndpoint) { ep.Spec.JettyBudget = 0 }, "spec.jettyBudget"},
		{"name too long for a label", func(ep *v1alpha1.UrmaEndpoint) { ep.Name = strings.Repeat("a", 64) }, "metadata.name must be at most 63 characters"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ep := newEndpoint(ns, fmt.Sprintf("case-%d", i), "invalid")
			c.mutate(ep)
			err := env.c.Create(ctx(), ep)
			if c.want == "" {
				if err != nil {
					t.Fatalf("valid endpoint rejected: %v", err)
				}
				_ = env.c.Delete(ctx(), ep)
				return
			}
			if err == nil {
				_ = env.c.Delete(ctx(), ep)
				t.Fatalf("accepted; want rejection containing %q", c.want)
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) && !apierrors.IsBadRequest(err) {
				t.Errorf("error is not a validation error: %v", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

// TestEveryFlagNameAccepted keeps the CRD's list of override names in step
// with pkg/transport/flags: every flag, at its default, is accepted.
func TestEveryFlagNameAccepted(t *testing.T) {
	ns := newNamespace(t)
	ep := newEndpoint(ns, "all-flags", "none")
	ep.Spec.Overrides = map[string]v1alpha1.FlagValue{}
	for _, s := range flags.Specs() {
		ep.Spec.Overrides[s.Name] = v1alpha1.FlagValue(s.Default)
	}
	if err := env.c.Create(ctx(), ep); err != nil {
		t.Fatalf("an endpoint overriding every flag with its default was rejected: %v", err)
	}
	t.Cleanup(func() { _ = env.c.Delete(ctx(), ep) })
}

func override(name, value string) func(*v1alpha1.UrmaEndpoint) {
	return func(ep *v1alpha1.UrmaEndpoint) {
		ep.Spec.Overrides = map[string]v1alpha1.FlagValue{name: v1alpha1.FlagValue(value)}
	}
}

func TestValidatingWebhookWarnsAboutClamps(t *testing.T) {
	ns := newNamespace(t)
	newNode(t, "warn", hw(64, 4096, 8192))
	wc, warn := warnClient(t)
	ep := newEndpoint(ns, "warned", "warn")
	ep.Spec.Profile.InflightPerConnection = 100
	if err := wc.Create(ctx(), ep); err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = env.c.Delete(ctx(), ep) })
	if !warn.contain("clamped: urma_sq_size 103 -> 64 (device maxJfsDepth 64)") {
		t.Errorf("no clamp warning at admission; warnings: %q", warn.take())
	}
}

func TestDeleteLeavesOwnedConfigMapToTheGarbageCollector(t *testing.T) {
	ns := newNamespace(t)
	create(t, newEndpoint(ns, "gone", "none"))
	ep := settled(t, ns, "gone", metav1.ConditionTrue)
	cm := configMap(t, ns, "gone")
	if !metav1.IsControlledBy(cm, ep) {
		t.Fatalf("ConfigMap not controlled by the endpoint: %+v", cm.OwnerReferences)
	}
	if err := env.c.Delete(ctx(), ep); err != nil {
		t.Fatal(err)
	}
	eventually.Succeeds(t, "endpoint deleted", 0, func() error {
		err := env.c.Get(ctx(), client.ObjectKeyFromObject(ep), &v1alpha1.UrmaEndpoint{})
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %w", err)
	})
	// The operator itself deletes nothing (no finalizer); envtest has no
	// garbage collector, so the ConfigMap is still here with its reference.
	if got := configMap(t, ns, "gone"); len(got.OwnerReferences) != 1 || got.OwnerReferences[0].UID != ep.UID {
		t.Errorf("ownerReference changed after delete: %+v", got.OwnerReferences)
	}
}

func TestEditedConfigMapIsRestored(t *testing.T) {
	ns := newNamespace(t)
	create(t, newEndpoint(ns, "restore", "none"))
	ep := settled(t, ns, "restore", metav1.ConditionTrue)
	cm := configMap(t, ns, "restore")
	cm.Data[v1alpha1.ConfigMapKeyFlags] = "--urma_sq_size=16\n"
	if err := env.c.Update(ctx(), cm); err != nil {
		t.Fatal(err)
	}
	eventually.Succeeds(t, "ConfigMap restored", 0, func() error {
		got := configMap(t, ns, "restore")
		if plan.Hash(got.Data[v1alpha1.ConfigMapKeyFlags]) != ep.Status.FlagsHash {
			return errors.New("still edited")
		}
		return nil
	})
}

func TestForeignConfigMapIsNotTouched(t *testing.T) {
	ns := newNamespace(t)
	foreign := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.ConfigMapName("taken")},
		Data:       map[string]string{"mine": "yes"},
	}
	if err := env.c.Create(ctx(), foreign); err != nil {
		t.Fatal(err)
	}
	create(t, newEndpoint(ns, "taken", "none"))
	ep := settled(t, ns, "taken", metav1.ConditionFalse)
	if c := condition(t, ep, v1alpha1.ConditionReady); c.Reason != v1alpha1.ReasonConfigMapConflict {
		t.Errorf("Ready reason %s (%s), want ConfigMapConflict", c.Reason, c.Message)
	}
	var got corev1.ConfigMap
	if err := env.c.Get(ctx(), client.ObjectKeyFromObject(foreign), &got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != foreign.ResourceVersion || len(got.OwnerReferences) != 0 {
		t.Errorf("foreign ConfigMap was modified: %+v", got)
	}
}

// A settled endpoint that sees an event changing nothing for it writes
// nothing and asks for no further reconcile: with neither a write (whose
// watch event would start another) nor a requeue, nothing runs it again.
// Only this endpoint's reconciles count; other tests' endpoints may be busy.
func TestSettledEndpointCausesNoWrites(t *testing.T) {
	ns := newNamespace(t)
	node := newNode(t, "settle", hw(4096, 4096, 8192))
	create(t, newEndpoint(ns, "quiet", "settle"))
	settled(t, ns, "quiet", metav1.ConditionTrue)
	key := types.NamespacedName{Namespace: ns, Name: "quiet"}

	// Let the reconciles that creation caused (its own status write, the
	// ConfigMap event) finish first, so the reconcile awaited below is most
	// likely the node's. Had one not finished, it is still checked: a
	// settled endpoint must write nothing, whatever woke it.
	waitReconcilesQuiet(t, key)
	ep := getEndpoint(t, ns, "quiet")
	cm := configMap(t, ns, "quiet")
	before := len(env.reconciles.of(key))

	// An event that changes nothing for the endpoint: a node label.
	n := &corev1.Node{}
	if err := env.c.Get(ctx(), client.ObjectKeyFromObject(node), n); err != nil {
		t.Fatal(err)
	}
	n.Labels["urma-test/touched"] = "yes"
	if err := env.c.Update(ctx(), n); err != nil {
		t.Fatal(err)
	}
	var after []reconcileOutcome
	eventually.Succeeds(t, "node change reconciled", 0, func() error {
		if after = env.reconciles.of(key)[before:]; len(after) == 0 {
			return errors.New("no reconcile finished yet")
		}
		return nil
	})
	// The reconcile has returned, so whatever it wrote is visible now.
	if got := getEndpoint(t, ns, "quiet"); got.ResourceVersion != ep.ResourceVersion {
		t.Errorf("endpoint written (resourceVersion %s -> %s)", ep.ResourceVersion, got.ResourceVersion)
	}
	if got := configMap(t, ns, "quiet"); got.ResourceVersion != cm.ResourceVersion {
		t.Errorf("ConfigMap written (resourceVersion %s -> %s)", cm.ResourceVersion, got.ResourceVersion)
	}
	for i, o := range after {
		if o.err != nil || o.result != (ctrl.Result{}) {
			t.Errorf("reconcile %d after the node change returned %+v, %v; want no requeue and no error", i+1, o.result, o.err)
		}
	}
}

// waitReconcilesQuiet waits until no reconcile of the endpoint has finished
// for half a second.
func waitReconcilesQuiet(t *testing.T, key types.NamespacedName) {
	t.Helper()
	last, since := len(env.reconciles.of(key)), time.Now()
	eventually.Succeeds(t, "reconciles drained", 0, func() error {
		if now := len(env.reconciles.of(key)); now != last {
			last, since = now, time.Now()
		}
		if time.Since(since) < 500*time.Millisecond {
			return errors.New("reconciles still running")
		}
		return nil
	})
}

// TestExamplesAreAccepted creates every examples/urmaendpoint-*.yaml and
// waits for it to render.
func TestExamplesAreAccepted(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "examples", "urmaendpoint-*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("examples: %v %v", files, err)
	}
	ns := newNamespace(t)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var ep v1alpha1.UrmaEndpoint
			if err := yaml.UnmarshalStrict(raw, &ep); err != nil {
				t.Fatalf("decode: %v", err)
			}
			ep.Namespace = ns
			create(t, &ep)
			got := settled(t, ns, ep.Name, metav1.ConditionTrue)
			if got.Status.FlagsHash == "" || got.Status.Effective["urma_buffer_size"] == "" {
				t.Errorf("example rendered nothing: %+v", got.Status)
			}
		})
	}
}

// TestAssumedLimitsAreNotKept: limits assumed without node facts are not
// recorded, so later renders still say Software, never LastKnown.
func TestAssumedLimitsAreNotKept(t *testing.T) {
	ns := newNamespace(t)
	create(t, newEndpoint(ns, "soft", "nobody"))
	ep := settled(t, ns, "soft", metav1.ConditionTrue)
	ep.Spec.Profile.InflightPerConnection = 64
	if err := env.c.Update(ctx(), ep); err != nil {
		t.Fatal(err)
	}
	eventually.Succeeds(t, "generation 2 rendered", 0, func() error {
		got := getEndpoint(t, ns, "soft")
		if got.Status.ObservedGeneration != got.Generation || got.Status.Effective["urma_sq_size"] != "67" {
			return fmt.Errorf("generation %d/%d sq %s", got.Status.ObservedGeneration, got.Generation, got.Status.Effective["urma_sq_size"])
		}
		if got.Status.LimitsSource != v1alpha1.LimitsSoftware {
			return fmt.Errorf("limitsSource %s, want Software", got.Status.LimitsSource)
		}
		return nil
	})
	if _, ok := configMap(t, ns, "soft").Annotations[v1alpha1.AnnotationDeviceLimits]; ok {
		t.Error("assumed software limits were recorded as last known")
	}
}
