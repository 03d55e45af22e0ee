package server

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/internal/node/shmdir"
	"github.com/openeuler/urma-k8s/internal/podenv"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

// fakeDev writes a device tree root with the given nodes (relative to it).
func fakeDev(t *testing.T, nodes ...string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "hostdev")
	for _, n := range nodes {
		p := filepath.Join(root, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func hw(root, name string, numa int, units uint32, healthy bool) inventory.Device {
	d := inventory.Device{
		Name: name, NUMANode: numa, Healthy: healthy,
		Budget:  budget.Budget{Units: units, Jetties: units * 16},
		DevNode: filepath.Join(root, "uburma", name), EID: "::ffff:10.0.0.1",
	}
	if !healthy {
		d.Reason = "no usable port (port0 DOWN)"
	}
	return d
}

func snapshot(root string) inventory.Snapshot {
	softDev := inventory.SoftDevices(inventory.Config{Budget: budget.Default(), SoftDevices: 1, SoftJetties: 64})[0]
	return inventory.Snapshot{
		JettiesPerUnit: 16,
		UMMUNode:       filepath.Join(root, "ummu", "tid"),
		Devices: []inventory.Device{
			softDev,
			hw(root, "udma0", 0, 4, true),
			hw(root, "udma1", 1, 4, true),
			hw(root, "udma2", -1, 2, false),
		},
	}
}

type fixture struct {
	inv    *inventory.Inventory
	srv    *Server
	client pluginapi.DevicePluginClient
	root   string
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	root := fakeDev(t, "uburma/udma0", "uburma/udma1", "ummu/tid", "present_extra")
	cfg.DevRoot = root
	inv := inventory.New(16)
	snap := snapshot(root)
	inv.Publish(snap)
	s := New(cfg, inv, testr.New(t), metrics.New())

	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(g, s)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
	})
	return &fixture{inv: inv, srv: s, client: pluginapi.NewDevicePluginClient(conn), root: root}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestOptions(t *testing.T) {
	f := newFixture(t, Config{})
	o, err := f.client.GetDevicePluginOptions(ctx(t), &pluginapi.Empty{})
	if err != nil || !o.GetPreferredAllocationAvailable || o.PreStartRequired {
		t.Fatalf("options %+v, %v", o, err)
	}
	if _, err := f.client.PreStartContainer(ctx(t), &pluginapi.PreStartContainerRequest{}); err != nil {
		t.Fatal(err)
	}
}

func TestUnits(t *testing.T) {
	snap := snapshot("/x")
	got := Units(&snap)
	var ids []string
	for _, d := range got {
		ids = append(ids, d.ID)
	}
	want := []string{"soft0-0", "soft0-1", "soft0-2", "soft0-3", "udma0-0", "udma0-1", "udma0-2", "udma0-3", "udma1-0", "udma1-1", "udma1-2", "udma1-3", "udma2-0", "udma2-1"}
	if !slices.Equal(ids, want) {
		t.Fatalf("IDs %v\nwant %v", ids, want)
	}
	byID := map[string]*pluginapi.Device{}
	for _, d := range got {
		byID[d.ID] = d
	}
	if d := byID["udma1-3"]; d.Health != pluginapi.Healthy || d.Topology == nil || d.Topology.Nodes[0].ID != 1 {
		t.Errorf("udma1-3 = %v", d)
	}
	if d := byID["udma0-0"]; d.Topology == nil || d.Topology.Nodes[0].ID != 0 {
		t.Errorf("udma0-0 = %v (NUMA node 0 is a node like any other)", d)
	}
	if d := byID["udma2-0"]; d.Health != pluginapi.Unhealthy || d.Topology != nil {
		t.Errorf("udma2-0 = %v (unknown NUMA must have no topology)", d)
	}
	if d := byID["soft0-0"]; d.Topology != nil || d.Health != pluginapi.Healthy {
		t.Errorf("soft0-0 = %v", d)
	}
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		name        string
		cfg         Config
		ids         []string
		wantEnv     map[string]string
		wantDevices []string // host paths == container paths
		wantCDI     []string
		// wantAnnotations are the container annotations (CDI annotation
		// strategy); none unless set.
		wantAnnotations map[string]string
		// shm sets Config.ShmDir to a fresh directory, which the container
		// must get mounted and named by URMA_SHM_DIR.
		shm bool
	}{
		{
			name:        "one device - its node, ummu, existing extra",
			cfg:         Config{ExtraDevNodes: []string{"/dev/present_extra", "/dev/missing_extra"}},
			ids:         []string{"udma1-0", "udma1-3"},
			wantEnv:     map[string]string{podenv.Device: "udma1", podenv.JettyBudget: "32", podenv.EID: "::ffff:10.0.0.1"},
			wantDevices: []string{"/dev/uburma/udma1", "/dev/ummu/tid", "/dev/present_extra"},
		},
		{
			name: "several devices - primary has most units, URMA_DEVICES lists all",
			ids:  []string{"udma0-0", "udma1-0", "udma1-1", "udma1-2"},
			wantEnv: map[string]string{podenv.Device: "udma1", podenv.JettyBudget: "48", podenv.EID: "::ffff:10.0.0.1",
				podenv.Devices: "udma1:48,udma0:16"},
			wantDevices: []string{"/dev/uburma/udma1", "/dev/uburma/udma0", "/dev/ummu/tid"},
		},
		{
			name:    "software device - provider env, nothing mounted",
			ids:     []string{"soft0-1", "soft0-2"},
			wantEnv: map[string]string{podenv.Device: "soft0", podenv.JettyBudget: "32", podenv.Provider: podenv.ProviderSoft},
		},
		{
			name:    "CDI mode answers with CDI names",
			cfg:     Config{CDIKind: "urma.openeuler.org/jetty"},
			ids:     []string{"udma0-0"},
			wantEnv: map[string]string{podenv.Device: "udma0", podenv.JettyBudget: "16", podenv.EID: "::ffff:10.0.0.1"},
			wantCDI: []string{"urma.openeuler.org/jetty=udma0"},
		},
		{
			name:    "CDI annotation strategy - a cdi.k8s.io annotation instead of the field",
			cfg:     Config{CDIKind: "urma.openeuler.org/jetty", CDIStrategies: []CDIStrategy{CDIStrategyAnnotations}},
			ids:     []string{"udma0-0", "udma1-0", "udma1-1"},
			wantEnv: map[string]string{podenv.Device: "udma1", podenv.JettyBudget: "32", podenv.EID: "::ffff:10.0.0.1", podenv.Devices: "udma1:32,udma0:16"},
			wantAnnotations: map[string]string{
				"cdi.k8s.io/urma.openeuler.org_jetty": "urma.openeuler.org/jetty=udma1,urma.openeuler.org/jetty=udma0",
			},
		},
		{
			name:    "both CDI strategies",
			cfg:     Config{CDIKind: "urma.openeuler.org/jetty", CDIStrategies: []CDIStrategy{CDIStrategyCRI, CDIStrategyAnnotations}},
			ids:     []string{"udma0-0"},
			wantEnv: map[string]string{podenv.Device: "udma0", podenv.JettyBudget: "16", podenv.EID: "::ffff:10.0.0.1"},
			wantCDI: []string{"urma.openeuler.org/jetty=udma0"},
			wantAnnotations: map[string]string{
				"cdi.k8s.io/urma.openeuler.org_jetty": "urma.openeuler.org/jetty=udma0",
			},
		},
		{
			name:    "CDI annotations for a software device - nothing to inject",
			cfg:     Config{CDIKind: "urma.openeuler.org/jetty", CDIStrategies: []CDIStrategy{CDIStrategyAnnotations}},
			ids:     []string{"soft0-0"},
			wantEnv: map[string]string{podenv.Device: "soft0", podenv.JettyBudget: "16", podenv.Provider: podenv.ProviderSoft},
		},
		{
			name:    "software device with the shm directory - mounted and named",
			shm:     true,
			ids:     []string{"soft0-1"},
			wantEnv: map[string]string{podenv.Device: "soft0", podenv.JettyBudget: "16", podenv.Provider: podenv.ProviderSoft},
		},
		{
			name:        "hardware device with the shm directory - both",
			shm:         true,
			ids:         []string{"udma0-0"},
			wantEnv:     map[string]string{podenv.Device: "udma0", podenv.JettyBudget: "16", podenv.EID: "::ffff:10.0.0.1"},
			wantDevices: []string{"/dev/uburma/udma0", "/dev/ummu/tid"},
		},
		{
			name:    "CDI mode with the shm directory",
			cfg:     Config{CDIKind: "urma.openeuler.org/jetty"},
			shm:     true,
			ids:     []string{"udma0-0"},
			wantEnv: map[string]string{podenv.Device: "udma0", podenv.JettyBudget: "16", podenv.EID: "::ffff:10.0.0.1"},
			wantCDI: []string{"urma.openeuler.org/jetty=udma0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, wantEnv := tt.cfg, maps.Clone(tt.wantEnv)
			var wantMounts []string
			if tt.shm {
				cfg.ShmDir = filepath.Join(t.TempDir(), "shm")
				wantEnv[podenv.ShmDir] = cfg.ShmDir
				wantMounts = []string{cfg.ShmDir}
			}
			f := newFixture(t, cfg)
			resp, err := f.client.Allocate(ctx(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: tt.ids}}})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.ContainerResponses) != 1 {
				t.Fatalf("%d container responses", len(resp.ContainerResponses))
			}
			cr := resp.ContainerResponses[0]
			if len(cr.Envs) != len(wantEnv) {
				t.Errorf("env %v, want %v", cr.Envs, wantEnv)
			}
			for k, v := range wantEnv {
				if cr.Envs[k] != v {
					t.Errorf("env %s = %q, want %q", k, cr.Envs[k], v)
				}
			}
			var devs []string
			for _, d := range cr.Devices {
				if d.HostPath != d.ContainerPath || d.Permissions != "rw" {
					t.Errorf("device spec %v", d)
				}
				devs = append(devs, d.HostPath)
			}
			if !slices.Equal(devs, tt.wantDevices) {
				t.Errorf("devices %v, want %v", devs, tt.wantDevices)
			}
			var cdi []string
			for _, d := range cr.CdiDevices {
				cdi = append(cdi, d.Name)
			}
			if !slices.Equal(cdi, tt.wantCDI) {
				t.Errorf("CDI devices %v, want %v", cdi, tt.wantCDI)
			}
			if !maps.Equal(cr.Annotations, tt.wantAnnotations) {
				t.Errorf("annotations %v, want %v", cr.Annotations, tt.wantAnnotations)
			}
			if len(cr.Annotations) > 0 {
				// What a runtime reading annotations will see.
				_, devices, err := cdiapi.ParseAnnotations(cr.Annotations)
				if err != nil || !slices.Equal(devices, strings.Split(tt.wantAnnotations["cdi.k8s.io/urma.openeuler.org_jetty"], ",")) {
					t.Errorf("the CDI library parses the annotations as %v, %v", devices, err)
				}
			}
			var mounts []string
			for _, m := range cr.Mounts {
				if m.HostPath != m.ContainerPath || m.ReadOnly {
					t.Errorf("mount %v: want the host path, writable, at the same path", m)
				}
				mounts = append(mounts, m.HostPath)
			}
			if !slices.Equal(mounts, wantMounts) {
				t.Errorf("mounts %v, want %v", mounts, wantMounts)
			}
		})
	}
}

// The shm directory is prepared at start, but whatever happens to it
// afterwards (an admin's cleanup, a remount, a chmod) must not hand the
// runtime a mount whose source is missing: Allocate puts it back, or
// fails naming it so that kubelet reports the cause on the pod.
func TestAllocateRestoresTheShmDirectory(t *testing.T) {
	tests := []struct {
		name string
		// spoil does something to the prepared directory dir.
		spoil func(t *testing.T, dir string)
		// wantErr, when set, is in Allocate's error, which must also name
		// the directory.
		wantErr string
	}{
		{"deleted", func(t *testing.T, dir string) { must(t, os.Remove(dir)) }, ""},
		{"deleted with its parent", func(t *testing.T, dir string) { must(t, os.RemoveAll(filepath.Dir(dir))) }, ""},
		{"mode changed", func(t *testing.T, dir string) { must(t, os.Chmod(dir, 0o755)) }, ""},
		{"a regular file in its place", func(t *testing.T, dir string) {
			must(t, os.Remove(dir))
			must(t, os.WriteFile(dir, nil, 0o644))
		}, "not a directory"},
		{"a symbolic link in its place", func(t *testing.T, dir string) {
			must(t, os.Remove(dir))
			must(t, os.Symlink(t.TempDir(), dir))
		}, "symbolic link"},
		{"mode changed and a file of other use inside", func(t *testing.T, dir string) {
			must(t, os.Chmod(dir, 0o755))
			must(t, os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644))
		}, "not a socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shm := filepath.Join(t.TempDir(), "run", "shm")
			f := newFixture(t, Config{ShmDir: shm})
			req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"udma0-0"}}}}
			if _, err := f.client.Allocate(ctx(t), req); err != nil {
				t.Fatal(err)
			}
			wantOpen(t, shm)
			tt.spoil(t, shm)
			resp, err := f.client.Allocate(ctx(t), req)
			if tt.wantErr != "" {
				msg := status.Convert(err).Message()
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, tt.wantErr) || !strings.Contains(msg, shm) {
					t.Fatalf("Allocate = %v, want FailedPrecondition naming %s and saying %q", err, shm, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.ContainerResponses[0].Mounts; len(got) != 1 || got[0].HostPath != shm {
				t.Errorf("mounts %v, want %s", got, shm)
			}
			wantOpen(t, shm)
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantOpen checks that dir is a directory open to every user and sticky.
func wantOpen(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatalf("shm directory: %v", err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("shm directory %s is %v, want drwxrwxrwt", dir, fi.Mode())
	}
}

func TestAllocateSeveralContainers(t *testing.T) {
	f := newFixture(t, Config{})
	resp, err := f.client.Allocate(ctx(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"udma0-0"}}, {DevicesIds: []string{"udma1-0", "udma1-1"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{resp.ContainerResponses[0].Envs[podenv.Device], resp.ContainerResponses[1].Envs[podenv.Device]}; !slices.Equal(got, []string{"udma0", "udma1"}) {
		t.Fatalf("devices per container %v", got)
	}
}

func TestAllocateRefusals(t *testing.T) {
	tests := []struct {
		name string
		ids  []string
		want []string
		// notWant: a refusal names only what is wrong.
		notWant []string
	}{
		{"unknown device", []string{"udma0-0", "udma9-0"}, []string{"unknown unit IDs udma9-0"}, []string{"unhealthy", "repeated"}},
		{"index beyond budget", []string{"udma0-4"}, []string{"unknown unit IDs udma0-4"}, []string{"unhealthy"}},
		{"malformed", []string{"garbage"}, []string{"unknown unit IDs garbage"}, []string{"unhealthy"}},
		{"unhealthy", []string{"udma2-1"}, []string{"unhealthy unit IDs udma2-1", "udma2: no usable port"}, []string{"unknown"}},
		{"both named", []string{"udma2-0", "nope-1", "udma0-0"}, []string{"unknown unit IDs nope-1", "unhealthy unit IDs udma2-0"}, nil},
		{"empty", nil, []string{"no unit IDs"}, []string{"unknown", "unhealthy"}},
		// Counted once, a repeat would allocate fewer units than requested.
		{"repeated", []string{"udma0-1", "udma0-2", "udma0-1"}, []string{"repeated unit IDs udma0-1"}, []string{"udma0-2", "unknown", "unhealthy"}},
		{"repeated thrice, named once", []string{"udma0-1", "udma0-1", "udma0-1"}, []string{"repeated unit IDs udma0-1"}, []string{"udma0-1,udma0-1"}},
		{"repeated among other faults", []string{"udma0-0", "udma0-0", "nope-1"}, []string{"repeated unit IDs udma0-0", "unknown unit IDs nope-1"}, nil},
		// The first container request names udma1-0 too: both containers
		// would get the same jetties.
		{"named by two containers", []string{"udma0-0", "udma1-0"}, []string{"unit IDs requested by more than one container udma1-0 (containers 0 and 1)"}, []string{"udma0-0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, Config{})
			_, err := f.client.Allocate(ctx(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
				{DevicesIds: []string{"udma1-0"}}, {DevicesIds: tt.ids},
			}})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("error %q does not contain %q", status.Convert(err).Message(), w)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("error %q mentions %q", status.Convert(err).Message(), w)
				}
			}
		})
	}
}

func TestGetPreferredAllocation(t *testing.T) {
	f := newFixture(t, Config{})
	resp, err := f.client.GetPreferredAllocation(ctx(t), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"udma0-0", "udma1-0", "udma1-1", "udma2-0", "udma2-1", "udma0-1", "udma0-2"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"udma0-0", "udma1-0", "udma1-1"}, MustIncludeDeviceIDs: []string{"udma0-3"}, AllocationSize: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	// udma2 is unhealthy: never preferred. udma1 holds 2 exactly: best fit.
	if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, []string{"udma1-0", "udma1-1"}) {
		t.Errorf("container 0: %v", got)
	}
	if got := resp.ContainerResponses[1].DeviceIDs; !slices.Equal(got, []string{"udma0-3", "udma0-0"}) {
		t.Errorf("container 1: %v", got)
	}
}

func TestListAndWatch(t *testing.T) {
	// No Resync: New must default it, a zero ticker period would panic.
	f := newFixture(t, Config{})
	stream, err := f.client.ListAndWatch(ctx(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 14 {
		t.Fatalf("initial list has %d units, want 14", len(first.Devices))
	}
	snap := snapshot(f.root)
	snap.Devices[3].Healthy, snap.Devices[3].Reason = true, ""
	f.inv.Publish(snap)
	second, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range second.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("after recovery %s is %s", d.ID, d.Health)
		}
	}
	// A second stream (kubelet reconnecting) gets the full list at once.
	stream2, err := f.client.ListAndWatch(ctx(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := stream2.Recv(); err != nil || len(again.Devices) != 14 {
		t.Fatalf("new stream: %d units, %v", len(again.GetDevices()), err)
	}
}

func TestListAndWatchResync(t *testing.T) {
	f := newFixture(t, Config{Resync: 5 * time.Millisecond})
	stream, err := f.client.ListAndWatch(ctx(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	gen, _ := f.inv.Current()
	for i := range 3 {
		msg, err := stream.Recv()
		if err != nil || len(msg.Devices) != 14 {
			t.Fatalf("message %d: %d units, %v", i, len(msg.GetDevices()), err)
		}
	}
	if now, _ := f.inv.Current(); now.Generation != gen.Generation {
		t.Fatal("inventory changed; the repeats were not resyncs")
	}
}

func TestHostPath(t *testing.T) {
	s := New(Config{DevRoot: "/host/dev"}, inventory.New(16), testr.New(t), nil)
	for in, want := range map[string]string{
		"/host/dev/uburma/udma0": "/dev/uburma/udma0",
		"/host/dev/ummu/tid":     "/dev/ummu/tid",
		"/host/devx/foo":         "",
		"/host/dev":              "",
		"":                       "",
		"/etc/passwd":            "",
	} {
		if got := s.HostPath(in); got != want {
			t.Errorf("HostPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c  Config
		ok bool
	}{
		{Config{ExtraDevNodes: []string{"/dev/infiniband/uverbs0"}, CDIKind: "urma.openeuler.org/jetty"}, true},
		{Config{ExtraDevNodes: []string{"/etc/shadow"}}, false},
		{Config{ExtraDevNodes: []string{"/dev/../etc"}}, false},
		{Config{ExtraDevNodes: []string{"dev/x"}}, false},
		{Config{CDIKind: "jetty"}, false},
		{Config{CDIKind: "a/b/c"}, false},
		{Config{CDIKind: "urma.openeuler.org/jetty", CDIStrategies: []CDIStrategy{CDIStrategyAnnotations, CDIStrategyCRI}}, true},
		{Config{CDIKind: "urma.openeuler.org/jetty", CDIStrategies: []CDIStrategy{"volume-mounts"}}, false},
		{Config{ShmDir: shmdir.DefaultDir}, true},
		{Config{ShmDir: "var/run/shm"}, false},
		{Config{ShmDir: "/var/run/../shm"}, false},
		{Config{ShmDir: "/"}, false},
	} {
		if err := tc.c.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.c, err, tc.ok)
		}
	}
}

// Kubelet refuses ListAndWatch messages over 4 MiB (kubernetes #109304).
// At the default cap a node would need hundreds of devices to get near it.
func TestListFitsKubeletMessageLimit(t *testing.T) {
	const devices = 64
	snap := &inventory.Snapshot{JettiesPerUnit: 16}
	for i := range devices {
		snap.Devices = append(snap.Devices, inventory.Device{
			Name: fmt.Sprintf("bonding_dev_%d", i), Healthy: true, NUMANode: i % 8,
			Budget: budget.Budget{Units: budget.DefaultMaxUnitsPerDevice},
		})
	}
	msg := &pluginapi.ListAndWatchResponse{Devices: Units(snap)}
	if len(msg.Devices) != devices*budget.DefaultMaxUnitsPerDevice {
		t.Fatalf("%d units", len(msg.Devices))
	}
	if size := proto.Size(msg); size > 4<<20 {
		t.Fatalf("%d devices at the default cap make a %d-byte list, over kubelet's 4 MiB", devices, size)
	}
}

func TestParseCDIStrategies(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []CDIStrategy
		err  string
	}{
		{in: "cdi-cri", want: []CDIStrategy{CDIStrategyCRI}},
		{in: "cdi-annotations", want: []CDIStrategy{CDIStrategyAnnotations}},
		{in: " cdi-cri , cdi-annotations,cdi-cri", want: []CDIStrategy{CDIStrategyCRI, CDIStrategyAnnotations}},
		{in: "envvar", err: `"envvar"`},
		{in: " , ", err: "empty"},
	} {
		got, err := ParseCDIStrategies(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseCDIStrategies(%q) = %v, %v; want an error naming %s", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseCDIStrategies(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// A device the last scan did not find stays listed, healthy, until its
// absence is debounced (a driver reload must not flap kubelet's count), but
// its device node is gone: Allocate refuses its units rather than hand a
// container a node the runtime cannot find, and no preferred allocation
// picks them while a present device can hold the container.
func TestVanishedDeviceIsNotAllocated(t *testing.T) {
	f := newFixture(t, Config{})
	snap := snapshot(f.root)
	for i := range snap.Devices {
		if snap.Devices[i].Name == "udma1" {
			snap.Devices[i].Vanished = true
		}
	}
	f.inv.Publish(snap)
	_, err := f.client.Allocate(ctx(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"udma1-0"}},
	}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "udma1-0") ||
		!strings.Contains(status.Convert(err).Message(), inventory.ReasonVanished) {
		t.Fatalf("Allocate of a vanished device's unit = %v, want InvalidArgument naming the unit and why", err)
	}
	resp, err := f.client.GetPreferredAllocation(ctx(t), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"udma1-0", "udma1-1", "udma0-0", "udma0-1", "udma0-2"}, AllocationSize: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, []string{"udma0-0", "udma0-1"}) {
		t.Fatalf("preferred allocation %v, want udma0's units", got)
	}
}

// TestDeviceWhoseNodeIsGoneIsNotAllocated: when /dev/uburma/<dev> vanishes
// while the sysfs entry stays (uburma unloaded, udev recreating the node),
// the health debounce keeps the device Healthy for a while, but the scan
// already reports no node. Allocate must refuse it rather than hand the
// container URMA_DEVICE without the node (or, in CDI mode, a CDI name the
// rewritten spec no longer has), and preferred allocations must avoid it.
func TestDeviceWhoseNodeIsGoneIsNotAllocated(t *testing.T) {
	for _, cfg := range []Config{{}, {CDIKind: "urma.openeuler.org/jetty"}} {
		t.Run(fmt.Sprintf("cdi=%q", cfg.CDIKind), func(t *testing.T) {
			f := newFixture(t, cfg)
			b := inventory.NewBuilder(inventory.Config{Budget: budget.Default(), Debounce: health.Debounce{Observations: 2, Hold: time.Minute}})
			dev := func(node string) sysfs.Device {
				eid, _ := urma.ParseEID("::ffff:10.0.0.1")
				return sysfs.Device{
					DeviceInfo: urma.DeviceInfo{
						Name: "udma0", Caps: urma.DeviceCaps{MaxJetty: 64},
						Ports: []urma.Port{{Index: 0, State: urma.PortActive}},
						EIDs:  []urma.EIDEntry{{Index: 0, EID: eid}},
					},
					NUMANode: 0, DevNode: node,
				}
			}
			now := time.Now()
			b.Build(inventory.Scan{Devices: []sysfs.Device{dev(filepath.Join(f.root, "uburma", "udma0"))}}, now)
			snap, _, _ := b.Build(inventory.Scan{Devices: []sysfs.Device{dev("")}}, now.Add(time.Second))
			if d, _ := snap.Lookup("udma0"); !d.Healthy || d.DevNode != "" {
				t.Fatalf("precondition: want the debounced device still healthy without a node, got %+v", d)
			}
			f.inv.Publish(snap)

			resp, err := f.client.Allocate(ctx(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
				{DevicesIds: []string{"udma0-0"}},
			}})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "udma0-0") ||
				!strings.Contains(status.Convert(err).Message(), "device node") {
				t.Fatalf("Allocate of a unit whose device node is gone = %v, %v; want InvalidArgument naming the unit and the node", resp, err)
			}
			pref, err := f.client.GetPreferredAllocation(ctx(t), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
				{AvailableDeviceIDs: []string{"udma0-0", "udma0-1"}, AllocationSize: 1},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if got := pref.ContainerResponses[0].DeviceIDs; len(got) != 0 {
				t.Fatalf("preferred allocation %v, want none of the node-less device", got)
			}
		})
	}
}

// A container gets a liburma for its C programs: the host's with a UB
// device (in CDI mode the CDI spec carries it, not the answer), the
// software one with software devices only; read-only, with
// LD_LIBRARY_PATH.
func TestAllocateInjectsLiburma(t *testing.T) {
	host := libinject.Injection{
		Mounts: []libinject.Mount{{HostPath: "/usr/lib64/liburma.so.0", ContainerPath: libinject.ContainerLibDir + "/liburma.so.0"},
			{HostPath: "/usr/lib64/urma", ContainerPath: "/usr/lib64/urma"}},
		Env: []string{"LD_LIBRARY_PATH=" + libinject.ContainerLibDir},
	}
	soft := libinject.Injection{
		Mounts: []libinject.Mount{{HostPath: "/var/lib/urma-k8s/liburma/liburma.so.0", ContainerPath: libinject.ContainerLibDir + "/liburma.so.0"}},
		Env:    []string{"LD_LIBRARY_PATH=" + libinject.ContainerLibDir},
	}
	both := libinject.Set{Host: host, Soft: soft}
	tests := []struct {
		name string
		cfg  Config
		ids  []string
		want libinject.Injection
	}{
		{"UB device: the host's", Config{Libs: both}, []string{"udma0-0"}, host},
		{"software device: urma-k8s's", Config{Libs: both}, []string{"soft0-0"}, soft},
		{"UB and software devices: the host's", Config{Libs: both}, []string{"soft0-0", "soft0-1", "udma0-0"}, host},
		{"UB device in CDI mode: the spec carries it", Config{Libs: both, CDIKind: "urma.openeuler.org/jetty"}, []string{"udma0-0"}, libinject.Injection{}},
		{"software device in CDI mode: the answer carries it", Config{Libs: both, CDIKind: "urma.openeuler.org/jetty"}, []string{"soft0-0"}, soft},
		{"no host liburma", Config{Libs: libinject.Set{Soft: soft}}, []string{"udma1-0"}, libinject.Injection{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.cfg)
			resp, err := f.client.Allocate(ctx(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: tt.ids}}})
			if err != nil {
				t.Fatal(err)
			}
			cr := resp.ContainerResponses[0]
			var got []libinject.Mount
			for _, m := range cr.Mounts {
				if !m.ReadOnly {
					t.Errorf("mount %v is writable", m)
				}
				got = append(got, libinject.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath})
			}
			if !slices.Equal(got, tt.want.Mounts) {
				t.Errorf("mounts %v, want %v", got, tt.want.Mounts)
			}
			path, set := cr.Envs["LD_LIBRARY_PATH"]
			if wantSet := len(tt.want.Env) > 0; set != wantSet || (set && path != libinject.ContainerLibDir) {
				t.Errorf("LD_LIBRARY_PATH %q (set %v), want %v", path, set, tt.want.Env)
			}
		})
	}
}
