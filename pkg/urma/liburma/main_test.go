//go:build linux && cgo

package liburma

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"unsafe"
)

// TestMain builds the fake liburma (testdata/fakeurma) into a shared object
// and points URMA_LIBRARY at it, so every test here runs through cgo, the
// shim and liburma's ABI, on a machine without UB hardware. With
// URMA_TEST_LIBURMA set, the tests run against that library instead
// (hack/test-liburma.sh: cmd/liburma-soft's liburma.so.0, in a process of
// their own), those that need the fake's test hooks skipped.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// libraryUnderTest is the liburma other than the fake the tests run
// against, "" for the fake.
var libraryUnderTest = os.Getenv("URMA_TEST_LIBURMA")

// requireFake skips a test that needs the fake liburma's test hooks (or
// builds a fake of its own) when the tests run against another library.
func requireFake(t testing.TB) {
	t.Helper()
	if libraryUnderTest != "" {
		t.Skipf("needs the fake liburma's test hooks; the tests run against %s", libraryUnderTest)
	}
}

func run(m *testing.M) int {
	if libraryUnderTest != "" {
		if err := os.Setenv(EnvLibrary, libraryUnderTest); err != nil {
			fmt.Fprintln(os.Stderr, "liburma under test:", err)
			return 1
		}
		return m.Run()
	}
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
	code := m.Run()
	if n, err := contextsLeftInFake(); err != nil {
		fmt.Fprintln(os.Stderr, "fakeurma:", err)
		return 1
	} else if n > 0 {
		// A test that breaks the fake (a failed delete, on purpose) runs
		// on a fake of its own (providerOfFake): what it leaves here would
		// be there for every later test.
		fmt.Fprintf(os.Stderr, "fakeurma: the tests left %d contexts undeleted in the shared fake\n", n)
		return 1
	}
	return code
}

// contextsLeftInFake is how many contexts the shared fake holds that
// nobody deleted.
func contextsLeftInFake() (int, error) {
	p, err := newProvider(Options{})
	if err != nil {
		return 0, err
	}
	var n int32
	err = p.lib.fakeHook("fakeurma_live_contexts", unsafe.Pointer(&n))
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	return int(n), err
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
