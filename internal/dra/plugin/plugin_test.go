package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/openeuler/urma-k8s/internal/dra/checkpoint"
	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	"github.com/openeuler/urma-k8s/internal/dra/dratest"
	"github.com/openeuler/urma-k8s/internal/dra/plugin"
	draslices "github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

const node = "node-1"

// host is one node: the driver's directories, inventory and claims.
type host struct {
	t       *testing.T
	dataDir string
	cdiDir  string
	regDir  string
	devRoot string
	shmDir  string
	inv     *inventory.Inventory
	kube    *fake.Clientset
	claims  int // claims made, which name the next
}

func newHost(t *testing.T, devs ...sysfstest.Device) *host {
	t.Helper()
	// Short paths: unix socket names are limited to 108 bytes.
	root, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	h := &host{t: t, dataDir: filepath.Join(root, "d"), cdiDir: filepath.Join(root, "cdi"), regDir: filepath.Join(root, "r"), shmDir: filepath.Join(root, "shm"), inv: inventory.New(16), kube: fake.NewClientset()}
	for _, d := range []string{h.dataDir, h.regDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tree := sysfstest.New(t)
	for _, d := range devs {
		tree.Add(t, d)
	}
	tree.AddDevNode(t, sysfstest.UMMUNode)
	h.devRoot = tree.DevRoot
	h.inv.Publish(*dratest.SnapshotOfTree(t, dratest.Config(0), tree))
	return h
}

// driver is one process of the driver: the plugin behind the real helper.
type driver struct {
	plugin *plugin.Plugin
	helper *kubeletplugin.Helper
	client drapb.DRAPluginClient
	health drahealthv1.DRAResourceHealthClient
}

func (h *host) start() *driver {
	h.t.Helper()
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind, ShmDir: h.shmDir})
	if err != nil {
		h.t.Fatal(err)
	}
	log := testr.New(h.t)
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy()},
		h.inv, specs, log, func(err error) { h.t.Errorf("fatal driver error: %v", err) })
	if err != nil {
		h.t.Fatal(err)
	}
	// As dra.Run does, but before serving: the tests that need kubelet's
	// calls during a rebuild make their plugin themselves.
	if err := p.Rebuild(context.Background(), apiClaims{h.kube}); err != nil {
		h.t.Fatalf("rebuilding the prepared claims: %v", err)
	}
	return h.serve(p)
}

// serve serves p behind the real helper, with the options dra.Run uses,
// and connects to it as kubelet does.
func (h *host) serve(p *plugin.Plugin) *driver {
	h.t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), testr.New(h.t)))
	helper, err := kubeletplugin.Start(ctx, p, append(plugin.HelperOptions(),
		kubeletplugin.DriverName(slicefacts.DriverName), kubeletplugin.KubeClient(h.kube), kubeletplugin.NodeName(node),
		kubeletplugin.PluginDataDirectoryPath(h.dataDir), kubeletplugin.RegistrarDirectoryPath(h.regDir),
		kubeletplugin.GRPCVerbosity(-1))...)
	if err != nil {
		cancel()
		h.t.Fatalf("starting the kubelet plugin helper: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(h.dataDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		conn.Close()
		helper.Stop()
		cancel()
	})
	return &driver{plugin: p, helper: helper, client: drapb.NewDRAPluginClient(conn), health: drahealthv1.NewDRAResourceHealthClient(conn)}
}

func (d *driver) stop() { d.helper.Stop() }

// claim creates an allocated claim in the API: one share per device name,
// each consuming jetties.
func (h *host) claim(jetties int64, devices ...string) *resourceapi.ResourceClaim {
	h.t.Helper()
	h.claims++
	// Names and UIDs go into CDI device names, which allow [a-zA-Z0-9_.-].
	name := "claim-" + strconv.Itoa(h.claims)
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for i, dev := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "jetties", Driver: slicefacts.DriverName, Pool: node, Device: dev,
			ShareID:          ptr.To(types.UID("share-" + name + string(rune('0'+i)))),
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{slicefacts.CapacityJetties: *resource.NewQuantity(jetties, resource.DecimalSI)},
		})
	}
	created, err := h.kube.ResourceV1().ResourceClaims("default").Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return created
}

func ref(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

func (d *driver) prepare(t *testing.T, cs ...*resourceapi.ResourceClaim) *drapb.NodePrepareResourcesResponse {
	t.Helper()
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range cs {
		req.Claims = append(req.Claims, ref(c))
	}
	resp, err := d.client.NodePrepareResources(context.Background(), req)
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	return resp
}

func (d *driver) unprepare(t *testing.T, cs ...*resourceapi.ResourceClaim) *drapb.NodeUnprepareResourcesResponse {
	t.Helper()
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range cs {
		req.Claims = append(req.Claims, ref(c))
	}
	resp, err := d.client.NodeUnprepareResources(context.Background(), req)
	if err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	return resp
}

// cdiEdits parses the spec directory with the CDI library and returns the
// environment and device nodes one CDI device brings (its own edits and
// the spec-wide ones).
func (h *host) cdiEdits(t *testing.T, id string) (env, nodes, mounts []string) {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(h.cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI spec errors: %v", errs)
	}
	dev := cache.GetDevice(id)
	if dev == nil {
		t.Fatalf("CDI device %s not found; devices: %v", id, cache.ListDevices())
	}
	for _, e := range []*cdi.ContainerEdits{{ContainerEdits: &dev.ContainerEdits}, {ContainerEdits: &dev.GetSpec().ContainerEdits}} {
		env = append(env, e.Env...)
		for _, n := range e.DeviceNodes {
			nodes = append(nodes, n.Path)
		}
		for _, m := range e.Mounts {
			mounts = append(mounts, m.HostPath+":"+m.ContainerPath)
		}
	}
	return env, nodes, mounts
}

func TestPrepareWritesACDISpecPerClaim(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	d := h.start()
	c := h.claim(100, "udma0")
	resp := d.prepare(t, c)
	r := resp.Claims[string(c.UID)]
	if r == nil || r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("prepare response %+v", resp.Claims)
	}
	dev := r.Devices[0]
	want := "urma.openeuler.org/claim=" + string(c.UID) + "-udma0.jetties"
	if dev.PoolName != node || dev.DeviceName != "udma0" || !slices.Equal(dev.CdiDeviceIds, []string{want}) ||
		dev.ShareId == nil || *dev.ShareId != string(*c.Status.Allocation.Devices.Results[0].ShareID) {
		t.Fatalf("device %+v, want udma0 in pool %s with CDI id %s and the share id", dev, node, want)
	}
	env, nodes, mounts := h.cdiEdits(t, want)
	for _, e := range []string{"URMA_DEVICE=udma0", "URMA_EID=::ffff:10.0.0.1", "URMA_JETTY_BUDGET=100", "URMA_SHM_DIR=" + h.shmDir} {
		if !slices.Contains(env, e) {
			t.Errorf("env %v lacks %s", env, e)
		}
	}
	if !slices.Equal(nodes, []string{"/dev/uburma/udma0", "/dev/ummu/tid"}) {
		t.Errorf("device nodes %v, want /dev/uburma/udma0 and /dev/ummu/tid", nodes)
	}
	if !slices.Equal(mounts, []string{h.shmDir + ":" + h.shmDir}) {
		t.Errorf("mounts %v, want the shm directory", mounts)
	}
}

func TestPrepareAndUnprepareAreIdempotent(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	d := h.start()
	c := h.claim(16, "udma0")
	first := d.prepare(t, c).Claims[string(c.UID)]
	again := d.prepare(t, c).Claims[string(c.UID)]
	if again.Error != "" || !slices.Equal(again.Devices[0].CdiDeviceIds, first.Devices[0].CdiDeviceIds) {
		t.Fatalf("second prepare %+v, want the first answer %+v", again, first)
	}
	for range 2 {
		if r := d.unprepare(t, c).Claims[string(c.UID)]; r == nil || r.Error != "" {
			t.Fatalf("unprepare: %+v", r)
		}
	}
	if entries, _ := os.ReadDir(h.cdiDir); len(entries) != 0 {
		t.Fatalf("CDI directory after unprepare: %d files", len(entries))
	}
	// Unpreparing a claim never prepared here is fine too.
	stranger := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "y", UID: "uid-stranger"}}
	if r := d.unprepare(t, stranger).Claims["uid-stranger"]; r == nil || r.Error != "" {
		t.Fatalf("unprepare of an unknown claim: %+v", r)
	}
}

func TestPreparedClaimsSurviveARestart(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	d := h.start()
	a, b := h.claim(500, "udma0"), h.claim(500, "udma0")
	first := d.prepare(t, a, b)
	d.stop()

	// The device goes unhealthy meanwhile: re-preparing a claim prepared
	// before still answers as before rather than failing a running pod.
	tree := sysfstest.New(t)
	down := sysfstest.DefaultDevice("udma0")
	down.Ports = []urma.PortState{urma.PortDown}
	tree.Add(t, down)
	h.inv.Publish(*dratest.SnapshotOfTree(t, dratest.Config(0), tree))

	d2 := h.start()
	again := d2.prepare(t, a)
	if got, want := again.Claims[string(a.UID)], first.Claims[string(a.UID)]; got.Error != "" || !slices.Equal(got.Devices[0].CdiDeviceIds, want.Devices[0].CdiDeviceIds) {
		t.Fatalf("after a restart: %+v, want %+v", got, want)
	}
	// The restarted driver still counts both claims' 1000 of 1008 jetties.
	h.inv.Publish(*dratest.Snapshot(t, dratest.Config(0), sysfstest.DefaultDevice("udma0")))
	c := h.claim(16, "udma0")
	if r := d2.prepare(t, c).Claims[string(c.UID)]; !strings.Contains(r.Error, "1000 of 1008 already prepared") {
		t.Fatalf("a claim beyond the budget after a restart: %+v", r)
	}
	// And unprepares what the first process prepared.
	d2.unprepare(t, a, b)
	claims, err := checkpoint.Load(filepath.Join(h.dataDir, checkpoint.FileName))
	if err != nil || len(claims) != 0 {
		t.Fatalf("checkpoint after unprepare: %v, %v", claims, err)
	}
	if entries, _ := os.ReadDir(h.cdiDir); len(entries) != 0 {
		t.Fatalf("CDI directory after unprepare: %d files", len(entries))
	}
}

func TestPrepareRewritesALostSpec(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	d := h.start()
	c := h.claim(16, "udma0")
	id := d.prepare(t, c).Claims[string(c.UID)].Devices[0].CdiDeviceIds[0]
	if err := os.RemoveAll(h.cdiDir); err != nil {
		t.Fatal(err)
	}
	// The answer is the one given before, with the spec written again.
	r := d.prepare(t, c).Claims[string(c.UID)]
	if r.Error != "" || len(r.Devices) != 1 || !slices.Equal(r.Devices[0].CdiDeviceIds, []string{id}) {
		t.Fatalf("prepared again as %+v, want the CDI device %s", r, id)
	}
	if env, _, _ := h.cdiEdits(t, id); !slices.Contains(env, "URMA_JETTY_BUDGET=16") {
		t.Fatalf("rewritten spec env %v", env)
	}
}

// The shm directory every claim's containers mount is prepared at start;
// removed or chmod'ed later (an admin's cleanup, a remount), a prepare,
// of a new claim or again of one prepared before (its spec still there),
// puts it back rather than let the runtime fail the container on a missing
// mount source; when it cannot, the claim fails naming the directory.
func TestPrepareRestoresTheShmDirectory(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	d := h.start()
	before := h.claim(16, "udma0")
	if r := d.prepare(t, before).Claims[string(before.UID)]; r.Error != "" {
		t.Fatalf("prepare: %s", r.Error)
	}
	wantOpen := func(when string) {
		t.Helper()
		fi, err := os.Lstat(h.shmDir)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Fatalf("shm directory %s: %v, %v; want drwxrwxrwt", when, fi, err)
		}
	}
	wantOpen("after the first prepare")

	for _, tc := range []struct {
		name  string
		spoil func() error
		claim func() *resourceapi.ResourceClaim
	}{
		{"removed, a new claim", func() error { return os.Remove(h.shmDir) }, func() *resourceapi.ResourceClaim { return h.claim(16, "udma0") }},
		{"removed, a claim prepared before", func() error { return os.Remove(h.shmDir) }, func() *resourceapi.ResourceClaim { return before }},
		{"mode changed, a claim prepared before", func() error { return os.Chmod(h.shmDir, 0o700) }, func() *resourceapi.ResourceClaim { return before }},
	} {
		if err := tc.spoil(); err != nil {
			t.Fatal(err)
		}
		c := tc.claim()
		if r := d.prepare(t, c).Claims[string(c.UID)]; r.Error != "" {
			t.Fatalf("%s: prepare: %s", tc.name, r.Error)
		}
		wantOpen(tc.name)
	}

	// A file in its place cannot be mended: both kinds of prepare fail,
	// naming the directory.
	if err := os.Remove(h.shmDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.shmDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{before, h.claim(16, "udma0")} {
		r := d.prepare(t, c).Claims[string(c.UID)]
		if !strings.Contains(r.Error, h.shmDir) || !strings.Contains(r.Error, "not a directory") {
			t.Errorf("prepare of %s with a file in the shm directory's place: %q, want an error naming %s", c.Name, r.Error, h.shmDir)
		}
	}
}

// A claim that cannot be prepared is logged as an error with its name and
// why; a claim prepared beside it is not.
func TestPrepareLogsRefusedClaims(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind, ShmDir: h.shmDir})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refused []string
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "claim not prepared") {
			mu.Lock()
			refused = append(refused, args)
			mu.Unlock()
		}
	}, funcr.Options{})
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy()}, h.inv, specs, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := h.claim(16, "udma0")
	bad := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "unallocated", Namespace: "default", UID: "uid-unallocated"}}
	res, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{good, bad})
	if err != nil || res[good.UID].Err != nil || res[bad.UID].Err == nil {
		t.Fatalf("PrepareResourceClaims: %v, %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) != 1 || !strings.Contains(refused[0], "default/unallocated") || !strings.Contains(refused[0], "is not allocated") {
		t.Fatalf("refusals logged: %q, want one naming default/unallocated and why", refused)
	}
}

// waitSpy is a context that reports the first time someone is about to
// wait on it (calls Done): the test then knows the call under test is
// blocked on it, without sleeping.
type waitSpy struct {
	context.Context
	once    sync.Once
	waiting chan struct{}
}

func newWaitSpy(ctx context.Context) *waitSpy {
	return &waitSpy{Context: ctx, waiting: make(chan struct{})}
}

func (w *waitSpy) Done() <-chan struct{} {
	w.once.Do(func() { close(w.waiting) })
	return w.Context.Done()
}

// unscannedPlugin is a plugin over an inventory that has not seen a scan
// yet, as in dra.Run between the helper's registration with kubelet and the
// first discovery scan; publish delivers that scan (of h's devices).
func unscannedPlugin(t *testing.T, h *host) (p *plugin.Plugin, publish func()) {
	t.Helper()
	scanned, _ := h.inv.Current()
	fresh := inventory.New(16)
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind, ShmDir: h.shmDir})
	if err != nil {
		t.Fatal(err)
	}
	p, err = plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy()},
		fresh, specs, testr.New(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, func() { fresh.Publish(*scanned) }
}

type prepared struct {
	res map[types.UID]kubeletplugin.PrepareResult
	err error
}

// Kubelet may call NodePrepareResources as soon as the helper registers,
// before the first scan: the claim waits for the scan instead of being
// refused with "no such device on this node" for a device that is there.
func TestPrepareBeforeTheFirstScanWaitsForIt(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	p, publish := unscannedPlugin(t, h)
	c := h.claim(16, "udma0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spy := newWaitSpy(ctx)
	done := make(chan prepared, 1)
	go func() {
		res, err := p.PrepareResourceClaims(spy, []*resourceapi.ResourceClaim{c})
		done <- prepared{res, err}
	}()
	select {
	case <-spy.waiting:
	case r := <-done:
		t.Fatalf("prepared before the first scan without waiting for it: %v, %+v", r.err, r.res)
	}

	// Unprepare does not wait behind it.
	other := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: "x", Name: "y"}, UID: "uid-other"}
	un, err := p.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{other})
	if err != nil || un[other.UID] != nil {
		t.Fatalf("unprepare while a prepare waits for the first scan: %v, %v", err, un)
	}
	select {
	case r := <-done:
		t.Fatalf("unprepare ran only after the waiting prepare gave up: %v, %+v", r.err, r.res)
	default:
	}

	publish()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := r.res[c.UID]; got.Err != nil || len(got.Devices) != 1 {
		t.Fatalf("claim on a present device prepared before the first scan: %+v", got)
	}
}

// The same through the helper, as kubelet calls it: a NodePrepareResources
// waiting for the first scan does not hold up NodeUnprepareResources (the
// helper's own serialization would, until kubelet's deadline).
func TestUnprepareDoesNotWaitBehindAPrepareWaitingForTheFirstScan(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	scanned, _ := h.inv.Current()
	h.inv = inventory.New(16)
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var once sync.Once
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "waiting for the first device scan") {
			once.Do(func() { close(waiting) })
		}
	}, funcr.Options{})
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy()},
		h.inv, specs, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := h.serve(p)
	c := h.claim(16, "udma0")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type answer struct {
		resp *drapb.NodePrepareResourcesResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := d.client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref(c)}})
		done <- answer{resp, err}
	}()
	select {
	case <-waiting:
	case a := <-done:
		t.Fatalf("prepared before the first scan without waiting for it: %v, %+v", a.err, a.resp)
	}

	// Far below the prepare's minute: a call queued behind it fails here.
	unCtx, unCancel := context.WithTimeout(ctx, 20*time.Second)
	defer unCancel()
	un, err := d.client.NodeUnprepareResources(unCtx, &drapb.NodeUnprepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: "x", Name: "y", Uid: "uid-other"}},
	})
	if err != nil || un.Claims["uid-other"] == nil || un.Claims["uid-other"].Error != "" {
		t.Fatalf("NodeUnprepareResources while a prepare waits for the first scan: %v, %+v", err, un)
	}
	select {
	case a := <-done:
		t.Fatalf("the prepare ended before the first scan: %v, %+v", a.err, a.resp)
	default:
	}

	h.inv.Publish(*scanned)
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if r := a.resp.Claims[string(c.UID)]; r == nil || r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("claim prepared after the first scan: %+v", r)
	}
}

// A prepare whose context ends before any scan fails as a whole, saying so,
// rather than refusing each claim with "no such device".
func TestPrepareBeforeTheFirstScanGivesUpWithItsContext(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	p, _ := unscannedPlugin(t, h)
	c := h.claim(16, "udma0")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "no device scan has finished yet") {
		t.Fatalf("PrepareResourceClaims = %v, %+v; want an error wrapping context.Canceled saying no scan has finished", err, res)
	}
}

func TestPrepareRefuses(t *testing.T) {
	down := sysfstest.DefaultDevice("udma1")
	down.Ports = []urma.PortState{urma.PortDown}
	h := newHost(t, sysfstest.DefaultDevice("udma0"), down)
	d := h.start()

	otherPool := h.claim(16, "udma0")
	otherPool.Status.Allocation.Devices.Results[0].Pool = "node-2"
	noCapacity := h.claim(16, "udma0")
	noCapacity.Status.Allocation.Devices.Results[0].ConsumedCapacity = nil
	for _, c := range []*resourceapi.ResourceClaim{otherPool, noCapacity} {
		if _, err := h.kube.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"unknown device", h.claim(16, "udma7"), "no such device on this node"},
		{"unhealthy device", h.claim(16, "udma1"), "unhealthy: no usable port"},
		{"over the budget", h.claim(1009, "udma0"), "1009 jetties requested, 0 of 1008"},
		{"zero jetties", h.claim(0, "udma0"), `consumed no jetties (0 of capacity "jetties")`},
		{"other pool", otherPool, `pool "node-2"`},
		{"no consumed capacity", noCapacity, "without consumable capacity (is the DRAConsumableCapacity feature gate off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := d.prepare(t, tc.claim).Claims[string(tc.claim.UID)]
			if r == nil || !strings.Contains(r.Error, tc.want) || !strings.Contains(r.Error, tc.claim.Name) {
				t.Fatalf("prepare = %+v, want an error naming the claim and %q", r, tc.want)
			}
		})
	}
	if entries, _ := os.ReadDir(h.cdiDir); len(entries) != 0 {
		t.Fatalf("refused claims left %d CDI specs", len(entries))
	}
	// A claim that tolerates the unhealthy taint (an admin debugging the
	// device) is prepared; other tolerations do not count.
	for _, tc := range []struct {
		name string
		tol  resourceapi.DeviceToleration
		ok   bool
	}{
		{"the unhealthy taint", resourceapi.DeviceToleration{Key: draslices.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpExists}, true},
		{"the unhealthy taint, NoSchedule", resourceapi.DeviceToleration{Key: draslices.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}, true},
		{"every taint", resourceapi.DeviceToleration{Operator: resourceapi.DeviceTolerationOpExists}, true},
		{"the unhealthy taint, NoExecute only", resourceapi.DeviceToleration{Key: draslices.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute}, false},
		{"another taint", resourceapi.DeviceToleration{Key: "example.com/other", Operator: resourceapi.DeviceTolerationOpExists}, false},
		{"an empty key that is not Exists", resourceapi.DeviceToleration{Operator: resourceapi.DeviceTolerationOpEqual}, false},
		// Operator Equal (the default when empty) matches the value too,
		// as the scheduler's allocator does: the taint is port-down.
		{"the unhealthy taint's value", resourceapi.DeviceToleration{Key: draslices.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpEqual, Value: draslices.ReasonPortDown}, true},
		{"the unhealthy taint's value, no operator", resourceapi.DeviceToleration{Key: draslices.TaintUnhealthy, Value: draslices.ReasonPortDown, Effect: resourceapi.DeviceTaintEffectNoSchedule}, true},
		{"the unhealthy taint with another value", resourceapi.DeviceToleration{Key: draslices.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpEqual, Value: draslices.ReasonNoEID}, false},
		{"the unhealthy taint with another value, NoSchedule", resourceapi.DeviceToleration{Key: draslices.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpEqual, Value: draslices.ReasonNoEID, Effect: resourceapi.DeviceTaintEffectNoSchedule}, false},
		{"the unhealthy taint with no value and no operator", resourceapi.DeviceToleration{Key: draslices.TaintUnhealthy}, false},
	} {
		t.Run("tolerating "+tc.name, func(t *testing.T) {
			c := h.claim(1, "udma1")
			c.Status.Allocation.Devices.Results[0].Tolerations = []resourceapi.DeviceToleration{tc.tol}
			if _, err := h.kube.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if r := d.prepare(t, c).Claims[string(c.UID)]; (r.Error == "") != tc.ok {
				t.Fatalf("prepared %v (%s), want %v", r.Error == "", r.Error, tc.ok)
			}
		})
	}
	// Exactly the budget fits.
	whole := h.claim(1008, "udma0")
	if r := d.prepare(t, whole).Claims[string(whole.UID)]; r.Error != "" {
		t.Fatalf("the whole budget of 1008: %s", r.Error)
	}
}

func TestHealthReports(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	specs, _ := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, Policy: draslices.DefaultRequestPolicy(), HealthResend: time.Hour}, h.inv, specs, logr.Discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error, 1)
	go func() { done <- p.WatchHealthStatus(ctx, reports) }()
	r := <-reports
	if len(r.Devices) != 1 || r.Devices[0].DeviceName != "udma0" || r.Devices[0].PoolName != node || r.Devices[0].Health != kubeletplugin.HealthStatusHealthy {
		t.Fatalf("first report %+v", r)
	}
	if r.Devices[0].HealthCheckTimeout != 3*time.Hour {
		t.Errorf("health check timeout %s, want 3 resend intervals", r.Devices[0].HealthCheckTimeout)
	}
	down := sysfstest.DefaultDevice("udma0")
	down.Ports = []urma.PortState{urma.PortDown}
	h.inv.Publish(*dratest.Snapshot(t, dratest.Config(0), down))
	r = <-reports
	if r.Devices[0].Health != kubeletplugin.HealthStatusUnhealthy || !strings.Contains(r.Devices[0].Message, "no usable port") {
		t.Fatalf("report after the port went down: %+v", r)
	}
	// Missed by a scan, its absence not yet confirmed: listed, but its node
	// is gone, and kubelet hears so.
	_, gone := vanishing(t)
	h.inv.Publish(gone)
	r = <-reports
	if r.Devices[0].Health != kubeletplugin.HealthStatusUnhealthy || !strings.Contains(r.Devices[0].Message, inventory.ReasonVanished) {
		t.Fatalf("report after the device vanished: %+v", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchHealthStatus returned %v", err)
	}
}

// recorder is a Publisher that keeps what it was given.
type recorder struct {
	mu  sync.Mutex
	got []resourceslice.DriverResources
	ch  chan struct{}
}

func (r *recorder) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	r.mu.Lock()
	r.got = append(r.got, res)
	r.mu.Unlock()
	r.ch <- struct{}{}
	return nil
}

func TestPublishWaitsForTheFirstScanAndFollowsChanges(t *testing.T) {
	inv := inventory.New(16)
	specs, _ := claimspec.New(claimspec.Config{Dir: t.TempDir(), Kind: claimspec.DefaultKind})
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: t.TempDir(), Policy: draslices.DefaultRequestPolicy()}, inv, specs, logr.Discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{ch: make(chan struct{}, 10)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Publish(ctx, rec) }()

	// Nothing is published before the first scan; the first scan, even an
	// empty one, is.
	snap, _, _ := inventory.NewBuilder(dratest.Config(0)).Build(inventory.Scan{}, time.Now())
	inv.Publish(snap)
	<-rec.ch
	down := sysfstest.DefaultDevice("udma0")
	down.Ports = []urma.PortState{urma.PortDown}
	inv.Publish(*dratest.Snapshot(t, dratest.Config(0), down))
	<-rec.ch
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.got) != 2 {
		t.Fatalf("%d publications, want 2 (first scan, health flip)", len(rec.got))
	}
	if n := len(rec.got[0].Pools[node].Slices); n != 0 {
		t.Fatalf("first scan found nothing, yet %d slices", n)
	}
	devs := rec.got[1].Pools[node].Slices[0].Devices
	if len(devs) != 1 || len(devs[0].Taints) != 1 || devs[0].Taints[0].Key != draslices.TaintUnhealthy {
		t.Fatalf("after the health flip: %+v, want udma0 tainted unhealthy", devs)
	}
}

// publisherFunc is a Publisher of a test's making.
type publisherFunc func(context.Context, resourceslice.DriverResources) error

func (f publisherFunc) PublishResources(ctx context.Context, res resourceslice.DriverResources) error {
	return f(ctx, res)
}

// A driver stopped while the helper starts its slice controller (which then
// fails with the context's error) has stopped, not failed; a publication
// that fails otherwise is an error.
func TestPublishStoppedWhileStartingIsNoError(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	specs, _ := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, Policy: draslices.DefaultRequestPolicy()}, h.inv, specs, logr.Discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopping := publisherFunc(func(ctx context.Context, _ resourceslice.DriverResources) error {
		cancel()
		return fmt.Errorf("start ResourceSlice controller: sync ResourceSlice informer: %w", ctx.Err())
	})
	if err := p.Publish(ctx, stopping); err != nil {
		t.Fatalf("Publish stopped during its first publication = %v, want nil", err)
	}
	failing := publisherFunc(func(context.Context, resourceslice.DriverResources) error { return errors.New("forbidden") })
	if err := p.Publish(context.Background(), failing); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("Publish with a failing publication = %v, want its error", err)
	}
}

func TestHandleError(t *testing.T) {
	var fatal error
	specs, err := claimspec.New(claimspec.Config{Dir: t.TempDir(), Kind: claimspec.DefaultKind})
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: t.TempDir(), Policy: draslices.DefaultRequestPolicy()}, inventory.New(16), specs, logr.Discard(), func(err error) { fatal = err })
	if err != nil {
		t.Fatal(err)
	}
	p.HandleError(context.Background(), errors.Join(kubeletplugin.ErrRecoverable, errors.New("slice conflict")), "publishing")
	if fatal != nil {
		t.Fatalf("a recoverable error stopped the driver: %v", fatal)
	}
	p.HandleError(context.Background(), errors.New("socket gone"), "DRA gRPC server failed")
	if fatal == nil || !strings.Contains(fatal.Error(), "socket gone") {
		t.Fatalf("a fatal error did not stop the driver: %v", fatal)
	}
}

// A driver that has not scanned yet reports nothing, rather than an empty
// list that would tell kubelet its pods' devices are gone.
func TestHealthReportsWaitForTheFirstScan(t *testing.T) {
	p, publish := unscannedPlugin(t, newHost(t, sysfstest.DefaultDevice("udma0")))
	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := newWaitSpy(base)
	reports := make(chan kubeletplugin.DeviceHealthReport)
	go func() { _ = p.WatchHealthStatus(ctx, reports) }()
	<-ctx.waiting // it looked at the unscanned inventory and waits
	publish()
	if r := <-reports; len(r.Devices) != 1 || r.Devices[0].DeviceName != "udma0" {
		t.Fatalf("first report %+v, want udma0's from the first scan", r)
	}
}

func TestDefaultHealthResend(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	specs, _ := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, Policy: draslices.DefaultRequestPolicy()}, h.inv, specs, logr.Discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reports := make(chan kubeletplugin.DeviceHealthReport)
	go func() { _ = p.WatchHealthStatus(ctx, reports) }()
	if got := (<-reports).Devices[0].HealthCheckTimeout; got != 3*plugin.DefaultHealthResend {
		t.Fatalf("health check timeout %s with the default resend, want %s", got, 3*plugin.DefaultHealthResend)
	}
}

// Kubelet hears the timeout in whole seconds: 3 resend intervals, as
// docs/dra.md says.
func TestHealthCheckTimeoutSentToKubelet(t *testing.T) {
	for _, tc := range []struct {
		name   string
		resend time.Duration
		want   int64
	}{
		{"default", 0, 30},
		{"chart test value", 2 * time.Second, 6},
		{"maximum", plugin.MaxHealthResend, 3 * 3600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, sysfstest.DefaultDevice("udma0"))
			specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
			if err != nil {
				t.Fatal(err)
			}
			p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, Policy: draslices.DefaultRequestPolicy(), HealthResend: tc.resend}, h.inv, specs, logr.Discard(), nil)
			if err != nil {
				t.Fatal(err)
			}
			d := h.serve(p)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			stream, err := d.health.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
			if err != nil {
				t.Fatalf("NodeWatchResources: %v", err)
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("receiving the first health report: %v", err)
			}
			if len(resp.Devices) != 1 || resp.Devices[0].HealthCheckTimeoutSeconds != tc.want {
				t.Fatalf("first report %v, want one device with health_check_timeout_seconds %d", resp.Devices, tc.want)
			}
		})
	}
}

// An interval above the maximum is refused rather than multiplied: 3× it
// overflowed to a negative timeout, or vouched for a stopped driver's
// devices for years.
func TestNewRefusesAHealthResendAboveTheMaximum(t *testing.T) {
	for _, resend := range []time.Duration{plugin.MaxHealthResend + time.Nanosecond, 100000 * time.Hour, 854016 * time.Hour, math.MaxInt64} {
		t.Run(resend.String(), func(t *testing.T) {
			h := newHost(t)
			_, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, Policy: draslices.DefaultRequestPolicy(), HealthResend: resend}, h.inv, nil, logr.Discard(), nil)
			if err == nil || !strings.Contains(err.Error(), resend.String()) || !strings.Contains(err.Error(), plugin.MaxHealthResend.String()) {
				t.Fatalf("New with a resend of %s = %v, want an error naming it and the maximum", resend, err)
			}
		})
	}
}

// A device the last scan did not find, whose absence the debounce has not
// confirmed yet, is still listed healthy (a driver reload must not
// flap the slices); but its device node is gone, so a claim on it is not
// prepared: a CDI spec naming a missing node fails the container, while a
// refusal is retried by kubelet and succeeds once the device is back.
func TestPrepareRefusesAVanishedDevice(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	seen, gone := vanishing(t)
	h.inv.Publish(gone)
	d := h.start()
	c := h.claim(16, "udma0")
	if r := d.prepare(t, c).Claims[string(c.UID)]; r == nil || !strings.Contains(r.Error, inventory.ReasonVanished) || !strings.Contains(r.Error, c.Name) {
		t.Fatalf("prepare on a vanished device = %+v, want an error naming the claim and saying the device was not found", r)
	}
	if entries, _ := os.ReadDir(h.cdiDir); len(entries) != 0 {
		t.Fatalf("a refused claim left %d CDI specs", len(entries))
	}
	// Back before its absence was confirmed: kubelet's retry prepares it.
	h.inv.Publish(seen)
	if r := d.prepare(t, c).Claims[string(c.UID)]; r == nil || r.Error != "" {
		t.Fatalf("prepare once the device is back = %+v", r)
	}
}

func TestPrepareRefusesADeviceWhoseNodeIsGone(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	seen, nodeGone := losingItsNode(t)
	h.inv.Publish(nodeGone)
	d := h.start()
	c := h.claim(16, "udma0")
	// Tolerating the unhealthy taint does not help: a CDI spec naming the
	// missing node would fail the container.
	c.Status.Allocation.Devices.Results[0].Tolerations = []resourceapi.DeviceToleration{{Operator: resourceapi.DeviceTolerationOpExists}}
	if r := d.prepare(t, c).Claims[string(c.UID)]; r == nil || !strings.Contains(r.Error, inventory.ReasonNoDevNode) || !strings.Contains(r.Error, c.Name) {
		t.Fatalf("prepare on a device without its node = %+v, want an error naming the claim and the missing node", r)
	}
	if entries, _ := os.ReadDir(h.cdiDir); len(entries) != 0 {
		t.Fatalf("a refused claim left %d CDI specs", len(entries))
	}
	h.inv.Publish(seen)
	if r := d.prepare(t, c).Claims[string(c.UID)]; r == nil || r.Error != "" {
		t.Fatalf("prepare once the node is back = %+v", r)
	}
}

// losingItsNode gives two snapshots of udma0: with its device node, then
// from a scan that found the device but not its node, the health verdict
// not yet changed (listed, healthy, no node).
func losingItsNode(t *testing.T) (seen, nodeGone inventory.Snapshot) {
	t.Helper()
	seen, nodeGone = scansAround(t, func(tree *sysfstest.Tree) { tree.RemoveDevNode(t, "uburma/udma0") })
	if d, ok := nodeGone.Lookup("udma0"); !ok || !d.Healthy || d.DevNode != "" {
		t.Fatalf("fixture: want udma0 listed, healthy and without its node, got %+v", d)
	}
	return seen, nodeGone
}

// vanishing gives two snapshots of udma0: found by a scan, then missed by
// the next, its absence not yet confirmed (listed, healthy, Vanished).
func vanishing(t *testing.T) (seen, gone inventory.Snapshot) {
	t.Helper()
	seen, gone = scansAround(t, func(tree *sysfstest.Tree) { tree.Remove(t, "udma0") })
	if d, ok := gone.Lookup("udma0"); !ok || !d.Vanished || !d.Healthy {
		t.Fatalf("fixture: want udma0 listed, vanished and still healthy, got %+v", d)
	}
	return seen, gone
}

// scansAround builds the snapshots of two scans of a node with udma0, one
// second apart, before and after change; health changes hold for an hour,
// so the second shows what the scan saw before any verdict changed.
func scansAround(t *testing.T, change func(*sysfstest.Tree)) (before, after inventory.Snapshot) {
	t.Helper()
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	tree.AddDevNode(t, sysfstest.UMMUNode)
	scan := func() inventory.Scan {
		found, err := sysfs.Discover(tree.Options())
		if err != nil {
			t.Fatal(err)
		}
		return inventory.Scan{Devices: found, UMMUNode: sysfs.UMMUNode(tree.Options())}
	}
	cfg := dratest.Config(0)
	cfg.Debounce = health.Debounce{Observations: 2, Hold: time.Hour}
	b := inventory.NewBuilder(cfg)
	now := time.Now()
	before, _, _ = b.Build(scan(), now)
	change(tree)
	after, _, _ = b.Build(scan(), now.Add(time.Second))
	return before, after
}

// claimGetter is a ClaimGetter over a map by namespace/name; a missing
// claim is NotFound, one in errs fails with that error.
type claimGetter struct {
	claims map[string]*resourceapi.ResourceClaim
	errs   map[string]error
}

func (g claimGetter) GetClaim(_ context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	key := namespace + "/" + name
	if err := g.errs[key]; err != nil {
		return nil, err
	}
	c, ok := g.claims[key]
	if !ok {
		return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), name)
	}
	return c, nil
}

// Claims whose kubelet state was wiped are never unprepared; the driver
// forgets those the API server no longer has allocated as prepared, so
// their jetties are free again, and keeps every other.
func TestDropStaleClaims(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("udma1"))
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy()}, h.inv, specs, testr.New(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	live, deleted, replaced, deallocated, reallocated, unreadable :=
		h.claim(100, "udma1"), h.claim(1000, "udma0"), h.claim(1, "udma1"), h.claim(1, "udma1"), h.claim(1, "udma1"), h.claim(1, "udma1")
	all := []*resourceapi.ResourceClaim{live, deleted, replaced, deallocated, reallocated, unreadable}
	res, err := p.PrepareResourceClaims(context.Background(), all)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if res[c.UID].Err != nil {
			t.Fatalf("prepare %s: %v", c.Name, res[c.UID].Err)
		}
	}

	// What the API server says now.
	key := func(c *resourceapi.ResourceClaim) string { return c.Namespace + "/" + c.Name }
	api := claimGetter{claims: map[string]*resourceapi.ResourceClaim{}, errs: map[string]error{key(unreadable): errors.New("connection refused")}}
	for _, c := range []*resourceapi.ResourceClaim{live, replaced, deallocated, reallocated, unreadable} {
		api.claims[key(c)] = c.DeepCopy()
	}
	api.claims[key(replaced)].UID = "uid-a-new-claim-of-that-name"
	api.claims[key(deallocated)].Status.Allocation = nil
	api.claims[key(reallocated)].Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("share-of-a-later-allocation"))

	dropped, err := p.DropStaleClaims(context.Background(), api)
	if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), key(unreadable)) {
		t.Errorf("DropStaleClaims error %v, want the failed lookup of %s", err, key(unreadable))
	}
	slices.Sort(dropped)
	want := []string{string(deallocated.UID), string(deleted.UID), string(reallocated.UID), string(replaced.UID)}
	slices.Sort(want)
	if !slices.Equal(dropped, want) {
		t.Fatalf("dropped %v, want %v", dropped, want)
	}
	saved, err := checkpoint.Load(filepath.Join(h.dataDir, checkpoint.FileName))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		_, inCheckpoint := saved[string(c.UID)]
		_, err := os.Stat(filepath.Join(h.cdiDir, specs.FileName(string(c.UID))))
		kept := !slices.Contains(want, string(c.UID))
		if inCheckpoint != kept || (err == nil) != kept {
			t.Errorf("%s: in the checkpoint %v, spec present %v; want both %v", c.Name, inCheckpoint, err == nil, kept)
		}
	}
	// The deleted claim's 1000 jetties of udma0 are free again.
	next := h.claim(1008, "udma0")
	if r, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{next}); err != nil || r[next.UID].Err != nil {
		t.Fatalf("the whole budget of udma0 after its stale claim was dropped: %v, %v", err, r[next.UID].Err)
	}
}

// CleanStaleClaims checks at once, then every StaleClaimCheck, and stops
// with its context.
func TestCleanStaleClaimsRunsUntilCanceled(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy(), StaleClaimCheck: time.Millisecond}, h.inv, specs, logr.Discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	asked := make(chan string)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c := h.claim(16, "udma0")
	if r, err := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c}); err != nil || r[c.UID].Err != nil {
		t.Fatalf("prepare: %v %+v", err, r)
	}
	go func() {
		defer close(done)
		p.CleanStaleClaims(ctx, getterFunc(func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
			select {
			case asked <- name:
			case <-ctx.Done():
			}
			return c, nil
		}))
	}()
	for range 3 { // the first round and two more
		if got := <-asked; got != c.Name {
			t.Fatalf("asked for %s, want %s", got, c.Name)
		}
	}
	cancel()
	<-done
}

// A round that fails is logged, and the next one runs all the same; a
// plugin left at the default interval does not tick at 0.
func TestCleanStaleClaimsLogsAFailedRound(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	if err != nil {
		t.Fatal(err)
	}
	var lines logtest.Lines
	newPlugin := func(interval time.Duration) *plugin.Plugin {
		p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy(), StaleClaimCheck: interval}, h.inv, specs, lines.Logger(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := newPlugin(time.Millisecond)
	c := h.claim(16, "udma0")
	if r, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c}); err != nil || r[c.UID].Err != nil {
		t.Fatalf("prepare: %v %+v", err, r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan struct{})
	done := make(chan struct{})
	var rounds int
	go func() {
		defer close(done)
		p.CleanStaleClaims(ctx, getterFunc(func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
			rounds++
			if rounds == 1 {
				return nil, errors.New("the API server is away")
			}
			if rounds == 2 {
				close(second) // the first round's log line is written by now
			}
			return c, nil
		}))
	}()
	<-second
	cancel()
	<-done
	if n := lines.Count("the API server is away"); n != 1 {
		t.Errorf("the failed round was logged %d times, want once:\n%s", n, lines.String())
	}

	// The default interval (StaleClaimCheck 0): one round, then the wait
	// ends with ctx.
	ended, stop := context.WithCancel(context.Background())
	stop()
	newPlugin(0).CleanStaleClaims(ended, getterFunc(func(context.Context, string, string) (*resourceapi.ResourceClaim, error) { return c, nil }))
}

type getterFunc func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)

func (f getterFunc) GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	return f(ctx, namespace, name)
}

// stripConsumableCapacity makes h's fake API server store ResourceSlices as
// one with DRAConsumableCapacity off does: without allowMultipleAllocations
// and the capacities' request policies.
func stripConsumableCapacity(h *host) {
	gvr := resourceapi.SchemeGroupVersion.WithResource("resourceslices")
	store := func(verb string) k8stesting.ReactionFunc {
		return func(action k8stesting.Action) (bool, runtime.Object, error) {
			obj := action.(interface{ GetObject() runtime.Object }).GetObject().(*resourceapi.ResourceSlice).DeepCopy()
			for i := range obj.Spec.Devices {
				d := &obj.Spec.Devices[i]
				d.AllowMultipleAllocations = nil
				for name, c := range d.Capacity {
					c.RequestPolicy = nil
					d.Capacity[name] = c
				}
			}
			if verb == "create" {
				if obj.Name == "" { // the fake does not generate names
					obj.Name = obj.GenerateName + "fake"
				}
				return true, obj, h.kube.Tracker().Create(gvr, obj, "")
			}
			return true, obj, h.kube.Tracker().Update(gvr, obj, "")
		}
	}
	for _, verb := range []string{"create", "update"} {
		h.kube.PrependReactor(verb, "resourceslices", store(verb))
	}
}

// A cluster without consumable capacity stores the slices without it; the
// driver says so when it publishes, naming the feature gate, rather than
// only later when every claim is refused at prepare.
func TestPublishReportsAClusterWithoutConsumableCapacity(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	if _, err := h.kube.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stripConsumableCapacity(h)
	said := make(chan string, 10)
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "DRAConsumableCapacity") {
			select {
			case said <- args:
			default:
			}
		}
	}, funcr.Options{})
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	if err != nil {
		t.Fatal(err)
	}
	fatal := make(chan error, 1)
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy()},
		h.inv, specs, log, func(err error) { fatal <- err })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), testr.New(t)))
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.DriverName(slicefacts.DriverName), kubeletplugin.KubeClient(h.kube), kubeletplugin.NodeName(node),
		kubeletplugin.PluginDataDirectoryPath(h.dataDir), kubeletplugin.RegistrarDirectoryPath(h.regDir),
		kubeletplugin.GRPCVerbosity(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer helper.Stop()
	go func() { _ = p.Publish(ctx, helper) }()
	select {
	case msg := <-said:
		if !strings.Contains(msg, "feature gate is off") || !strings.Contains(msg, "refused at prepare") {
			t.Fatalf("logged %s; want the gate named and what it breaks", msg)
		}
	case err := <-fatal:
		t.Fatalf("the driver stopped: %v", err)
	case <-time.After(time.Minute): // a deadline, not synchronisation
		t.Fatal("nothing said about DRAConsumableCapacity within a minute of publishing")
	}
}

// A claim prepared here, then deallocated and allocated again without
// kubelet unpreparing it (its state wiped), is prepared for its new
// allocation: the earlier answer would hand the container the old device
// and keep counting the old jetties.
func TestPrepareFollowsANewAllocationOfAPreparedClaim(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("udma1"))
	d := h.start()
	c := h.claim(1000, "udma0")
	if r := d.prepare(t, c).Claims[string(c.UID)]; r.Error != "" || r.Devices[0].DeviceName != "udma0" {
		t.Fatalf("first prepare: %+v", r)
	}
	// Allocated anew: another device, a new share.
	res := &c.Status.Allocation.Devices.Results[0]
	res.Device, res.ShareID = "udma1", ptr.To(types.UID("share-of-the-new-allocation"))
	res.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{slicefacts.CapacityJetties: *resource.NewQuantity(100, resource.DecimalSI)}
	c, err := h.kube.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := d.prepare(t, c).Claims[string(c.UID)]
	if r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "udma1" || r.Devices[0].GetShareId() != "share-of-the-new-allocation" {
		t.Fatalf("prepare after a new allocation: %+v, want udma1 with the new share", r)
	}
	if env, _, _ := h.cdiEdits(t, r.Devices[0].CdiDeviceIds[0]); !slices.Contains(env, "URMA_DEVICE=udma1") || !slices.Contains(env, "URMA_JETTY_BUDGET=100") {
		t.Fatalf("CDI env %v, want udma1's 100 jetties", env)
	}
	// The old allocation's 1000 jetties of udma0 are no longer counted.
	whole := h.claim(1008, "udma0")
	if r := d.prepare(t, whole).Claims[string(whole.UID)]; r.Error != "" {
		t.Fatalf("udma0's whole budget after the claim moved off it: %s", r.Error)
	}
}

// A device whose node stays missing past the health debounce is unhealthy
// (taint no-device-node); a claim tolerating that taint is still refused,
// as while the verdict was pending: its CDI spec could not give the
// container the node, so the pod would start with a device it cannot open.
func TestPrepareRefusesATolerantClaimOnADeviceWithoutItsNode(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	tree.AddDevNode(t, sysfstest.UMMUNode)
	cfg := dratest.Config(0)
	cfg.Debounce = health.Debounce{Observations: 2, Hold: time.Minute}
	b := inventory.NewBuilder(cfg)
	scan := func() inventory.Scan {
		found, err := sysfs.Discover(tree.Options())
		if err != nil {
			t.Fatal(err)
		}
		return inventory.Scan{Devices: found, UMMUNode: sysfs.UMMUNode(tree.Options())}
	}
	now := time.Now()
	b.Build(scan(), now)
	tree.RemoveDevNode(t, "uburma/udma0")
	var nodeGone inventory.Snapshot
	for i := 1; i <= 3; i++ {
		nodeGone, _, _ = b.Build(scan(), now.Add(time.Duration(i)*time.Hour))
	}
	dev, ok := nodeGone.Lookup("udma0")
	if !ok || dev.Healthy || dev.Vanished || dev.DevNode != "" {
		t.Fatalf("fixture: want udma0 listed, unhealthy and without its node, got %+v", dev)
	}
	if got := draslices.UnhealthyTaint(dev).Value; got != draslices.ReasonNoDeviceNode {
		t.Fatalf("fixture: taint value %q, want %q", got, draslices.ReasonNoDeviceNode)
	}

	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	h.inv.Publish(nodeGone)
	d := h.start()
	for _, tol := range []resourceapi.DeviceToleration{
		{Operator: resourceapi.DeviceTolerationOpExists},
		{Key: draslices.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpEqual, Value: draslices.ReasonNoDeviceNode},
	} {
		c := h.claim(16, "udma0")
		c.Status.Allocation.Devices.Results[0].Tolerations = []resourceapi.DeviceToleration{tol}
		if _, err := h.kube.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if r := d.prepare(t, c).Claims[string(c.UID)]; r == nil || r.Error == "" || !strings.Contains(r.Error, c.Name) {
			t.Errorf("prepare tolerating %+v on a device without its node = %+v, want a refusal naming the claim", tol, r)
		}
	}
	if entries, _ := os.ReadDir(h.cdiDir); len(entries) != 0 {
		t.Fatalf("refused claims left %d CDI specs", len(entries))
	}
}

// The scheduler does not count the capacity an admin-access result
// consumes (it "is not considered as allocated"), so neither does the
// budget check at prepare: otherwise a claim the scheduler placed beside an
// admin's debug claim is refused and its pod stays in ContainerCreating,
// and an admin claim on a device whose budget is taken is refused although
// admin access exists to reach devices in use. This holds across a restart.
func TestAdminAccessSharesDoNotCountAgainstTheBudget(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	d := h.start()
	admin := func(jetties int64) *resourceapi.ResourceClaim {
		c := h.claim(jetties, "udma0")
		c.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
		c, err := h.kube.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	debug := admin(1000)
	if r := d.prepare(t, debug).Claims[string(debug.UID)]; r == nil || r.Error != "" {
		t.Fatalf("admin-access claim: %+v", r)
	}
	d.stop()
	d = h.start()
	whole := h.claim(1008, "udma0")
	if r := d.prepare(t, whole).Claims[string(whole.UID)]; r == nil || r.Error != "" {
		t.Fatalf("the whole budget beside an admin-access claim, after a restart: %+v", r)
	}
	late := admin(16)
	if r := d.prepare(t, late).Claims[string(late.UID)]; r == nil || r.Error != "" {
		t.Fatalf("admin-access claim on a device whose budget is taken: %+v", r)
	}
	over := h.claim(1, "udma0")
	if r := d.prepare(t, over).Claims[string(over.UID)]; r == nil || !strings.Contains(r.Error, "1008 of 1008 already prepared") {
		t.Fatalf("a claim beyond the budget: %+v, want a refusal counting only the regular claim", r)
	}
}
