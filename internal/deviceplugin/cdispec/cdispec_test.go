package cdispec

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
)

func devRoot(t *testing.T, nodes ...string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "dev")
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

func snap(root string) *inventory.Snapshot {
	soft := inventory.SoftDevices(inventory.Config{Budget: budget.Default(), SoftDevices: 1, SoftJetties: 32})[0]
	return &inventory.Snapshot{
		UMMUNode: filepath.Join(root, "ummu/tid"),
		Devices: []inventory.Device{
			soft,
			{Name: "udma0", Healthy: true, DevNode: filepath.Join(root, "uburma/udma0")},
			{Name: "udma1", Healthy: true, DevNode: filepath.Join(root, "uburma/udma1")},
			{Name: "udma2", Reason: "device node missing"},
		},
	}
}

func TestBuild(t *testing.T) {
	root := devRoot(t, "ummu/tid", "extra0")
	w, err := New(Config{Dir: t.TempDir(), Kind: DefaultKind, DevRoot: root, ExtraDevNodes: []string{"/dev/extra0", "/dev/missing"}}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	spec, ok := w.Build(snap(root))
	if !ok {
		t.Fatal("Build found nothing to inject")
	}
	var names []string
	for _, d := range spec.Devices {
		names = append(names, d.Name)
		if len(d.ContainerEdits.DeviceNodes) != 1 || d.ContainerEdits.DeviceNodes[0].Path != "/dev/uburma/"+d.Name || d.ContainerEdits.DeviceNodes[0].HostPath != "/dev/uburma/"+d.Name {
			t.Errorf("device %s edits %+v", d.Name, d.ContainerEdits.DeviceNodes)
		}
	}
	if !slices.Equal(names, []string{"udma0", "udma1"}) {
		t.Errorf("devices %v, want udma0 udma1 (no software device, none without a node)", names)
	}
	var common []string
	for _, n := range spec.ContainerEdits.DeviceNodes {
		common = append(common, n.Path)
	}
	if !slices.Equal(common, []string{"/dev/ummu/tid", "/dev/extra0"}) {
		t.Errorf("spec-wide nodes %v", common)
	}
	if spec.Kind != DefaultKind || spec.Version == "" {
		t.Errorf("kind %q version %q", spec.Kind, spec.Version)
	}
	// The spec declares the lowest CDI version that can express it, not the
	// library's newest, so runtimes with an older CDI parser accept it.
	if least, err := specs.MinimumRequiredVersion(spec); err != nil || spec.Version != least {
		t.Errorf("spec version %q, want the minimum required %q (%v)", spec.Version, least, err)
	}
	if w.Name("udma0") != "urma.openeuler.org/jetty=udma0" {
		t.Errorf("Name = %q", w.Name("udma0"))
	}
}

func TestSyncWritesAReadableSpecAndRemovesIt(t *testing.T) {
	root := devRoot(t, "ummu/tid")
	dir := t.TempDir()
	w, err := New(Config{Dir: dir, Kind: DefaultKind, DevRoot: root}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(snap(root)); err != nil {
		t.Fatal(err)
	}
	reader, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("the runtime's CDI cache rejects our spec: %v", err)
	}
	if got := reader.ListDevices(); !slices.Equal(got, []string{"urma.openeuler.org/jetty=udma0", "urma.openeuler.org/jetty=udma1"}) {
		t.Fatalf("CDI devices %v", got)
	}
	if d := reader.GetDevice("urma.openeuler.org/jetty=udma1"); d == nil || d.ContainerEdits.DeviceNodes[0].Path != "/dev/uburma/udma1" {
		t.Fatalf("udma1: %+v", d)
	}

	// udma1 goes away: the spec follows.
	s := snap(root)
	s.Devices = s.Devices[:2]
	if err := w.Sync(s); err != nil {
		t.Fatal(err)
	}
	if err := reader.Refresh(); err != nil {
		t.Fatal(err)
	}
	if got := reader.ListDevices(); !slices.Equal(got, []string{"urma.openeuler.org/jetty=udma0"}) {
		t.Fatalf("after udma1 left: %v", got)
	}

	// Only software devices: nothing to inject, the file goes.
	if err := w.Sync(&inventory.Snapshot{Devices: s.Devices[:1]}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("spec dir not empty: %v", entries)
	}
}

// A plugin that starts on a node without hardware devices removes the spec
// a previous run left: it names device nodes that are gone. It removes it
// once, not at every scan.
func TestSyncRemovesASpecLeftByAPreviousRun(t *testing.T) {
	root := devRoot(t, "ummu/tid")
	dir := t.TempDir()
	before, err := New(Config{Dir: dir, Kind: DefaultKind, DevRoot: root}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := before.Sync(snap(root)); err != nil {
		t.Fatal(err)
	}
	path := before.path()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the first run wrote no spec: %v", err)
	}

	// The next run finds only a software device.
	w, err := New(Config{Dir: dir, Kind: DefaultKind, DevRoot: root}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	noHardware := &inventory.Snapshot{Devices: snap(root).Devices[:1]}
	if err := w.Sync(noHardware); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the previous run's spec is still there (%v)", err)
	}
	// Removed once: a file put there later by someone else is left alone.
	if err := os.WriteFile(path, []byte("# someone else's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(noHardware); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a later sync with nothing to inject touched the directory again: %v", err)
	}
}

// The spec file is what makes the CDI names Allocate answers with
// resolvable. Deleted while the plugin runs (the CDI directory cleaned), it
// must be written again on the next sync even though the devices did not
// change; otherwise every new container fails with "unresolvable CDI
// devices" while the devices stay advertised. A spec still in place is not
// rewritten.
func TestSyncRewritesADeletedSpec(t *testing.T) {
	const marker = "# left by the test\n"
	tests := []struct {
		name      string
		tamper    func(t *testing.T, dir, file string)
		rewritten bool
	}{
		{"file deleted", func(t *testing.T, _, file string) {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"directory deleted", func(t *testing.T, dir, _ string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"untouched", func(*testing.T, string, string) {}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := devRoot(t, "ummu/tid")
			dir := filepath.Join(t.TempDir(), "cdi")
			w, err := New(Config{Dir: dir, Kind: DefaultKind, DevRoot: root}, testr.New(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Sync(snap(root)); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, "urma.openeuler.org-jetty.yaml")
			// A marker shows whether the next Sync rewrote the file.
			f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString(marker); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			tc.tamper(t, dir, file)

			if err := w.Sync(snap(root)); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("the spec is not there after Sync: %v", err)
			}
			if rewritten := !strings.Contains(string(data), marker); rewritten != tc.rewritten {
				t.Fatalf("spec rewritten %v, want %v", rewritten, tc.rewritten)
			}
			reader, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
			if err != nil {
				t.Fatalf("the runtime's CDI cache rejects the spec: %v", err)
			}
			if got := reader.ListDevices(); !slices.Equal(got, []string{"urma.openeuler.org/jetty=udma0", "urma.openeuler.org/jetty=udma1"}) {
				t.Fatalf("CDI devices %v", got)
			}
		})
	}
}

// runWriter runs w.Run from discovered to a new advertised inventory until
// the test ends.
func runWriter(t *testing.T, w *Writer, discovered *inventory.Inventory, retry time.Duration) *inventory.Inventory {
	t.Helper()
	advertised := inventory.New(16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, discovered, advertised, retry) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return advertised
}

// waitAdvertised follows an inventory until cond holds.
func waitAdvertised(t *testing.T, inv *inventory.Inventory, what string, cond func(*inventory.Snapshot) bool) *inventory.Snapshot {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		s, changed := inv.Current()
		if cond(s) {
			return s
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("timed out waiting for %s; advertised %+v", what, s)
		}
	}
}

func TestRunFollowsInventory(t *testing.T) {
	root := devRoot(t)
	dir := t.TempDir()
	w, err := New(Config{Dir: dir, Kind: "example.com/urma", DevRoot: root}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	discovered := inventory.New(16)
	advertised := runWriter(t, w, discovered, time.Hour)
	discovered.Publish(inventory.Snapshot{Scanned: true, Devices: []inventory.Device{{Name: "udma7", Healthy: true, DevNode: filepath.Join(root, "uburma/udma7")}}})
	waitAdvertised(t, advertised, "udma7 advertised", func(s *inventory.Snapshot) bool { _, ok := s.Lookup("udma7"); return ok })
	b, err := os.ReadFile(filepath.Join(dir, "example.com-urma.yaml"))
	if err != nil {
		t.Fatalf("udma7 advertised before its CDI spec was written: %v", err)
	}
	if spec, err := cdi.ParseSpec(b); err != nil || spec.Devices[0].Name != "udma7" {
		t.Fatalf("spec %+v, %v", spec, err)
	}
}

func TestRunHoldsBackDevicesUntilTheirSpecIsWritten(t *testing.T) {
	root := devRoot(t)
	// The spec directory cannot be created while a file stands in its way.
	blocker := filepath.Join(t.TempDir(), "run-cdi")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(blocker, "cdi")
	w, err := New(Config{Dir: dir, Kind: DefaultKind, DevRoot: root}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	discovered := inventory.New(16)
	advertised := runWriter(t, w, discovered, 10*time.Millisecond)
	soft := inventory.SoftDevices(inventory.Config{Budget: budget.Default(), SoftDevices: 1, SoftJetties: 32})[0]
	discovered.Publish(inventory.Snapshot{Scanned: true, Devices: []inventory.Device{
		soft,
		{Name: "udma0", Healthy: true, DevNode: filepath.Join(root, "uburma/udma0")},
		{Name: "udma1", Reason: "device node missing"},
	}})
	s := waitAdvertised(t, advertised, "the first scan's covered part", func(s *inventory.Snapshot) bool { return s.Scanned })
	if _, ok := s.Lookup("udma0"); ok {
		t.Fatal("udma0 advertised although its CDI spec could not be written")
	}
	for _, name := range []string{soft.Name, "udma1"} {
		if _, ok := s.Lookup(name); !ok {
			t.Errorf("%s needs no spec but was held back: %+v", name, s.Devices)
		}
	}

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	waitAdvertised(t, advertised, "udma0 once a retry wrote its spec", func(s *inventory.Snapshot) bool { _, ok := s.Lookup("udma0"); return ok })
	if _, err := os.Stat(filepath.Join(dir, "urma.openeuler.org-jetty.yaml")); err != nil {
		t.Fatalf("udma0 advertised without a spec on disk: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		c  Config
		ok bool
	}{
		{Config{Dir: "/var/run/cdi", Kind: DefaultKind}, true},
		{Config{Dir: "", Kind: DefaultKind}, false},
		{Config{Dir: "/x", Kind: "jetty"}, false},
		{Config{Dir: "/x", Kind: "urma.openeuler.org/"}, false},
		{Config{Dir: "/x", Kind: "bad vendor/jetty"}, false},
	} {
		if err := tc.c.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.c, err, tc.ok)
		}
	}
}

// With the host's liburma found, every hardware container gets it through
// the spec: read-only bind mounts, and LD_LIBRARY_PATH over the image's
// and the pod's, as a container runtime applies the spec.
func TestSpecInjectsTheHostsLiburma(t *testing.T) {
	root := devRoot(t, "ummu/tid")
	dir := t.TempDir()
	libs := libinject.Injection{
		Mounts: []libinject.Mount{{HostPath: "/usr/lib64/liburma.so.0", ContainerPath: libinject.ContainerLibDir + "/liburma.so.0"},
			{HostPath: "/usr/lib64/urma", ContainerPath: "/usr/lib64/urma"}},
		Env: []string{"LD_LIBRARY_PATH=" + libinject.ContainerLibDir},
	}
	w, err := New(Config{Dir: dir, Kind: DefaultKind, DevRoot: root, Libs: libs}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(snap(root)); err != nil {
		t.Fatal(err)
	}
	reader, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("the runtime's CDI cache rejects our spec: %v", err)
	}
	dev := reader.GetDevice("urma.openeuler.org/jetty=udma1")
	if dev == nil {
		t.Fatal("udma1 is not in the spec")
	}
	// The spec-wide edits as the runtime applies them (its device nodes
	// left out: this machine has no /dev/ummu/tid to stat).
	read := dev.GetSpec().ContainerEdits
	container := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin", "LD_LIBRARY_PATH=/opt/app/lib"}}}
	edits := &cdi.ContainerEdits{ContainerEdits: &specs.ContainerEdits{Mounts: read.Mounts, Env: read.Env}}
	if err := edits.Apply(container); err != nil {
		t.Fatal(err)
	}
	var mounts []libinject.Mount
	for _, m := range container.Mounts {
		if !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev") {
			t.Errorf("mount %+v: want ro, nosuid, nodev", m)
		}
		mounts = append(mounts, libinject.Mount{HostPath: m.Source, ContainerPath: m.Destination})
	}
	slices.SortFunc(mounts, func(a, b libinject.Mount) int { return strings.Compare(a.HostPath, b.HostPath) })
	if !slices.Equal(mounts, libs.Mounts) {
		t.Errorf("container mounts %v, want %v", mounts, libs.Mounts)
	}
	if !slices.Contains(container.Process.Env, "LD_LIBRARY_PATH="+libinject.ContainerLibDir) || slices.Contains(container.Process.Env, "LD_LIBRARY_PATH=/opt/app/lib") {
		t.Errorf("container env %v: want LD_LIBRARY_PATH=%s in place of the image's", container.Process.Env, libinject.ContainerLibDir)
	}
}
