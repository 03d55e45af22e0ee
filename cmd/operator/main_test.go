package main

// The wiring test runs the operator's run() against an envtest control
// plane with self-signed certificates: the API server must reach the pod
// webhook over TLS trusting only the caBundle the operator patched in.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/pkg/webhook"
	"github.com/openeuler/urma-k8s/pkg/webhook/certs"
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
				o.metricsAddr != ":8080" || o.probeAddr != ":8081" || o.certDir == "" || o.defaultJettiesPerUnit != 16 {
				t.Errorf("defaults: %+v", o)
			}
		}},
		{name: "everything set", args: []string{"--leader-elect", "--enable-webhooks=false", "--webhook-port=1234",
			"--metrics-bind-address=0", "--health-probe-bind-address=:9", "--cert-dir=/c", "--self-signed-certs=false",
			"--namespace=ns", "--webhook-service=svc", "--cert-secret=sec", "--webhook-extra-dns-names=a, b,,c",
			"--leader-election-namespace=le", "--default-jetties-per-unit=32"},
			check: func(t *testing.T, o options) {
				if !o.leaderElect || o.enableWebhooks || o.webhookPort != 1234 || o.metricsAddr != "0" || o.probeAddr != ":9" ||
					o.certDir != "/c" || o.selfSignedCerts || o.namespace != "ns" || o.webhookService != "svc" ||
					o.certSecret != "sec" || strings.Join(o.extraDNSNames, "|") != "a|b|c" || o.leaderElectionNamespace != "le" ||
					o.defaultJettiesPerUnit != 32 {
					t.Errorf("parsed: %+v", o)
				}
			}},
		{name: "bad port", args: []string{"--webhook-port=70000"}, wantErr: "--webhook-port 70000 is not a port"},
		{name: "zero jetties per unit", args: []string{"--default-jetties-per-unit=0"}, wantErr: "--default-jetties-per-unit 0: want 1 to 4294967295"},
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
			c.check(t, o)
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

func poll(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestRunWiresOperatorWithSelfSignedWebhooks(t *testing.T) {
	envtestAssets(t)
	te := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths:                        []string{filepath.Join("..", "..", "config", "webhook")},
			LocalServingHost:             "127.0.0.1",
			LocalServingHostExternalName: "localhost",
		},
	}
	cfg, err := te.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	defer func() {
		if err := te.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	}()
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

	probe := freeAddr(t)
	o, err := parseFlags([]string{
		"--leader-elect", "--leader-election-namespace=urma-system", "--namespace=urma-system",
		"--metrics-bind-address=0", "--health-probe-bind-address=" + probe,
		fmt.Sprintf("--webhook-port=%d", te.WebhookInstallOptions.LocalServingPort),
		"--cert-dir=" + t.TempDir(), "--webhook-extra-dns-names=localhost",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, o, testr.New(t)) }()

	// The operator's CA replaced envtest's in the webhook configuration.
	poll(t, "caBundle set from the operator's Secret", func() error {
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
	poll(t, "readyz", func() error {
		resp, err := http.Get("http://" + probe + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	poll(t, "leader Lease", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: "urma-system", Name: "urma-operator.urma.openeuler.org"}, &coordinationv1.Lease{})
	})

	ep := &v1alpha1.UrmaEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "svc"},
		Spec:       v1alpha1.UrmaEndpointSpec{JettyBudget: 4, Profile: v1alpha1.TrafficProfile{MessageSize: resource.MustParse("4Ki")}},
	}
	if err := c.Create(ctx, ep); err != nil {
		t.Fatal(err)
	}
	var hash string
	poll(t, "endpoint rendered", func() error {
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
