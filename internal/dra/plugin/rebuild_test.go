package plugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/openeuler/urma-k8s/internal/dra/checkpoint"
	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	"github.com/openeuler/urma-k8s/internal/dra/dratest"
	"github.com/openeuler/urma-k8s/internal/dra/plugin"
	draslices "github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// apiClaims lists the claims of the fake API server, as dra.Run's reader
// lists the real one's.
type apiClaims struct{ kube *fake.Clientset }

func (a apiClaims) ListClaims(ctx context.Context) ([]resourceapi.ResourceClaim, error) {
	l, err := a.kube.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// listerFunc is a ClaimLister of a test's making.
type listerFunc func(context.Context) ([]resourceapi.ResourceClaim, error)

func (f listerFunc) ListClaims(ctx context.Context) ([]resourceapi.ResourceClaim, error) {
	return f(ctx)
}

// reserve reserves a claim in the API server for a pod, as the scheduler
// does before kubelet prepares it.
func (h *host) reserve(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	h.t.Helper()
	c = c.DeepCopy()
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-of-" + c.Name, UID: types.UID("pod-uid-" + c.Name)}}
	return h.updateClaim(c)
}

func (h *host) updateClaim(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	h.t.Helper()
	updated, err := h.kube.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return updated
}

// newPlugin makes a plugin over h as dra.Run does, without serving it and
// without rebuilding.
func (h *host) newPlugin(lines *logtest.Lines) *plugin.Plugin {
	h.t.Helper()
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind, ShmDir: h.shmDir})
	if err != nil {
		h.t.Fatal(err)
	}
	p, err := plugin.New(plugin.Config{NodeName: node, DataDir: h.dataDir, DevRoot: h.devRoot, Policy: draslices.DefaultRequestPolicy()},
		h.inv, specs, lines.Logger(h.t), func(err error) { h.t.Errorf("fatal driver error: %v", err) })
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

func (h *host) specExists(c *resourceapi.ResourceClaim) bool {
	h.t.Helper()
	specs, err := claimspec.New(claimspec.Config{Dir: h.cdiDir, Kind: claimspec.DefaultKind})
	if err != nil {
		h.t.Fatal(err)
	}
	return specs.Exists(string(c.UID))
}

func movedAside(t *testing.T, dataDir string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dataDir, checkpoint.FileName+".unusable-*"))
	if err != nil {
		t.Fatal(err)
	}
	return matches
}

// A checkpoint that is deleted or unusable is moved aside and rebuilt, by a
// driver served to kubelet as dra.Run serves it, from the CDI specs and
// the API server: the claims prepared for running pods come back exactly as
// prepare recorded them, answer as before and count against the budget;
// the specs of claims it cannot account for are removed; and it says so.
func TestALostCheckpointIsRebuilt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string, good []byte)
	}{
		{"corrupted", func(t *testing.T, path string, good []byte) {
			writeFile(t, path, strings.Replace(string(good), `"jetties": 500`, `"jetties": 5`, 1))
		}},
		{"truncated", func(t *testing.T, path string, good []byte) { writeFile(t, path, string(good[:len(good)/3])) }},
		{"deleted", func(t *testing.T, path string, _ []byte) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
		{"from an older version", func(t *testing.T, path string, good []byte) {
			writeFile(t, path, strings.Replace(string(good), `"version": 1`, `"version": 0`, 1))
		}},
		{"unreadable", func(t *testing.T, path string, _ []byte) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("udma1"))
			d := h.start()
			running, spanning := h.reserve(h.claim(500, "udma0")), h.reserve(h.claim(100, "udma0", "udma1"))
			deleted, unreserved, deallocated := h.reserve(h.claim(16, "udma1")), h.claim(16, "udma1"), h.reserve(h.claim(16, "udma1"))
			all := []*resourceapi.ResourceClaim{running, spanning, deleted, unreserved, deallocated}
			first := d.prepare(t, all...)
			for _, c := range all {
				if r := first.Claims[string(c.UID)]; r.Error != "" {
					t.Fatalf("prepare %s: %s", c.Name, r.Error)
				}
			}
			notPrepared := h.reserve(h.claim(16, "udma1")) // allocated here, kubelet has not prepared it yet
			d.stop()
			path := filepath.Join(h.dataDir, checkpoint.FileName)
			recorded, err := checkpoint.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			good, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}

			// While the driver is down: one claim is deleted, one
			// deallocated; and the checkpoint is damaged.
			if err := h.kube.ResourceV1().ResourceClaims("default").Delete(context.Background(), deleted.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			gone := deallocated.DeepCopy()
			gone.Status.Allocation, gone.Status.ReservedFor = nil, nil
			h.updateClaim(gone)
			tc.damage(t, path, good)
			damaged, _ := os.ReadFile(path) // nothing, for a directory or a deleted file

			var lines logtest.Lines
			p := h.newPlugin(&lines)
			if err := p.Rebuild(context.Background(), apiClaims{h.kube}); err != nil {
				t.Fatal(err)
			}
			d2 := h.serve(p)

			// Moved aside, named with the time, as it was.
			aside := movedAside(t, h.dataDir)
			if tc.name == "deleted" {
				if len(aside) != 0 {
					t.Fatalf("moved aside %q, but there was no checkpoint", aside)
				}
			} else if len(aside) != 1 {
				t.Fatalf("moved aside %q, want the one unusable checkpoint", aside)
			} else if got, _ := os.ReadFile(aside[0]); !slices.Equal(got, damaged) {
				t.Fatalf("%s holds %q, want the unusable checkpoint %q", aside[0], got, damaged)
			}
			// Rebuilt exactly as prepare recorded the claims still in use.
			rebuilt, err := checkpoint.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			want := checkpoint.Claims{string(running.UID): recorded[string(running.UID)], string(spanning.UID): recorded[string(spanning.UID)]}
			if !reflect.DeepEqual(rebuilt, want) {
				t.Fatalf("rebuilt checkpoint %+v,\nwant %+v", rebuilt, want)
			}
			for _, c := range all {
				kept := c == running || c == spanning
				if h.specExists(c) != kept {
					t.Errorf("%s: CDI spec present %v, want %v", c.Name, !kept, kept)
				}
			}
			// The same answer as before; the budget counts them.
			again := d2.prepare(t, running, spanning)
			for _, c := range []*resourceapi.ResourceClaim{running, spanning} {
				if got, was := again.Claims[string(c.UID)], first.Claims[string(c.UID)]; got.Error != "" || !reflect.DeepEqual(got.Devices, was.Devices) {
					t.Errorf("%s prepared again after the rebuild: %+v, want %+v", c.Name, got, was)
				}
			}
			over := h.claim(409, "udma0")
			if r := d2.prepare(t, over).Claims[string(over.UID)]; !strings.Contains(r.Error, "600 of 1008 already prepared") {
				t.Errorf("a claim beyond the budget after the rebuild: %+v, want refused with 600 of 1008 already prepared", r)
			}
			// A claim allocated here but never prepared is prepared now as
			// any new claim.
			if r := d2.prepare(t, notPrepared).Claims[string(notPrepared.UID)]; r.Error != "" {
				t.Errorf("a claim allocated but not prepared before the rebuild: %s", r.Error)
			}
			// What it rebuilt and what it could not, each with the claim.
			for _, want := range []string{
				`"msg"="prepared claim restored from its CDI spec and the API server" "claim"="default/` + running.Name,
				`"msg"="prepared claim restored from its CDI spec and the API server" "claim"="default/` + spanning.Name,
				`"uid"="` + string(deleted.UID) + `" "reason"="no ResourceClaim of this UID in the API server"`,
				`"uid"="` + string(unreserved.UID) + `" "reason"="claim default/` + unreserved.Name + `: reserved for no pod"`,
				`"uid"="` + string(deallocated.UID) + `" "reason"="claim default/` + deallocated.Name + `: not allocated"`,
				`"msg"="prepared claims rebuilt" "restored"=2 "unprepared"=3 "notUnprepared"=0`,
			} {
				if !lines.Contains(want) {
					t.Errorf("the log lacks %s:\n%s", want, lines.String())
				}
			}
			if tc.name != "deleted" && !lines.Contains(`"msg"="the checkpoint cannot be used: moved aside for inspection`) {
				t.Errorf("the log does not say the checkpoint was moved aside:\n%s", lines.String())
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A claim whose spec is on disk but whose allocation the driver cannot
// match (a device gone from the node, another node's pool, no jetties, no
// device of this driver) is unprepared; a spec of another vendor is not
// this driver's to remove.
func TestRebuildUnpreparesWhatItCannotAccountFor(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("udma1"))
	d := h.start()
	onUdma1, elsewhere, noJetties, otherDriver := h.reserve(h.claim(16, "udma1")), h.reserve(h.claim(16, "udma0")), h.reserve(h.claim(16, "udma0")), h.reserve(h.claim(16, "udma0"))
	all := []*resourceapi.ResourceClaim{onUdma1, elsewhere, noJetties, otherDriver}
	for uid, r := range d.prepare(t, all...).Claims {
		if r.Error != "" {
			t.Fatalf("prepare %s: %s", uid, r.Error)
		}
	}
	d.stop()
	foreign := filepath.Join(h.cdiDir, "vendor.example-gpu_uid-foreign.yaml")
	writeFile(t, foreign, "cdiVersion: 0.6.0\nkind: vendor.example/gpu\ndevices: []\n")
	edit := func(c *resourceapi.ResourceClaim, f func(r *resourceapi.DeviceRequestAllocationResult)) {
		c = c.DeepCopy()
		f(&c.Status.Allocation.Devices.Results[0])
		h.updateClaim(c)
	}
	edit(elsewhere, func(r *resourceapi.DeviceRequestAllocationResult) { r.Pool = "node-2" })
	edit(noJetties, func(r *resourceapi.DeviceRequestAllocationResult) { r.ConsumedCapacity = nil })
	edit(otherDriver, func(r *resourceapi.DeviceRequestAllocationResult) { r.Driver = "gpu.example.com" })
	if err := os.Remove(filepath.Join(h.dataDir, checkpoint.FileName)); err != nil {
		t.Fatal(err)
	}
	// udma1 is gone from the node for good.
	h.inv.Publish(*dratest.Snapshot(t, dratest.Config(0), sysfstest.DefaultDevice("udma0")))

	var lines logtest.Lines
	p := h.newPlugin(&lines)
	if err := p.Rebuild(context.Background(), apiClaims{h.kube}); err != nil {
		t.Fatal(err)
	}
	for c, why := range map[*resourceapi.ResourceClaim]string{
		onUdma1:     "request jetties: device udma1 is not on this node",
		elsewhere:   "request jetties: device node-2/udma0 is in another node's pool",
		noJetties:   "request jetties: the allocation consumed no jetties of device udma0",
		otherDriver: "no device of urma.openeuler.org in its allocation",
	} {
		if h.specExists(c) {
			t.Errorf("%s: its CDI spec is still there", c.Name)
		}
		if want := `"reason"="claim default/` + c.Name + ": " + why + `"`; !lines.Contains(want) {
			t.Errorf("the log lacks %s:\n%s", want, lines.String())
		}
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("another vendor's spec was removed: %v", err)
	}
	if claims, err := checkpoint.Load(filepath.Join(h.dataDir, checkpoint.FileName)); err != nil || len(claims) != 0 {
		t.Errorf("rebuilt checkpoint %v, %v; want empty", claims, err)
	}
}

// Until the rebuild has finished, kubelet's prepare waits (and when its
// time runs out it says why, with the rebuild's last error), while its
// unprepare does not wait, and what it unprepares is left out of the
// rebuilt set.
func TestKubeletDuringARebuild(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	d := h.start()
	a, b := h.reserve(h.claim(100, "udma0")), h.reserve(h.claim(100, "udma0"))
	d.prepare(t, a, b)
	d.stop()
	if err := os.Remove(filepath.Join(h.dataDir, checkpoint.FileName)); err != nil {
		t.Fatal(err)
	}
	var lines logtest.Lines
	p := h.newPlugin(&lines)

	// A rebuild whose list fails: a prepare gives up with its context and
	// says why.
	refused := errors.New("connection refused")
	if err := p.Rebuild(context.Background(), listerFunc(func(context.Context) ([]resourceapi.ResourceClaim, error) { return nil, refused })); !errors.Is(err, refused) {
		t.Fatalf("Rebuild with a failing list = %v, want %v", err, refused)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.PrepareResourceClaims(ended, []*resourceapi.ResourceClaim{a}); err == nil ||
		!strings.Contains(err.Error(), "rebuilding its prepared claims") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("prepare during a failing rebuild = %v, want an error saying the rebuild failed and why", err)
	}

	// A rebuild whose list is held until the test lets it go.
	listing, release := make(chan struct{}), make(chan struct{})
	held := listerFunc(func(ctx context.Context) ([]resourceapi.ResourceClaim, error) {
		close(listing)
		<-release
		return apiClaims{h.kube}.ListClaims(ctx)
	})
	rebuilt := make(chan error, 1)
	go func() { rebuilt <- p.Rebuild(context.Background(), held) }()
	<-listing
	// Unprepare answers while the rebuild is held.
	res, err := p.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: a.Namespace, Name: a.Name}, UID: a.UID}})
	if err != nil || res[a.UID] != nil {
		t.Fatalf("unprepare during the rebuild: %v, %v", res, err)
	}
	// Prepare waits for the rebuild.
	spy := newWaitSpy(context.Background())
	preparing := make(chan prepared, 1)
	go func() {
		res, err := p.PrepareResourceClaims(spy, []*resourceapi.ResourceClaim{b})
		preparing <- prepared{res, err}
	}()
	<-spy.waiting
	select {
	case r := <-preparing:
		t.Fatalf("prepare answered during the rebuild: %+v", r)
	default:
	}
	close(release)
	if err := <-rebuilt; err != nil {
		t.Fatal(err)
	}
	r := <-preparing
	if r.err != nil || r.res[b.UID].Err != nil || len(r.res[b.UID].Devices) != 1 {
		t.Fatalf("prepare after the rebuild: %+v", r)
	}
	saved, err := checkpoint.Load(filepath.Join(h.dataDir, checkpoint.FileName))
	if _, ok := saved[string(b.UID)]; err != nil || len(saved) != 1 || !ok {
		t.Fatalf("checkpoint after the rebuild %v, %v; want only %s (%s was unprepared during it)", saved, err, b.Name, a.Name)
	}
	if h.specExists(a) {
		t.Errorf("the spec of %s, unprepared during the rebuild, is back", a.Name)
	}
}

// RebuildUntilDone tries again after a failure, waiting longer each time,
// until a rebuild succeeds; then prepare answers.
func TestRebuildUntilDoneRetries(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	d := h.start()
	c := h.reserve(h.claim(100, "udma0"))
	d.prepare(t, c)
	d.stop()
	writeFile(t, filepath.Join(h.dataDir, checkpoint.FileName), "{")
	var lines logtest.Lines
	p := h.newPlugin(&lines)
	var mu sync.Mutex
	calls := 0
	flaky := listerFunc(func(ctx context.Context) ([]resourceapi.ResourceClaim, error) {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls <= 2 {
			return nil, errors.New("the server is currently unable to handle the request")
		}
		return apiClaims{h.kube}.ListClaims(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p.RebuildUntilDone(ctx, flaky, time.Millisecond)
	if n := lines.Count(`"msg"="rebuilding the prepared claims; trying again"`); n != 2 || calls != 3 {
		t.Fatalf("%d lists, %d failures logged; want 3 and 2:\n%s", calls, n, lines.String())
	}
	for _, want := range []string{`"in"="1ms"`, `"in"="2ms"`} {
		if !lines.Contains(want) {
			t.Errorf("the log lacks the retry %s:\n%s", want, lines.String())
		}
	}
	res, err := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare after the rebuild: %v, %+v", err, res)
	}
}

// Without a checkpoint and without a spec of a prepared claim (a new node,
// or one whose claims were all unprepared), nothing was prepared: the
// driver answers at once, without asking the API server.
func TestNoCheckpointAndNoSpecsNeedNoRebuild(t *testing.T) {
	h := newHost(t, sysfstest.DefaultDevice("udma0"))
	var lines logtest.Lines
	p := h.newPlugin(&lines)
	c := h.claim(16, "udma0")
	res, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare without a rebuild: %v, %+v", err, res)
	}
	if err := p.Rebuild(context.Background(), listerFunc(func(context.Context) ([]resourceapi.ResourceClaim, error) {
		t.Error("Rebuild listed claims although there was nothing to rebuild")
		return nil, nil
	})); err != nil {
		t.Fatal(err)
	}
	if !lines.Contains("no CDI spec of a prepared claim on disk: no claim is prepared on this node") {
		t.Errorf("the log does not say why nothing is rebuilt:\n%s", lines.String())
	}
	if _, err := checkpoint.Load(filepath.Join(h.dataDir, checkpoint.FileName)); err != nil {
		t.Errorf("checkpoint after the first prepare: %v", err)
	}
}
