package libinject

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// hostTree makes a host's filesystem under a temporary root: files (a
// name ending in "/" is a directory; "a -> b" a symbolic link).
func hostTree(t *testing.T, entries ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, e := range entries {
		name, target, link := strings.Cut(e, " -> ")
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case link:
			err = os.Symlink(target, p)
		case strings.HasSuffix(name, "/"):
			err = os.MkdirAll(p, 0o755)
		default:
			err = os.WriteFile(p, []byte("lib "+name), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestHost(t *testing.T) {
	umdk := []string{
		"usr/lib64/liburma.so.0 -> liburma.so.0.0.1", "usr/lib64/liburma.so.0.0.1",
		"usr/lib64/liburma_common.so.0 -> /usr/lib64/liburma_common.so.0.0.1", "usr/lib64/liburma_common.so.0.0.1",
		"usr/lib64/libummu.so.1 -> libummu.so.1.0.0", "usr/lib64/libummu.so.1.0.0",
		"usr/lib64/libc.so.6", "usr/lib64/urma/liburma-udma.so",
	}
	lib := func(n string) Mount {
		return Mount{HostPath: "/usr/lib64/" + n, ContainerPath: ContainerLibDir + "/" + n}
	}
	providers := Mount{HostPath: "/usr/lib64/urma", ContainerPath: "/usr/lib64/urma"}
	tests := []struct {
		name    string
		tree    []string
		cfg     func(*Config)
		want    []Mount
		env     []string
		wantErr string
	}{
		{name: "UMDK's runtime package", tree: umdk,
			want: []Mount{lib("libummu.so.1"), lib("libummu.so.1.0.0"), lib("liburma.so.0"), lib("liburma.so.0.0.1"), lib("liburma_common.so.0"), lib("liburma_common.so.0.0.1"), providers},
			env:  []string{"LD_LIBRARY_PATH=" + ContainerLibDir}},
		{name: "mounts only", tree: umdk, cfg: func(c *Config) { c.SetLibraryPath = false },
			want: []Mount{lib("libummu.so.1"), lib("libummu.so.1.0.0"), lib("liburma.so.0"), lib("liburma.so.0.0.1"), lib("liburma_common.so.0"), lib("liburma_common.so.0.0.1"), providers}},
		{name: "no liburma", tree: []string{"usr/lib64/libc.so.6", "usr/lib64/urma/"}, wantErr: "has no liburma.so.0"},
		{name: "no library directory", tree: []string{"etc/"}, wantErr: "no liburma on the host"},
		{name: "liburma but no providers", tree: []string{"usr/lib64/liburma.so.0"}, wantErr: "provider directory /usr/lib64/urma"},
		{name: "a dangling liburma.so.0", tree: []string{"usr/lib64/liburma.so.0 -> gone", "usr/lib64/urma/"}, wantErr: "has no liburma.so.0"},
		{name: "a directory named like a library is no library",
			tree: []string{"usr/lib64/liburma.so.0", "usr/lib64/liburma.so.d/", "usr/lib64/urma/"},
			want: []Mount{lib("liburma.so.0"), providers}, env: []string{"LD_LIBRARY_PATH=" + ContainerLibDir}},
		{name: "other paths", tree: []string{"opt/umdk/lib/liburma.so.0", "opt/umdk/lib/providers/"},
			cfg: func(c *Config) { c.HostLibDir, c.HostProviderDir = "/opt/umdk/lib", "/opt/umdk/lib/providers" },
			want: []Mount{{HostPath: "/opt/umdk/lib/liburma.so.0", ContainerPath: ContainerLibDir + "/liburma.so.0"},
				{HostPath: "/opt/umdk/lib/providers", ContainerPath: "/opt/umdk/lib/providers"}},
			env: []string{"LD_LIBRARY_PATH=" + ContainerLibDir}},
		{name: "off", tree: umdk, cfg: func(c *Config) { c.Enabled = false }, wantErr: "off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.HostRoot = hostTree(t, tt.tree...)
			if tt.cfg != nil {
				tt.cfg(&c)
			}
			got, err := Host(c)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !got.Empty() {
					t.Fatalf("Host = %+v, %v; want nothing and an error naming %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Mounts, tt.want) || !reflect.DeepEqual(got.Env, tt.env) {
				t.Errorf("Host = %+v\nwant mounts %+v env %v", got, tt.want, tt.env)
			}
		})
	}
}

func TestSoftPublishesTheLibrary(t *testing.T) {
	dir := t.TempDir()
	c := Default()
	c.SoftLib, c.SoftHostDir = filepath.Join(dir, "image", "liburma.so.0"), filepath.Join(dir, "host", "liburma")
	if _, err := Soft(c); err == nil {
		t.Fatal("Soft without the library in the image succeeded")
	}
	if err := os.MkdirAll(filepath.Dir(c.SoftLib), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, content := range []string{"v1", "v1", "v2"} {
		if err := os.WriteFile(c.SoftLib, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		got, err := Soft(c)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(c.SoftHostDir, "liburma.so.0")
		want := Injection{Mounts: []Mount{{HostPath: dst, ContainerPath: ContainerLibDir + "/liburma.so.0"}}, Env: []string{"LD_LIBRARY_PATH=" + ContainerLibDir}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("round %d: Soft = %+v, want %+v", i, got, want)
		}
		b, err := os.ReadFile(dst)
		if err != nil || string(b) != content {
			t.Errorf("round %d: the host copy holds %q (%v), want %q", i, b, err, content)
		}
		if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("round %d: the host copy's mode %v (%v), want 0644", i, fi.Mode(), err)
		}
		entries, _ := os.ReadDir(c.SoftHostDir)
		if len(entries) != 1 {
			t.Errorf("round %d: the host directory holds %d files, want the library only", i, len(entries))
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"off ignores paths", func(c *Config) { c.Enabled, c.HostLibDir = false, "lib" }, ""},
		{"relative library directory", func(c *Config) { c.HostLibDir = "usr/lib64" }, "host library directory"},
		{"unclean provider directory", func(c *Config) { c.HostProviderDir = "/usr/lib64/urma/" }, "host provider directory"},
		{"relative host root", func(c *Config) { c.HostRoot = "host" }, "host root"},
		{"software library into /", func(c *Config) { c.SoftHostDir = "/" }, "software liburma"},
	} {
		c := Default()
		tc.cfg(&c)
		err := c.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

func TestSetFor(t *testing.T) {
	host := Injection{Mounts: []Mount{{HostPath: "/h", ContainerPath: "/c"}}}
	soft := Injection{Mounts: []Mount{{HostPath: "/s", ContainerPath: "/c"}}}
	s := Set{Host: host, Soft: soft}
	if !reflect.DeepEqual(s.For(true), host) || !reflect.DeepEqual(s.For(false), soft) {
		t.Errorf("For picks the wrong injection: %+v %+v", s.For(true), s.For(false))
	}
}
