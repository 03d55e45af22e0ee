package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestArchitectureDocNamesOperatorImports keeps docs/architecture.md's
// account of what the operator and the device plugin import of each other
// true: the operator reaches the node core's packages through
// internal/dra/slices, and the page names exactly which.
func TestArchitectureDocNamesOperatorImports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const module = "github.com/openeuler/urma-k8s/"
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	deps := func(pkg string) []string {
		c := exec.Command("go", "list", "-deps", pkg)
		c.Dir = root
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		return strings.Fields(string(out))
	}

	var fromPlugin []string
	for _, d := range deps("./cmd/operator") {
		if name, ok := strings.CutPrefix(d, module+"internal/node/"); ok {
			fromPlugin = append(fromPlugin, name)
		}
	}
	slices.Sort(fromPlugin)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "`internal/node/{" + strings.Join(fromPlugin, ",") + "}`"; !strings.Contains(string(doc), want) {
		t.Errorf("docs/architecture.md does not name what the operator imports of the device plugin: want %s", want)
	}

	for _, d := range deps("./cmd/deviceplugin") {
		for _, op := range []string{"controllers", "internal/operator/", "api/"} {
			if strings.HasPrefix(d, module+op) {
				t.Errorf("the device plugin imports %s, which docs/architecture.md says it never does", d)
			}
		}
	}
}
