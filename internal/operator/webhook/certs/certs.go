// Package certs gives the operator's webhook server a serving certificate
// when cert-manager does not: it keeps a self-signed CA and a serving
// certificate in a Secret shared by all replicas, writes them to the
// webhook server's certificate directory (controller-runtime's certwatcher
// reloads them) and puts the CA into the webhook configurations' caBundle.
//
// The CA lives ten years and the serving certificate one; each is renewed
// when less than a third of its life is left. A renewed CA is trusted next
// to the previous one until the previous expires, so replicas that still
// serve an older certificate keep working during the switch.
//
// Besides the periodic check, the rotator watches the two webhook
// configurations: a `helm upgrade --force` or a GitOps sync that replaces
// them empties their caBundle, which would block every labelled pod until
// the next check, so a change to them triggers a check at once.
//
// Files: certs.go is the Rotator and its check (Ensure: the Secret, the
// files, the caBundle); bundle.go the CA and serving certificate as kept in
// the Secret and how they are issued; cabundle.go the caBundle of the
// webhook configurations; watch.go the watch of those configurations.
//
// Why not open-policy-agent's cert-controller, which kueue and gatekeeper
// use (it builds against this module's controller-runtime): it gives the
// webhook configurations the new CA alone when it rotates the CA, so a
// replica still serving a certificate of the previous CA is refused until
// it reloads, where this rotator keeps the previous CA in the caBundle
// until it expires; and it watches the Secret and the webhook
// configurations through an informer cache, which needs list and watch on
// every Secret of the namespace and on every webhook configuration of the
// cluster, where the chart grants get, create and update on one Secret and
// watches exactly two configurations by name.
package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Secret keys. tls.crt and tls.key follow kubernetes.io/tls.
const (
	KeyCert       = corev1.TLSCertKey       // serving certificate
	KeyKey        = corev1.TLSPrivateKeyKey // serving key
	KeyCA         = "ca.crt"
	KeyCAKey      = "ca.key"
	KeyPreviousCA = "ca-previous.crt"
)

// Default lifetimes.
const (
	DefaultCAValidity     = 10 * 365 * 24 * time.Hour
	DefaultServerValidity = 365 * 24 * time.Hour
	DefaultCheckInterval  = time.Hour
	DefaultRetryInterval  = 10 * time.Second
	maxWatchBackoff       = time.Minute
)

// The rotator reads its Secret and the webhook configurations without the
// cache (no cluster-wide Secret cache) and writes them by name.
//
// +kubebuilder:rbac:groups="",namespace=urma-system,resources=secrets,verbs=get;create;update
// Watching by name (a metadata.name field selector) is what lets list and
// watch be limited to these two names.
//
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,resourceNames=urma-operator-mutating;urma-operator-validating,verbs=get;list;watch;update

// Rotator keeps the webhook serving certificate valid.
type Rotator struct {
	// Client writes the Secret and the webhook configurations; Reader reads
	// them (use the manager's API reader: uncached).
	Client client.Client
	Reader client.Reader
	// Secret is where the CA and certificate are kept.
	Secret types.NamespacedName
	// CertDir receives tls.crt and tls.key.
	CertDir string
	// DNSNames of the webhook Service, e.g. svc.ns.svc and svc.ns.svc.cluster.local.
	DNSNames []string
	// MutatingWebhooks and ValidatingWebhooks name the configurations whose
	// caBundle is kept current.
	MutatingWebhooks, ValidatingWebhooks []string
	// Watcher, when set, watches those configurations by name, and any
	// change to them triggers a check (which restores an emptied caBundle
	// within seconds); nil leaves only the periodic check.
	Watcher client.WithWatch

	// CheckInterval is the period of the regular check; RetryInterval how
	// soon a failed check is retried.
	CAValidity, ServerValidity, CheckInterval, RetryInterval time.Duration
	// Now is the clock (tests move it); nil means time.Now.
	Now func() time.Time
	Log logr.Logger

	// after waits between watches; nil means time.After (tests record the
	// delays).
	after func(time.Duration) <-chan time.Time
}

func (r *Rotator) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Rotator) validity() (ca, server time.Duration) {
	ca, server = r.CAValidity, r.ServerValidity
	if ca <= 0 {
		ca = DefaultCAValidity
	}
	if server <= 0 {
		server = DefaultServerValidity
	}
	return ca, server
}

// NeedLeaderElection is false: every replica serves webhooks and needs the
// files.
func (r *Rotator) NeedLeaderElection() bool { return false }

// Start re-checks the certificates every CheckInterval, and whenever a
// watched webhook configuration changes, until ctx ends; a failed check is
// retried after RetryInterval. Call Ensure once before starting the webhook
// server, which needs the files.
func (r *Rotator) Start(ctx context.Context) error {
	interval, retryIn := r.CheckInterval, r.RetryInterval
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	if retryIn <= 0 {
		retryIn = DefaultRetryInterval
	}
	changed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.Watcher != nil {
		for _, w := range r.watched() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.watch(ctx, w.list, w.name, changed)
			}()
		}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	retry := time.NewTimer(retryIn)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-changed:
		case <-retry.C:
		}
		if err := r.Ensure(ctx); err != nil {
			// Keep serving the current files; try again soon.
			r.Log.Error(err, "webhook certificate check failed", "retryIn", retryIn)
			retry.Reset(retryIn)
		}
	}
}

// Ensure makes the Secret hold a CA and serving certificate with enough
// life left (creating or renewing them), writes the serving pair to CertDir
// and sets the caBundle of the webhook configurations.
func (r *Rotator) Ensure(ctx context.Context) error {
	var bundle *Bundle
	// Two replicas may race on the Secret; the loser re-reads.
	for attempt := 0; attempt < 5; attempt++ {
		b, err := r.ensureSecret(ctx)
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return err
		}
		bundle = b
		break
	}
	if bundle == nil {
		return fmt.Errorf("update Secret %s: kept conflicting with another writer", r.Secret)
	}
	if err := r.writeFiles(bundle); err != nil {
		return err
	}
	return r.patchCABundles(ctx, bundle.CABundle())
}

func (r *Rotator) ensureSecret(ctx context.Context) (*Bundle, error) {
	var s corev1.Secret
	err := r.Reader.Get(ctx, r.Secret, &s)
	switch {
	case apierrors.IsNotFound(err):
		b, err := r.renew(nil)
		if err != nil {
			return nil, err
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.Secret.Namespace, Name: r.Secret.Name},
			Type:       corev1.SecretTypeTLS,
			Data:       b.Data(),
		}
		if err := r.Client.Create(ctx, &s); err != nil {
			return nil, fmt.Errorf("create Secret %s: %w", r.Secret, err)
		}
		r.Log.Info("created webhook certificates", "secret", r.Secret.String(), "notAfter", b.ServerCert.NotAfter)
		return b, nil
	case err != nil:
		return nil, fmt.Errorf("get Secret %s: %w", r.Secret, err)
	}
	current, perr := ParseBundle(s.Data)
	if perr == nil && r.fresh(current) {
		return current, nil
	}
	if perr != nil {
		r.Log.Info("webhook certificate Secret is unusable; generating a new CA", "secret", r.Secret.String(), "reason", perr.Error())
		current = nil
	}
	b, err := r.renew(current)
	if err != nil {
		return nil, err
	}
	s.Data = b.Data()
	if s.Type == "" {
		s.Type = corev1.SecretTypeTLS
	}
	if err := r.Client.Update(ctx, &s); err != nil {
		return nil, fmt.Errorf("update Secret %s: %w", r.Secret, err)
	}
	r.Log.Info("renewed webhook certificates", "secret", r.Secret.String(), "notAfter", b.ServerCert.NotAfter)
	return b, nil
}

// fresh: both certificates have more than a third of their life left and the
// serving certificate names every DNS name and chains to the CA.
func (r *Rotator) fresh(b *Bundle) bool {
	now := r.now()
	if !lifeLeft(b.CACert, now) || !lifeLeft(b.ServerCert, now) {
		return false
	}
	for _, n := range r.DNSNames {
		if b.ServerCert.VerifyHostname(n) != nil {
			return false
		}
	}
	return b.ServerCert.CheckSignatureFrom(b.CACert) == nil
}

func lifeLeft(c *x509.Certificate, now time.Time) bool {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotAfter.Sub(now) > life/3 && !now.Before(c.NotBefore)
}

// renew issues a new serving certificate, from the current CA when it still
// has life left, else from a new CA (keeping the old one trusted).
func (r *Rotator) renew(current *Bundle) (*Bundle, error) {
	caValidity, serverValidity := r.validity()
	now := r.now()
	b := &Bundle{}
	if current != nil && lifeLeft(current.CACert, now) {
		b.CACert, b.CAKey, b.PreviousCA = current.CACert, current.CAKey, current.PreviousCA
	} else {
		cert, key, err := newCA(now, caValidity)
		if err != nil {
			return nil, err
		}
		b.CACert, b.CAKey = cert, key
		if current != nil && now.Before(current.CACert.NotAfter) {
			b.PreviousCA = current.CACert
		}
	}
	if b.PreviousCA != nil && !now.Before(b.PreviousCA.NotAfter) {
		b.PreviousCA = nil
	}
	cert, key, err := newServerCert(now, serverValidity, b.CACert, b.CAKey, r.DNSNames)
	if err != nil {
		return nil, err
	}
	b.ServerCert, b.ServerKey = cert, key
	return b, nil
}

// writeFiles replaces tls.crt and tls.key atomically when they differ.
func (r *Rotator) writeFiles(b *Bundle) error {
	if err := os.MkdirAll(r.CertDir, 0o700); err != nil {
		return fmt.Errorf("create certificate directory %s: %w", r.CertDir, err)
	}
	for name, data := range map[string][]byte{KeyCert: b.ServerCertPEM(), KeyKey: b.ServerKeyPEM()} {
		p := filepath.Join(r.CertDir, name)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, data) {
			continue
		}
		tmp, err := os.CreateTemp(r.CertDir, "."+name+".*")
		if err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		_, werr := tmp.Write(data)
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := os.Rename(tmp.Name(), p); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}
