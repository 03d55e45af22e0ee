package plan

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/dra/dratest"
	draslices "github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// cacheReader serves objects the way controller-runtime's informer cache
// does (pkg/cache/internal/cache_reader.go): List deep-copies each stored
// object unless client.UnsafeDisableDeepCopy is passed, in which case the
// items are shallow copies sharing maps, slices and pointers with the
// store; Get always deep-copies. The fake client cannot stand in for it:
// it round-trips every List through JSON and ignores the option.
type cacheReader struct {
	scheme *runtime.Scheme
	// objs by item kind (a Node is kept as metadata, as the operator's
	// cache keeps it).
	objs map[schema.GroupVersionKind][]client.Object
	// listed records the options of each List, by list kind.
	listed map[string][]client.ListOptions
	// copyAlways deep-copies even when asked not to: what every List
	// cost before Observe asked (the benchmark's baseline).
	copyAlways bool
}

func newCacheReader(tb testing.TB, objs ...client.Object) *cacheReader {
	tb.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		tb.Fatal(err)
	}
	r := &cacheReader{scheme: s, objs: map[schema.GroupVersionKind][]client.Object{}, listed: map[string][]client.ListOptions{}}
	for _, o := range objs {
		gvk, err := apiutil.GVKForObject(o, s)
		if err != nil {
			tb.Fatal(err)
		}
		r.objs[gvk] = append(r.objs[gvk], o)
	}
	return r
}

func (r *cacheReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	gvk, err := apiutil.GVKForObject(obj, r.scheme)
	if err != nil {
		return fmt.Errorf("get %s: %w", key, err)
	}
	for _, o := range r.objs[gvk] {
		if client.ObjectKeyFromObject(o) == key {
			reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(o.DeepCopyObject()).Elem())
			return nil
		}
	}
	return apierrors.NewNotFound(schema.GroupResource{Resource: strings.ToLower(gvk.Kind) + "s"}, key.Name)
}

func (r *cacheReader) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	gvk, err := apiutil.GVKForObject(list, r.scheme)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	r.listed[gvk.Kind] = append(r.listed[gvk.Kind], *lo)
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	var out []runtime.Object
	for _, o := range r.objs[gvk] {
		if lo.Namespace != "" && o.GetNamespace() != lo.Namespace ||
			lo.LabelSelector != nil && !lo.LabelSelector.Matches(labels.Set(o.GetLabels())) {
			continue
		}
		if !r.copyAlways && lo.UnsafeDisableDeepCopy != nil && *lo.UnsafeDisableDeepCopy {
			out = append(out, o)
		} else {
			out = append(out, o.DeepCopyObject())
		}
	}
	if err := meta.SetList(list, out); err != nil {
		return fmt.Errorf("list %s: %w", gvk.Kind, err)
	}
	return nil
}

// cluster is nodes with device-plugin facts and their DRA ResourceSlices,
// and the endpoint's pods (some finished or terminating, which Observe
// skips), ConfigMap and other pods, all as a cache holds them.
func cluster(tb testing.TB, ep *v1alpha1.UrmaEndpoint, nodes, pods int) []client.Object {
	tb.Helper()
	snap := dratest.Snapshot(tb, dratest.Config(0), sysfstest.DefaultDevice("udma0"))
	ann := facts(1024, 16).Annotations()
	var objs []client.Object
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		n := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:      map[string]string{"kubernetes.io/hostname": name, "group": fmt.Sprint(i % 3)},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}}}
		n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
		for k, v := range ann {
			n.Annotations[k] = v
		}
		objs = append(objs, n)
		for _, s := range dratest.ResourceSlices(slicefacts.DriverName, name, draslices.Resources(name, snap, draslices.DefaultRequestPolicy())) {
			objs = append(objs, s)
		}
	}
	now := metav1.Now()
	for i := range pods {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ep.Namespace, Name: fmt.Sprintf("pod-%d", i),
				Labels:      map[string]string{v1alpha1.LabelEndpoint: ep.Name, "app": "perf"},
				Annotations: map[string]string{v1alpha1.AnnotationFlagsHash: "abc"}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%04d", i%max(nodes, 1)),
				Containers: []corev1.Container{{Name: "app", Image: "perf", Env: []corev1.EnvVar{{Name: "URMA_FLAGS", Value: "x"}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
		switch i % 10 {
		case 1:
			p.Status.Phase = corev1.PodSucceeded
		case 2:
			p.DeletionTimestamp = &now
		}
		objs = append(objs, p)
	}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ep.Namespace, Name: "other",
		Labels: map[string]string{v1alpha1.LabelEndpoint: "other"}}}
	limits := LimitsFromFacts(facts(512, 16))
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ep.Namespace, Name: v1alpha1.ConfigMapName(ep.Name),
		Annotations: map[string]string{v1alpha1.AnnotationDeviceLimits: EncodeLimits(limits)},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "UrmaEndpoint",
			Name: ep.Name, UID: ep.UID, Controller: new(true)}}}}
	return append(objs, other, cm)
}

func endpoint() *v1alpha1.UrmaEndpoint {
	s := spec()
	s.NodeSelector = map[string]string{"group": "1"}
	return &v1alpha1.UrmaEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ep", UID: "uid-ep"}, Spec: s}
}

// Observe runs on every pod admission: its Lists must not deep-copy every
// node, ResourceSlice and pod of the cache, which it only reads.
func TestObserveListsWithoutDeepCopy(t *testing.T) {
	for _, tc := range []struct {
		driver Driver
		lists  []string
	}{
		{DriverDevicePlugin, []string{"PodList", "NodeList"}},
		{DriverDRA, []string{"PodList", "NodeList", "ResourceSliceList"}},
	} {
		t.Run(string(tc.driver), func(t *testing.T) {
			ep := endpoint()
			r := newCacheReader(t, cluster(t, ep, 3, 3)...)
			if _, err := Observe(context.Background(), r, ep, tc.driver); err != nil {
				t.Fatal(err)
			}
			if len(r.listed) != len(tc.lists) {
				t.Errorf("listed %v, want %v", reflect.ValueOf(r.listed).MapKeys(), tc.lists)
			}
			for _, kind := range tc.lists {
				if len(r.listed[kind]) != 1 {
					t.Errorf("%s listed %d times, want once", kind, len(r.listed[kind]))
					continue
				}
				if o := r.listed[kind][0].UnsafeDisableDeepCopy; o == nil || !*o {
					t.Errorf("%s listed without client.UnsafeDisableDeepCopy: every admission deep-copies the cached objects", kind)
				}
			}
		})
	}
}

// Without deep copies, what Observe returns shares maps, slices and
// pointers with the cache: neither Observe nor the planning built on it
// may write to them.
func TestObserveLeavesCachedObjectsUnchanged(t *testing.T) {
	for _, driver := range []Driver{DriverDevicePlugin, DriverDRA} {
		t.Run(string(driver), func(t *testing.T) {
			ep := endpoint()
			objs := cluster(t, ep, 6, 10)
			before := make([]runtime.Object, len(objs))
			for i, o := range objs {
				before[i] = o.DeepCopyObject()
			}
			r := newCacheReader(t, objs...)
			obs, err := Observe(context.Background(), r, ep, driver)
			if err != nil {
				t.Fatal(err)
			}
			// The pods returned are the cache's, so the check below means something.
			if len(obs.Pods) == 0 || reflect.ValueOf(obs.Pods[0].Labels).UnsafePointer() != reflect.ValueOf(r.objs[corev1.SchemeGroupVersion.WithKind("Pod")][0].GetLabels()).UnsafePointer() {
				t.Fatalf("the pods Observe returned do not share the cache's labels (%d pods)", len(obs.Pods))
			}
			pl, err := Make(obs.Input)
			if err != nil {
				t.Fatal(err)
			}
			if pl.Source != v1alpha1.LimitsFromNodes || len(pl.Groups) != 1 || pl.Groups[0].NodeCount != 6 {
				t.Fatalf("plan: source %s, groups %+v; want every node's facts", pl.Source, pl.Groups)
			}
			_ = JettyUnits(obs.Input)
			for i, o := range objs {
				if !reflect.DeepEqual(o, before[i]) {
					t.Errorf("%T %s changed in the cache", o, client.ObjectKeyFromObject(o))
				}
			}
		})
	}
}

// BenchmarkObserve is one pod admission's read on a 2000-node cluster
// with 200 pods of the endpoint, against a store that copies as
// controller-runtime's cache does (in-place), beside the same store
// copying every object regardless (deep-copy: the cost before Observe
// asked for no copies), in the same run.
func BenchmarkObserve(b *testing.B) {
	for _, driver := range []Driver{DriverDevicePlugin, DriverDRA} {
		for _, copyAlways := range []bool{false, true} {
			name := string(driver) + "/in-place"
			if copyAlways {
				name = string(driver) + "/deep-copy"
			}
			b.Run(name, func(b *testing.B) {
				ep := endpoint()
				r := newCacheReader(b, cluster(b, ep, 2000, 200)...)
				r.copyAlways = copyAlways
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					obs, err := Observe(ctx, r, ep, driver)
					if err != nil {
						b.Fatal(err)
					}
					if len(obs.Input.Nodes) != 2000 {
						b.Fatalf("%d nodes observed", len(obs.Input.Nodes))
					}
					clear(r.listed) // records are the test's, not the cost measured
				}
			})
		}
	}
}
