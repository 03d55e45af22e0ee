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
package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
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

type watchedConfig struct {
	name string
	list client.ObjectList
}

func (r *Rotator) watched() []watchedConfig {
	var out []watchedConfig
	for _, n := range r.MutatingWebhooks {
		out = append(out, watchedConfig{n, &admissionv1.MutatingWebhookConfigurationList{}})
	}
	for _, n := range r.ValidatingWebhooks {
		out = append(out, watchedConfig{n, &admissionv1.ValidatingWebhookConfigurationList{}})
	}
	return out
}

// watch sends on changed (without blocking) at every event on the named
// configuration, including the initial one of each new watch, until ctx
// ends. A watch that fails or ends in an error is started again after a
// growing delay.
func (r *Rotator) watch(ctx context.Context, list client.ObjectList, name string, changed chan<- struct{}) {
	backoff := time.Second
	for ctx.Err() == nil {
		began := time.Now()
		w, err := r.Watcher.Watch(ctx, list, client.MatchingFields{"metadata.name": name})
		failed := err != nil
		if err != nil {
			r.Log.Error(err, "cannot watch webhook configuration; relying on the periodic check until it works", "name", name, "retryIn", backoff)
		} else {
			// A watch the server ends at once is no better than an error:
			// do not spin on it.
			failed = r.drain(ctx, w, name, changed) || time.Since(began) < time.Second
		}
		if !failed {
			backoff = time.Second
			continue
		}
		wait := time.After
		if r.after != nil {
			wait = r.after
		}
		select {
		case <-ctx.Done():
		case <-wait(backoff):
		}
		backoff = min(backoff*2, maxWatchBackoff)
	}
}

// drain forwards one watch's events and reports whether it ended in error.
// It asks for a check once at the start too: a change between two watches
// would go unseen otherwise.
func (r *Rotator) drain(ctx context.Context, w watch.Interface, name string, changed chan<- struct{}) bool {
	defer w.Stop()
	notify(changed)
	for {
		select {
		case <-ctx.Done():
			return false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false // the server ended the watch (timeout): watch again
			}
			if ev.Type == watch.Error {
				r.Log.Info("watch of webhook configuration ended in an error; watching again", "name", name,
					"error", apierrors.FromObject(ev.Object).Error())
				return true
			}
			notify(changed)
		}
	}
}

// notify asks for a check without blocking; one already due covers it.
func notify(changed chan<- struct{}) {
	select {
	case changed <- struct{}{}:
	default:
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

// Bundle is the CA and serving certificate kept in the Secret.
type Bundle struct {
	CACert     *x509.Certificate
	CAKey      *ecdsa.PrivateKey
	PreviousCA *x509.Certificate
	ServerCert *x509.Certificate
	ServerKey  *ecdsa.PrivateKey
}

// Data is the Secret's data for the bundle.
func (b *Bundle) Data() map[string][]byte {
	d := map[string][]byte{
		KeyCA:    certPEM(b.CACert),
		KeyCAKey: keyPEM(b.CAKey),
		KeyCert:  b.ServerCertPEM(),
		KeyKey:   b.ServerKeyPEM(),
	}
	if b.PreviousCA != nil {
		d[KeyPreviousCA] = certPEM(b.PreviousCA)
	}
	return d
}

// CABundle is what webhook configurations trust: the CA, and the previous
// CA while it is valid.
func (b *Bundle) CABundle() []byte {
	out := certPEM(b.CACert)
	if b.PreviousCA != nil {
		out = append(out, certPEM(b.PreviousCA)...)
	}
	return out
}

// ServerCertPEM is the serving certificate.
func (b *Bundle) ServerCertPEM() []byte { return certPEM(b.ServerCert) }

// ServerKeyPEM is the serving key.
func (b *Bundle) ServerKeyPEM() []byte { return keyPEM(b.ServerKey) }

// ParseBundle reads a Secret's data; it fails naming the first key that is
// missing or malformed.
func ParseBundle(d map[string][]byte) (*Bundle, error) {
	var b Bundle
	var err error
	if b.CACert, err = parseCert(d, KeyCA); err != nil {
		return nil, err
	}
	if b.CAKey, err = parseKey(d, KeyCAKey); err != nil {
		return nil, err
	}
	if b.ServerCert, err = parseCert(d, KeyCert); err != nil {
		return nil, err
	}
	if b.ServerKey, err = parseKey(d, KeyKey); err != nil {
		return nil, err
	}
	if _, ok := d[KeyPreviousCA]; ok {
		if b.PreviousCA, err = parseCert(d, KeyPreviousCA); err != nil {
			return nil, err
		}
	}
	if !b.CAKey.PublicKey.Equal(b.CACert.PublicKey) {
		return nil, fmt.Errorf("%s does not match %s", KeyCAKey, KeyCA)
	}
	if !b.ServerKey.PublicKey.Equal(b.ServerCert.PublicKey) {
		return nil, fmt.Errorf("%s does not match %s", KeyKey, KeyCert)
	}
	return &b, nil
}

func parseCert(d map[string][]byte, key string) (*x509.Certificate, error) {
	blk, _ := pem.Decode(d[key])
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("secret key %s: no PEM certificate", key)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("secret key %s: %w", key, err)
	}
	return c, nil
}

func parseKey(d map[string][]byte, key string) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(d[key])
	if blk == nil || blk.Type != "EC PRIVATE KEY" {
		return nil, fmt.Errorf("secret key %s: no PEM EC private key", key)
	}
	k, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("secret key %s: %w", key, err)
	}
	return k, nil
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func keyPEM(k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		panic(fmt.Sprintf("marshal a P-256 key we generated: %v", err)) // cannot happen for P-256
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial number: %w", err)
	}
	return n, nil
}

func newCA(now time.Time, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("urma-operator webhook CA %d", now.Unix())},
		NotBefore:             now.Add(-time.Hour), // tolerate clock skew between replicas
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return cert, key, nil
}

func newServerCert(now time.Time, validity time.Duration, ca *x509.Certificate, caKey *ecdsa.PrivateKey, dnsNames []string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	if len(dnsNames) == 0 {
		return nil, nil, errors.New("serving certificate needs at least one DNS name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate serving key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("create serving certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse serving certificate: %w", err)
	}
	return cert, key, nil
}
