package dra_test

// These tests run the driver against a real kube-apiserver (envtest) with
// the resource.k8s.io/v1 API and the DRA features it uses: the slices it
// publishes must pass the API server's validation, follow health flips, and
// the DeviceClass with its extended-resource mapping must be accepted.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/openeuler/urma-k8s/internal/dra"
	"github.com/openeuler/urma-k8s/internal/dra/checkpoint"
	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	"github.com/openeuler/urma-k8s/internal/dra/plugin"
	draslices "github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// kube is the API server all tests of the package share.
var kube kubernetes.Interface

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		fmt.Fprintln(os.Stderr, "FAIL: KUBEBUILDER_ASSETS is not set: these tests need kube-apiserver and etcd. "+
			"Run them with `make test`, or KUBEBUILDER_ASSETS=$PWD/bin/k8s go test ./internal/dra/")
		return 1
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		env.ControlPlaneStartTimeout = 180 * time.Second
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	// resource.k8s.io/v1 and these gates are on by default at 1.37; saying
	// so keeps the test meaningful on an API server whose defaults differ.
	args.Set("runtime-config", "resource.k8s.io/v1=true")
	args.Set("feature-gates", "DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=true")
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: starting envtest:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		}
	}()
	kube, err = kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: client:", err)
		return 1
	}
	return m.Run()
}

// waitForSlices waits until the node's slices of the driver satisfy cond,
// watching for changes (no polling), and returns them.
func waitForSlices(ctx context.Context, t *testing.T, node string, cond func([]resourceapi.ResourceSlice) bool) []resourceapi.ResourceSlice {
	t.Helper()
	sel := metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node}
	for {
		list, err := kube.ResourceV1().ResourceSlices().List(ctx, sel)
		if err != nil {
			t.Fatalf("listing slices: %v", err)
		}
		if cond(list.Items) {
			return list.Items
		}
		opts := sel
		opts.ResourceVersion = list.ResourceVersion
		w, err := kube.ResourceV1().ResourceSlices().Watch(ctx, opts)
		if err != nil {
			t.Fatalf("watching slices: %v", err)
		}
		select {
		case <-ctx.Done():
			w.Stop()
			t.Fatalf("slices never satisfied the condition; last: %+v", list.Items)
		case <-w.ResultChan():
		}
		w.Stop()
	}
}

func devicesOf(ss []resourceapi.ResourceSlice) map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

func tainted(d resourceapi.Device, key string) bool {
	return slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == key })
}

func TestSlicesPublishedAndFollowHealth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Generated names let the package run again on the same API server
	// (go test -count=N), which keeps what the last run created.
	n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "dra-node-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := n.Name
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	small := sysfstest.DefaultDevice("udma1")
	small.Caps.MaxJetty = 20 // 4 jetties: below the default request
	tree.Add(t, small)

	root, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cfg := dra.Default()
	cfg.Libs.HostRoot, cfg.Libs.SoftLib = root, "" // nothing of this machine's
	cfg.NodeName = node
	cfg.Sysfs = tree.Options()
	cfg.Inventory.SoftDevices = 1
	cfg.Inventory.Debounce.Observations, cfg.Inventory.Debounce.Hold = 1, 0
	cfg.Watch.PollInterval = 100 * time.Millisecond
	cfg.CDI.Dir = filepath.Join(root, "cdi")
	cfg.CDI.ShmDir = filepath.Join(root, "shm")
	cfg.PluginDataDir = filepath.Join(root, "d")
	cfg.RegistrarDir = filepath.Join(root, "r")
	if err := os.MkdirAll(cfg.RegistrarDir, 0o755); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- dra.Run(runCtx, testr.New(t), cfg, dra.Deps{KubeClient: kube}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	got := waitForSlices(ctx, t, node, func(ss []resourceapi.ResourceSlice) bool { return len(devicesOf(ss)) == 3 })
	// The shm directory is open to every pod, as the device plugin leaves it.
	if fi, err := os.Stat(cfg.CDI.ShmDir); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("shm directory %s: %v %v, want drwxrwxrwt", cfg.CDI.ShmDir, fi, err)
	}
	s := got[0]
	if s.Spec.Driver != slicefacts.DriverName || s.Spec.Pool.Name != node || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" {
		t.Fatalf("slice %+v: want driver %s, pool %s, owned by the Node", s.ObjectMeta, slicefacts.DriverName, node)
	}
	devs := devicesOf(got)
	udma0 := devs["udma0"]
	c := udma0.Capacity[slicefacts.CapacityJetties]
	if c.Value.Value() != 1008 || c.RequestPolicy == nil || c.RequestPolicy.Default.Value() != 16 || udma0.AllowMultipleAllocations == nil || !*udma0.AllowMultipleAllocations {
		t.Fatalf("udma0 as stored: capacity %+v, shared %v", c, udma0.AllowMultipleAllocations)
	}
	if len(udma0.Attributes) < 15 || len(udma0.Taints) != 0 {
		t.Fatalf("udma0 as stored: %d attributes (fields dropped?), taints %+v", len(udma0.Attributes), udma0.Taints)
	}
	if !tainted(devs["udma1"], draslices.TaintNoBudget) {
		t.Fatalf("udma1 (4 jetties) not tainted %s: %+v", draslices.TaintNoBudget, devs["udma1"].Taints)
	}
	if sw := devs["soft0"]; sw.Attributes[slicefacts.AttrSoftware].BoolValue == nil || !*sw.Attributes[slicefacts.AttrSoftware].BoolValue {
		t.Fatalf("soft0 not marked software: %+v", sw.Attributes)
	}

	// The port goes down: the slice is republished with the device tainted.
	tree.SetPortState(t, "udma0", 0, urma.PortDown)
	waitForSlices(ctx, t, node, func(ss []resourceapi.ResourceSlice) bool {
		return tainted(devicesOf(ss)["udma0"], draslices.TaintUnhealthy)
	})
	// It recovers: the taint goes, without a restart.
	tree.SetPortState(t, "udma0", 0, urma.PortActive)
	waitForSlices(ctx, t, node, func(ss []resourceapi.ResourceSlice) bool {
		d, ok := devicesOf(ss)["udma0"]
		return ok && len(d.Taints) == 0
	})
	// The device vanishes: it leaves the slice once that is debounced.
	tree.Remove(t, "udma0")
	waitForSlices(ctx, t, node, func(ss []resourceapi.ResourceSlice) bool {
		_, ok := devicesOf(ss)["udma0"]
		return !ok && len(devicesOf(ss)) == 2
	})
}

func TestDeviceClassMapsTheExtendedResource(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dc, err := kube.ResourceV1().DeviceClasses().Create(ctx, draslices.DeviceClass(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the DeviceClass: %v", err)
	}
	t.Cleanup(func() {
		// Its name is the driver's, so it goes for the next run (-count=N).
		if err := kube.ResourceV1().DeviceClasses().Delete(context.Background(), dc.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting the DeviceClass: %v", err)
		}
	})
	// A dropped field would mean DRAExtendedResource is off.
	if dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != "urma.openeuler.org/jetty" {
		t.Fatalf("stored DeviceClass lost its extendedResourceName: %+v", dc.Spec)
	}
	ns := testNamespace(ctx, t, "jetty-pods-")
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	two := resource.MustParse("2")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "unchanged-spec"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "app",
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{draslices.ExtendedResourceName: two},
				Limits:   corev1.ResourceList{draslices.ExtendedResourceName: two},
			},
		}}},
	}
	created, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a pod requesting urma.openeuler.org/jetty: 2 was refused: %v", err)
	}
	if q := created.Spec.Containers[0].Resources.Limits[draslices.ExtendedResourceName]; q.Value() != 2 {
		t.Fatalf("stored pod asks for %s", q.String())
	}
}

// The examples in examples/dra must be accepted as they are.
func TestExampleClaimTemplates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := testNamespace(ctx, t, "dra-examples-")
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "dra", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples in examples/dra: %v", err)
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
		for {
			var tmpl resourceapi.ResourceClaimTemplate
			if err := dec.Decode(&tmpl); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if tmpl.Kind != "ResourceClaimTemplate" {
				continue
			}
			if _, err := kube.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &tmpl, metav1.CreateOptions{}); err != nil {
				t.Errorf("%s: %s refused: %v", f, tmpl.Name, err)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("the examples hold no ResourceClaimTemplate")
	}
}

// testNamespace creates a namespace named prefix and a generated suffix:
// envtest has no namespace controller, so a deleted namespace never goes,
// and a fixed name would fail the next run (go test -count=N).
func testNamespace(ctx context.Context, t *testing.T, prefix string) string {
	t.Helper()
	ns, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// A shm directory the driver cannot open to pods (here one holding a file:
// a mistyped /etc) turns shared memory between pods off, as in the device
// plugin: pods still get their devices and meet same-node peers over TCP.
// The driver used to stop instead, leaving the node without URMA devices.
func TestUnusableShmDirDoesNotStopTheDriver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "dra-shm-node-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	root, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cfg := dra.Default()
	cfg.Libs.HostRoot, cfg.Libs.SoftLib = root, "" // nothing of this machine's
	cfg.NodeName = n.Name
	cfg.Sysfs = tree.Options()
	cfg.CDI.Dir = filepath.Join(root, "cdi")
	cfg.CDI.ShmDir = filepath.Join(root, "etc")
	cfg.PluginDataDir = filepath.Join(root, "d")
	cfg.RegistrarDir = filepath.Join(root, "r")
	for _, d := range []string{cfg.RegistrarDir, cfg.CDI.ShmDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(cfg.CDI.ShmDir, "passwd"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	// Run returning ends the wait for slices, and says why.
	waitCtx, stopWaiting := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- dra.Run(runCtx, testr.New(t), cfg, dra.Deps{KubeClient: kube})
		stopWaiting()
	}()
	defer func() {
		if runCtx.Err() == nil {
			t.Errorf("Run stopped before it published the node's devices: %v", <-done)
		}
	}()
	waitForSlices(waitCtx, t, n.Name, func(ss []resourceapi.ResourceSlice) bool { return len(devicesOf(ss)) == 1 })
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if fi, err := os.Stat(cfg.CDI.ShmDir); err != nil || fi.Mode().Perm() != 0o755 || fi.Mode()&os.ModeSticky != 0 {
		t.Errorf("directory %s: %v %v, want it left drwxr-xr-x", cfg.CDI.ShmDir, fi, err)
	}
}

// A driver whose checkpoint is corrupted moves it aside, rebuilds the
// claims prepared for running pods from the API server and its CDI specs,
// unprepares a spec it cannot account for, and answers kubelet as before.
func TestRunRebuildsACorruptedCheckpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "dra-rebuild-node-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := testNamespace(ctx, t, "dra-rebuild-")
	claim, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "jetties"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "jetties", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: slicefacts.DriverName},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	share := types.UID("6a0e3f5e-6b2b-4b8e-9d55-2f5c1b8f3a10")
	claim.Status = resourceapi.ResourceClaimStatus{
		Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "jetties", Driver: slicefacts.DriverName, Pool: n.Name, Device: "udma0", ShareID: &share,
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{slicefacts.CapacityJetties: resource.MustParse("100")},
		}}}},
		ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "app", UID: "0b7e5c1e-1f7a-4d6e-8d8c-3c2f4a9e6b21"}},
	}
	if claim, err = kube.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	root, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cfg := dra.Default()
	cfg.Libs.HostRoot, cfg.Libs.SoftLib = root, "" // nothing of this machine's
	cfg.NodeName = n.Name
	cfg.Sysfs = tree.Options()
	cfg.CDI.Dir = filepath.Join(root, "cdi")
	cfg.CDI.ShmDir = ""
	cfg.PluginDataDir = filepath.Join(root, "d")
	cfg.RegistrarDir = filepath.Join(root, "r")
	for _, d := range []string{cfg.RegistrarDir, cfg.PluginDataDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// What an earlier driver left: the claim's spec, the spec of a claim
	// the API server no longer has, and a corrupted checkpoint.
	specs, err := claimspec.New(cfg.CDI)
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{string(claim.UID), "uid-of-a-deleted-claim"} {
		if _, err := specs.Write(uid, []claimspec.Device{{Name: "udma0.jetties", URMADevice: "udma0", Jetties: 100}}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(cfg.PluginDataDir, checkpoint.FileName)
	if err := os.WriteFile(path, []byte(`{"version": 1, "checksum": "0", "claims": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- dra.Run(runCtx, testr.New(t), cfg, dra.Deps{KubeClient: kube}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Kubelet's prepare is answered once the rebuild is done.
	conn, err := grpc.NewClient("unix://"+filepath.Join(cfg.PluginDataDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: ns, Name: claim.Name, Uid: string(claim.UID)}}}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Claims[string(claim.UID)]
	if want := specs.DeviceID(string(claim.UID), "udma0.jetties"); r == nil || r.Error != "" || len(r.Devices) != 1 || !slices.Equal(r.Devices[0].CdiDeviceIds, []string{want}) {
		t.Fatalf("prepare after the rebuild: %+v, want the CDI device %s", r, want)
	}
	rebuilt, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := rebuilt[string(claim.UID)]; len(rebuilt) != 1 || !ok || c.Devices[0].Jetties != 100 || c.Devices[0].ShareID != string(share) {
		t.Fatalf("rebuilt checkpoint %+v, want the claim with its 100 jetties and share", rebuilt)
	}
	if aside, _ := filepath.Glob(path + ".unusable-*"); len(aside) != 1 {
		t.Errorf("moved aside: %q, want the corrupted checkpoint", aside)
	}
	if uids, err := specs.ClaimUIDs(); err != nil || !slices.Equal(uids, []string{string(claim.UID)}) {
		t.Errorf("CDI specs after the rebuild %q, %v; want only the claim's", uids, err)
	}
}

// /readyz is the DaemonSet's readiness probe: 503 until kubelet has
// registered the driver, 200 then, and 503 again while a restarted
// kubelet registers it anew. The test is kubelet's plugin watcher on the
// registration socket.
func TestReadyzFollowsKubeletsRegistration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "dra-ready-node-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	root, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cfg := dra.Default()
	cfg.Libs.HostRoot, cfg.Libs.SoftLib = root, "" // nothing of this machine's
	cfg.NodeName = n.Name
	cfg.Sysfs = tree.Options()
	cfg.CDI.Dir = filepath.Join(root, "cdi")
	cfg.CDI.ShmDir = ""
	cfg.PluginDataDir = filepath.Join(root, "d")
	cfg.RegistrarDir = filepath.Join(root, "r")
	cfg.HealthAddress = "127.0.0.1:0"
	if err := os.MkdirAll(cfg.RegistrarDir, 0o755); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	addr := make(chan string, 1)
	go func() {
		done <- dra.Run(runCtx, testr.New(t), cfg, dra.Deps{KubeClient: kube, HealthListening: func(a string) { addr <- a }})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var url string
	select {
	case a := <-addr:
		url = "http://" + a + "/readyz"
	case err := <-done:
		t.Fatalf("Run ended before serving /readyz: %v", err)
	}
	readyz := func(wantCode int, wantBody string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != wantCode || !strings.Contains(string(b), wantBody) {
			t.Fatalf("/readyz = %d %q, want %d and %q", resp.StatusCode, b, wantCode, wantBody)
		}
	}
	readyz(http.StatusServiceUnavailable, plugin.NotRegisteredYet)

	conn, err := grpc.NewClient("unix://"+filepath.Join(cfg.RegistrarDir, slicefacts.DriverName+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kubelet := registerapi.NewRegistrationClient(conn)
	// Two kubelets, the second after a restart: each registers the driver.
	for i := range 2 {
		info, err := kubelet.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		if info.Name != slicefacts.DriverName {
			t.Fatalf("GetInfo = %+v, want driver %s", info, slicefacts.DriverName)
		}
		readyz(http.StatusServiceUnavailable, plugin.RegistrationPending)
		if _, err := kubelet.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
			t.Fatal(err)
		}
		readyz(http.StatusOK, "registered")
		t.Logf("kubelet %d registered the driver", i+1)
	}
}
