package nodelabel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

func hwDevice(name string, jfs, jfr, jfc uint32, msg uint64, jetties uint32) inventory.Device {
	return inventory.Device{
		Name: name, Healthy: true, Budget: budget.Budget{Jetties: jetties, Units: jetties / 16},
		Info: urma.DeviceInfo{Name: name, Caps: urma.DeviceCaps{MaxJFSDepth: jfs, MaxJFRDepth: jfr, MaxJFCDepth: jfc, MaxMsgSize: msg}},
	}
}

func twoDevices() *inventory.Snapshot {
	return &inventory.Snapshot{JettiesPerUnit: 16, Generation: 1, Devices: []inventory.Device{
		hwDevice("udma0", 8192, 2048, 1<<22, 1<<32, 1008),
		hwDevice("udma1", 4096, 4096, 1<<20, 1<<31, 2000),
	}}
}

func TestFactsFor(t *testing.T) {
	soft := inventory.SoftDevices(inventory.Config{Budget: budget.Default(), SoftDevices: 2, SoftJetties: 64})
	tests := []struct {
		name string
		snap *inventory.Snapshot
		want nodefacts.Facts
	}{
		{"none", &inventory.Snapshot{JettiesPerUnit: 16}, nodefacts.Facts{}},
		{"minimum of each capability", twoDevices(), nodefacts.Facts{
			DeviceCount: 2, MaxJFSDepth: 4096, MaxJFRDepth: 2048, MaxJFCDepth: 1 << 20, MaxMsgSize: 1 << 31,
			JettiesPerDevice: 1008, JettiesPerUnit: 16,
		}},
		{"software only", &inventory.Snapshot{JettiesPerUnit: 16, Devices: soft}, nodefacts.Facts{
			DeviceCount: 2, Software: true, MaxJFSDepth: soft[0].Info.Caps.MaxJFSDepth, MaxJFRDepth: soft[0].Info.Caps.MaxJFRDepth,
			MaxJFCDepth: soft[0].Info.Caps.MaxJFCDepth, MaxMsgSize: soft[0].Info.Caps.MaxMsgSize, JettiesPerDevice: 64, JettiesPerUnit: 16,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FactsFor(tt.snap)
			if got != tt.want {
				t.Errorf("FactsFor = %+v\nwant %+v", got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("facts invalid: %v", err)
			}
		})
	}
	// Only healthy devices with a budget count: a bad device must not
	// poison the node's limits.
	poisoned := twoDevices()
	sick := hwDevice("udma2", 1, 1, 1, 1, 1008)
	sick.Healthy = false
	empty := hwDevice("udma3", 2, 2, 2, 2, 0)
	malformed := hwDevice("udma4", 0, 0, 0, 0, 0)
	malformed.Healthy, malformed.Reason = false, "max_jetty: malformed"
	poisoned.Devices = append(poisoned.Devices, sick, empty, malformed)
	if got, want := FactsFor(poisoned), FactsFor(twoDevices()); got != want {
		t.Errorf("FactsFor with unhealthy and empty devices = %+v\nwant the healthy ones' %+v", got, want)
	}
	allSick := &inventory.Snapshot{JettiesPerUnit: 16, Devices: []inventory.Device{sick}}
	if got := FactsFor(allSick); got != (nodefacts.Facts{}) {
		t.Errorf("FactsFor with no healthy device = %+v, want none", got)
	}

	mixed := twoDevices()
	mixed.Devices = append(mixed.Devices, soft[0])
	if FactsFor(mixed).Software {
		t.Error("hardware plus software reported as software")
	}
}

func newNode() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        "node-a",
		Labels:      map[string]string{"kubernetes.io/hostname": "node-a"},
		Annotations: map[string]string{"example.com/keep": "yes", nodefacts.AnnotationMaxJFSDepth: "1"},
	}}
}

func getNode(t *testing.T, c *fake.Clientset) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestApplyLabelsAndAnnotatesTheNode(t *testing.T) {
	c := fake.NewClientset(newNode())
	p := New(Config{NodeName: "node-a"}, c, testr.New(t), nil)
	want := FactsFor(twoDevices())
	if err := p.Apply(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c)
	if n.Labels[nodefacts.LabelPresent] != "true" || n.Labels[nodefacts.LabelDeviceCount] != "2" || n.Labels["kubernetes.io/hostname"] != "node-a" {
		t.Errorf("labels %v", n.Labels)
	}
	got, err := nodefacts.Parse(n.Annotations)
	if err != nil || got != want {
		t.Fatalf("operator's Parse of the node: %+v, %v; want %+v", got, err, want)
	}
	if n.Annotations["example.com/keep"] != "yes" {
		t.Error("unrelated annotation lost")
	}

	// Devices gone for good: capabilities removed, count 0, present=false.
	if err := p.Apply(context.Background(), FactsFor(&inventory.Snapshot{})); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, c)
	if n.Labels[nodefacts.LabelPresent] != "false" {
		t.Errorf("present = %q", n.Labels[nodefacts.LabelPresent])
	}
	if _, ok := n.Annotations[nodefacts.AnnotationMaxJFSDepth]; ok {
		t.Errorf("stale capability annotation kept: %v", n.Annotations)
	}
	if got, err := nodefacts.Parse(n.Annotations); err != nil || got.Present() {
		t.Errorf("Parse after removal: %+v, %v", got, err)
	}
}

func TestApplyMissingNode(t *testing.T) {
	p := New(Config{NodeName: "ghost"}, fake.NewClientset(), testr.New(t), nil)
	err := p.Apply(context.Background(), nodefacts.Facts{})
	if err == nil || !strings.Contains(err.Error(), "ghost") || !strings.Contains(err.Error(), "RBAC") {
		t.Fatalf("Apply = %v, want an error naming the node and RBAC", err)
	}
}

func TestFeatureFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "features.d")
	p := New(Config{FeaturesDir: dir}, nil, testr.New(t), nil)
	if err := p.Apply(context.Background(), FactsFor(twoDevices())); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, FeatureFileName))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("line %q is not name=value", line)
		}
		got[k] = v
	}
	want := map[string]string{
		nodefacts.LabelPresent: "true", nodefacts.LabelDeviceCount: "2", nodefacts.LabelSoftware: "false",
		nodefacts.AnnotationMaxJFSDepth: "4096", nodefacts.AnnotationJettiesPerDevice: "1008", nodefacts.AnnotationJettiesPerUnit: "16",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("features dir holds %d files, want 1 (no temp leftovers)", len(entries))
	}
}

type run struct {
	applied chan nodefacts.Facts
	errs    chan error
}

func startRun(t *testing.T, p *Publisher, inv *inventory.Inventory) *run {
	t.Helper()
	r := &run{applied: make(chan nodefacts.Facts, 32), errs: make(chan error, 32)}
	p.afterApply = func(f nodefacts.Facts, err error) {
		if err != nil {
			r.errs <- err
			return
		}
		r.applied <- f
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, inv) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return r
}

func patches(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "patch" {
			n++
		}
	}
	return n
}

func TestRunWaitsForFirstScanAndSkipsRepeats(t *testing.T) {
	c := fake.NewClientset(newNode())
	inv := inventory.New(16)
	p := New(Config{NodeName: "node-a"}, c, testr.New(t), nil)
	looked := make(chan uint64, 32)
	p.looked = func(gen uint64) { looked <- gen }
	r := startRun(t, p, inv)

	// Generation 0 (no scan yet) must not be published: that would flash
	// present=false on every plugin restart. Publishing the first scan must.
	select {
	case gen := <-looked:
		if gen != 0 {
			t.Fatalf("first look at generation %d", gen)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run never looked at the inventory")
	}
	if n := patches(c); n != 0 {
		t.Fatalf("%d patches before the first scan, want 0", n)
	}
	inv.Publish(*twoDevices())
	select {
	case f := <-r.applied:
		if f.DeviceCount != 2 {
			t.Fatalf("first publication %+v, want the scanned devices", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing published")
	}
	if n := patches(c); n != 1 {
		t.Fatalf("%d patches, want 1", n)
	}
	// Same facts, new generation (an unhealthy device appeared: facts
	// count healthy devices only): no new patch, once Run has looked at
	// it. A change of facts (a healthy device gone): one more.
	s2 := twoDevices()
	s2.Devices = append(s2.Devices, hwDevice("udma2", 64, 64, 64, 64, 16))
	s2.Devices[2].Healthy = false
	if !inv.Publish(*s2) {
		t.Fatal("the snapshot with an unhealthy device was not published")
	}
	cur, _ := inv.Current()
	s2gen := cur.Generation
	for gen := uint64(0); gen < s2gen; {
		select {
		case gen = <-looked:
		case <-time.After(10 * time.Second):
			t.Fatalf("Run never looked at generation %d", s2gen)
		}
	}
	if n := patches(c); n != 1 {
		t.Fatalf("%d patches, want 1 (the unhealthy device changes no fact)", n)
	}
	s3 := twoDevices()
	s3.Devices = s3.Devices[:1]
	inv.Publish(*s3)
	select {
	case f := <-r.applied:
		if f.DeviceCount != 1 {
			t.Fatalf("second publication %+v, want one device", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("change not published")
	}
	if n := patches(c); n != 2 {
		t.Fatalf("%d patches, want 2", n)
	}
}

func TestRunRetriesFailures(t *testing.T) {
	c := fake.NewClientset(newNode())
	var mu sync.Mutex
	failures := 4
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return true, nil, errors.New("apiserver unavailable")
		}
		return false, nil, nil
	})
	inv := inventory.New(16)
	inv.Publish(*twoDevices())
	p := New(Config{NodeName: "node-a", RetryInitial: time.Millisecond, RetryMax: 4 * time.Millisecond}, c, testr.New(t), nil)
	delays := make(chan time.Duration, 8)
	p.retryIn = func(d time.Duration) { delays <- d }
	r := startRun(t, p, inv)
	// The delay doubles from RetryInitial up to RetryMax.
	for i, want := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 4 * time.Millisecond} {
		select {
		case err := <-r.errs:
			if !strings.Contains(err.Error(), "apiserver unavailable") {
				t.Fatalf("error %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no retry %d", i)
		}
		if got := <-delays; got != want {
			t.Errorf("retry %d after %v, want %v", i, got, want)
		}
	}
	select {
	case <-r.applied:
	case <-time.After(10 * time.Second):
		t.Fatal("never succeeded after the failures")
	}
	if getNode(t, c).Labels[nodefacts.LabelPresent] != "true" {
		t.Fatal("node not labeled")
	}
}

func verbs(c *fake.Clientset, verb string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == "nodes" {
			n++
		}
	}
	return n
}

type resyncs struct {
	clock *testingclock.FakeClock
	done  chan error // one per resync check: its error
	wrote chan bool  // and whether it wrote
}

// startResyncing runs p over a snapshot of twoDevices with a fake resync
// clock, waits for the first publication and returns the means to drive
// resyncs.
func startResyncing(t *testing.T, p *Publisher) (*run, *resyncs) {
	t.Helper()
	rs := &resyncs{clock: testingclock.NewFakeClock(time.Now()), done: make(chan error, 8), wrote: make(chan bool, 8)}
	p.clock = rs.clock
	p.afterResync = func(wrote bool, err error) {
		rs.wrote <- wrote
		rs.done <- err
	}
	inv := inventory.New(16)
	inv.Publish(*twoDevices())
	r := startRun(t, p, inv)
	select {
	case <-r.applied:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing published")
	}
	return r, rs
}

// resync makes one resync interval pass and returns what the check did.
func (rs *resyncs) resync(t *testing.T) (bool, error) {
	t.Helper()
	// The ticker exists: Run made it before its first publication.
	rs.clock.Step(time.Minute)
	select {
	case wrote := <-rs.wrote:
		return wrote, <-rs.done
	case <-time.After(10 * time.Second):
		t.Fatal("no resync check after the interval passed")
	}
	return false, nil
}

// Facts someone else removes or edits between device changes (an admin,
// another controller, a Node registered afresh, a cleanup of features.d)
// are put back at the next resync; facts that are intact are only read.
func TestResyncPutsBackFactsRemovedOutOfBand(t *testing.T) {
	c := fake.NewClientset(newNode())
	features := filepath.Join(t.TempDir(), "features.d")
	m := metrics.New()
	p := New(Config{NodeName: "node-a", FeaturesDir: features, Resync: time.Minute}, c, testr.New(t), m)
	_, rs := startResyncing(t, p)
	want := FactsFor(twoDevices())
	file := filepath.Join(features, FeatureFileName)
	published, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}

	// Nothing changed: one read of the node, no patch, the file untouched.
	gets, pats, updates := verbs(c, "get"), verbs(c, "patch"), nodeUpdates(t, m)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if wrote, err := rs.resync(t); wrote || err != nil {
		t.Fatalf("resync with nothing changed: wrote %v, %v; want nothing written", wrote, err)
	}
	if verbs(c, "get") != gets+1 || verbs(c, "patch") != pats {
		t.Errorf("resync with nothing changed: %d gets and %d patches, want 1 and 0", verbs(c, "get")-gets, verbs(c, "patch")-pats)
	}
	if fi2, err := os.Stat(file); err != nil || !os.SameFile(fi, fi2) {
		t.Errorf("feature file rewritten though intact: %v", err)
	}
	// A check that wrote nothing is no update in the metrics.
	if got := nodeUpdates(t, m); got != updates {
		t.Errorf("resync with nothing changed counted %v node updates, want none", got-updates)
	}

	tests := []struct {
		name string
		// spoil edits the node n (updated when it returns true) or the file.
		spoil func(n *corev1.Node) bool
		// wantPatch: the node needs one patch (the file is rewritten alone).
		wantPatch bool
	}{
		{"a label removed", func(n *corev1.Node) bool { delete(n.Labels, nodefacts.LabelPresent); return true }, true},
		{"a label edited", func(n *corev1.Node) bool { n.Labels[nodefacts.LabelDeviceCount] = "7"; return true }, true},
		{"an annotation removed", func(n *corev1.Node) bool { delete(n.Annotations, nodefacts.AnnotationMaxJFSDepth); return true }, true},
		{"an annotation edited", func(n *corev1.Node) bool { n.Annotations[nodefacts.AnnotationJettiesPerUnit] = "1"; return true }, true},
		{"all wiped (the Node registered afresh)", func(n *corev1.Node) bool {
			n.Labels, n.Annotations = map[string]string{"kubernetes.io/hostname": "node-a"}, nil
			return true
		}, true},
		{"the feature file removed", func(*corev1.Node) bool { must(t, os.Remove(file)); return false }, false},
		{"the feature file edited", func(*corev1.Node) bool { must(t, os.WriteFile(file, []byte("x=y\n"), 0o644)); return false }, false},
		{"the features directory removed", func(*corev1.Node) bool { must(t, os.RemoveAll(features)); return false }, false},
	}
	for _, tt := range tests {
		n := getNode(t, c)
		if tt.spoil(n) {
			if _, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		pats, updates := verbs(c, "patch"), nodeUpdates(t, m)
		if wrote, err := rs.resync(t); !wrote || err != nil {
			t.Fatalf("%s: resync wrote %v, %v; want the facts put back", tt.name, wrote, err)
		}
		if got := nodeUpdates(t, m); got != updates+1 {
			t.Errorf("%s: %v node updates counted, want 1", tt.name, got-updates)
		}
		wantPatches := 0
		if tt.wantPatch {
			wantPatches = 1
		}
		if got := verbs(c, "patch") - pats; got != wantPatches {
			t.Errorf("%s: %d patches, want %d", tt.name, got, wantPatches)
		}
		n = getNode(t, c)
		if !NodeCarries(n, want) {
			t.Errorf("%s: node after the resync: labels %v annotations %v", tt.name, n.Labels, n.Annotations)
		}
		if got, err := nodefacts.Parse(n.Annotations); err != nil || got != want {
			t.Errorf("%s: the operator reads %+v, %v; want %+v", tt.name, got, err, want)
		}
		if n.Labels["kubernetes.io/hostname"] != "node-a" {
			t.Errorf("%s: unrelated label lost: %v", tt.name, n.Labels)
		}
		if b, err := os.ReadFile(file); err != nil || string(b) != string(published) {
			t.Errorf("%s: feature file %q, %v; want it as published", tt.name, b, err)
		}
	}
}

// A resync that cannot read the node is retried with the backoff, which
// applies the facts whole.
func TestResyncFailureIsRetried(t *testing.T) {
	c := fake.NewClientset(newNode())
	var mu sync.Mutex
	failGet := false
	c.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failGet {
			failGet = false
			return true, nil, errors.New("apiserver unavailable")
		}
		return false, nil, nil
	})
	p := New(Config{NodeName: "node-a", Resync: time.Minute, RetryInitial: time.Millisecond}, c, testr.New(t), nil)
	r, rs := startResyncing(t, p)
	n := getNode(t, c)
	delete(n.Labels, nodefacts.LabelPresent)
	if _, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	failGet = true
	mu.Unlock()
	if _, err := rs.resync(t); err == nil || !strings.Contains(err.Error(), "apiserver unavailable") || !strings.Contains(err.Error(), "node-a") {
		t.Fatalf("resync = %v, want the read's error naming the node", err)
	}
	select {
	case f := <-r.applied:
		if f != FactsFor(twoDevices()) {
			t.Fatalf("retry applied %+v", f)
		}
	case err := <-r.errs:
		t.Fatalf("retry failed: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the failed resync was not retried")
	}
	if getNode(t, c).Labels[nodefacts.LabelPresent] != "true" {
		t.Error("label not put back by the retry")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNewDefaultsTheBackoff(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name              string
		initial, max      time.Duration
		wantInit, wantMax time.Duration
	}{
		{"unset", 0, 0, DefaultRetryInitial, DefaultRetryMax},
		{"negative initial", -ms, 0, DefaultRetryInitial, DefaultRetryMax},
		{"both set", 5 * ms, 10 * ms, 5 * ms, 10 * ms},
		{"max equal to initial", 5 * ms, 5 * ms, 5 * ms, 5 * ms},
		{"max below initial", 5 * ms, 2 * ms, 5 * ms, DefaultRetryMax},
		{"initial above the default max", 2 * DefaultRetryMax, 0, 2 * DefaultRetryMax, 2 * DefaultRetryMax},
	}
	if p := New(Config{}, nil, testr.New(t), nil); p.cfg.Resync != DefaultResync {
		t.Errorf("resync %v, want the default %v", p.cfg.Resync, DefaultResync)
	}
	for _, tt := range tests {
		p := New(Config{RetryInitial: tt.initial, RetryMax: tt.max}, nil, testr.New(t), nil)
		if p.cfg.RetryInitial != tt.wantInit || p.cfg.RetryMax != tt.wantMax {
			t.Errorf("%s: backoff %v..%v, want %v..%v", tt.name, p.cfg.RetryInitial, p.cfg.RetryMax, tt.wantInit, tt.wantMax)
		}
	}
}

func TestFeatureFileWriteFailureIsReported(t *testing.T) {
	dir := t.TempDir()
	// A directory where the feature file goes: the final rename fails.
	if err := os.MkdirAll(filepath.Join(dir, FeatureFileName, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := New(Config{FeaturesDir: dir}, nil, testr.New(t), nil)
	err := p.Apply(context.Background(), nodefacts.Facts{DeviceCount: 1, JettiesPerUnit: 16})
	if err == nil || !strings.Contains(err.Error(), "NFD feature file") {
		t.Fatalf("Apply = %v, want the feature file's write error", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".urma-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

func TestDisabledRunReturnsOnCancel(t *testing.T) {
	p := New(Config{}, nil, testr.New(t), nil)
	if p.Enabled() {
		t.Fatal("enabled without node name or features dir")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Run(ctx, inventory.New(16)); err != nil {
		t.Fatal(err)
	}
}

// nodeUpdates is the successful node updates m counted.
func nodeUpdates(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if !strings.HasSuffix(f.GetName(), "node_updates_total") {
			continue
		}
		for _, mm := range f.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "ok" {
					return mm.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
