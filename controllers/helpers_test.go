package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

func ctx() context.Context { return context.Background() }

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "urma-test-"}}
	if err := env.c.Create(ctx(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// hw is a hardware node's facts; the arguments are the queue depth limits.
func hw(jfs, jfr, jfc uint32) *nodefacts.Facts {
	return &nodefacts.Facts{DeviceCount: 2, MaxJFSDepth: jfs, MaxJFRDepth: jfr, MaxJFCDepth: jfc,
		MaxMsgSize: 1 << 31, JettiesPerDevice: 1024, JettiesPerUnit: 16}
}

// newNode creates a node labelled group=<group> with the facts (nil: no
// URMA annotations) and deletes it when the test ends.
func newNode(t *testing.T, group string, facts *nodefacts.Facts) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "node-", Labels: map[string]string{"urma-test/group": group}}}
	if facts != nil {
		n.Annotations = facts.Annotations()
	}
	if err := env.c.Create(ctx(), n); err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() { _ = env.c.Delete(ctx(), n) })
	waitCached(t, n)
	return n
}

// waitCached waits until the operator's cache holds this version of the
// node, so that what the test does next sees it as the operator will.
func waitCached(t *testing.T, n *corev1.Node) {
	t.Helper()
	eventually.Succeeds(t, "node "+n.Name+" in the operator's cache", 0, func() error {
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
		if err := env.cache.Get(ctx(), client.ObjectKeyFromObject(n), m); err != nil {
			return err
		}
		if m.ResourceVersion != n.ResourceVersion {
			return fmt.Errorf("cache has resourceVersion %s, want %s", m.ResourceVersion, n.ResourceVersion)
		}
		return nil
	})
}

// newEndpoint returns a Balanced endpoint tuned against nodes of group.
func newEndpoint(ns, name, group string) *v1alpha1.UrmaEndpoint {
	return &v1alpha1.UrmaEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.UrmaEndpointSpec{
			NodeSelector: map[string]string{"urma-test/group": group},
			JettyBudget:  8,
			Profile: v1alpha1.TrafficProfile{
				MessageSize:           resource.MustParse("4Ki"),
				ConnectionsPerPod:     4,
				InflightPerConnection: 32,
				Objective:             v1alpha1.ObjectiveBalanced,
			},
		},
	}
}

func create(t *testing.T, ep *v1alpha1.UrmaEndpoint) {
	t.Helper()
	if err := env.c.Create(ctx(), ep); err != nil {
		t.Fatalf("create endpoint %s/%s: %v", ep.Namespace, ep.Name, err)
	}
	t.Cleanup(func() { _ = env.c.Delete(ctx(), ep) })
}

// updateEndpoint changes an endpoint's spec, retrying when the operator's
// status write got in between.
func updateEndpoint(t *testing.T, ns, name string, mutate func(*v1alpha1.UrmaEndpoint)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		e := getEndpoint(t, ns, name)
		mutate(e)
		return env.c.Update(ctx(), e)
	})
	if err != nil {
		t.Fatalf("update endpoint %s/%s: %v", ns, name, err)
	}
}

func getEndpoint(t *testing.T, ns, name string) *v1alpha1.UrmaEndpoint {
	t.Helper()
	var ep v1alpha1.UrmaEndpoint
	if err := env.c.Get(ctx(), client.ObjectKey{Namespace: ns, Name: name}, &ep); err != nil {
		t.Fatalf("get endpoint: %v", err)
	}
	return &ep
}

// settled waits until status describes the current generation with the
// given Ready status, then returns the endpoint.
func settled(t *testing.T, ns, name string, ready metav1.ConditionStatus) *v1alpha1.UrmaEndpoint {
	t.Helper()
	var ep v1alpha1.UrmaEndpoint
	eventually.Succeeds(t, "endpoint "+name+" reconciled", 0, func() error {
		if err := env.c.Get(ctx(), client.ObjectKey{Namespace: ns, Name: name}, &ep); err != nil {
			return err
		}
		if ep.Status.ObservedGeneration != ep.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", ep.Status.ObservedGeneration, ep.Generation)
		}
		c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != ready {
			return fmt.Errorf("Ready condition %+v, want status %s", c, ready)
		}
		return nil
	})
	return &ep
}

func configMap(t *testing.T, ns, endpoint string) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	if err := env.c.Get(ctx(), client.ObjectKey{Namespace: ns, Name: v1alpha1.ConfigMapName(endpoint)}, &cm); err != nil {
		t.Fatalf("get ConfigMap: %v", err)
	}
	return &cm
}

func condition(t *testing.T, ep *v1alpha1.UrmaEndpoint, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(ep.Status.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, ep.Status.Conditions)
	}
	if c.ObservedGeneration != ep.Generation {
		t.Errorf("%s condition observedGeneration %d, want %d", typ, c.ObservedGeneration, ep.Generation)
	}
	return *c
}

// warnings collects the API server's warning headers for one client.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

func (w *warnings) contain(sub string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// warnClient is a direct client whose warnings land in the returned list.
func warnClient(t *testing.T) (client.Client, *warnings) {
	t.Helper()
	w := &warnings{}
	cfg := rest.CopyConfig(env.cfg)
	cfg.WarningHandler = nil
	cfg.WarningHandlerWithContext = w
	c, err := client.New(cfg, client.Options{Scheme: env.scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
