// Package dra assembles urma-dra-driver, the Dynamic Resource Allocation
// driver: the device plugin's discovery and health loop (watch, inventory)
// feeds the node plugin (package plugin), which the kubeletplugin helper
// serves to kubelet and whose slices it publishes. cmd/dra-driver only
// parses flags into a Config and calls Run.
package dra

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	"github.com/openeuler/urma-k8s/internal/dra/plugin"
	"github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/kubeclient"
	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
	"github.com/openeuler/urma-k8s/internal/node/selection"
	"github.com/openeuler/urma-k8s/internal/node/shmdir"
	"github.com/openeuler/urma-k8s/internal/node/watch"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

// Defaults not owned by a sub-package.
const (
	DefaultSoftJetties   = 1024
	DefaultDebounceScans = 2
	DefaultDebounceHold  = 3 * time.Second

	httpReadTimeout    = 10 * time.Second
	httpShutdownPeriod = 5 * time.Second
)

// Config is everything the driver can be told.
type Config struct {
	Sysfs     sysfs.Options
	Inventory inventory.Config
	Watch     watch.Config
	Policy    slices.RequestPolicy
	CDI       claimspec.Config

	// NodeName is this node (default $NODE_NAME); its pool and slices
	// carry the name.
	NodeName string
	// Kubeconfig is for running outside a cluster; "" is in-cluster.
	Kubeconfig string
	// PluginDataDir holds dra.sock and the checkpoint; RegistrarDir is
	// kubelet's plugin registration directory. Both must be the same
	// paths inside and outside the driver's container.
	PluginDataDir string
	RegistrarDir  string
	// HealthResend is how often device health is re-sent to kubelet.
	HealthResend time.Duration
	// StaleClaimCheck is how often prepared claims are checked against the
	// API server for ones kubelet will never unprepare.
	StaleClaimCheck time.Duration
	// Libs is the liburma injected into containers for C programs.
	Libs libinject.Config
	// HealthAddress serves /readyz (ready once kubelet has registered the
	// driver); "" serves nothing.
	HealthAddress string
}

// Default returns the defaults.
func Default() Config {
	return Config{
		Inventory: inventory.Config{
			// Units are the device plugin's; the driver publishes the
			// budget before rounding (Budget.Available), so one jetty per
			// unit and no cap leave it untouched.
			Budget:      budget.Config{JettiesPerUnit: 1, MaxUnitsPerDevice: math.MaxUint32},
			Selection:   selection.Policy{Bonding: selection.BondingAuto},
			Debounce:    health.Debounce{Observations: DefaultDebounceScans, Hold: DefaultDebounceHold},
			SoftJetties: DefaultSoftJetties,
		},
		Watch:           watch.Config{PollInterval: watch.DefaultPollInterval, Settle: watch.DefaultSettle},
		Policy:          slices.DefaultRequestPolicy(),
		CDI:             claimspec.Config{Dir: claimspec.DefaultDir, Kind: claimspec.DefaultKind, ShmDir: shmdir.DefaultDir},
		PluginDataDir:   filepath.Join(kubeletplugin.KubeletPluginsDir, slicefacts.DriverName),
		RegistrarDir:    kubeletplugin.KubeletRegistryDir,
		HealthResend:    plugin.DefaultHealthResend,
		StaleClaimCheck: plugin.DefaultStaleClaimCheck,
		Libs:            libinject.Default(),
	}
}

// AddFlags registers the driver's flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Sysfs.SysfsRoot, "sysfs-root", "/sys", "root of the host's sysfs; devices are read from <root>/class/ubcore and <root>/class/uburma")
	fs.StringVar(&c.Sysfs.DevRoot, "dev-root", "/dev", "where the host's /dev is visible; device nodes are checked under it (CDI specs always name /dev/... paths)")
	c.Inventory.AddFlags(fs)
	c.Inventory.AddHealthFlags(fs)
	c.Watch.AddFlags(fs)
	fs.Int64Var(&c.Policy.Default, "jetty-request-default", c.Policy.Default, "jetties a request that names no amount gets (an extended-resource unit); use the device plugin's --jetties-per-unit")
	fs.Int64Var(&c.Policy.Min, "jetty-request-min", c.Policy.Min, "smallest jetty request; smaller ones are rounded up to it")
	fs.Int64Var(&c.Policy.Step, "jetty-request-step", c.Policy.Step, "requests are rounded up to min + a multiple of this")
	fs.StringVar(&c.CDI.Dir, "cdi-spec-dir", c.CDI.Dir, "directory the container runtime reads CDI specs from; one spec per prepared claim goes there")
	fs.StringVar(&c.CDI.Kind, "cdi-kind", c.CDI.Kind, "CDI vendor/class of the claims' devices")
	fs.StringVar(&c.CDI.ShmDir, "shm-dir", c.CDI.ShmDir, "host directory of the shm fabric, mounted into every container at the same path (URMA_SHM_DIR); empty: none")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "this node's name (default: $NODE_NAME)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig for running outside a cluster (default: in-cluster config)")
	fs.StringVar(&c.PluginDataDir, "plugin-data-dir", c.PluginDataDir, "directory for dra.sock and the checkpoint; same path on the host")
	fs.StringVar(&c.RegistrarDir, "registrar-dir", c.RegistrarDir, "kubelet's plugin registration directory; same path on the host")
	fs.DurationVar(&c.HealthResend, "health-resend-interval", c.HealthResend, "resend device health to kubelet this often without a change")
	fs.DurationVar(&c.StaleClaimCheck, "stale-claim-check-interval", c.StaleClaimCheck, "check prepared claims this often (and at start) against the API server, and forget those deleted or deallocated that kubelet will never unprepare")
	c.Libs.AddFlags(fs)
	fs.StringVar(&c.HealthAddress, "health-address", c.HealthAddress, "address serving /readyz, ready once kubelet has registered the driver (the readiness probe's target); empty serves nothing")
}

// Validate checks the whole configuration and names every problem.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is empty: set NODE_NAME or --node-name"))
	}
	for _, err := range []error{c.Inventory.Validate(), c.Watch.Validate(), c.Policy.Validate(), c.CDI.Validate(), c.Libs.Validate()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.PluginDataDir == "" || c.RegistrarDir == "" {
		errs = append(errs, errors.New("plugin data and registrar directories must be set"))
	}
	// Kubelet finds the sockets by these paths, which mean nothing
	// relative to the driver's working directory.
	for _, d := range []struct{ what, dir string }{{"plugin data", c.PluginDataDir}, {"registrar", c.RegistrarDir}} {
		if d.dir != "" && !filepath.IsAbs(d.dir) {
			errs = append(errs, fmt.Errorf("%s directory %q must be an absolute path", d.what, d.dir))
		}
	}
	// The plugin reads zero as "the default"; on the command line a zero
	// or negative interval is a mistake, not a request for it.
	// Capped too: kubelet is told to expire health after 3× the interval,
	// and beyond the cap that lease means nothing or overflows.
	if c.HealthResend <= 0 || c.HealthResend > plugin.MaxHealthResend {
		errs = append(errs, fmt.Errorf("--health-resend-interval %s must be positive and at most %s (kubelet expires device health after %d× it)",
			c.HealthResend, plugin.MaxHealthResend, plugin.HealthTimeoutResends))
	}
	if c.StaleClaimCheck <= 0 {
		errs = append(errs, fmt.Errorf("--stale-claim-check-interval %s must be positive", c.StaleClaimCheck))
	}
	if c.HealthAddress != "" {
		if _, _, err := net.SplitHostPort(c.HealthAddress); err != nil {
			errs = append(errs, fmt.Errorf("--health-address %q must be host:port or :port: %w", c.HealthAddress, err))
		}
	}
	return errors.Join(errs...)
}

// Deps are the things Run would otherwise create itself; tests inject them.
type Deps struct {
	// KubeClient publishes slices and reads claims; nil builds one from
	// Kubeconfig or the in-cluster config.
	KubeClient kubernetes.Interface
	// HealthListening, when set, is told the address /readyz is served on.
	HealthListening func(addr string)
}

// Run serves the driver until ctx is canceled. It returns an error for a
// configuration it cannot work with, or when the helper meets an error
// that retrying cannot fix.
func Run(ctx context.Context, log logr.Logger, cfg Config, deps Deps) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	if err := os.MkdirAll(cfg.PluginDataDir, 0o750); err != nil {
		return fmt.Errorf("create the plugin data directory: %w", err)
	}
	if cfg.CDI.ShmDir != "" {
		if err := shmdir.Prepare(cfg.CDI.ShmDir); err != nil {
			// As in the device plugin: pods still get their devices; their
			// software provider then serves same-node peers over TCP
			// (no_fast_path).
			log.Error(err, "shared memory between pods is off: claims carry no shm directory")
			cfg.CDI.ShmDir = ""
		}
	}
	client := deps.KubeClient
	if client == nil {
		c, err := kubeclient.New(cfg.Kubeconfig, "urma-dra-driver")
		if err != nil {
			return err
		}
		client = c
	}
	libs := libinject.Prepare(cfg.Libs, cfg.Inventory.SoftDevices > 0, log)
	cfg.CDI.Libs = libs
	specs, err := claimspec.New(cfg.CDI)
	if err != nil {
		return err
	}
	inv := inventory.New(cfg.Inventory.Budget.JettiesPerUnit)
	watcher := watch.New(cfg.Watch, watch.SysfsSource{Opts: cfg.Sysfs}, inventory.NewBuilder(cfg.Inventory), inv, log.WithName("discovery"), nil)

	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	plug, err := plugin.New(plugin.Config{
		NodeName: cfg.NodeName, DataDir: cfg.PluginDataDir, DevRoot: cfg.Sysfs.DevRoot,
		Policy: cfg.Policy, HealthResend: cfg.HealthResend, StaleClaimCheck: cfg.StaleClaimCheck,
		Liburma: slices.Liburma{Host: !libs.Host.Empty(), Soft: !libs.Soft.Empty()},
	}, inv, specs, log.WithName("plugin"), fail)
	if err != nil {
		return err
	}
	registration := plugin.NewRegistration()
	helper, err := kubeletplugin.Start(klog.NewContext(ctx, log.WithName("kubeletplugin")), plug,
		append(plugin.HelperOptions(),
			kubeletplugin.GRPCInterceptor(registration.Interceptor()),
			kubeletplugin.DriverName(slicefacts.DriverName),
			kubeletplugin.KubeClient(client),
			kubeletplugin.NodeName(cfg.NodeName),
			kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir),
			kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		)...,
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	var lis net.Listener
	if cfg.HealthAddress != "" {
		lis, err = net.Listen("tcp", cfg.HealthAddress)
		if err != nil {
			return fmt.Errorf("serve /readyz on %s (--health-address): %w", cfg.HealthAddress, err)
		}
		if deps.HealthListening != nil {
			deps.HealthListening(lis.Addr().String())
		}
	}

	log.Info("urma-dra-driver started", "driver", slicefacts.DriverName, "node", cfg.NodeName,
		"pluginDataDir", cfg.PluginDataDir, "registrarDir", cfg.RegistrarDir, "cdiSpecDir", cfg.CDI.Dir,
		"sysfsRoot", cfg.Sysfs.SysfsRoot, "devRoot", cfg.Sysfs.DevRoot, "requestPolicy", cfg.Policy, "healthAddress", cfg.HealthAddress)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return watcher.Run(gctx) })
	g.Go(func() error { return plug.Publish(gctx, helper) })
	g.Go(func() error {
		plug.RebuildUntilDone(gctx, claimReader{client}, 0)
		return nil
	})
	g.Go(func() error {
		plug.CleanStaleClaims(gctx, claimReader{client})
		return nil
	})
	if lis != nil {
		g.Go(func() error { return serveReadyz(gctx, lis, registration, log.WithName("http")) })
	}
	err = g.Wait()
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	log.Info("urma-dra-driver stopped")
	return err
}

// serveReadyz serves /readyz until ctx ends: 200 once kubelet has
// registered the driver, 503 and why until then and from a kubelet's next
// registration (a restarted kubelet) until it is done. It is the
// DaemonSet's readiness probe: a pod created on the node, or a rollout
// moving to the next node, waits for it.
func serveReadyz(ctx context.Context, lis net.Listener, reg *plugin.Registration, log logr.Logger) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready, why := reg.Ready(); !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, why)
			return
		}
		fmt.Fprintln(w, "ok: registered with kubelet")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: httpReadTimeout}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("readiness server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), httpShutdownPeriod)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Error(err, "readiness server shutdown")
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("readiness server: %w", err)
	}
	return nil
}

// claimReader reads claims straight from the API server (no cache: a claim
// prepared a moment ago must be found).
type claimReader struct{ client kubernetes.Interface }

func (g claimReader) GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	return g.client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

// ListClaims lists every namespace's claims, a page at a time.
func (g claimReader) ListClaims(ctx context.Context) ([]resourceapi.ResourceClaim, error) {
	var out []resourceapi.ResourceClaim
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return g.client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, opts)
	})
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		c, ok := obj.(*resourceapi.ResourceClaim)
		if !ok {
			return fmt.Errorf("listing ResourceClaims returned a %T", obj)
		}
		out = append(out, *c)
		return nil
	})
	return out, err
}
