package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/openeuler/urma-k8s/internal/deviceplugin/cdispec"
	"github.com/openeuler/urma-k8s/internal/deviceplugin/nodelabel"
	"github.com/openeuler/urma-k8s/internal/deviceplugin/registrar"
	"github.com/openeuler/urma-k8s/internal/deviceplugin/server"
	"github.com/openeuler/urma-k8s/internal/kubeclient"
	"github.com/openeuler/urma-k8s/internal/node/discover"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/internal/node/shmdir"
	"github.com/openeuler/urma-k8s/internal/node/watch"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

// Deps are the things Run would otherwise create itself; tests inject them.
type Deps struct {
	// KubeClient labels the Node; nil means build one from Kubeconfig or
	// the in-cluster config when node labeling is on.
	KubeClient kubernetes.Interface
	// MetricsListening, when set, is told the address /metrics is served on.
	MetricsListening func(addr string)
	// Source, when set, replaces sysfs discovery (tests).
	Source watch.Source
}

// Run serves the device plugin until ctx is canceled. It returns an error
// only for a configuration it cannot work with (invalid flags, an
// unbindable metrics address); everything at runtime is retried.
func Run(ctx context.Context, log logr.Logger, cfg Config, deps Deps) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	if cfg.Inventory.SoftDevices > 0 {
		log.Info("advertising software-provider devices; allocations from them set URMA_PROVIDER=soft",
			"count", cfg.Inventory.SoftDevices, "jettiesEach", cfg.Inventory.SoftJetties)
	}
	m := metrics.New()
	// discovered is what the scans find; advertised is what kubelet, the
	// node facts and /healthz are told. They are one inventory unless CDI
	// is on: then a device is advertised only once its CDI spec is written.
	discovered := inventory.New(cfg.Inventory.Budget.JettiesPerUnit)
	advertised := discovered

	srvCfg := cfg.Server
	srvCfg.DevRoot = cfg.Sysfs.DevRoot
	if srvCfg.ShmDir != "" {
		if err := shmdir.Prepare(srvCfg.ShmDir); err != nil {
			// Pods still get their devices; their software provider then
			// serves same-node peers over TCP (no_fast_path).
			log.Error(err, "shared memory between pods is off: allocations carry no shm directory")
			srvCfg.ShmDir = ""
		}
	}
	srvCfg.Libs = libinject.Prepare(cfg.Libs, cfg.Inventory.SoftDevices > 0, log)
	var cdiWriter *cdispec.Writer
	if cfg.CDIEnabled {
		cdiCfg := cfg.CDI
		cdiCfg.DevRoot, cdiCfg.ExtraDevNodes, cdiCfg.Libs = cfg.Sysfs.DevRoot, cfg.Server.ExtraDevNodes, srvCfg.Libs.Host
		w, err := cdispec.New(cdiCfg, log.WithName("cdi"))
		if err != nil {
			return err
		}
		cdiWriter = w
		srvCfg.CDIKind = cdiCfg.Kind
		advertised = inventory.New(cfg.Inventory.Budget.JettiesPerUnit)
	}
	svc := server.New(srvCfg, advertised, log.WithName("server"), m)
	regCfg := cfg.Registrar
	regCfg.Options = server.Options()
	reg := registrar.New(regCfg, svc, log.WithName("registrar"), m)
	var src watch.Source = watch.SysfsSource{Opts: cfg.Sysfs}
	if deps.Source != nil {
		src = deps.Source
	}
	watcher := watch.New(cfg.Watch, src, inventory.NewBuilder(cfg.Inventory), discovered, log.WithName("discovery"), m)

	publisher, err := newPublisher(cfg, deps, srvCfg.Libs, log.WithName("node"), m)
	if err != nil {
		return err
	}

	var lis net.Listener
	if cfg.MetricsAddress != "" {
		lis, err = net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			return fmt.Errorf("serve metrics on %s: %w", cfg.MetricsAddress, err)
		}
		if deps.MetricsListening != nil {
			deps.MetricsListening(lis.Addr().String())
		}
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return watcher.Run(ctx) })
	g.Go(func() error {
		// Kubelet must never get an empty first list from a node that has
		// devices, nor a device before its CDI spec exists: serve and
		// register only once the first scan is advertised.
		if _, ok := advertised.WaitScanned(ctx); !ok {
			return nil
		}
		return reg.Run(ctx)
	})
	g.Go(func() error { return publisher.Run(ctx, advertised) })
	if cdiWriter != nil {
		g.Go(func() error { return cdiWriter.Run(ctx, discovered, advertised, cfg.CDIRetry) })
	}
	if lis != nil {
		g.Go(func() error { return serveHTTP(ctx, lis, m, reg, advertised, log.WithName("http")) })
	}
	log.Info("urma-device-plugin started", "resource", cfg.Registrar.ResourceName, "socketDir", cfg.Registrar.SocketDir,
		"sysfsRoot", cfg.Sysfs.SysfsRoot, "devRoot", cfg.Sysfs.DevRoot, "jettiesPerUnit", cfg.Inventory.Budget.JettiesPerUnit,
		"cdi", cfg.CDIEnabled, "metrics", cfg.MetricsAddress)
	err = g.Wait()
	log.Info("urma-device-plugin stopped")
	return err
}

func newPublisher(cfg Config, deps Deps, libs libinject.Set, log logr.Logger, m *metrics.Metrics) (*nodelabel.Publisher, error) {
	pcfg := nodelabel.Config{FeaturesDir: cfg.FeaturesDir, RetryInitial: DefaultNodeRetry, Resync: cfg.NodeResync,
		HostLiburma: !libs.Host.Empty(), SoftLiburma: !libs.Soft.Empty()}
	client := deps.KubeClient
	if cfg.LabelNode && cfg.NodeName != "" {
		pcfg.NodeName = cfg.NodeName
		if client == nil {
			c, err := kubeclient.New(cfg.Kubeconfig, "urma-device-plugin")
			if err != nil {
				// Labeling is optional; the plugin's job is kubelet's.
				log.Error(err, "no Kubernetes API access; not labeling the node")
				pcfg.NodeName = ""
			}
			client = c
		}
	} else if cfg.LabelNode {
		log.Info("NODE_NAME is not set; not labeling the node")
	}
	return nodelabel.New(pcfg, client, log, m), nil
}

// HealthWaitingForScan is /healthz's answer until the first discovery scan
// is advertised (the plugin registers with kubelet only then).
const HealthWaitingForScan = "waiting for the first discovery scan; not registered with kubelet yet"

// Answers of /readyz while the plugin is not ready, besides
// HealthWaitingForScan and NotServing.
const (
	ReadyNotRegistered = "not registered with kubelet"
	ReadyNotFollowed   = "registered; kubelet has not asked for the device list yet"
	// NotServing is /healthz's and /readyz's answer while the plugin's
	// socket is not served (a serve that failed is being retried).
	NotServing = "not serving the device plugin socket"
)

// serveHTTP serves /metrics, /healthz and /readyz until ctx ends.
//
// /healthz (liveness) is 200 while the plugin's gRPC socket is served:
// kubelet being away is not the plugin's illness. /readyz (readiness) is
// 200 only while kubelet has the plugin, registered and following its
// device list: what a pod created next, or a DaemonSet rollout moving to
// the next node, needs. Both say why not in their body.
func serveHTTP(ctx context.Context, lis net.Listener, m *metrics.Metrics, reg *registrar.Registrar, inv *inventory.Inventory, log logr.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	// notServing answers 503 with the reason when the socket is not served.
	notServing := func(w http.ResponseWriter, snap *inventory.Snapshot) bool {
		if reg.Serving() {
			return false
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		if !snap.Scanned {
			fmt.Fprintln(w, HealthWaitingForScan)
		} else {
			fmt.Fprintln(w, NotServing)
		}
		return true
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		snap, _ := inv.Current()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if notServing(w, snap) {
			return
		}
		fmt.Fprintf(w, "ok: serving; registered=%v devices=%d\n", reg.Registered(), len(snap.Devices))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		snap, _ := inv.Current()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if reg.Ready() {
			fmt.Fprintf(w, "ok: registered with kubelet, which follows the device list; devices=%d\n", len(snap.Devices))
			return
		}
		if notServing(w, snap) {
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		if reg.Registered() {
			fmt.Fprintln(w, ReadyNotFollowed)
		} else {
			fmt.Fprintln(w, ReadyNotRegistered)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: defaultHTTPReadTimeout}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), defaultHTTPShutdownPeriod)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Error(err, "metrics server shutdown")
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}

// Discover prints the discovery report (see package discover) to w.
func Discover(w io.Writer, cfg Config) error {
	if err := cfg.Inventory.Validate(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	devs, err := sysfs.Discover(cfg.Sysfs)
	if err != nil {
		return err
	}
	return discover.Write(w, discover.Report(devs, cfg.Inventory))
}
