// Command urma-operator reconciles UrmaEndpoint resources into tuned urma_*
// transport flags and injects them into pods (docs/operator.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/controllers"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/operator/plan"
	"github.com/openeuler/urma-k8s/internal/operator/webhook"
	"github.com/openeuler/urma-k8s/internal/operator/webhook/certs"
)

// options are the command line.
type options struct {
	leaderElect             bool
	leaderElectionNamespace string
	metricsAddr             string
	metricsSecure           bool
	metricsCertDir          string
	probeAddr               string
	enableWebhooks          bool
	webhookPort             int
	certDir                 string
	selfSignedCerts         bool
	namespace               string
	webhookService          string
	certSecret              string
	extraDNSNames           []string
	defaultJettiesPerUnit   int64
	driver                  plan.Driver
	zap                     zap.Options
	// repeatControllers lets run start its controllers again in this
	// process: controller-runtime refuses a controller name it has seen,
	// and tests run the operator once per go test -count.
	repeatControllers bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{driver: plan.DriverDevicePlugin}
	fs := flag.NewFlagSet("urma-operator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader so that only one replica reconciles (use with more than one replica)")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "address of the Prometheus /metrics endpoint; 0 disables it")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "serve /metrics over HTTPS and let only callers whose token may get the non-resource URL /metrics read it (TokenReview and SubjectAccessReview); false serves plain HTTP to anyone")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "directory holding tls.crt and tls.key for /metrics; empty means a self-signed certificate generated at start")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	fs.BoolVar(&o.enableWebhooks, "enable-webhooks", true, "serve the pod mutating and UrmaEndpoint validating webhooks")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "port of the webhook server")
	fs.StringVar(&o.certDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory holding the webhook server's tls.crt and tls.key")
	fs.BoolVar(&o.selfSignedCerts, "self-signed-certs", true, "generate and rotate the webhook certificate and caBundle; set false when cert-manager provides them")
	fs.StringVar(&o.namespace, "namespace", envOr("POD_NAMESPACE", "urma-system"), "namespace the operator runs in (webhook Service and certificate Secret)")
	fs.StringVar(&o.webhookService, "webhook-service", "urma-operator-webhook", "name of the Service in front of the webhook server")
	fs.StringVar(&o.certSecret, "cert-secret", "urma-operator-webhook-certs", "Secret holding the self-signed CA and serving certificate")
	fs.Func("webhook-extra-dns-names", "comma-separated extra DNS names for the self-signed serving certificate (when the API server reaches the webhook by another name)", func(v string) error {
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				o.extraDNSNames = append(o.extraDNSNames, n)
			}
		}
		return nil
	})
	fs.Int64Var(&o.defaultJettiesPerUnit, "default-jetties-per-unit", nodefacts.DefaultJettiesPerUnit,
		"jetties one unit of "+nodefacts.ResourceName+" stands for until nodes publish facts; set it to the device plugin's --jetties-per-unit")
	fs.Func("jetty-driver", "node agent offering URMA devices: devicePlugin (pods request "+nodefacts.ResourceName+" units) or dra (node facts from ResourceSlices, pods get ResourceClaims; docs/dra.md)", func(v string) error {
		d, err := plan.ParseDriver(v)
		o.driver = d
		return err
	})
	o.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	// The port is used only by the webhook server; a chart that turns
	// webhooks off does not pass it.
	if o.enableWebhooks && (o.webhookPort <= 0 || o.webhookPort > 65535) {
		return options{}, fmt.Errorf("--webhook-port %d is not a port", o.webhookPort)
	}
	// Plain HTTP has no use for a certificate: the user who gave one expects
	// HTTPS and would get an open /metrics without a word.
	if !o.metricsSecure && o.metricsCertDir != "" {
		return options{}, fmt.Errorf("--metrics-cert-dir %q needs HTTPS, but --metrics-secure=false serves /metrics over plain HTTP: drop one of the two flags", o.metricsCertDir)
	}
	// Likewise with no /metrics at all (controller-runtime's "0"): the
	// certificate would be dropped, and the user expects an endpoint.
	if o.metricsAddr == "0" && o.metricsCertDir != "" {
		return options{}, fmt.Errorf("--metrics-cert-dir %q is for the /metrics endpoint, but --metrics-bind-address=0 disables it: drop one of the two flags", o.metricsCertDir)
	}
	if o.defaultJettiesPerUnit < 1 || o.defaultJettiesPerUnit > math.MaxUint32 {
		return options{}, fmt.Errorf("--default-jetties-per-unit %d: want 1 to %d", o.defaultJettiesPerUnit, uint32(math.MaxUint32))
	}
	if o.enableWebhooks && o.selfSignedCerts {
		// The rotator names the Service in the certificate and keeps it in
		// the Secret: refuse names the API server would, now rather than
		// after minutes of failing retries.
		for _, n := range []struct {
			flag, value string
			check       func(string) []string
		}{
			{"--namespace", o.namespace, validation.IsDNS1123Label},
			{"--webhook-service", o.webhookService, validation.IsDNS1035Label},
			{"--cert-secret", o.certSecret, validation.IsDNS1123Subdomain},
		} {
			if errs := n.check(n.value); len(errs) > 0 {
				return options{}, fmt.Errorf("%s %q: %s", n.flag, n.value, strings.Join(errs, "; "))
			}
		}
	}
	return o, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "urma-operator:", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	log := ctrl.Log.WithName("urma-operator")
	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "no Kubernetes client configuration")
		os.Exit(1)
	}
	if err := run(ctrl.SetupSignalHandler(), cfg, o, log); err != nil {
		log.Error(err, "operator stopped")
		os.Exit(1)
	}
}

// run wires the manager and blocks until ctx ends.
func run(ctx context.Context, cfg *rest.Config, o options, log logr.Logger) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("register Kubernetes types: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("register UrmaEndpoint types: %w", err)
	}
	mopts := ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(),
		Metrics:                 metricsOptions(o),
		HealthProbeBindAddress:  o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "urma-operator.urma.openeuler.org",
		LeaderElectionNamespace: o.leaderElectionNamespace,
		// Let a new leader take over at once when this one stops cleanly.
		LeaderElectionReleaseOnCancel: true,
	}
	if o.repeatControllers {
		mopts.Controller.SkipNameValidation = ptr.To(true)
	}
	if o.enableWebhooks {
		mopts.WebhookServer = ctrlwebhook.NewServer(ctrlwebhook.Options{Port: o.webhookPort, CertDir: o.certDir})
	}
	mgr, err := ctrl.NewManager(cfg, mopts)
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	r := &controllers.UrmaEndpointReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("urma-operator"),
		FallbackJettiesPerUnit: o.defaultJettiesPerUnit, Driver: o.driver,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up UrmaEndpoint controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	if o.enableWebhooks {
		if o.selfSignedCerts {
			rot, err := newRotator(cfg, scheme, o, log)
			if err != nil {
				return err
			}
			// The webhook server reads the files when it starts.
			if err := ensureWithRetry(ctx, rot, log); err != nil {
				if ctx.Err() != nil {
					// Stopped (SIGTERM) before the certificates were
					// ready: a normal stop, as it is once the manager runs.
					log.Info("stopped while waiting for webhook certificates", "lastError", err.Error())
					return nil
				}
				return err
			}
			if err := mgr.Add(rot); err != nil {
				return fmt.Errorf("add certificate rotator: %w", err)
			}
		}
		if err := webhook.Register(mgr, webhook.Options{FallbackJettiesPerUnit: o.defaultJettiesPerUnit, Driver: o.driver}); err != nil {
			return fmt.Errorf("register webhooks: %w", err)
		}
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return fmt.Errorf("add webhook readiness check: %w", err)
		}
		if err := mgr.AddReadyzCheck("informers", webhook.CacheSynced(mgr.GetCache())); err != nil {
			return fmt.Errorf("add informer readiness check: %w", err)
		}
	} else {
		log.Info("webhooks disabled: pods get no flags injected; mount the ConfigMap yourself")
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	log.Info("starting", "leaderElect", o.leaderElect, "webhooks", o.enableWebhooks, "selfSignedCerts", o.selfSignedCerts)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

// metricsOptions serves /metrics as kubebuilder does: over HTTPS, readable
// only with a token allowed to get the non-resource URL /metrics.
func metricsOptions(o options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure}
	if o.metricsSecure {
		m.FilterProvider = filters.WithAuthenticationAndAuthorization
		m.CertDir = o.metricsCertDir
	}
	return m
}

func newRotator(cfg *rest.Config, scheme *runtime.Scheme, o options, log logr.Logger) (*certs.Rotator, error) {
	// Uncached: the manager's cache is not running yet, and Secrets must not
	// be cached cluster-wide. The webhook configurations are watched by name.
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("create client for certificates: %w", err)
	}
	svc := o.webhookService + "." + o.namespace + ".svc"
	return &certs.Rotator{
		Client: c, Reader: c, Watcher: c,
		Secret:             types.NamespacedName{Namespace: o.namespace, Name: o.certSecret},
		CertDir:            o.certDir,
		DNSNames:           append([]string{svc, svc + ".cluster.local"}, o.extraDNSNames...),
		MutatingWebhooks:   []string{webhook.MutatingConfigName},
		ValidatingWebhooks: []string{webhook.ValidatingConfigName},
		Log:                log.WithName("certs"),
	}, nil
}

// ensureWithRetry gets the first certificate, retrying transient failures
// (API server not reachable yet) for up to two minutes.
func ensureWithRetry(ctx context.Context, rot *certs.Rotator, log logr.Logger) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: time.Second, Factor: 2, Steps: 8, Cap: 30 * time.Second},
		func(ctx context.Context) (bool, error) {
			if last = rot.Ensure(ctx); last != nil {
				log.Info("webhook certificates not ready; retrying", "error", last.Error())
				return false, nil
			}
			return true, nil
		})
	if err != nil {
		return fmt.Errorf("webhook certificates: %w", errors.Join(err, last))
	}
	return nil
}
