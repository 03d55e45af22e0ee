//go:build linux && cgo

package liburma

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The device plugin and the operator are static binaries (CGO_ENABLED=0,
// images/*.Dockerfile): neither may depend on this package, which is where
// cgo enters the module.
func TestStaticBinariesDoNotImportLiburma(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	const self = "github.com/openeuler/urma-k8s/pkg/urma/liburma"
	for _, cmd := range []string{"./cmd/deviceplugin", "./cmd/operator", "./cmd/dra-driver"} {
		if _, err := os.Stat(filepath.Join(root, cmd)); err != nil {
			continue // not in this tree (yet)
		}
		c := exec.Command("go", "list", "-deps", cmd)
		c.Dir = root
		c.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", cmd, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == self {
				t.Errorf("%s imports %s", cmd, self)
			}
		}
	}
}
