package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
)

// Names of the webhook configurations (config/webhook/manifests.yaml); the
// certificate rotator patches their caBundle.
const (
	MutatingConfigName   = "urma-operator-mutating"
	ValidatingConfigName = "urma-operator-validating"
)

// Options tune the webhooks.
type Options struct {
	// FallbackJettiesPerUnit is the device plugin's jetties per unit
	// assumed before any node publishes facts; 0 means the plugin's default.
	FallbackJettiesPerUnit int64
	// Driver is the node agent: with the DRA driver pods get claims for
	// their jetties rather than urma.openeuler.org/jetty units.
	Driver plan.Driver
}

// Register adds the pod mutator and the UrmaEndpoint validator to the
// manager's webhook server. Both read through the manager's cache; the pod
// mutator falls back to the API server for an endpoint the cache lacks.
// The informers they read are registered here, to start with the manager
// on every replica (see StartInformers).
func Register(mgr ctrl.Manager, opts Options) error {
	if err := StartInformers(context.Background(), mgr.GetCache(), opts.Driver); err != nil {
		return err
	}
	mgr.GetWebhookServer().Register(PodWebhookPath, &admission.Webhook{Handler: &PodInjector{
		Reader:                 mgr.GetClient(),
		APIReader:              mgr.GetAPIReader(),
		Decoder:                admission.NewDecoder(mgr.GetScheme()),
		FallbackJettiesPerUnit: opts.FallbackJettiesPerUnit,
		Driver:                 opts.Driver,
	}})
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.UrmaEndpoint{}).
		WithValidator(&EndpointValidator{Reader: mgr.GetClient(), FallbackJettiesPerUnit: opts.FallbackJettiesPerUnit, Driver: opts.Driver}).
		Complete()
}

// CachedTypes are the kinds the webhooks read through the manager's cache.
func CachedTypes(driver plan.Driver) []client.Object {
	objs := append([]client.Object{&v1alpha1.UrmaEndpoint{}}, plan.ObservedTypes(driver)...)
	if driver == plan.DriverDRA {
		objs = append(objs, &resourceapi.ResourceClaimTemplate{})
	}
	return objs
}

// StartInformers registers an informer for each of CachedTypes, without
// waiting for it: informers registered before the manager starts start and
// sync with its cache. Without this only the leader's controllers would
// start them, and on every other replica (and on the leader before it is
// elected) the first admission request would start and sync them all
// within its timeout, which a large cluster does not make; with failure
// policy Fail the pod is then refused.
func StartInformers(ctx context.Context, informers cache.Informers, driver plan.Driver) error {
	for _, obj := range CachedTypes(driver) {
		if _, err := informers.GetInformer(ctx, obj, cache.BlockUntilSynced(false)); err != nil {
			return fmt.Errorf("start the informer for %T the webhooks read: %w", obj, err)
		}
	}
	return nil
}

// CacheSynced is a readiness check that passes once every informer of c has
// synced: a replica is not sent admission requests (the webhook Service
// routes to ready pods only) before it can answer them from its cache.
func CacheSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		// Only a look: the probe asks again.
		ctx, cancel := context.WithTimeout(req.Context(), 50*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("the informers the webhooks read have not synced yet")
		}
		return nil
	}
}
