package main

// The wiring test runs the operator's run() against an envtest control
// plane with self-signed certificates: the API server must reach the pod
// webhook over TLS trusting only the caBundle the operator patched in.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/operator/webhook"
	"github.com/openeuler/urma-k8s/internal/operator/webhook/certs"
)

func TestParseFlags(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
		check   func(*testing.T, options)
	}{
		{name: "defaults", check: func(t *testing.T, o options) {
			if o.leaderElect || !o.enableWebhooks || !o.selfSignedCerts || o.webhookPort != 9443 ||
				o.metricsAddr != ":8443" || !o.metricsSecure || o.metricsCertDir != "" || o.probeAddr != ":8081" || o.certDir == "" ||
				o.defaultJettiesPerUnit != 16 {
				t.Errorf("defaults: %+v", o)
			}
		}},
		{name: "everything set", args: []string{"--leader-elect", "--enable-webhooks=false", "--webhook-port=1234",
			"--metrics-bind-address=0", "--health-probe-bind-address=:9", "--cert-dir=/c", "--self-signed-certs=false",
			"--namespace=ns", "--webhook-service=svc", "--cert-secret=sec", "--webhook-extra-dns-names=a, b,,c",
			"--leader-election-namespace=le", "--default-jetties-per-unit=32", "--metrics-secure=false"},
			check: func(t *testing.T, o options) {
				if !o.leaderElect || o.enableWebhooks || o.webhookPort != 1234 || o.metricsAddr != "0" || o.probeAddr != ":9" ||
					o.certDir != "/c" || o.selfSignedCerts || o.namespace != "ns" || o.webhookService != "svc" ||
					o.certSecret != "sec" || strings.Join(o.extraDNSNames, "|") != "a|b|c" || o.leaderElectionNamespace != "le" ||
					o.defaultJettiesPerUnit != 32 || o.metricsSecure {
					t.Errorf("parsed: %+v", o)
				}
			}},
		{name: "bad port", args: []string{"--webhook-port=70000"}, wantErr: "--webhook-port 70000 is not a port"},
		{name: "zero port", args: []string{"--webhook-port=0"}, wantErr: "--webhook-port 0 is not a port"},
		// No webhook server listens: the port is not used.
		{name: "bad port unused without webhooks", args: []string{"--enable-webhooks=false", "--webhook-port=0"}, check: func(t *testing.T, o options) {
			if o.enableWebhooks {
				t.Errorf("webhooks on: %+v", o)
			}
		}},
		{name: "metrics cert dir", args: []string{"--metrics-cert-dir=/m"}, check: func(t *testing.T, o options) {
			if !o.metricsSecure || o.metricsCertDir != "/m" || metricsOptions(o).CertDir != "/m" {
				t.Errorf("metrics: %+v", o)
			}
		}},
		// A certificate for plain HTTP used to be dropped without a word.
		{name: "metrics cert dir without HTTPS", args: []string{"--metrics-secure=false", "--metrics-cert-dir=/m"},
			wantErr: `--metrics-cert-dir "/m" needs HTTPS, but --metrics-secure=false serves /metrics over plain HTTP`},
		// A certificate for no endpoint at all was dropped without a word too.
		{name: "metrics cert dir with metrics disabled", args: []string{"--metrics-bind-address=0", "--metrics-cert-dir=/m"},
			wantErr: `--metrics-cert-dir "/m" is for the /metrics endpoint, but --metrics-bind-address=0 disables it`},
		{name: "metrics cert dir with metrics disabled, flags reversed", args: []string{"--metrics-cert-dir=/m", "--metrics-bind-address=0"},
			wantErr: `--metrics-cert-dir "/m" is for the /metrics endpoint, but --metrics-bind-address=0 disables it`},
		{name: "metrics disabled without a cert dir", args: []string{"--metrics-bind-address=0"}, check: func(t *testing.T, o options) {
			if o.metricsAddr != "0" || o.metricsCertDir != "" || metricsOptions(o).BindAddress != "0" {
				t.Errorf("metrics: %+v", o)
			}
		}},
		{name: "metrics cert dir on another address", args: []string{"--metrics-bind-address=:9000", "--metrics-cert-dir=/m"}, check: func(t *testing.T, o options) {
			if o.metricsAddr != ":9000" || metricsOptions(o).CertDir != "/m" {
				t.Errorf("metrics: %+v", o)
			}
		}},
		{name: "zero jetties per unit", args: []string{"--default-jetties-per-unit=0"}, wantErr: "--default-jetties-per-unit 0: want 1 to 4294967295"},
		// The self-signed certificate names the Service and is kept in the
		// Secret: names the API server refuses used to surface only after
		// two minutes of failing retries.
		{name: "empty namespace", args: []string{"--namespace="}, wantErr: `--namespace "": `},
		{name: "bad webhook service", args: []string{"--webhook-service=Webhook_Svc"}, wantErr: `--webhook-service "Webhook_Svc": `},
		{name: "empty cert secret", args: []string{"--cert-secret="}, wantErr: `--cert-secret "": `},
		{name: "bad names unused without webhooks", args: []string{"--enable-webhooks=false", "--namespace=", "--cert-secret="}},
		{name: "bad names unused with cert-manager", args: []string{"--self-signed-certs=false", "--webhook-service=", "--cert-secret="}},
		{name: "stray argument", args: []string{"serve"}, wantErr: "unexpected arguments: serve"},
		{name: "unknown flag", args: []string{"--turbo"}, wantErr: "flag provided but not defined: -turbo"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseFlags(c.args, io.Discard)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.check != nil {
				c.check(t, o)
			}
		})
	}
}

// envtestAssets fails, never skips, when the control plane binaries are
// missing: CI must not pass with this test skipped.
func envtestAssets(t *testing.T) {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: this test needs kube-apiserver and etcd. Run `make test`, " +
			"or `make envtest-assets` and KUBEBUILDER_ASSETS=$PWD/bin/k8s go test ./cmd/operator")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("KUBEBUILDER_ASSETS=%s has no %s: run `make envtest-assets` (or `make test`)", dir, b)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestRunWiresOperatorWithSelfSignedWebhooks(t *testing.T) {
	te := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths:                        []string{filepath.Join("..", "..", "config", "webhook")},
			LocalServingHost:             "127.0.0.1",
			LocalServingHostExternalName: "localhost",
		},
	}
	cfg := startEnvtest(t, te)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ns := range []string{"urma-system", "app"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}

	probe, metricsAddr := freeAddr(t), freeAddr(t)
	o, err := parseFlags([]string{
		"--leader-elect", "--leader-election-namespace=urma-system", "--namespace=urma-system",
		"--metrics-bind-address=" + metricsAddr, "--health-probe-bind-address=" + probe,
		fmt.Sprintf("--webhook-port=%d", te.WebhookInstallOptions.LocalServingPort),
		"--cert-dir=" + t.TempDir(), "--webhook-extra-dns-names=localhost",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o.repeatControllers = true // go test -count=N runs this again
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, o, testr.New(t)) }()

	// The operator's CA replaced envtest's in the webhook configuration.
	eventually.Succeeds(t, "caBundle set from the operator's Secret", time.Minute, func() error {
		select {
		case err := <-done:
			t.Fatalf("run returned before it served: %v", err)
		default:
		}
		var s corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: "urma-system", Name: o.certSecret}, &s); err != nil {
			return err
		}
		b, err := certs.ParseBundle(s.Data)
		if err != nil {
			return err
		}
		var m admissionv1.MutatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: webhook.MutatingConfigName}, &m); err != nil {
			return err
		}
		if string(m.Webhooks[0].ClientConfig.CABundle) != string(b.CABundle()) {
			return errors.New("mutating caBundle is not the operator's CA")
		}
		var v admissionv1.ValidatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: webhook.ValidatingConfigName}, &v); err != nil {
			return err
		}
		if string(v.Webhooks[0].ClientConfig.CABundle) != string(b.CABundle()) {
			return errors.New("validating caBundle is not the operator's CA")
		}
		return nil
	})
	// /readyz/informers is asked for by name as well: it is wired only with
	// webhooks, and says the informers they read have synced.
	for _, path := range []string{"/readyz", "/readyz/informers"} {
		eventually.Succeeds(t, path, time.Minute, func() error {
			resp, err := http.Get("http://" + probe + path)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		})
	}
	eventually.Succeeds(t, "leader Lease", time.Minute, func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: "urma-system", Name: "urma-operator.urma.openeuler.org"}, &coordinationv1.Lease{})
	})

	t.Run("an emptied caBundle is restored at once", func(t *testing.T) {
		checkCABundleRestored(ctx, t, c, o.certSecret)
	})
	t.Run("metrics over HTTPS for authorized tokens only", func(t *testing.T) {
		checkSecureMetrics(ctx, t, cfg, c, metricsAddr)
	})

	ep := &v1alpha1.UrmaEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "svc"},
		Spec:       v1alpha1.UrmaEndpointSpec{JettyBudget: 4, Profile: v1alpha1.TrafficProfile{MessageSize: resource.MustParse("4Ki")}},
	}
	if err := c.Create(ctx, ep); err != nil {
		t.Fatal(err)
	}
	var hash string
	eventually.Succeeds(t, "endpoint rendered", time.Minute, func() error {
		var got v1alpha1.UrmaEndpoint
		if err := c.Get(ctx, client.ObjectKeyFromObject(ep), &got); err != nil {
			return err
		}
		if hash = got.Status.FlagsHash; hash == "" {
			return errors.New("no flags hash yet")
		}
		return nil
	})
	// The API server calls the pod webhook over TLS, trusting the operator's CA.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "p", Labels: map[string]string{v1alpha1.LabelEndpoint: "svc"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("create pod through the webhook: %v", err)
	}
	if pod.Annotations[v1alpha1.AnnotationFlagsHash] != hash {
		t.Errorf("pod not mutated by the operator's webhook: annotations %v, want hash %s", pod.Annotations, hash)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run returned %v after cancel", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// checkCABundleRestored clears the caBundle of both webhook configurations,
// as a `helm upgrade --force` or a GitOps replace does, and waits for the
// operator to put its CA back. The regular check is an hour away, so only
// the rotator's watch can do it.
func checkCABundleRestored(ctx context.Context, t *testing.T, c client.Client, secret string) {
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: "urma-system", Name: secret}, &s); err != nil {
		t.Fatal(err)
	}
	b, err := certs.ParseBundle(s.Data)
	if err != nil {
		t.Fatal(err)
	}
	want := string(b.CABundle())
	var m admissionv1.MutatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: webhook.MutatingConfigName}, &m); err != nil {
		t.Fatal(err)
	}
	for i := range m.Webhooks {
		m.Webhooks[i].ClientConfig.CABundle = nil
	}
	if err := c.Update(ctx, &m); err != nil {
		t.Fatal(err)
	}
	var v admissionv1.ValidatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: webhook.ValidatingConfigName}, &v); err != nil {
		t.Fatal(err)
	}
	for i := range v.Webhooks {
		v.Webhooks[i].ClientConfig.CABundle = nil
	}
	if err := c.Update(ctx, &v); err != nil {
		t.Fatal(err)
	}
	eventually.Succeeds(t, "caBundle restored", time.Minute, func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: webhook.MutatingConfigName}, &m); err != nil {
			return err
		}
		if err := c.Get(ctx, client.ObjectKey{Name: webhook.ValidatingConfigName}, &v); err != nil {
			return err
		}
		if string(m.Webhooks[0].ClientConfig.CABundle) != want || string(v.Webhooks[0].ClientConfig.CABundle) != want {
			return errors.New("a caBundle is still empty")
		}
		return nil
	})
}

// checkSecureMetrics reads /metrics over HTTPS without a token (401), with
// the token of a ServiceAccount that may not (403) and of one bound to a
// ClusterRole allowing get on /metrics (200), as Prometheus would.
func checkSecureMetrics(ctx context.Context, t *testing.T, cfg *rest.Config, c client.Client, addr string) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: sa}}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts("app").CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	reader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if err := c.Create(ctx, reader); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "prometheus-metrics-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: reader.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "app", Name: "prometheus"}}}); err != nil {
		t.Fatal(err)
	}
	allowed, denied := token("prometheus"), token("nosy")

	// The certificate is self-signed, as a ServiceMonitor with
	// insecureSkipVerify expects; a plain-HTTP client gets nowhere.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}} //nolint:gosec // self-signed by design
	get := func(bearer string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	for _, tc := range []struct {
		who   string
		token string
		code  int
	}{
		{"anonymous", "", http.StatusUnauthorized},
		{"a ServiceAccount without the ClusterRole", denied, http.StatusForbidden},
		{"a ServiceAccount allowed get on /metrics", allowed, http.StatusOK},
	} {
		eventually.Succeeds(t, tc.who, time.Minute, func() error {
			code, body, err := get(tc.token)
			if err != nil {
				return err
			}
			if code != tc.code {
				return fmt.Errorf("status %d, want %d: %.200s", code, tc.code, body)
			}
			if code == http.StatusOK && !strings.Contains(body, "controller_runtime_reconcile_total") {
				return fmt.Errorf("no controller metrics in %.200s", body)
			}
			return nil
		})
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("/metrics answered plain HTTP")
		}
	}
}

// A SIGTERM while the operator still waits for its webhook certificates
// (here: its namespace is not there yet) is a normal stop, as it is once the
// manager runs: run must return nil so the process exits 0, not 1.
func TestRunStoppedWhileWaitingForCertificatesIsClean(t *testing.T) {
	o, err := parseFlags([]string{
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--cert-dir=" + t.TempDir(),
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o.repeatControllers = true
	te := &envtest.Environment{}
	cfg := startEnvtest(t, te)
	// The operator's namespace does not exist: creating the certificate
	// Secret fails, and is retried, until the test stops the operator.
	retrying := make(chan struct{})
	var once sync.Once
	log := funcr.New(func(prefix, args string) {
		if strings.Contains(args, "webhook certificates not ready") {
			once.Do(func() { close(retrying) })
		}
	}, funcr.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, o, log) }()
	select {
	case <-retrying:
	case err := <-done:
		t.Fatalf("run returned before it retried the certificates: %v", err)
	}
	cancel() // what SIGTERM does to the signal handler's context
	if err := <-done; err != nil {
		t.Fatalf("run after a stop while waiting for certificates = %v, want nil (exit 0)", err)
	}
}

// startEnvtest starts te with the project's envtest binaries and stops it
// once the test and its other cleanups are done.
func startEnvtest(t *testing.T, te *envtest.Environment) *rest.Config {
	t.Helper()
	envtestAssets(t)
	cfg, err := te.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := te.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	return cfg
}
