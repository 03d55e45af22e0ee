// Package deviceplugin assembles urma-device-plugin: discovery and health
// (watch, inventory), the kubelet service (server, registrar), CDI specs,
// node facts, metrics and the discover report. cmd/deviceplugin only parses
// flags into a Config and calls Run or Discover.
package deviceplugin

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/openeuler/urma-k8s/internal/deviceplugin/cdispec"
	"github.com/openeuler/urma-k8s/internal/deviceplugin/nodelabel"
	"github.com/openeuler/urma-k8s/internal/deviceplugin/registrar"
	"github.com/openeuler/urma-k8s/internal/deviceplugin/server"
	"github.com/openeuler/urma-k8s/internal/flagvar"
	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
	"github.com/openeuler/urma-k8s/internal/node/selection"
	"github.com/openeuler/urma-k8s/internal/node/shmdir"
	"github.com/openeuler/urma-k8s/internal/node/watch"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

// Defaults not owned by a sub-package.
const (
	DefaultMetricsAddress     = ":9400"
	DefaultSoftJetties        = 1024
	DefaultDebounceScans      = 2
	DefaultDebounceHold       = 3 * time.Second
	DefaultNodeRetry          = time.Second
	DefaultCDIRetry           = 30 * time.Second
	defaultHTTPReadTimeout    = 10 * time.Second
	defaultHTTPShutdownPeriod = 5 * time.Second
)

// Config is everything the plugin can be told.
type Config struct {
	Sysfs     sysfs.Options
	Inventory inventory.Config
	Watch     watch.Config
	Server    server.Config
	Registrar registrar.Config

	// CDI enables CDI mode: write a spec into CDI.Dir and answer Allocate
	// with CDI device names.
	CDIEnabled bool
	CDI        cdispec.Config
	// CDIRetry is how often a failed CDI spec write is retried, and how
	// often the spec file is checked for having been deleted.
	CDIRetry time.Duration
	// cdiDirGiven and cdiKindGiven record --cdi-spec-dir and --cdi-kind on
	// the command line: without --cdi they would be ignored.
	cdiDirGiven, cdiKindGiven bool

	// LabelNode enables node labels/annotations; NodeName is the Node
	// (default: $NODE_NAME) and Kubeconfig an optional kubeconfig path
	// (default: in-cluster).
	LabelNode   bool
	NodeName    string
	Kubeconfig  string
	FeaturesDir string
	// NodeResync is how often the published node facts (labels,
	// annotations, feature file) are checked and put back where someone
	// else removed or edited them.
	NodeResync time.Duration

	// MetricsAddress serves /metrics, /healthz and /readyz; "" disables.
	MetricsAddress string

	// Libs is the liburma injected into containers for C programs.
	Libs libinject.Config
}

// Default returns the defaults.
func Default() Config {
	return Config{
		Inventory: inventory.Config{
			Budget:      budget.Default(),
			Selection:   selection.Policy{Bonding: selection.BondingAuto},
			Debounce:    health.Debounce{Observations: DefaultDebounceScans, Hold: DefaultDebounceHold},
			SoftJetties: DefaultSoftJetties,
		},
		Watch:  watch.Config{PollInterval: watch.DefaultPollInterval, Settle: watch.DefaultSettle},
		Server: server.Config{Resync: server.DefaultResync, ShmDir: shmdir.DefaultDir},
		Registrar: registrar.Config{
			SocketDir: registrar.DefaultSocketDir, SocketName: registrar.DefaultSocketName,
			ResourceName: nodefacts.ResourceName, CheckInterval: registrar.DefaultCheckInterval,
		},
		CDI:            cdispec.Config{Dir: cdispec.DefaultDir, Kind: cdispec.DefaultKind},
		CDIRetry:       DefaultCDIRetry,
		LabelNode:      true,
		NodeResync:     nodelabel.DefaultResync,
		MetricsAddress: DefaultMetricsAddress,
		Libs:           libinject.Default(),
	}
}

// AddDiscoveryFlags registers the flags shared by serve and discover: the
// host roots, the budget rule, selection and software devices.
func (c *Config) AddDiscoveryFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Sysfs.SysfsRoot, "sysfs-root", "/sys", "root of the host's sysfs; devices are read from <root>/class/ubcore and <root>/class/uburma")
	fs.StringVar(&c.Sysfs.DevRoot, "dev-root", "/dev", "where the host's /dev is visible; device nodes are checked under it (kubelet is always given /dev/... paths)")
	b := &c.Inventory.Budget
	uintVar(fs, &b.JettiesPerUnit, "jetties-per-unit", "jetties one advertised unit (device ID) stands for; use the same value on every node")
	uintVar(fs, &b.MaxUnitsPerDevice, "max-units-per-device", "most units (device IDs) advertised per device; jetties beyond are not advertised")
	c.Inventory.AddFlags(fs)
}

// AddServeFlags registers the serve command's flags (discovery flags too).
func (c *Config) AddServeFlags(fs *flag.FlagSet) {
	c.AddDiscoveryFlags(fs)
	c.Watch.AddFlags(fs)
	c.Inventory.AddHealthFlags(fs)
	fs.StringVar(&c.Registrar.SocketDir, "socket-dir", c.Registrar.SocketDir, "kubelet's device-plugin socket directory")
	fs.StringVar(&c.Registrar.SocketName, "socket-name", c.Registrar.SocketName, "this plugin's socket file name in --socket-dir")
	fs.StringVar(&c.Registrar.ResourceName, "resource-name", c.Registrar.ResourceName, "extended resource to advertise")
	fs.DurationVar(&c.Registrar.CheckInterval, "kubelet-check-interval", c.Registrar.CheckInterval, "how often to check that kubelet.sock and our socket are unchanged (fsnotify reacts at once)")
	fs.DurationVar(&c.Server.Resync, "resync-interval", c.Server.Resync, "resend the full device list to kubelet this often")
	fs.StringVar(&c.Server.ShmDir, "shm-dir", c.Server.ShmDir, "host directory mounted into every allocated container at the same path, and named by URMA_SHM_DIR: where the software provider of pods on this node meets for shared memory (made world-writable and sticky at start, like /tmp); empty disables")
	listVar(fs, &c.Server.ExtraDevNodes, "extra-dev-nodes", "comma-separated /dev/... nodes every container with a hardware device also gets (skipped when absent)")
	fs.BoolVar(&c.CDIEnabled, "cdi", c.CDIEnabled, "CDI mode: write a CDI spec and answer Allocate with CDI device names")
	fs.Var(&givenString{dst: &c.CDI.Dir, given: &c.cdiDirGiven}, "cdi-spec-dir", "`directory` to write the CDI spec into (one the container runtime reads); needs --cdi")
	fs.Var(&givenString{dst: &c.CDI.Kind, given: &c.cdiKindGiven}, "cdi-kind", "CDI `vendor/class` of the devices; needs --cdi")
	fs.Func("cdi-strategy", "how CDI device names reach the runtime, comma-separated: cdi-cri (the CdiDevices field of the Allocate response) and/or cdi-annotations (a cdi.k8s.io/ container annotation, for runtimes that read only annotations) (default cdi-cri)", func(s string) error {
		st, err := server.ParseCDIStrategies(s)
		c.Server.CDIStrategies = st
		return err
	})
	fs.BoolVar(&c.LabelNode, "label-node", c.LabelNode, "label and annotate this Node (NODE_NAME) with the device facts; needs RBAC nodes get/patch")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "Node to label (default: $NODE_NAME)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig for node labeling outside a cluster (default: in-cluster config)")
	fs.StringVar(&c.FeaturesDir, "nfd-features-dir", c.FeaturesDir, "also write a Node Feature Discovery feature file into this features.d directory")
	fs.DurationVar(&c.NodeResync, "node-facts-resync-interval", c.NodeResync, "check the node's labels and annotations and the feature file this often, and put back what someone else removed or changed")
	fs.StringVar(&c.MetricsAddress, "metrics-address", c.MetricsAddress, "address serving /metrics, /healthz (liveness) and /readyz (readiness: registered with kubelet); empty disables")
	c.Libs.AddFlags(fs)
}

// Validate checks the whole configuration and names every problem.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Inventory.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Watch.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Server.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Registrar.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Libs.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("liburma injection: %w", err))
	}
	// The sub-packages read zero as "the default"; on the command line a
	// zero or negative interval is a mistake, not a request for it.
	if c.Registrar.CheckInterval <= 0 {
		errs = append(errs, fmt.Errorf("--kubelet-check-interval %s must be positive", c.Registrar.CheckInterval))
	}
	if c.Server.Resync <= 0 {
		errs = append(errs, fmt.Errorf("--resync-interval %s must be positive", c.Server.Resync))
	}
	if c.NodeResync <= 0 {
		errs = append(errs, fmt.Errorf("--node-facts-resync-interval %s must be positive", c.NodeResync))
	}
	// NFD reads the feature file by its path on the host, which means
	// nothing relative to the plugin's working directory.
	if c.FeaturesDir != "" && !filepath.IsAbs(c.FeaturesDir) {
		errs = append(errs, fmt.Errorf("--nfd-features-dir %q must be an absolute path", c.FeaturesDir))
	}
	if c.CDIEnabled {
		if err := c.CDI.Validate(); err != nil {
			errs = append(errs, err)
		}
		if c.CDIRetry <= 0 {
			errs = append(errs, fmt.Errorf("CDI retry interval %s must be positive", c.CDIRetry))
		}
		if slices.Contains(c.Server.CDIStrategies, server.CDIStrategyAnnotations) {
			if _, err := server.CDIAnnotationKey(c.CDI.Kind); err != nil {
				errs = append(errs, err)
			}
		}
	} else {
		if len(c.Server.CDIStrategies) > 0 {
			errs = append(errs, errors.New("a CDI strategy is set but CDI mode is off: add --cdi"))
		}
		for _, f := range []struct {
			name  string
			given bool
		}{{"--cdi-spec-dir", c.cdiDirGiven}, {"--cdi-kind", c.cdiKindGiven}} {
			if f.given {
				errs = append(errs, fmt.Errorf("%s is set but CDI mode is off: add --cdi", f.name))
			}
		}
	}
	return errors.Join(errs...)
}

func listVar(fs *flag.FlagSet, dst *[]string, name, usage string) {
	flagvar.List(fs, dst, name, usage)
}

func uintVar(fs *flag.FlagSet, dst *uint32, name, usage string) {
	flagvar.Uint32(fs, dst, name, usage)
}

// givenString is a string flag that records whether it was given, so that
// Validate can refuse one that means nothing in the chosen mode.
type givenString struct {
	dst   *string
	given *bool
}

func (v *givenString) String() string {
	if v.dst == nil {
		return ""
	}
	return *v.dst
}

func (v *givenString) Set(s string) error {
	*v.dst, *v.given = s, true
	return nil
}
