package controllers_test

// One envtest control plane (kube-apiserver + etcd built by hack/tools.sh)
// for every test in this package, started in TestMain. The operator's
// manager runs against it with the reconciler and both webhooks, the
// webhooks installed from the generated config/webhook manifests.
//
// envtest runs no kube-controller-manager: there is no garbage collector,
// so deleting an endpoint does not delete its ConfigMap here. The tests
// check the ownerReference that makes the real garbage collector do it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
	"github.com/openeuler/urma-k8s/internal/operator/webhook"
)

// suite is the shared environment.
type suite struct {
	cfg        *rest.Config
	scheme     *runtime.Scheme
	c          client.Client // direct (uncached) client for the tests
	cache      client.Reader // the manager's cache, which the operator reads
	reconciles *reconcileLog
}

// reconcileOutcome is what one finished reconcile returned.
type reconcileOutcome struct {
	result ctrl.Result
	err    error
}

// reconcileLog records every finished reconcile per endpoint (through the
// reconciler's Reconciled hook), so a test looks only at its own endpoint's.
type reconcileLog struct {
	mu    sync.Mutex
	byKey map[types.NamespacedName][]reconcileOutcome
}

func (l *reconcileLog) record(req ctrl.Request, res ctrl.Result, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byKey[req.NamespacedName] = append(l.byKey[req.NamespacedName], reconcileOutcome{res, err})
}

// of returns the outcomes of the endpoint's reconciles so far, oldest first.
func (l *reconcileLog) of(key types.NamespacedName) []reconcileOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.byKey[key])
}

// env is set once by TestMain before any test runs and never changed after.
var env *suite

// checkAssets fails fast, with what to do, when the control plane binaries
// are missing: CI must never pass with these tests skipped.
func checkAssets() error {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set: these tests need kube-apiserver and etcd. " +
			"Run them with `make test`, or `make envtest-assets` and then KUBEBUILDER_ASSETS=$PWD/bin/k8s go test ./controllers/...")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.IsDir() {
			return fmt.Errorf("KUBEBUILDER_ASSETS=%s has no %s binary: run `make envtest-assets` (or `make test`, which builds it)", dir, b)
		}
	}
	return nil
}

func TestMain(m *testing.M) {
	if err := checkAssets(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true), zap.Level(zapLevel())))
	te := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths:            []string{filepath.Join("..", "config", "webhook")},
			LocalServingHost: "127.0.0.1",
		},
	}
	cfg, err := te.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: start envtest control plane:", err)
		return 1
	}
	defer func() {
		if err := te.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}()

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	wo := te.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: ctrlwebhook.NewServer(ctrlwebhook.Options{
			Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
		}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: create manager:", err)
		return 1
	}
	reconciles := &reconcileLog{byKey: map[types.NamespacedName][]reconcileOutcome{}}
	r := &controllers.UrmaEndpointReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: scheme, Recorder: mgr.GetEventRecorder("urma-operator"),
		Reconciled: reconciles.record}
	if err := r.SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: set up reconciler:", err)
		return 1
	}
	if err := webhook.Register(mgr, webhook.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: register webhooks:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager stopped:", err)
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: create client:", err)
		return 1
	}
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		fmt.Fprintln(os.Stderr, "FAIL: cache did not sync")
		return 1
	}
	if err := waitForWebhookServer(ctx, mgr); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	env = &suite{cfg: cfg, scheme: scheme, c: c, cache: mgr.GetCache(), reconciles: reconciles}
	return m.Run()
}

func waitForWebhookServer(ctx context.Context, mgr ctrl.Manager) error {
	check := mgr.GetWebhookServer().StartedChecker()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check(nil)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("webhook server did not start: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// zapLevel keeps the manager quiet unless URMA_TEST_VERBOSE is set.
func zapLevel() zapcore.Level {
	if os.Getenv("URMA_TEST_VERBOSE") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel
}
