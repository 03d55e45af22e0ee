package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseOptions(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		check   func(t *testing.T, o options)
		wantErr string
	}{
		{
			name: "defaults under the root",
			args: []string{"-root", root},
			check: func(t *testing.T, o options) {
				if o.binDir != filepath.Join(root, "bin") || o.assetsDir != filepath.Join(root, "bin", "k8s") ||
					o.crdDir != filepath.Join(root, "config", "crd", "bases") {
					t.Fatalf("paths %+v", o)
				}
				if o.duration != 3*time.Second || o.size != 4096 || o.concurrency != 4 || o.keep {
					t.Fatalf("defaults %+v", o)
				}
			},
		},
		{
			name: "explicit values",
			args: []string{"-root", root, "-bin-dir", "/b", "-assets", "/a", "-crds", "/c", "-duration", "1s", "-size", "64", "-concurrency", "2", "-keep"},
			check: func(t *testing.T, o options) {
				if o.binDir != "/b" || o.assetsDir != "/a" || o.crdDir != "/c" || o.duration != time.Second || o.size != 64 || o.concurrency != 2 || !o.keep {
					t.Fatalf("options %+v", o)
				}
			},
		},
		{name: "zero duration", args: []string{"-root", root, "-duration", "0s"}, wantErr: "must be positive"},
		{name: "negative size", args: []string{"-root", root, "-size", "-1"}, wantErr: "must be positive"},
		{name: "stray argument", args: []string{"-root", root, "now"}, wantErr: "unexpected arguments"},
		{name: "unknown flag", args: []string{"-frobnicate"}, wantErr: "frobnicate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			o, err := parseOptions(tc.args, &stderr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}
}

// TestRunFailsClearly runs the whole program against a root with nothing
// built: it must fail at the first step, say which and why, and leave no
// temporary directory behind.
func TestRunFailsClearly(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var stdout, stderr bytes.Buffer
	code := run([]string{"-root", root}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit code %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{`FAILED at step "fake UB node`, "urma-device-plugin", "hack/demo.sh"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}

	if code := run([]string{"-bogus"}, &stdout, &stderr); code != 2 {
		t.Fatalf("a usage error exits %d, want 2", code)
	}
}
