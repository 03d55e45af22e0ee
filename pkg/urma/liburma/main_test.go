//go:build linux && cgo

package liburma

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestMain builds the fake liburma (testdata/fakeurma) into a shared object
// and points URMA_LIBRARY at it, so every test here runs through cgo, the
// shim and liburma's ABI, on a machine without UB hardware.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fakeurma")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeurma:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	lib, err := buildFake(dir, "libfakeurma.so", filepath.Join("testdata", "fakeurma", "fakeurma.c"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeurma:", err)
		return 1
	}
	if err := os.Setenv(EnvLibrary, lib); err != nil {
		fmt.Fprintln(os.Stderr, "fakeurma:", err)
		return 1
	}
	return m.Run()
}

// buildFake compiles a fake liburma (src, with extra compiler flags) into
// dir/name with the C compiler cgo uses.
func buildFake(dir, name, src string, flags ...string) (string, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	out := filepath.Join(dir, name)
	args := append([]string{"-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread"}, flags...)
	cmd := exec.Command(cc, append(args, "-o", out, src)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the fake liburma %s with %s: %w\n%s", src, cc, err, b)
	}
	return out, nil
}
