package liburma_test

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// runOK runs a C program to its end; it must exit 0 and say OK.
func runOK(t *testing.T, env []string, path string, args ...string) {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("%s: %v\n%s", path, err, out)
	}
}

// A program that leaves SIGPIPE alone survives a write to a closed pipe
// once the library (and with it a Go runtime) is loaded; one that handles
// SIGPIPE itself before loading the library keeps its handler.
func TestSIGPIPEStaysTheProgramsBusiness(t *testing.T) {
	env := []string{"URMA_SHM_DIR=" + t.TempDir()}
	t.Run("linked", func(t *testing.T) { runOK(t, env, program("sigpipe")) })
	t.Run("dlopen after a handler", func(t *testing.T) { runOK(t, env, program("sigpipe-dlopen"), built.lib) })
}

// A function the library does not implement returns liburma's error for an
// operation its provider lacks, before and after urma_init.
func TestRefusedFunctions(t *testing.T) {
	runOK(t, []string{"URMA_SHM_DIR=" + t.TempDir()}, program("refusals"))
}

// The library exports every function of liburma's API (UMDK 26.06
// urma_api.h, listed in testdata/urma_api_functions.txt), so that any
// program linked against liburma loads, and nothing else: not the Go
// half's functions, not the runtime's.
func TestExportsExactlyLiburmasAPI(t *testing.T) {
	f, err := os.Open("testdata/urma_api_functions.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if name := strings.TrimSpace(sc.Text()); name != "" {
			want = append(want, name)
		}
	}
	lib, err := elf.Open(built.lib)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	syms, err := lib.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			got = append(got, s.Name)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	for _, name := range want {
		if _, found := slices.BinarySearch(got, name); !found {
			t.Errorf("liburma function %s is not exported", name)
		}
	}
	for _, name := range got {
		if _, found := slices.BinarySearch(want, name); !found {
			t.Errorf("%s is exported, and is no liburma function", name)
		}
	}
	if soname, err := lib.DynString(elf.DT_SONAME); err != nil || !slices.Equal(soname, []string{"liburma.so.0"}) {
		t.Errorf("SONAME %v (%v), want liburma.so.0", soname, err)
	}
}

// The library's runtime never preempts by signal: SIGURG is a C program's
// to take (bthread does), so the build sets asyncpreemptoff=1 as the
// runtime's GODEBUG default (runtime.godebugDefault, read here from the
// library's symbol table).
func TestAsyncPreemptionIsOff(t *testing.T) {
	lib, err := elf.Open(built.lib)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	def, err := goString(lib, "runtime.godebugDefault")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Split(def, ","), "asyncpreemptoff=1") {
		t.Errorf("the runtime's GODEBUG default is %q, want asyncpreemptoff=1 in it", def)
	}
}

// goString reads the Go string variable name of an ELF file: its header
// (pointer, length) at the symbol, then the bytes it points at.
func goString(f *elf.File, name string) (string, error) {
	syms, err := f.Symbols()
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(syms, func(s elf.Symbol) bool { return s.Name == name })
	if i < 0 {
		return "", fmt.Errorf("no symbol %s", name)
	}
	hdr, err := readAt(f, syms[i].Value, 16)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	ptr, n := binary.LittleEndian.Uint64(hdr), binary.LittleEndian.Uint64(hdr[8:])
	if n == 0 {
		return "", nil
	}
	b, err := readAt(f, ptr, n)
	return string(b), err
}

// readAt reads n bytes at virtual address addr from the section holding them.
func readAt(f *elf.File, addr, n uint64) ([]byte, error) {
	for _, s := range f.Sections {
		if s.Type == elf.SHT_NOBITS || addr < s.Addr || addr+n > s.Addr+s.Size {
			continue
		}
		b := make([]byte, n)
		if _, err := s.ReadAt(b, int64(addr-s.Addr)); err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("no section holds %#x+%d", addr, n)
}
