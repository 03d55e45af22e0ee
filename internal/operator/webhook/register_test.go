package webhook

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
)

// kindOf names the informer a cached read of obj is served from: its kind
// (a list's item kind) and whether it is metadata only, which a cache keeps
// apart from the typed objects.
func kindOf(t *testing.T, s *runtime.Scheme, obj runtime.Object) string {
	t.Helper()
	gvk, err := apiutil.GVKForObject(obj, s)
	if err != nil {
		t.Fatalf("kind of %T: %v", obj, err)
	}
	kind := schema.GroupKind{Group: gvk.Group, Kind: strings.TrimSuffix(gvk.Kind, "List")}.String()
	switch obj.(type) {
	case *metav1.PartialObjectMetadata, *metav1.PartialObjectMetadataList:
		kind += " (metadata)"
	}
	return kind
}

// The webhooks read only kinds whose informers StartInformers starts: one
// they read but do not start is started by the first admission request on
// a replica that does not lead, inside that request's timeout.
func TestCachedTypesCoverWhatWebhooksRead(t *testing.T) {
	s := scheme(t)
	for _, driver := range []plan.Driver{plan.DriverDevicePlugin, plan.DriverDRA} {
		t.Run(string(driver), func(t *testing.T) {
			ep := endpoint()
			read := map[string]bool{}
			cl := fake.NewClientBuilder().WithScheme(s).
				WithObjects(ep, ownedConfigMap(ep, "h1"), claimTemplate("my-urma", slicefacts.DriverName)).
				WithInterceptorFuncs(interceptor.Funcs{
					Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
						read[kindOf(t, s, obj)] = true
						return c.Get(ctx, key, obj, opts...)
					},
					List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
						read[kindOf(t, s, list)] = true
						return c.List(ctx, list, opts...)
					},
				}).Build()
			// APIReader is not the cache: reads through it are not recorded.
			api := fake.NewClientBuilder().WithScheme(s).WithObjects(ep).Build()
			pod := basePod()
			pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "jetties", ResourceClaimTemplateName: ptr.To("my-urma")}}
			h := &PodInjector{Reader: cl, APIReader: api, Decoder: admission.NewDecoder(s), Driver: driver}
			admitted(t, h, pod)
			if _, err := (&EndpointValidator{Reader: cl, Driver: driver}).ValidateCreate(context.Background(), endpoint()); err != nil {
				t.Fatal(err)
			}

			started := map[string]bool{}
			for _, obj := range CachedTypes(driver) {
				started[kindOf(t, s, obj)] = true
			}
			if len(read) == 0 {
				t.Fatal("the webhooks read nothing: the recorder is broken")
			}
			for kind := range read {
				if !started[kind] {
					t.Errorf("the webhooks read %s, which CachedTypes(%s) leaves out", kind, driver)
				}
			}
			if driver == plan.DriverDRA && !read["ResourceClaimTemplate.resource.k8s.io"] {
				t.Errorf("the DRA pod's claim template was not read (read %v): the test no longer covers it", read)
			}
		})
	}
}

// recordingInformers is the part of a cache StartInformers calls.
type recordingInformers struct {
	cache.Informers
	got   []string
	block []bool
	fail  error
}

func (r *recordingInformers) GetInformer(_ context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	o := cache.InformerGetOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	r.got = append(r.got, typeName(obj))
	r.block = append(r.block, o.BlockUntilSynced == nil || *o.BlockUntilSynced)
	return nil, r.fail
}

// typeName is obj's Go type, or "metadata" and its kind.
func typeName(obj client.Object) string {
	if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
		return "metadata " + m.Kind
	}
	return reflect.TypeOf(obj).Elem().Name()
}

func TestStartInformersStartsEachCachedTypeWithoutWaiting(t *testing.T) {
	for _, c := range []struct {
		driver plan.Driver
		want   []string
	}{
		{plan.DriverDevicePlugin, []string{"UrmaEndpoint", "Pod", "metadata Node", "ConfigMap"}},
		{plan.DriverDRA, []string{"UrmaEndpoint", "Pod", "metadata Node", "ConfigMap", "ResourceSlice", "ResourceClaimTemplate"}},
	} {
		t.Run(string(c.driver), func(t *testing.T) {
			r := &recordingInformers{}
			if err := StartInformers(context.Background(), r, c.driver); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.got, c.want) {
				t.Errorf("informers started: %v, want %v", r.got, c.want)
			}
			if slices.Contains(r.block, true) {
				t.Errorf("a GetInformer waits for its sync (%v): before the manager starts that never ends", r.block)
			}
		})
	}
	r := &recordingInformers{fail: errors.New("no such kind")}
	if err := StartInformers(context.Background(), r, plan.DriverDRA); err == nil || !strings.Contains(err.Error(), "no such kind") {
		t.Errorf("a failed GetInformer gave %v", err)
	}
}

// syncCache is the part of a cache CacheSynced calls.
type syncCache struct {
	cache.Cache
	synced bool
}

func (c syncCache) WaitForCacheSync(ctx context.Context) bool {
	if c.synced {
		// As controller-runtime's: a context already done may lose the race
		// with the started signal and report not synced.
		return ctx.Err() == nil
	}
	<-ctx.Done()
	return false
}

func TestCacheSyncedIsReadyOnlyOnceSynced(t *testing.T) {
	for _, synced := range []bool{false, true} {
		err := CacheSynced(syncCache{synced: synced})(httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if (err == nil) != synced {
			t.Errorf("synced %v: readiness error %v", synced, err)
		}
	}
}
