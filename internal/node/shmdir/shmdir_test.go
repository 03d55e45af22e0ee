package shmdir_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/internal/node/shmdir"
)

func TestPrepare(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "shm")
	for range 2 { // idempotent
		if err := shmdir.Prepare(dir); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("mode %s, want drwxrwxrwt", fi.Mode())
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{file, filepath.Join(file, "shm")} {
		if err := shmdir.Prepare(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Fatalf("Prepare(%s) = %v, want an error naming it", bad, err)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		dir string
		ok  bool
	}{
		{"/var/run/urma-k8s/shm", true},
		{"/shm", true},
		{"/", false},                        // Prepare would open the host's root to every user
		{"/var/run/urma-k8s/shm/", false},   // a trailing slash
		{"/var/run//shm", false},            // "//"
		{"/var/run/./shm", false},           // "."
		{"/var/run/urma-k8s/../shm", false}, // ".."
		{"var/run/shm", false},              // relative
		{"", false},
	} {
		err := shmdir.Check(tc.dir)
		if tc.ok != (err == nil) {
			t.Errorf("Check(%q) = %v, want ok %v", tc.dir, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "clean absolute path") {
			t.Errorf("Check(%q) = %v: the error does not say what is wanted", tc.dir, err)
		}
	}
}

// TestPrepareRefusesADirectoryOfOtherUse: Prepare makes the directory
// world-writable, so a mistyped --shm-dir (/etc, /var/run, /usr/lib64)
// must not turn a system directory into one any pod user can create files
// in. Only a directory that holds nothing but the shm fabric's sockets is
// opened; one already world-writable and sticky is left as it is.
func TestPrepareRefusesADirectoryOfOtherUse(t *testing.T) {
	withFile := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(withFile, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withFile, "passwd"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := shmdir.Prepare(withFile)
	if err == nil || !strings.Contains(err.Error(), "passwd") {
		t.Fatalf("Prepare of a directory holding a regular file = %v, want an error naming the file", err)
	}
	if fi, _ := os.Stat(withFile); fi.Mode().Perm() != 0o755 || fi.Mode()&os.ModeSticky != 0 {
		t.Fatalf("mode %s after a refusal, want it untouched (drwxr-xr-x)", fi.Mode())
	}

	withSubdir := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(filepath.Join(withSubdir, "lock"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := shmdir.Prepare(withSubdir); err == nil {
		t.Fatal("Prepare of a directory holding a subdirectory succeeded, want a refusal")
	}

	// A plugin restart finds the sockets of running pods: fine.
	sockets := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(sockets, 0o755); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", filepath.Join(sockets, "00ff.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if err := shmdir.Prepare(sockets); err != nil {
		t.Fatalf("Prepare of a directory holding only sockets = %v", err)
	}

	// Already open to all (a /tmp-like directory): nothing to change.
	open := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(open, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := shmdir.Prepare(open); err != nil {
		t.Fatalf("Prepare of an already world-writable sticky directory = %v", err)
	}
}
