package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/openeuler/urma-k8s/internal/eventually"
)

const dnsName = "urma-operator-webhook.urma-system.svc"

var secretKey = types.NamespacedName{Namespace: "urma-system", Name: "urma-operator-webhook-certs"}

type fixture struct {
	c   client.WithWatch
	r   *Rotator
	now time.Time
}

func newFixture(t *testing.T, objs ...client.Object) *fixture {
	t.Helper()
	scheme := kruntime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := admissionv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	f := &fixture{c: c, now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	f.r = &Rotator{
		Client: c, Reader: c, Secret: secretKey, CertDir: t.TempDir(),
		DNSNames:           []string{dnsName, dnsName + ".cluster.local"},
		MutatingWebhooks:   []string{"urma-operator-mutating"},
		ValidatingWebhooks: []string{"urma-operator-validating"},
		Now:                func() time.Time { return f.now },
		Log:                testr.New(t),
	}
	return f
}

func webhookConfigs() []client.Object {
	svc := func() admissionv1.WebhookClientConfig {
		return admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Namespace: "urma-system", Name: "urma-operator-webhook"}}
	}
	none := admissionv1.SideEffectClassNone
	return []client.Object{
		&admissionv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "urma-operator-mutating"},
			Webhooks: []admissionv1.MutatingWebhook{{Name: "pods.urma.openeuler.org", ClientConfig: svc(), SideEffects: &none, AdmissionReviewVersions: []string{"v1"}}}},
		&admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "urma-operator-validating"},
			Webhooks: []admissionv1.ValidatingWebhook{
				{Name: "a.urma.openeuler.org", ClientConfig: svc(), SideEffects: &none, AdmissionReviewVersions: []string{"v1"}},
				{Name: "b.urma.openeuler.org", ClientConfig: svc(), SideEffects: &none, AdmissionReviewVersions: []string{"v1"}},
			}},
	}
}

func (f *fixture) secret(t *testing.T) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	if err := f.c.Get(context.Background(), secretKey, &s); err != nil {
		t.Fatalf("get secret: %v", err)
	}
	return &s
}

func (f *fixture) bundles(t *testing.T) [][]byte {
	t.Helper()
	ctx := context.Background()
	var m admissionv1.MutatingWebhookConfiguration
	var v admissionv1.ValidatingWebhookConfiguration
	if err := f.c.Get(ctx, client.ObjectKey{Name: "urma-operator-mutating"}, &m); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Get(ctx, client.ObjectKey{Name: "urma-operator-validating"}, &v); err != nil {
		t.Fatal(err)
	}
	return [][]byte{m.Webhooks[0].ClientConfig.CABundle, v.Webhooks[0].ClientConfig.CABundle, v.Webhooks[1].ClientConfig.CABundle}
}

// certFile reads a file the rotator wrote; a missing or empty file fails the
// test, so comparing two reads never passes on nil == nil.
func (f *fixture) certFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.r.CertDir, name))
	if err != nil {
		t.Fatalf("read written %s: %v", name, err)
	}
	if len(b) == 0 {
		t.Fatalf("written %s is empty", name)
	}
	return b
}

// bundle parses the stored secret.
func (f *fixture) bundle(t *testing.T) *Bundle {
	t.Helper()
	b, err := ParseBundle(f.secret(t).Data)
	if err != nil {
		t.Fatalf("stored bundle: %v", err)
	}
	return b
}

// handshake serves the files in CertDir on loopback and connects trusting
// only caBundle, as the API server does; it returns the handshake error.
func (f *fixture) handshake(t *testing.T, caBundle []byte, serverName string) error {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(f.r.CertDir, "tls.crt"), filepath.Join(f.r.CertDir, "tls.key"))
	if err != nil {
		t.Fatalf("load written key pair: %v", err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		_ = conn.(*tls.Conn).Handshake()
		conn.Close()
	}()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caBundle) {
		t.Fatal("caBundle holds no certificate")
	}
	// The certificates are valid at the fixture's clock, not the wall clock.
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12, Time: func() time.Time { return f.now }}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
	if err == nil {
		conn.Close()
	}
	ln.Close()
	<-done
	return err
}

func TestEnsureCreatesAndTrusts(t *testing.T) {
	f := newFixture(t, webhookConfigs()...)
	if err := f.r.Ensure(context.Background()); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	s := f.secret(t)
	if s.Type != corev1.SecretTypeTLS {
		t.Errorf("secret type %q, want %q", s.Type, corev1.SecretTypeTLS)
	}
	b := f.bundle(t)
	for i, got := range f.bundles(t) {
		if !bytes.Equal(got, b.CABundle()) {
			t.Errorf("webhook %d caBundle not set to the CA", i)
		}
	}
	for _, name := range f.r.DNSNames {
		if err := f.handshake(t, b.CABundle(), name); err != nil {
			t.Errorf("TLS handshake for %s: %v", name, err)
		}
	}
	if err := f.handshake(t, b.CABundle(), "other.example"); err == nil {
		t.Error("handshake for a name not in the certificate succeeded")
	}
	key, err := os.Stat(filepath.Join(f.r.CertDir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	if key.Mode().Perm()&0o077 != 0 {
		t.Errorf("tls.key mode %v is readable by others", key.Mode().Perm())
	}
}

func TestEnsureIsStableWhenFresh(t *testing.T) {
	f := newFixture(t, webhookConfigs()...)
	ctx := context.Background()
	if err := f.r.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	rv := f.secret(t).ResourceVersion
	crt := f.certFile(t, "tls.crt")
	stat := func(name string) os.FileInfo {
		fi, err := os.Stat(filepath.Join(f.r.CertDir, name))
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	crtInfo, keyInfo := stat("tls.crt"), stat("tls.key")
	f.now = f.now.Add(30 * 24 * time.Hour)
	if err := f.r.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.secret(t).ResourceVersion; got != rv {
		t.Errorf("secret rewritten (resourceVersion %s -> %s) though the certificate is fresh", rv, got)
	}
	if crt2 := f.certFile(t, "tls.crt"); !bytes.Equal(crt, crt2) {
		t.Error("tls.crt changed though the certificate is fresh")
	}
	// Not even rewritten with the same bytes (a rewrite renames a new file in).
	if !os.SameFile(crtInfo, stat("tls.crt")) || !os.SameFile(keyInfo, stat("tls.key")) {
		t.Error("tls.crt or tls.key rewritten though the certificate is fresh")
	}
}

func TestEnsureRenews(t *testing.T) {
	cases := []struct {
		name      string
		advance   time.Duration
		newCA     bool
		keepsPrev bool
	}{
		{name: "serving certificate near expiry, same CA", advance: 300 * 24 * time.Hour, newCA: false},
		{name: "CA near expiry - new CA, old one still trusted", advance: 8 * 365 * 24 * time.Hour, newCA: true, keepsPrev: true},
		{name: "everything expired - new CA, old one dropped", advance: 11 * 365 * 24 * time.Hour, newCA: true, keepsPrev: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, webhookConfigs()...)
			ctx := context.Background()
			if err := f.r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			before := f.bundle(t)
			f.now = f.now.Add(c.advance)
			if err := f.r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			after := f.bundle(t)
			if after.ServerCert.SerialNumber.Cmp(before.ServerCert.SerialNumber) == 0 {
				t.Error("serving certificate not renewed")
			}
			if gotNew := !after.CACert.Equal(before.CACert); gotNew != c.newCA {
				t.Errorf("new CA = %v, want %v", gotNew, c.newCA)
			}
			if gotPrev := after.PreviousCA != nil && after.PreviousCA.Equal(before.CACert); gotPrev != c.keepsPrev {
				t.Errorf("previous CA kept = %v, want %v", gotPrev, c.keepsPrev)
			}
			for i, got := range f.bundles(t) {
				if !bytes.Equal(got, after.CABundle()) {
					t.Errorf("webhook %d caBundle not updated", i)
				}
			}
			if err := f.handshake(t, after.CABundle(), dnsName); err != nil {
				t.Errorf("handshake with the renewed certificate: %v", err)
			}
		})
	}
}

func TestEnsureReplacesBrokenSecretAndNewNames(t *testing.T) {
	broken := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name},
		Data: map[string][]byte{KeyCA: []byte("not pem")}}
	f := newFixture(t, broken)
	ctx := context.Background()
	if err := f.r.Ensure(ctx); err != nil {
		t.Fatalf("Ensure with a broken secret: %v", err)
	}
	b := f.bundle(t)
	f.r.DNSNames = append(f.r.DNSNames, "urma-operator-webhook.other.svc")
	if err := f.r.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	b2 := f.bundle(t)
	if b2.ServerCert.VerifyHostname("urma-operator-webhook.other.svc") != nil {
		t.Error("certificate not reissued for a new DNS name")
	}
	if !b2.CACert.Equal(b.CACert) {
		t.Error("CA replaced though only the names changed")
	}
}

func TestParseBundleNamesTheBadKey(t *testing.T) {
	f := newFixture(t)
	if err := f.r.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	good := f.secret(t).Data
	other := newFixture(t)
	if err := other.r.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key   string
		value []byte
		want  string
	}{
		{KeyCA, nil, "secret key ca.crt: no PEM certificate"},
		{KeyCAKey, []byte("x"), "secret key ca.key: no PEM EC private key"},
		{KeyCert, good[KeyCA][:20], "secret key tls.crt"},
		{KeyKey, other.secret(t).Data[KeyKey], "tls.key does not match tls.crt"},
		{KeyPreviousCA, []byte("junk"), "secret key ca-previous.crt"},
	} {
		d := map[string][]byte{}
		for k, v := range good {
			d[k] = v
		}
		d[c.key] = c.value
		_, err := ParseBundle(d)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
			t.Errorf("corrupt %s: error %v, want it to contain %q", c.key, err, c.want)
		}
	}
}

func TestEnsureWithoutWebhookConfigurations(t *testing.T) {
	f := newFixture(t)
	if err := f.r.Ensure(context.Background()); err != nil {
		t.Fatalf("Ensure without webhook configurations installed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.r.CertDir, "tls.crt")); err != nil {
		t.Errorf("certificate not written: %v", err)
	}
}

// runRotator runs Start until stop is called or the test ends, and checks
// that Start returns nil when stopped.
func runRotator(t *testing.T, r *Rotator) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Start returned %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Start did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestWatchRestoresAnEmptiedCABundleAtOnce(t *testing.T) {
	f := newFixture(t, webhookConfigs()...)
	ctx := context.Background()
	if err := f.r.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	want := f.bundles(t)[0]
	// Only a watch can bring it back in time: the regular check is hours away.
	f.r.CheckInterval, f.r.Watcher = 24*time.Hour, f.c
	runRotator(t, f.r)

	for _, clear := range []func() client.Object{
		func() client.Object {
			var m admissionv1.MutatingWebhookConfiguration
			if err := f.c.Get(ctx, client.ObjectKey{Name: "urma-operator-mutating"}, &m); err != nil {
				t.Fatal(err)
			}
			m.Webhooks[0].ClientConfig.CABundle = nil
			return &m
		},
		func() client.Object {
			var v admissionv1.ValidatingWebhookConfiguration
			if err := f.c.Get(ctx, client.ObjectKey{Name: "urma-operator-validating"}, &v); err != nil {
				t.Fatal(err)
			}
			v.Webhooks[1].ClientConfig.CABundle = []byte("stale")
			return &v
		},
	} {
		// A helm upgrade --force or a GitOps replace of the configuration.
		if err := f.c.Update(ctx, clear()); err != nil {
			t.Fatal(err)
		}
		eventually.Holds(t, "the caBundle restored after the webhook configuration was replaced", 10*time.Second, func() bool {
			b := f.bundles(t)
			return bytes.Equal(b[0], want) && bytes.Equal(b[1], want) && bytes.Equal(b[2], want)
		})
	}
}

func TestStartStopsWithContext(t *testing.T) {
	f := newFixture(t, webhookConfigs()...)
	f.r.CheckInterval, f.r.Watcher = time.Millisecond, f.c
	before := runtime.NumGoroutine()
	stop := runRotator(t, f.r)
	// Wait until a tick has created the secret, then stop.
	eventually.Succeeds(t, "Start to run Ensure (the Secret created)", 10*time.Second, func() error {
		return f.c.Get(context.Background(), secretKey, &corev1.Secret{})
	})
	stop()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("goroutines: %d before, %d after Start returned", before, n)
	}
}

// Ensure retries a Secret write that conflicts with another replica up to
// five times, then says it gave up.
func TestEnsureRetriesConflictsFiveTimes(t *testing.T) {
	for _, tc := range []struct {
		conflicts int
		wantErr   bool
	}{{4, false}, {5, true}} {
		f := newFixture(t, webhookConfigs()...)
		left := tc.conflicts
		f.r.Client = interceptor.NewClient(f.c, interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				if left > 0 {
					left--
					return apierrors.NewConflict(corev1.Resource("secrets"), obj.GetName(), errors.New("another replica wrote it"))
				}
				return c.Create(ctx, obj, opts...)
			},
		})
		err := f.r.Ensure(context.Background())
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), "kept conflicting with another writer") {
				t.Errorf("%d conflicts: Ensure = %v, want it to give up", tc.conflicts, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%d conflicts: Ensure = %v, want the fifth attempt to succeed", tc.conflicts, err)
		}
	}
}

// A certificate with exactly a third of its life left is renewed; one with
// a moment more is not.
func TestEnsureRenewsAtAThirdOfLifeLeft(t *testing.T) {
	for _, tc := range []struct {
		beyond  time.Duration // before the one-third mark
		renewed bool
	}{{0, true}, {time.Second, false}} {
		f := newFixture(t, webhookConfigs()...)
		ctx := context.Background()
		if err := f.r.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		before := f.bundle(t).ServerCert
		life := before.NotAfter.Sub(before.NotBefore)
		f.now = before.NotAfter.Add(-life/3 - tc.beyond)
		if err := f.r.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		renewed := f.bundle(t).ServerCert.SerialNumber.Cmp(before.SerialNumber) != 0
		if renewed != tc.renewed {
			t.Errorf("%v before a third of the life left: renewed = %v, want %v", tc.beyond, renewed, tc.renewed)
		}
	}
}

// An existing Secret's type is kept (the API server refuses to change it);
// one without a type becomes kubernetes.io/tls.
func TestEnsureKeepsTheSecretType(t *testing.T) {
	for _, typ := range []corev1.SecretType{"", corev1.SecretTypeOpaque} {
		broken := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name},
			Type: typ, Data: map[string][]byte{KeyCA: []byte("not pem")}}
		f := newFixture(t, broken)
		if err := f.r.Ensure(context.Background()); err != nil {
			t.Fatal(err)
		}
		want := typ
		if want == "" {
			want = corev1.SecretTypeTLS
		}
		if got := f.secret(t).Type; got != want {
			t.Errorf("Secret of type %q: type after Ensure %q, want %q", typ, got, want)
		}
	}
}

// Start with no CheckInterval uses the default; a failed check is logged
// with its error, a passed one is not logged as failed.
func TestStartDefaultIntervalAndFailedChecks(t *testing.T) {
	f := newFixture(t, webhookConfigs()...)
	runRotator(t, f.r)() // CheckInterval 0: the default, no tick in this test

	for _, tc := range []struct {
		failing   bool
		retry     time.Duration
		wantRetry string // the retryIn logged with a failure
	}{
		{failing: true, wantRetry: `"retryIn"="10s"`}, // DefaultRetryInterval
		{failing: true, retry: 3 * time.Millisecond, wantRetry: `"retryIn"="3ms"`},
		{failing: false},
	} {
		failing := tc.failing
		f := newFixture(t, webhookConfigs()...)
		f.r.CheckInterval, f.r.RetryInterval = time.Millisecond, tc.retry
		lines := make(chan string, 1000)
		f.r.Log = funcr.New(func(_, args string) {
			select {
			case lines <- args:
			default:
			}
		}, funcr.Options{})
		checks := make(chan struct{}, 1000) // one per check: its Get of the Secret
		f.r.Reader = interceptor.NewClient(f.c, interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if key == secretKey {
					select {
					case checks <- struct{}{}:
					default:
					}
				}
				return c.Get(ctx, key, obj, opts...)
			},
		})
		if failing {
			f.r.Client = interceptor.NewClient(f.c, interceptor.Funcs{
				Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
					return errors.New("apiserver down")
				},
			})
		}
		stop := runRotator(t, f.r)
		// A check's outcome is logged before the next check starts: after
		// the third Get, two checks are complete.
		for range 3 {
			select {
			case <-checks:
			case <-time.After(30 * time.Second):
				t.Fatal("Start ran no checks")
			}
		}
		stop()
		close(lines)
		var failed []string
		for l := range lines {
			if strings.Contains(l, "webhook certificate check failed") {
				failed = append(failed, l)
			}
		}
		switch {
		case failing && (len(failed) < 2 || !strings.Contains(failed[0], "apiserver down")):
			t.Errorf("failing checks logged %q, want each failure with its error", failed)
		case failing && !strings.Contains(failed[0], tc.wantRetry):
			t.Errorf("failure logged %q, want %s", failed[0], tc.wantRetry)
		case !failing && len(failed) > 0:
			t.Errorf("passing checks logged as failed: %q", failed)
		}
	}
}
