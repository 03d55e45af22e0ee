package certs

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// patchCABundles sets caBundle on every webhook of the named configurations.
// A configuration that does not exist is skipped (the chart may not install
// the validating one); any other failure is returned.
func (r *Rotator) patchCABundles(ctx context.Context, bundle []byte) error {
	var errs []error
	for _, name := range r.MutatingWebhooks {
		var c admissionv1.MutatingWebhookConfiguration
		errs = append(errs, r.patchOne(ctx, name, &c, func() bool {
			changed := false
			for i := range c.Webhooks {
				changed = setBundle(&c.Webhooks[i].ClientConfig, bundle) || changed
			}
			return changed
		}))
	}
	for _, name := range r.ValidatingWebhooks {
		var c admissionv1.ValidatingWebhookConfiguration
		errs = append(errs, r.patchOne(ctx, name, &c, func() bool {
			changed := false
			for i := range c.Webhooks {
				changed = setBundle(&c.Webhooks[i].ClientConfig, bundle) || changed
			}
			return changed
		}))
	}
	return errors.Join(errs...)
}

func (r *Rotator) patchOne(ctx context.Context, name string, obj client.Object, mutate func() bool) error {
	if err := r.Reader.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.Log.V(1).Info("webhook configuration not installed; no caBundle to set", "name", name)
			return nil
		}
		return fmt.Errorf("get webhook configuration %s: %w", name, err)
	}
	if !mutate() {
		return nil
	}
	if err := r.Client.Update(ctx, obj); err != nil {
		return fmt.Errorf("set caBundle of webhook configuration %s: %w", name, err)
	}
	r.Log.Info("set webhook caBundle", "configuration", name)
	return nil
}

func setBundle(cc *admissionv1.WebhookClientConfig, bundle []byte) bool {
	if bytes.Equal(cc.CABundle, bundle) {
		return false
	}
	cc.CABundle = bytes.Clone(bundle)
	return true
}
