package liburma_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// built is what TestMain builds once for every test: the library and the C
// programs linked against it.
var built struct {
	lib      string // liburma.so.0
	libDir   string
	programs string // directory of the C programs
}

// TestMain builds liburma.so.0 with hack/build-liburma-soft.sh, once per
// run (or takes the one $URMA_TEST_LIBURMA_SOFT names, which `make test`
// built), and the C programs in testdata against it, as a C program links
// liburma: -lurma, found through the run path.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "liburma-soft-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	built.lib = os.Getenv("URMA_TEST_LIBURMA_SOFT")
	if built.lib == "" {
		built.lib = filepath.Join(tmp, "lib", "liburma.so.0")
		cmd := exec.Command(filepath.Join(root, "hack", "build-liburma-soft.sh"), built.lib)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build liburma.so.0: %v\n%s", err, out)
			return 1
		}
	}
	if built.lib, err = filepath.Abs(built.lib); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	built.libDir = filepath.Dir(built.lib)
	built.programs = filepath.Join(tmp, "bin")
	if err := os.Mkdir(built.programs, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, p := range []struct {
		name  string
		flags []string
	}{
		{"brpcflow", []string{"-lurma"}},
		{"sigpipe", []string{"-lurma"}},
		{"sigpipe-dlopen", []string{"-DDLOPEN", "-ldl"}},
		{"refusals", []string{"-lurma"}},
	} {
		src := p.name
		if src == "sigpipe-dlopen" {
			src = "sigpipe"
		}
		if err := compile(root, src, p.name, p.flags); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// compile builds testdata/src.c into the programs directory as name,
// against urma_compat.h and the library. -lurma finds liburma.so.0
// through a liburma.so link, as a development package provides it.
func compile(root, src, name string, flags []string) error {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	link := filepath.Join(built.programs, "liburma.so")
	if _, err := os.Lstat(link); err != nil {
		if err := os.Symlink(built.lib, link); err != nil {
			return err
		}
	}
	args := []string{"-O2", "-Wall", "-Wextra", "-Werror", "-o", filepath.Join(built.programs, name),
		filepath.Join(root, "test", "liburma", "testdata", src+".c"),
		"-I", filepath.Join(root, "pkg", "urma", "liburma"),
		"-L", built.programs, "-Wl,-rpath," + built.libDir}
	args = append(args, flags...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("compile %s with %s: %w\n%s", src, cc, err, out)
	}
	return nil
}

const modulePath = "github.com/openeuler/urma-k8s"

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the test directory", modulePath)
		}
		dir = parent
	}
}

// program is the path of a C program TestMain built.
func program(name string) string { return filepath.Join(built.programs, name) }
