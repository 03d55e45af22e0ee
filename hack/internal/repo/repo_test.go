package repo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRoot(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "hack", "demo")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Root(deep); err == nil || !strings.Contains(err.Error(), "no go.mod") {
		t.Fatalf("without go.mod: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Root(deep)
	if err != nil || got != root {
		t.Fatalf("Root = %q, %v; want %q", got, err, root)
	}
}
