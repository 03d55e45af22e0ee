package webhook

import (
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers/plan"
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
func Register(mgr ctrl.Manager, opts Options) error {
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
