package webhook

import (
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
)

// Names of the webhook configurations (config/webhook/manifests.yaml); the
// certificate rotator patches their caBundle.
const (
	MutatingConfigName   = "urma-operator-mutating"
	ValidatingConfigName = "urma-operator-validating"
)

// Register adds the pod mutator and the UrmaEndpoint validator to the
// manager's webhook server. Both read through the manager's cache.
func Register(mgr ctrl.Manager) error {
	mgr.GetWebhookServer().Register(PodWebhookPath, &admission.Webhook{Handler: &PodInjector{
		Reader:  mgr.GetClient(),
		Decoder: admission.NewDecoder(mgr.GetScheme()),
	}})
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.UrmaEndpoint{}).
		WithValidator(&EndpointValidator{Reader: mgr.GetClient()}).
		Complete()
}
