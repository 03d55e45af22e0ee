//go:build linux && cgo

package liburma

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A urma_init that fails (liburma's, when no provider registers:
// core/urma_main.c returns URMA_FAIL) fails New and leaves nothing behind:
// the dispatch table is freed and its dlopen reference dropped, so the
// library is unloaded again. Kept, each such New leaked both, and the
// transport's auto choice calls New for every engine it starts.
func TestInitFailureLeavesNothingLoaded(t *testing.T) {
	lib, err := buildFake(t.TempDir(), "libinitfail.so", filepath.Join("testdata", "fakeurma", "fakeurma.c"), "-DFAKE_INIT_STATUS=URMA_FAIL")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		p, err := newProvider(Options{Library: lib})
		if err == nil {
			_ = p.Close()
			t.Fatal("New succeeded over a liburma whose urma_init fails")
		}
		if !errors.Is(err, urma.ErrFail) {
			t.Errorf("New: %v, want urma_init's URMA_FAIL", err)
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(maps, []byte(lib)) {
		t.Errorf("%s is still loaded after its urma_init failed: the dispatch table and its dlopen reference leaked", lib)
	}
}

// A provider opened after the last one closed uses the dispatch table of
// the first, and liburma is initialised again. The table (with its dlopen
// reference) outlived the last Close, and each New made another, so every
// New/Close cycle leaked one; the transport's auto choice makes such a
// cycle for each engine on a node without a usable UB device.
func TestReopenReusesTheTable(t *testing.T) {
	lib, err := buildFake(t.TempDir(), "libreopen.so", filepath.Join("testdata", "fakeurma", "fakeurma.c"))
	if err != nil {
		t.Fatal(err)
	}
	first, err := newProvider(Options{Library: lib})
	if err != nil {
		t.Fatal(err)
	}
	table := first.lib.c
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		p, err := newProvider(Options{Library: lib})
		if err != nil {
			t.Fatal(err)
		}
		if p.lib.c != table {
			t.Error("New after the last Close made another dispatch table; the first one leaked")
		}
		if !p.lib.ownsInit {
			t.Error("liburma was not initialised again")
		}
		if devs, err := p.Devices(); err != nil || len(devs) != 2 {
			t.Errorf("devices: %d, %v", len(devs), err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
