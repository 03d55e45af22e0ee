package claimspec_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
)

func writer(t *testing.T, shm string) (*claimspec.Writer, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cdi")
	w, err := claimspec.New(claimspec.Config{Dir: dir, Kind: claimspec.DefaultKind, ShmDir: shm})
	if err != nil {
		t.Fatal(err)
	}
	return w, dir
}

// inject reads the directory with CDI's own cache and injects the devices
// into an empty OCI spec, as a container runtime would.
func inject(t *testing.T, dir string, ids ...string) *oci.Spec {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache over %s: %v", dir, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI spec errors: %v", errs)
	}
	return injectInto(t, dir, &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}, ids...)
}

// injectInto is inject into a given container spec.
func injectInto(t *testing.T, dir string, spec *oci.Spec, ids ...string) *oci.Spec {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache over %s: %v", dir, err)
	}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("injecting %v: unresolved %v: %v", ids, unresolved, err)
	}
	return spec
}

func TestSpecForOneDevice(t *testing.T) {
	shm := filepath.Join(t.TempDir(), "shm")
	w, dir := writer(t, shm)
	// /dev/null stands in for /dev/uburma/udma0: CDI stats device nodes.
	ids, err := w.Write("uid-1", []claimspec.Device{{
		Name: "udma0", URMADevice: "udma0", EID: "::ffff:10.0.0.1", Jetties: 100, DevNodes: []string{"/dev/null"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "urma.openeuler.org/claim=uid-1-udma0"; len(ids) != 1 || ids[0] != want {
		t.Fatalf("CDI ids %v, want [%s]", ids, want)
	}
	spec := inject(t, dir, ids...)
	for _, want := range []string{"URMA_DEVICE=udma0", "URMA_EID=::ffff:10.0.0.1", "URMA_JETTY_BUDGET=100", "URMA_SHM_DIR=" + shm} {
		if !slices.Contains(spec.Process.Env, want) {
			t.Errorf("env %v lacks %s", spec.Process.Env, want)
		}
	}
	for _, unwanted := range []string{"URMA_DEVICES=", "URMA_PROVIDER="} {
		if slices.ContainsFunc(spec.Process.Env, func(e string) bool { return strings.HasPrefix(e, unwanted) }) {
			t.Errorf("env %v has %s for one hardware device", spec.Process.Env, unwanted)
		}
	}
	if len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Path != "/dev/null" {
		t.Errorf("devices %+v, want the claim's device node", spec.Linux.Devices)
	}
	if len(spec.Mounts) != 1 || spec.Mounts[0].Source != shm || spec.Mounts[0].Destination != shm {
		t.Errorf("mounts %+v, want the shm directory", spec.Mounts)
	}
	if !w.Exists("uid-1") {
		t.Error("Exists is false after Write")
	}
}

func TestSpecForSeveralDevices(t *testing.T) {
	w, dir := writer(t, "")
	devs := []claimspec.Device{
		{Name: "udma0", URMADevice: "udma0", EID: "::1", Jetties: 16},
		{Name: "udma1", URMADevice: "udma1", EID: "::2", Jetties: 16},
		{Name: "udma1", URMADevice: "udma1", EID: "::2", Jetties: 16},
	}
	// Two shares of udma1 in one claim need distinct CDI names: the DRA
	// name of a share is unique per (request, device), so use two names.
	devs[2].Name = "udma1-b"
	ids, err := w.Write("uid-2", devs)
	if err != nil {
		t.Fatal(err)
	}
	spec := inject(t, dir, ids[0])
	for _, want := range []string{"URMA_DEVICE=udma1", "URMA_JETTY_BUDGET=32", "URMA_EID=::2", "URMA_DEVICES=udma1:32,udma0:16"} {
		if !slices.Contains(spec.Process.Env, want) {
			t.Errorf("env %v lacks %s", spec.Process.Env, want)
		}
	}
	if slices.ContainsFunc(spec.Process.Env, func(e string) bool { return strings.HasPrefix(e, "URMA_SHM_DIR=") }) || len(spec.Mounts) != 0 {
		t.Errorf("no shm directory configured, yet env %v mounts %v", spec.Process.Env, spec.Mounts)
	}
}

func TestSoftwareDevice(t *testing.T) {
	shm := filepath.Join(t.TempDir(), "shm-x")
	w, dir := writer(t, shm)
	ids, err := w.Write("uid-3", []claimspec.Device{{Name: "soft0", URMADevice: "soft0", Jetties: 8, Software: true}})
	if err != nil {
		t.Fatal(err)
	}
	spec := inject(t, dir, ids...)
	for _, want := range []string{"URMA_DEVICE=soft0", "URMA_PROVIDER=soft", "URMA_JETTY_BUDGET=8", "URMA_SHM_DIR=" + shm} {
		if !slices.Contains(spec.Process.Env, want) {
			t.Errorf("env %v lacks %s", spec.Process.Env, want)
		}
	}
	if slices.ContainsFunc(spec.Process.Env, func(e string) bool { return strings.HasPrefix(e, "URMA_EID=") }) || len(spec.Linux.Devices) != 0 {
		t.Errorf("software device got an EID or device nodes: %v %v", spec.Process.Env, spec.Linux.Devices)
	}
}

// Write makes sure of the shm directory its spec mounts: removed or
// chmod'ed since the driver started, it is put back; what cannot be mended
// fails the write, naming the directory.
func TestWriteEnsuresTheShmDirectory(t *testing.T) {
	dev := []claimspec.Device{{Name: "soft0", URMADevice: "soft0", Jetties: 8, Software: true}}
	tests := []struct {
		name    string
		spoil   func(dir string) error
		wantErr string
	}{
		{"missing", func(string) error { return nil }, ""},
		{"mode changed", func(dir string) error {
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
			return os.Chmod(dir, 0o700)
		}, ""},
		{"a regular file in its place", func(dir string) error { return os.WriteFile(dir, nil, 0o644) }, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shm := filepath.Join(t.TempDir(), "shm")
			w, _ := writer(t, shm)
			if err := tt.spoil(shm); err != nil {
				t.Fatal(err)
			}
			_, err := w.Write("uid-5", dev)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), shm) || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "uid-5") {
					t.Fatalf("Write = %v, want an error naming the claim and %s and saying %q", err, shm, tt.wantErr)
				}
				if w.Exists("uid-5") {
					t.Error("a spec mounting an unusable directory was written")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(shm)
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
				t.Fatalf("shm directory after Write: %v, %v; want drwxrwxrwt", fi, err)
			}
		})
	}
}

func TestRemoveIsIdempotent(t *testing.T) {
	w, dir := writer(t, "")
	if _, err := w.Write("uid-4", []claimspec.Device{{Name: "soft0", URMADevice: "soft0", Jetties: 8, Software: true}}); err != nil {
		t.Fatal(err)
	}
	other, err := w.Write("uid-5", []claimspec.Device{{Name: "soft0", URMADevice: "soft0", Jetties: 8, Software: true}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := w.Remove("uid-4"); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	}
	if w.Exists("uid-4") {
		t.Fatal("spec still there after Remove")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("spec directory holds %d files, want only the other claim's", len(entries))
	}
	inject(t, dir, other...) // the other claim's spec is untouched
}

func TestWriteRejectsAnEmptyClaim(t *testing.T) {
	w, _ := writer(t, "")
	if _, err := w.Write("uid-6", nil); err == nil || !strings.Contains(err.Error(), "uid-6") {
		t.Fatalf("Write without devices = %v, want an error naming the claim", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []claimspec.Config{
		{Dir: "", Kind: claimspec.DefaultKind},
		{Dir: "/x", Kind: "no-class"},
		{Dir: "/x", Kind: "bad vendor/claim"},
		{Dir: "/x", Kind: claimspec.DefaultKind, ShmDir: "relative/shm"},
		{Dir: "/x", Kind: claimspec.DefaultKind, ShmDir: "/"}, // the driver would open the host's root to every user
		{Dir: "/x", Kind: claimspec.DefaultKind, ShmDir: "/var/run/urma-k8s/shm/"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: Validate = nil", c)
		}
	}
}

// ClaimUIDs finds the specs this writer wrote, and only those: other
// vendors' specs, other kinds', directories and names that only look alike
// are left out.
func TestClaimUIDs(t *testing.T) {
	w, dir := writer(t, "")
	for _, uid := range []string{"uid-2", "uid-1"} {
		if _, err := w.Write(uid, []claimspec.Device{{Name: "soft0", URMADevice: "soft0", Jetties: 16, Software: true}}); err != nil {
			t.Fatal(err)
		}
	}
	others := []string{
		"nvidia.com-gpu_uid-3.yaml",                  // another vendor
		"urma.openeuler.org-other_uid-4.yaml",        // another class
		"urma.openeuler.org-claim_uid-5.json",        // not what Write writes
		"urma.openeuler.org-claim_.yaml",             // no UID
		"x-urma.openeuler.org-claim_uid-6.yaml",      // only looks alike
		".urma.openeuler.org-claim_uid-7.yaml.tmp.1", // a writer's temporary file
	}
	for _, name := range others {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, w.FileName("uid-8")), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := w.ClaimUIDs()
	if err != nil || !slices.Equal(got, []string{"uid-1", "uid-2"}) {
		t.Fatalf("ClaimUIDs = %q, %v; want [uid-1 uid-2]", got, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if got, err := w.ClaimUIDs(); err != nil || len(got) != 0 {
		t.Fatalf("ClaimUIDs of a missing directory = %q, %v; want none", got, err)
	}
	if err := os.WriteFile(dir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ClaimUIDs(); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("ClaimUIDs with a file in the directory's place = %v, want an error naming it", err)
	}
}

// A claim's containers get a liburma for their C programs, as the runtime
// applies the spec: the host's with a UB device, the software one with
// software devices only, read-only, with LD_LIBRARY_PATH over the image's.
func TestSpecInjectsLiburma(t *testing.T) {
	host := libinject.Injection{
		Mounts: []libinject.Mount{{HostPath: "/usr/lib64/urma", ContainerPath: "/usr/lib64/urma"}},
		Env:    []string{"LD_LIBRARY_PATH=" + libinject.ContainerLibDir},
	}
	soft := libinject.Injection{
		Mounts: []libinject.Mount{{HostPath: "/var/lib/urma-k8s/liburma/liburma.so.0", ContainerPath: libinject.ContainerLibDir + "/liburma.so.0"}},
		Env:    []string{"LD_LIBRARY_PATH=" + libinject.ContainerLibDir},
	}
	hw := claimspec.Device{Name: "udma0", URMADevice: "udma0", EID: "::1", Jetties: 16, DevNodes: []string{"/dev/null"}}
	sw := claimspec.Device{Name: "soft0", URMADevice: "soft0", Jetties: 16, Software: true}
	for _, tc := range []struct {
		name string
		libs libinject.Set
		devs []claimspec.Device
		want []string // host paths mounted
	}{
		{"UB device: the host's", libinject.Set{Host: host, Soft: soft}, []claimspec.Device{hw}, []string{"/usr/lib64/urma"}},
		{"software device: urma-k8s's", libinject.Set{Host: host, Soft: soft}, []claimspec.Device{sw}, []string{"/var/lib/urma-k8s/liburma/liburma.so.0"}},
		{"both: the host's", libinject.Set{Host: host, Soft: soft}, []claimspec.Device{sw, hw}, []string{"/usr/lib64/urma"}},
		{"no host liburma", libinject.Set{Soft: soft}, []claimspec.Device{hw}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cdi")
			w, err := claimspec.New(claimspec.Config{Dir: dir, Kind: claimspec.DefaultKind, Libs: tc.libs})
			if err != nil {
				t.Fatal(err)
			}
			ids, err := w.Write("uid-9", tc.devs)
			if err != nil {
				t.Fatal(err)
			}
			// Over an image that sets LD_LIBRARY_PATH itself.
			spec := injectInto(t, dir, &oci.Spec{Process: &oci.Process{Env: []string{"LD_LIBRARY_PATH=/opt/app/lib"}}, Linux: &oci.Linux{}}, ids[0])
			if tc.want != nil && slices.Contains(spec.Process.Env, "LD_LIBRARY_PATH=/opt/app/lib") {
				t.Errorf("env %v keeps the image's LD_LIBRARY_PATH", spec.Process.Env)
			}
			var got []string
			for _, m := range spec.Mounts {
				if !slices.Contains(m.Options, "ro") {
					t.Errorf("mount %+v is not read-only", m)
				}
				got = append(got, m.Source)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("mounts %v, want %v", got, tc.want)
			}
			if set := slices.Contains(spec.Process.Env, "LD_LIBRARY_PATH="+libinject.ContainerLibDir); set != (tc.want != nil) {
				t.Errorf("env %v: LD_LIBRARY_PATH set %v, want %v", spec.Process.Env, set, tc.want != nil)
			}
		})
	}
}
