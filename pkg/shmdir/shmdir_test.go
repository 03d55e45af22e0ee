package shmdir_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/shmdir"
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
