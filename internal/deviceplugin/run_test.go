package deviceplugin

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openeuler/urma-k8s/internal/deviceplugin/kubelettest"
	"github.com/openeuler/urma-k8s/internal/deviceplugin/server"
	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/watch"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/podenv"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

const deadline = 15 * time.Second

type node struct {
	t       *testing.T
	logs    *logtest.Lines
	tree    *sysfstest.Tree
	dir     string
	kubelet *kubelettest.Kubelet
	client  *fake.Clientset
	metrics string // base URL
	stop    func()
}

// start runs the whole plugin against a fake host tree, a fake kubelet and
// a fake API server.
func start(t *testing.T, tree *sysfstest.Tree, mutate func(*Config)) *node {
	t.Helper()
	return startWith(t, tree, mutate, Deps{})
}

// startWith is start with dependencies to inject (KubeClient and
// MetricsListening are always the harness's own).
func startWith(t *testing.T, tree *sysfstest.Tree, mutate func(*Config), deps Deps) *node {
	t.Helper()
	dir, cleanup, err := kubelettest.SocketDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, tree: tree, dir: dir, kubelet: k, logs: &logtest.Lines{},
		client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})}
	t.Cleanup(func() { n.kubelet.Stop() })

	cfg := Default()
	cfg.Sysfs = tree.Options()
	cfg.Registrar.SocketDir = dir
	cfg.Registrar.BackoffInitial, cfg.Registrar.BackoffMax = time.Millisecond, 20*time.Millisecond
	cfg.Watch.PollInterval, cfg.Watch.Settle = 10*time.Millisecond, time.Millisecond
	cfg.Inventory.Debounce.Hold = 0
	cfg.NodeName = "node-a"
	cfg.MetricsAddress = "127.0.0.1:0"
	cfg.Server.ShmDir = filepath.Join(t.TempDir(), "shm")
	// Nothing of this machine's: a host without liburma, no software one.
	cfg.Libs.HostRoot, cfg.Libs.SoftLib = t.TempDir(), ""
	if mutate != nil {
		mutate(&cfg)
	}
	addr := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		deps.KubeClient, deps.MetricsListening = n.client, func(a string) { addr <- a }
		done <- Run(ctx, n.logs.Logger(t), cfg, deps)
	}()
	select {
	case a := <-addr:
		n.metrics = "http://" + a
	case err := <-done:
		t.Fatalf("Run ended at once: %v", err)
	}
	stopped := false
	n.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil after cancel", err)
			}
		case <-time.After(deadline):
			t.Error("Run did not stop")
		}
	}
	t.Cleanup(n.stop)
	return n
}

func (n *node) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	n.t.Cleanup(cancel)
	return ctx
}

// units waits until kubelet's view satisfies cond and returns it.
func (n *node) units(what string, cond func(map[string]*pluginapi.Device) bool) map[string]*pluginapi.Device {
	n.t.Helper()
	var last map[string]*pluginapi.Device
	_, err := n.kubelet.WaitFor(n.ctx(), func(s kubelettest.State) bool {
		p, ok := s.Plugins[nodefacts.ResourceName]
		if !ok || !p.Streaming {
			return false
		}
		last = map[string]*pluginapi.Device{}
		for _, d := range p.Devices {
			last[d.ID] = d
		}
		return cond(last)
	})
	if err != nil {
		n.t.Fatalf("waiting for %s: %v; kubelet has %d units", what, err, len(last))
	}
	return last
}

func count(prefix, health string) func(map[string]*pluginapi.Device) int {
	return func(m map[string]*pluginapi.Device) int {
		c := 0
		for id, d := range m {
			if strings.HasPrefix(id, prefix) && (health == "" || d.Health == health) {
				c++
			}
		}
		return c
	}
}

func (n *node) allocate(ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	c := n.kubelet.Client(nodefacts.ResourceName)
	if c == nil {
		n.t.Fatal("kubelet has no client for the resource")
	}
	resp, err := c.Allocate(n.ctx(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0], nil
}

func (n *node) get(path string) (int, string) {
	n.t.Helper()
	resp, err := http.Get(n.metrics + path)
	if err != nil {
		n.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		n.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func (n *node) nodeObj() *corev1.Node {
	obj, err := n.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	return obj
}

func TestHardwareLifecycle(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	tree.AddDevNode(t, sysfstest.UMMUNode)
	n := start(t, tree, nil)

	// 1024 max_jetty - 16 reserved = 1008 = 63 units of 16, on NUMA node 0.
	got := n.units("udma0's 63 units", func(m map[string]*pluginapi.Device) bool { return count("udma0-", pluginapi.Healthy)(m) == 63 })
	if topo := got["udma0-62"].Topology; topo == nil || topo.Nodes[0].ID != 0 {
		t.Errorf("udma0-62 topology %v", topo)
	}

	resp, err := n.allocate("udma0-0", "udma0-1", "udma0-2", "udma0-3")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Envs[podenv.Device] != "udma0" || resp.Envs[podenv.JettyBudget] != "64" || resp.Envs[podenv.EID] != "::ffff:10.0.0.1" {
		t.Errorf("env %v", resp.Envs)
	}
	var paths []string
	for _, d := range resp.Devices {
		paths = append(paths, d.ContainerPath+"="+d.HostPath)
	}
	if strings.Join(paths, ",") != "/dev/uburma/udma0=/dev/uburma/udma0,/dev/ummu/tid=/dev/ummu/tid" {
		t.Errorf("devices %v", paths)
	}

	eventually.Holds(t, "node labeled", deadline, func() bool { return n.nodeObj().Labels[nodefacts.LabelPresent] == "true" })
	facts, err := nodefacts.Parse(n.nodeObj().Annotations)
	if err != nil || facts.DeviceCount != 1 || facts.JettiesPerDevice != 1008 || facts.MaxJFSDepth != 8192 || facts.JettiesPerUnit != 16 {
		t.Errorf("node facts %+v, %v", facts, err)
	}

	// kubelet may list the units (its ListAndWatch) before the plugin's
	// Register call has returned and marked it registered.
	eventually.Holds(t, "/healthz saying registered", deadline, func() bool {
		code, body := n.get("/healthz")
		return code == http.StatusOK && strings.Contains(body, "registered=true")
	})
	eventually.Holds(t, "metrics", deadline, func() bool {
		_, body := n.get("/metrics")
		return strings.Contains(body, `urma_deviceplugin_units{device="udma0"} 63`) &&
			strings.Contains(body, "urma_deviceplugin_registered 1") &&
			strings.Contains(body, `urma_deviceplugin_allocated_units_total{device="udma0"} 4`)
	})

	// Hot-plug a second device on NUMA node 1.
	d1 := sysfstest.DefaultDevice("udma1")
	one := 1
	d1.NUMANode = &one
	tree.Add(t, d1)
	got = n.units("hot-plugged udma1", func(m map[string]*pluginapi.Device) bool { return count("udma1-", pluginapi.Healthy)(m) == 63 })
	if got["udma1-0"].Topology.Nodes[0].ID != 1 {
		t.Errorf("udma1 topology %v", got["udma1-0"].Topology)
	}
	pref, err := n.kubelet.Client(nodefacts.ResourceName).GetPreferredAllocation(n.ctx(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: []string{"udma0-5", "udma1-0", "udma1-1", "udma0-6"}, MustIncludeDeviceIDs: []string{"udma1-9"}, AllocationSize: 3,
		}},
	})
	if err != nil || strings.Join(pref.ContainerResponses[0].DeviceIDs, ",") != "udma1-9,udma1-0,udma1-1" {
		t.Errorf("preferred %v, %v", pref, err)
	}

	// Health flips (debounced over two scans) and recovers.
	tree.SetPortState(t, "udma1", 0, urma.PortDown)
	n.units("udma1 unhealthy", func(m map[string]*pluginapi.Device) bool { return count("udma1-", pluginapi.Unhealthy)(m) == 63 })
	_, err = n.allocate("udma1-0")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "udma1-0") || !strings.Contains(err.Error(), "port0 DOWN") {
		t.Errorf("allocating an unhealthy unit: %v", err)
	}
	eventually.Holds(t, "unhealthy reason metric", deadline, func() bool {
		_, body := n.get("/metrics")
		return strings.Contains(body, `urma_deviceplugin_device_healthy{device="udma1"} 0`) && strings.Contains(body, `urma_deviceplugin_healthy_units{device="udma1"} 0`)
	})
	tree.SetPortState(t, "udma1", 0, urma.PortActive)
	n.units("udma1 recovered", func(m map[string]*pluginapi.Device) bool { return count("udma1-", pluginapi.Healthy)(m) == 63 })

	// A malformed file makes the device unhealthy, with the reason in the
	// metrics; its IDs stay (they vanish only with the device).
	tree.WriteFile(t, "udma1", "max_jetty", "many\n")
	n.units("udma1 malformed", func(m map[string]*pluginapi.Device) bool { return count("udma1-", pluginapi.Unhealthy)(m) == 63 })
	eventually.Holds(t, "discovery problem metric", deadline, func() bool {
		_, body := n.get("/metrics")
		return strings.Contains(body, `urma_deviceplugin_discovery_problems{device="udma1"} 1`) && strings.Contains(body, "max_jetty")
	})
	tree.WriteFile(t, "udma1", "max_jetty", "1024\n")
	n.units("udma1 repaired", func(m map[string]*pluginapi.Device) bool { return count("udma1-", pluginapi.Healthy)(m) == 63 })

	// kubelet restarts: sockets wiped, registrations forgotten.
	k2, err := n.kubelet.Restart()
	if err != nil {
		t.Fatal(err)
	}
	n.kubelet = k2
	n.units("full list after kubelet restart", func(m map[string]*pluginapi.Device) bool { return len(m) == 126 })
	if _, err := n.allocate("udma0-7"); err != nil {
		t.Errorf("allocate after kubelet restart: %v", err)
	}

	// Hot-unplug.
	tree.Remove(t, "udma1")
	n.units("udma1 removed", func(m map[string]*pluginapi.Device) bool { return len(m) == 63 && count("udma1-", "")(m) == 0 })
	eventually.Holds(t, "device count label", deadline, func() bool { return n.nodeObj().Labels[nodefacts.LabelDeviceCount] == "1" })

	n.stop()
	if _, err := os.Stat(filepath.Join(n.dir, "urma-jetty.sock")); !os.IsNotExist(err) {
		t.Errorf("socket after shutdown: %v", err)
	}
	if n.nodeObj().Labels[nodefacts.LabelPresent] != "true" {
		t.Error("shutdown changed the node labels")
	}
}

func TestBondingOnlyAdvertisesTheBond(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	tree.Add(t, sysfstest.DefaultDevice("udma1"))
	bond := sysfstest.DefaultDevice("bonding_dev_0")
	bond.Bonding = true
	tree.Add(t, bond)
	n := start(t, tree, nil)
	got := n.units("the bonding device only", func(m map[string]*pluginapi.Device) bool { return count("bonding_dev_0-", pluginapi.Healthy)(m) == 63 })
	if len(got) != 63 {
		t.Fatalf("%d units, want only the bond's 63", len(got))
	}
	if got["bonding_dev_0-0"].Topology != nil {
		t.Errorf("bond has no NUMA node, got topology %v", got["bonding_dev_0-0"].Topology)
	}
}

func TestSoftDevicesOnANodeWithoutHardware(t *testing.T) {
	tree := sysfstest.New(t)
	shm := filepath.Join(t.TempDir(), "shm")
	n := start(t, tree, func(c *Config) {
		c.Inventory.SoftDevices, c.Inventory.SoftJetties = 2, 64
		c.Server.ShmDir = shm
	})
	n.units("soft units", func(m map[string]*pluginapi.Device) bool {
		return count("soft0-", pluginapi.Healthy)(m) == 4 && count("soft1-", pluginapi.Healthy)(m) == 4
	})
	resp, err := n.allocate("soft1-0", "soft1-3")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Envs[podenv.Provider] != podenv.ProviderSoft || resp.Envs[podenv.Device] != "soft1" || resp.Envs[podenv.JettyBudget] != "32" {
		t.Errorf("env %v", resp.Envs)
	}
	if len(resp.Devices) != 0 {
		t.Errorf("software device got device nodes: %v", resp.Devices)
	}
	// Only the shm directory, where pods on this node meet.
	if len(resp.Mounts) != 1 || resp.Mounts[0].HostPath != shm || resp.Mounts[0].ContainerPath != shm || resp.Envs[podenv.ShmDir] != shm {
		t.Errorf("mounts %v, %s=%q; want %s mounted and named", resp.Mounts, podenv.ShmDir, resp.Envs[podenv.ShmDir], shm)
	}
	if st, err := os.Stat(shm); err != nil || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("shm directory not prepared: %v, %v", st, err)
	}
	// Removed while the plugin runs (an admin's cleanup): the next
	// allocation, through kubelet, must not mount a missing directory.
	if err := os.Remove(shm); err != nil {
		t.Fatal(err)
	}
	if _, err := n.allocate("soft0-0"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(shm); err != nil || st.Mode().Perm() != 0o777 || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("shm directory after its removal and an allocation: %v, %v; want it back, drwxrwxrwt", st, err)
	}
	eventually.Holds(t, "node labeled software", deadline, func() bool {
		l := n.nodeObj().Labels
		return l[nodefacts.LabelSoftware] == "true" && l[nodefacts.LabelDeviceCount] == "2"
	})
}

// A container given a UB device gets the host's liburma, one given a
// software device urma-k8s's, and the node says so; on a host without
// liburma the plugin advertises as before and says that too.
func TestInjectsLiburma(t *testing.T) {
	host := t.TempDir()
	for _, p := range []string{"usr/lib64/liburma.so.0", "usr/lib64/urma/liburma-udma.so"} {
		if err := os.MkdirAll(filepath.Join(host, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(host, p), []byte("lib"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	soft := filepath.Join(t.TempDir(), "liburma.so.0")
	if err := os.WriteFile(soft, []byte("soft lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	softDir := filepath.Join(t.TempDir(), "published")
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	n := start(t, tree, func(c *Config) {
		c.Inventory.SoftDevices = 1
		c.Server.ShmDir = ""
		c.Libs.HostRoot, c.Libs.SoftLib, c.Libs.SoftHostDir = host, soft, softDir
	})
	n.units("units", func(m map[string]*pluginapi.Device) bool {
		return count("udma0-", pluginapi.Healthy)(m) > 0 && count("soft0-", pluginapi.Healthy)(m) > 0
	})
	for _, tc := range []struct {
		id   string
		want []string // host paths mounted
	}{
		{"udma0-0", []string{"/usr/lib64/liburma.so.0", "/usr/lib64/urma"}},
		{"soft0-0", []string{filepath.Join(softDir, "liburma.so.0")}},
	} {
		resp, err := n.allocate(tc.id)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range resp.Mounts {
			got = append(got, m.HostPath)
		}
		if !slices.Equal(got, tc.want) || resp.Envs["LD_LIBRARY_PATH"] != "/opt/urma-k8s/lib" {
			t.Errorf("%s: mounts %v, LD_LIBRARY_PATH %q; want %v and /opt/urma-k8s/lib", tc.id, got, resp.Envs["LD_LIBRARY_PATH"], tc.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(softDir, "liburma.so.0")); err != nil || string(b) != "soft lib" {
		t.Errorf("the software liburma was not published: %q, %v", b, err)
	}
	eventually.Holds(t, "node labeled with both injections", deadline, func() bool {
		l := n.nodeObj().Labels
		return l[nodefacts.LabelHostLiburma] == "true" && l[nodefacts.LabelSoftLiburma] == "true"
	})

	bare := start(t, tree, nil) // a host without liburma
	bare.units("units", func(m map[string]*pluginapi.Device) bool { return count("udma0-", pluginapi.Healthy)(m) > 0 })
	resp, err := bare.allocate("udma0-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, set := resp.Envs["LD_LIBRARY_PATH"]; set || len(resp.Mounts) != 1 {
		t.Errorf("a host without liburma: mounts %v, env %v; want only the shm directory", resp.Mounts, resp.Envs)
	}
	eventually.Holds(t, "host-liburma=false", deadline, func() bool { return bare.nodeObj().Labels[nodefacts.LabelHostLiburma] == "false" })
	if !bare.logs.Contains("containers given a UB device get no liburma") || !bare.logs.Contains("no liburma on the host") {
		t.Errorf("the log does not say that UB containers get no liburma, and why:\n%s", bare.logs.String())
	}
}

func TestStartsWithoutDevicesAndSaysSo(t *testing.T) {
	tree := sysfstest.New(t)
	n := start(t, tree, nil)
	n.units("registration with no units", func(m map[string]*pluginapi.Device) bool { return len(m) == 0 })
	eventually.Holds(t, "no-devices metrics", deadline, func() bool {
		_, body := n.get("/metrics")
		return strings.Contains(body, "urma_deviceplugin_no_devices 1") && strings.Contains(body, "driver not loaded") &&
			strings.Contains(body, "urma_deviceplugin_registered 1")
	})
	eventually.Holds(t, "present=false", deadline, func() bool { return n.nodeObj().Labels[nodefacts.LabelPresent] == "false" })
	if !n.logs.Contains("no URMA device to advertise yet") || !n.logs.Contains("driver not loaded") {
		t.Errorf("the log does not say that there is no device and why:\n%s", n.logs.String())
	}
	// The driver loads later.
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	n.units("late device", func(m map[string]*pluginapi.Device) bool { return count("udma0-", pluginapi.Healthy)(m) == 63 })
	eventually.Holds(t, "present=true", deadline, func() bool { return n.nodeObj().Labels[nodefacts.LabelPresent] == "true" })
}

func TestCDIMode(t *testing.T) {
	for _, tc := range []struct {
		strategy        string
		field, annotate bool
	}{
		{"", true, false},
		{"cdi-annotations", false, true},
		{"cdi-cri,cdi-annotations", true, true},
	} {
		t.Run("strategy="+tc.strategy, func(t *testing.T) {
			tree := sysfstest.New(t)
			tree.Add(t, sysfstest.DefaultDevice("udma0"))
			cdiDir := t.TempDir()
			n := start(t, tree, func(c *Config) {
				c.CDIEnabled, c.CDI.Dir = true, cdiDir
				if tc.strategy != "" {
					st, err := server.ParseCDIStrategies(tc.strategy)
					if err != nil {
						t.Fatal(err)
					}
					c.Server.CDIStrategies = st
				}
			})
			n.units("udma0", func(m map[string]*pluginapi.Device) bool { return count("udma0-", pluginapi.Healthy)(m) == 63 })
			resp, err := n.allocate("udma0-1")
			if err != nil {
				t.Fatal(err)
			}
			if got := len(resp.CdiDevices) == 1 && resp.CdiDevices[0].Name == "urma.openeuler.org/jetty=udma0"; got != tc.field {
				t.Errorf("CdiDevices %v, want them set: %v", resp.CdiDevices, tc.field)
			}
			if got := resp.Annotations["cdi.k8s.io/urma.openeuler.org_jetty"] == "urma.openeuler.org/jetty=udma0"; got != tc.annotate {
				t.Errorf("annotations %v, want the CDI annotation: %v", resp.Annotations, tc.annotate)
			}
			if len(resp.Devices) != 0 {
				t.Errorf("CDI mode also answered with device specs %v", resp.Devices)
			}
			b, err := os.ReadFile(filepath.Join(cdiDir, "urma.openeuler.org-jetty.yaml"))
			if err != nil || !strings.Contains(string(b), "/dev/uburma/udma0") {
				t.Errorf("CDI spec of an advertised device: %q, %v", b, err)
			}
		})
	}
}

// gatedSource is a sysfs source whose first scan waits for release: a
// slow first scan (a driver still creating its files).
type gatedSource struct {
	watch.SysfsSource
	release chan struct{}
	once    sync.Once
}

func (g *gatedSource) Scan() (inventory.Scan, error) {
	g.once.Do(func() { <-g.release })
	return g.SysfsSource.Scan()
}

// streaming reports whether the fake kubelet follows the plugin's stream
// and has received a list.
func streaming(s kubelettest.State) bool {
	p, ok := s.Plugins[nodefacts.ResourceName]
	return ok && p.Streaming && p.Updates > 0
}

func TestRegistersOnlyAfterTheFirstScan(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	src := &gatedSource{SysfsSource: watch.SysfsSource{Opts: tree.Options()}, release: make(chan struct{})}
	n := startWith(t, tree, nil, Deps{Source: src})

	// Hold the first scan until either kubelet got a list (the plugin
	// registered without waiting) or the plugin says it waits for the scan.
	eventually.Holds(t, "the kubelet's first list or the plugin waiting for its first scan", deadline, func() bool {
		if s, _ := n.kubelet.State(); streaming(s) {
			return true
		}
		code, body := n.get("/healthz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, HealthWaitingForScan)
	})
	close(src.release)

	s, err := n.kubelet.WaitFor(n.ctx(), streaming)
	if err != nil {
		t.Fatal(err)
	}
	if first := s.Plugins[nodefacts.ResourceName].FirstDevices; len(first) != 63 {
		t.Fatalf("kubelet's first list has %d units, want udma0's 63: registered before the first scan", len(first))
	}
}

// /readyz is the DaemonSet's readiness probe: 503 until kubelet has the
// plugin (registered, following its list), 200 then, and 503 again from a
// kubelet restart until the new kubelet has it.
func TestReadyzFollowsKubeletsRegistration(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	src := &gatedSource{SysfsSource: watch.SysfsSource{Opts: tree.Options()}, release: make(chan struct{})}
	n := startWith(t, tree, nil, Deps{Source: src})

	// Nothing registers before the first scan.
	if code, body := n.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, HealthWaitingForScan) {
		t.Fatalf("/readyz before the first scan = %d %q, want 503 %q", code, body, HealthWaitingForScan)
	}
	close(src.release)
	if _, err := n.kubelet.WaitFor(n.ctx(), streaming); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, "/readyz 200 once kubelet follows the list", deadline, func() bool {
		code, body := n.get("/readyz")
		return code == http.StatusOK && strings.Contains(body, "devices=1")
	})

	// Kubelet goes away: not ready, while /healthz (liveness) stays 200.
	n.kubelet.Stop()
	eventually.Holds(t, "/readyz 503 once kubelet is gone", deadline, func() bool {
		code, _ := n.get("/readyz")
		return code == http.StatusServiceUnavailable
	})
	if code, body := n.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with kubelet gone = %d %q, want 200: kubelet's absence is not the plugin's illness", code, body)
	}
	if err := kubelettest.CleanupSockets(n.dir); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, "/readyz says why while no kubelet registered the plugin", deadline, func() bool {
		code, body := n.get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, ReadyNotRegistered)
	})
	k, err := kubelettest.Start(n.dir)
	if err != nil {
		t.Fatal(err)
	}
	n.kubelet = k
	if _, err := k.WaitFor(n.ctx(), streaming); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, "/readyz 200 for the restarted kubelet", deadline, func() bool {
		code, _ := n.get("/readyz")
		return code == http.StatusOK
	})
}

func TestCDIModeAdvertisesADeviceOnlyOnceItsSpecIsWritten(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	// The spec directory cannot be created while a file stands in its way.
	blocker := filepath.Join(t.TempDir(), "cdi-blocked")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(blocker, "cdi")
	n := start(t, tree, func(c *Config) {
		c.CDIEnabled, c.CDI.Dir, c.CDIRetry = true, cdiDir, 10*time.Millisecond
	})
	if _, err := n.kubelet.WaitFor(n.ctx(), streaming); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, "udma0 discovered", deadline, func() bool {
		_, body := n.get("/metrics")
		return strings.Contains(body, `urma_deviceplugin_units{device="udma0"} 63`)
	})
	if _, err := n.allocate("udma0-0"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("allocating udma0 while its CDI spec cannot be written: %v, want it refused as unknown", err)
	}

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	n.units("udma0 once its spec is written", func(m map[string]*pluginapi.Device) bool { return count("udma0-", pluginapi.Healthy)(m) == 63 })
	if _, err := os.Stat(filepath.Join(cdiDir, "urma.openeuler.org-jetty.yaml")); err != nil {
		t.Fatalf("udma0 advertised without its CDI spec: %v", err)
	}
	if _, err := n.allocate("udma0-0"); err != nil {
		t.Fatalf("allocate once the spec exists: %v", err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	cfg := Default()
	cfg.Inventory.Budget.JettiesPerUnit = 0
	cfg.Registrar.SocketDir = "relative"
	err := Run(context.Background(), testr.New(t), cfg, Deps{})
	if err == nil || !strings.Contains(err.Error(), "jetties per unit") || !strings.Contains(err.Error(), "absolute") {
		t.Fatalf("Run = %v, want both problems named", err)
	}
}

func TestDiscover(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	cfg := Default()
	cfg.Sysfs = tree.Options()
	var b strings.Builder
	if err := Discover(&b, cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"name": "udma0"`) || !strings.Contains(b.String(), `"units": 63`) {
		t.Fatalf("report:\n%s", b.String())
	}
	cfg.Inventory.Selection.Include = []string{"["}
	if err := Discover(io.Discard, cfg); err == nil {
		t.Fatal("Discover accepted a bad pattern")
	}
}

func TestRunLeavesNoGoroutines(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	base := runtime.NumGoroutine()
	n := start(t, tree, func(c *Config) { c.CDIEnabled, c.CDI.Dir = true, t.TempDir() })
	n.units("udma0", func(m map[string]*pluginapi.Device) bool { return len(m) == 63 })
	eventually.Holds(t, "node labeled", deadline, func() bool { return n.nodeObj().Labels[nodefacts.LabelPresent] == "true" })
	n.stop()
	// The metrics server shut down in time: no error about it.
	if n.logs.Contains("metrics server shutdown") {
		t.Errorf("a clean stop logged a metrics server shutdown error:\n%s", n.logs.String())
	}
	n.kubelet.Stop()
	eventually.Holds(t, "goroutines back to the baseline", deadline, func() bool { return runtime.NumGoroutine() <= base })
}
