package deviceplugin

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/deviceplugin/server"
	"github.com/openeuler/urma-k8s/internal/node/selection"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

func parse(t *testing.T, args ...string) (Config, error) {
	t.Helper()
	cfg := Default()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.AddServeFlags(fs)
	err := fs.Parse(args)
	return cfg, err
}

func TestDefaultsAreValid(t *testing.T) {
	cfg, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if cfg.Sysfs.SysfsRoot != "/sys" || cfg.Sysfs.DevRoot != "/dev" || cfg.Registrar.SocketDir != "/var/lib/kubelet/device-plugins" ||
		cfg.Inventory.Budget.JettiesPerUnit != 16 || cfg.Inventory.Selection.Bonding != selection.BondingAuto || !cfg.LabelNode {
		t.Errorf("defaults %+v", cfg)
	}
}

func TestServeFlags(t *testing.T) {
	cfg, err := parse(t,
		"--sysfs-root=/host/sys", "--dev-root=/host/dev", "--jetties-per-unit=32", "--host-reserve=64",
		"--max-units-per-device=100", "--include=udma*, bonding*", "--exclude=udma9", "--drivers=udma",
		"--transports=UB,hns_ub", "--bonding=never", "--soft-devices=3", "--soft-jetties=256",
		"--poll-interval=2s", "--health-debounce-scans=3", "--health-debounce-hold=1s",
		"--socket-dir=/plugins", "--socket-name=x.sock", "--resource-name=example.com/j",
		"--kubelet-check-interval=1s", "--resync-interval=30s", "--extra-dev-nodes=/dev/a,/dev/b",
		"--cdi", "--cdi-spec-dir=/etc/cdi", "--cdi-kind=example.com/urma", "--cdi-strategy=cdi-annotations,cdi-cri", "--label-node=false",
		"--node-name=n1", "--kubeconfig=/kc", "--nfd-features-dir=/nfd", "--metrics-address=:1234",
		"--node-facts-resync-interval=90s",
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"roots", cfg.Sysfs.SysfsRoot == "/host/sys" && cfg.Sysfs.DevRoot == "/host/dev"},
		{"budget", cfg.Inventory.Budget.JettiesPerUnit == 32 && cfg.Inventory.Budget.HostReserve == 64 && cfg.Inventory.Budget.MaxUnitsPerDevice == 100},
		{"include", slices.Equal(cfg.Inventory.Selection.Include, []string{"udma*", "bonding*"})},
		{"exclude", slices.Equal(cfg.Inventory.Selection.Exclude, []string{"udma9"})},
		{"drivers", slices.Equal(cfg.Inventory.Selection.Drivers, []string{"udma"})},
		{"transports", slices.Equal(cfg.Inventory.Selection.Transports, []urma.TransportType{urma.TransportUB, urma.TransportHNSUB})},
		{"bonding", cfg.Inventory.Selection.Bonding == selection.BondingNever},
		{"soft", cfg.Inventory.SoftDevices == 3 && cfg.Inventory.SoftJetties == 256},
		{"watch", cfg.Watch.PollInterval == 2*time.Second && cfg.Inventory.Debounce.Observations == 3 && cfg.Inventory.Debounce.Hold == time.Second},
		{"registrar", cfg.Registrar.SocketDir == "/plugins" && cfg.Registrar.SocketName == "x.sock" && cfg.Registrar.ResourceName == "example.com/j" && cfg.Registrar.CheckInterval == time.Second},
		{"server", cfg.Server.Resync == 30*time.Second && slices.Equal(cfg.Server.ExtraDevNodes, []string{"/dev/a", "/dev/b"})},
		{"cdi", cfg.CDIEnabled && cfg.CDI.Dir == "/etc/cdi" && cfg.CDI.Kind == "example.com/urma" &&
			slices.Equal(cfg.Server.CDIStrategies, []server.CDIStrategy{server.CDIStrategyAnnotations, server.CDIStrategyCRI})},
		{"node", !cfg.LabelNode && cfg.NodeName == "n1" && cfg.Kubeconfig == "/kc" && cfg.FeaturesDir == "/nfd" && cfg.NodeResync == 90*time.Second},
		{"metrics", cfg.MetricsAddress == ":1234"},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s not parsed: %+v", c.name, cfg)
		}
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	cfg, err := parse(t, "--jetties-per-unit=0", "--poll-interval=0s", "--extra-dev-nodes=/etc/x", "--socket-dir=rel", "--cdi", "--cdi-kind=nokind")
	if err != nil {
		t.Fatal(err)
	}
	cfg.CDIRetry = 0 // set in Config only, no flag
	err = cfg.Validate()
	for _, want := range []string{"jetties per unit", "poll interval", "/etc/x", "absolute", "nokind", "CDI retry interval 0s must be positive"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to mention %q", err, want)
		}
	}
}

func TestBadFlagValues(t *testing.T) {
	for _, args := range [][]string{
		{"--jetties-per-unit=-1"}, {"--jetties-per-unit=4294967296"}, {"--host-reserve=x"}, {"--transports=roce"},
		{"--cdi-strategy=envvar"},
	} {
		if _, err := parse(t, args...); err == nil {
			t.Errorf("parse(%q) succeeded", args)
		}
	}
}

func TestCDIStrategyNeedsCDIMode(t *testing.T) {
	cfg, err := parse(t, "--cdi-strategy=cdi-annotations")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--cdi") {
		t.Fatalf("Validate = %v, want it to say CDI mode is off", err)
	}
	long := "example.com/" + strings.Repeat("j", 60)
	cfg, err = parse(t, "--cdi", "--cdi-strategy=cdi-annotations", "--cdi-kind="+long)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "annotation key") {
		t.Fatalf("Validate = %v, want the kind refused as an annotation key (63 characters at most)", err)
	}
}

// An interval flag of zero or less used to be replaced by its default
// without a word; it must be refused like --poll-interval is.
func TestIntervalFlagsMustBePositive(t *testing.T) {
	for _, tt := range []struct{ arg, want string }{
		{"--kubelet-check-interval=0s", "--kubelet-check-interval 0s must be positive"},
		{"--kubelet-check-interval=-1s", "--kubelet-check-interval -1s must be positive"},
		{"--resync-interval=0s", "--resync-interval 0s must be positive"},
		{"--resync-interval=-5m", "--resync-interval -5m0s must be positive"},
		{"--node-facts-resync-interval=0s", "--node-facts-resync-interval 0s must be positive"},
	} {
		t.Run(tt.arg, func(t *testing.T) {
			cfg, err := parse(t, tt.arg)
			if err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// The container runtime reads CDI specs from its own absolute directories:
// one written relative to the plugin's working directory is never found.
func TestRelativeCDISpecDirRefused(t *testing.T) {
	cfg, err := parse(t, "--cdi", "--cdi-spec-dir=var/run/cdi")
	if err != nil {
		t.Fatal(err)
	}
	want := `CDI spec directory "var/run/cdi" must be an absolute path`
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Validate = %v, want it to say %q", err, want)
	}
}

// --cdi-spec-dir and --cdi-kind mean something only in CDI mode: without
// --cdi they were accepted and ignored (no spec written, no CDI names),
// while --cdi-strategy was refused. Given alone, even with their default
// values, they are a mistake to report.
func TestCDIFlagsNeedCDIMode(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		wantErr []string // every one must be in the error; none: valid
	}{
		{[]string{"--cdi-spec-dir=/etc/cdi"}, []string{"--cdi-spec-dir is set but CDI mode is off: add --cdi"}},
		{[]string{"--cdi-spec-dir=/var/run/cdi"}, []string{"--cdi-spec-dir is set but CDI mode is off: add --cdi"}},
		{[]string{"--cdi-kind=example.com/urma"}, []string{"--cdi-kind is set but CDI mode is off: add --cdi"}},
		{[]string{"--cdi-kind=example.com/urma", "--cdi-spec-dir=/etc/cdi"}, []string{"--cdi-spec-dir is set but CDI mode is off: add --cdi", "--cdi-kind is set but CDI mode is off: add --cdi"}},
		{[]string{"--cdi", "--cdi-spec-dir=/etc/cdi", "--cdi-kind=example.com/urma"}, nil},
		{[]string{"--cdi=false"}, nil},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			cfg, err := parse(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			err = cfg.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			for _, w := range tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %v, want it to say %q", err, w)
				}
			}
		})
	}
}

// NFD reads its features.d directory by an absolute path on the host: a
// feature file written relative to the plugin's working directory is never
// read, and the node never gets the labels the chart's affinity selects on.
func TestRelativeNFDFeaturesDirRefused(t *testing.T) {
	cfg, err := parse(t, "--nfd-features-dir=etc/kubernetes/node-feature-discovery/features.d")
	if err != nil {
		t.Fatal(err)
	}
	want := `--nfd-features-dir "etc/kubernetes/node-feature-discovery/features.d" must be an absolute path`
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Validate = %v, want it to say %q", err, want)
	}
}
