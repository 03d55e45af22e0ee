package sysfs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// TestHostileFiles puts things in attribute files that a real kernel never
// would. Each must become a Problem naming the file; none may hang, panic or
// read unbounded data.
func TestHostileFiles(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		make    func(t *testing.T, path string)
		problem string
		check   func(t *testing.T, d sysfs.Device)
	}{
		{
			name: "huge file",
			file: "max_jetty",
			make: func(t *testing.T, p string) {
				writeRaw(t, p, strings.Repeat("9", 1<<20))
			},
			problem: "max_jetty: larger than 4096 bytes",
		},
		{
			name: "exactly one page is fine",
			file: "max_jetty",
			make: func(t *testing.T, p string) {
				writeRaw(t, p, "1024"+strings.Repeat(" ", sysfs.MaxAttrSize-5)+"\n")
			},
			check: func(t *testing.T, d sysfs.Device) {
				if d.Caps.MaxJetty != 1024 {
					t.Errorf("MaxJetty = %d", d.Caps.MaxJetty)
				}
			},
		},
		{
			name: "named pipe (would block a plain read)",
			file: "max_jetty",
			make: func(t *testing.T, p string) {
				if err := syscall.Mkfifo(p, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			problem: "max_jetty: not a regular file but a named pipe",
		},
		{
			name: "link to a character device",
			file: "port0/state",
			make: func(t *testing.T, p string) {
				if err := os.Symlink("/dev/zero", p); err != nil {
					t.Fatal(err)
				}
			},
			problem: "port0/state: not a regular file but a device node",
			check: func(t *testing.T, d sysfs.Device) {
				if d.HasUsablePort() {
					t.Error("a port whose state cannot be read counts as usable")
				}
			},
		},
		{
			name: "symlink loop",
			file: "max_jfc",
			make: func(t *testing.T, p string) {
				if err := os.Symlink(filepath.Base(p), p); err != nil {
					t.Fatal(err)
				}
			},
			problem: "max_jfc: stat: too many levels of symbolic links",
		},
		{
			name: "dangling symlink reads as missing",
			file: "max_jfs",
			make: func(t *testing.T, p string) {
				if err := os.Symlink("nowhere", p); err != nil {
					t.Fatal(err)
				}
			},
			problem: "max_jfs: missing",
		},
		{
			name: "directory instead of a file",
			file: "max_jfr",
			make: func(t *testing.T, p string) {
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			problem: "max_jfr: not a regular file but a directory",
		},
		{
			name: "path through a file",
			file: "eids",
			make: func(t *testing.T, p string) {
				writeRaw(t, p, "x")
			},
			problem: "eids: not a directory but a regular file",
		},
		{
			name: "binary garbage is quoted, not dumped",
			file: "driver_name",
			make: func(t *testing.T, p string) {
				writeRaw(t, p, "\xff\xfe\x00\x1b[31m"+strings.Repeat("A", 3000))
			},
			problem: `driver_name: "\xff\xfe\x00\x1b[31mAAAA`,
			check: func(t *testing.T, d sysfs.Device) {
				for _, p := range d.Problems {
					if len(p) > 300 {
						t.Errorf("problem of %d bytes: %.80q...", len(p), p)
					}
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, sysfstest.DefaultDevice("udma0"))
			p := filepath.Join(tr.ClassPath("ubcore", "udma0"), tc.file)
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
			tc.make(t, p)
			d := discoverOne(t, tr, "udma0")
			if tc.problem == "" {
				wantNoProblems(t, d)
			} else {
				wantProblem(t, d, tc.problem)
			}
			if tc.check != nil {
				tc.check(t, d)
			}
		})
	}
}

func TestHostileClassEntries(t *testing.T) {
	tests := []struct {
		name    string
		entry   string
		make    func(t *testing.T, tr *sysfstest.Tree, path string)
		problem string
	}{
		{
			name:  "entry is a symlink loop",
			entry: "udma9",
			make: func(t *testing.T, tr *sysfstest.Tree, p string) {
				if err := os.Symlink("udma9", p); err != nil {
					t.Fatal(err)
				}
			},
			problem: "class entry: stat: too many levels of symbolic links",
		},
		{
			name:  "entry is a regular file",
			entry: "udma9",
			make: func(t *testing.T, tr *sysfstest.Tree, p string) {
				writeRaw(t, p, "x")
			},
			problem: "class entry: not a directory but a regular file",
		},
		{
			name:  "entry link dangles (device going away)",
			entry: "udma9",
			make: func(t *testing.T, tr *sysfstest.Tree, p string) {
				if err := os.Symlink(filepath.Join(tr.SysfsRoot, "devices", "gone"), p); err != nil {
					t.Fatal(err)
				}
			},
			problem: "class entry: stat: no such file or directory",
		},
		{
			name:  "name with a space",
			entry: "udma 9",
			make: func(t *testing.T, tr *sysfstest.Tree, p string) {
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			problem: `device name "udma 9": character ' ' is not a letter, digit, or one of _ . : -`,
		},
		{
			name:  "name with a newline",
			entry: "udma\n9",
			make: func(t *testing.T, tr *sysfstest.Tree, p string) {
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			problem: `device name "udma\n9"`,
		},
		{
			name:  "name too long",
			entry: strings.Repeat("u", 100),
			make: func(t *testing.T, tr *sysfstest.Tree, p string) {
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			// Quoted in the problem cut to 64 bytes.
			problem: `device name "` + strings.Repeat("u", 64) + `"...: longer than 63 bytes`,
		},
		{
			name:  "name one byte too long",
			entry: strings.Repeat("u", 64),
			make: func(t *testing.T, tr *sysfstest.Tree, p string) {
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			// 64 bytes are quoted whole.
			problem: `device name "` + strings.Repeat("u", 64) + `": longer than 63 bytes`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, sysfstest.DefaultDevice("udma0"))
			tc.make(t, tr, tr.ClassPath("ubcore", tc.entry))
			devs := discover(t, tr)
			if len(devs) != 2 {
				t.Fatalf("devices %q, want udma0 and the odd entry", names(devs))
			}
			good := discoverOne(t, tr, "udma0")
			wantNoProblems(t, good)
			if !good.Usable() {
				t.Fatalf("a bad neighbor made udma0 unusable: %s", good.Reason())
			}
			bad := discoverOne(t, tr, tc.entry)
			wantProblem(t, bad, tc.problem)
		})
	}
}

// The limits on names and on a class listing are inclusive: a 63-byte
// device name is the kernel's longest, and MaxClassEntries entries are read.
func TestLimitsAreInclusive(t *testing.T) {
	t.Run("63-byte device name", func(t *testing.T) {
		name := strings.Repeat("u", 63)
		tr := sysfstest.New(t)
		tr.Add(t, sysfstest.DefaultDevice(name))
		d := discoverOne(t, tr, name)
		wantNoProblems(t, d)
		if !d.Usable() {
			t.Fatalf("unusable: %s", d.Reason())
		}
	})
	t.Run("MaxClassEntries class entries", func(t *testing.T) {
		tr := sysfstest.New(t)
		tr.Add(t, sysfstest.DefaultDevice("udma0"))
		// Dot entries count towards the listing but are never read.
		for i := 1; i < sysfs.MaxClassEntries; i++ {
			writeRaw(t, tr.ClassPath("ubcore", fmt.Sprintf(".x%d", i)), "")
		}
		if devs := discover(t, tr); len(devs) != 1 || devs[0].Name != "udma0" {
			t.Fatalf("devices %q, want udma0", names(devs))
		}
	})
}

func TestManyPortDirectories(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	dir := tr.ClassPath("ubcore", "udma0")
	for i := 1; i < 400; i++ {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("port%d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := discoverOne(t, tr, "udma0")
	wantNoProblems(t, d)
	if len(d.Ports) != 1 {
		t.Fatalf("%d ports read, want port_count's 1", len(d.Ports))
	}
}

func writeRaw(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
