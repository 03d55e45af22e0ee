package urma

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func TestAllocMemory(t *testing.T) {
	for _, size := range []int{1, 4096, 4097, 1 << 20} {
		m, err := AllocMemory(size)
		if err != nil {
			t.Fatalf("AllocMemory(%d): %v", size, err)
		}
		b := m.Bytes()
		if len(b) != size {
			t.Fatalf("AllocMemory(%d): len %d", size, len(b))
		}
		for i, v := range b {
			if v != 0 {
				t.Fatalf("AllocMemory(%d): byte %d is %#x, want zeroed memory", size, i, v)
			}
		}
		// The region is writable end to end.
		for i := range b {
			b[i] = byte(i % 251)
		}
		for i, v := range b {
			if v != byte(i%251) {
				t.Fatalf("AllocMemory(%d): byte %d reads %#x after writing %#x", size, i, v, byte(i%251))
			}
		}
		if err := m.Free(); err != nil {
			t.Fatalf("Free: %v", err)
		}
		if m.Bytes() != nil {
			t.Fatalf("Bytes after Free = %d bytes, want nil", len(m.Bytes()))
		}
		if err := m.Free(); err != nil {
			t.Fatalf("second Free: %v, want nil (idempotent)", err)
		}
	}
}

func TestAllocMemoryRejectsBadSizes(t *testing.T) {
	for _, size := range []int{0, -1, -4096} {
		m, err := AllocMemory(size)
		if err == nil {
			_ = m.Free()
			t.Fatalf("AllocMemory(%d) succeeded, want an error", size)
		}
		if m != nil || !strings.Contains(err.Error(), "must be positive") {
			t.Fatalf("AllocMemory(%d) = %v, %v; want nil and a 'must be positive' error", size, m, err)
		}
	}
}

func TestAllocMemoryIsPageAligned(t *testing.T) {
	// mmap hands out whole pages; a small Go heap slice would not be page
	// aligned, so this catches a regression to make([]byte, n).
	a, err := AllocMemory(100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Free(); err != nil {
			t.Error(err)
		}
	})
	b, err := AllocMemory(100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Error(err)
		}
	})
	for _, m := range []*Memory{a, b} {
		if addr := uintptrOf(m.Bytes()); addr%4096 != 0 {
			t.Fatalf("region at %#x is not page aligned", addr)
		}
	}
	if uintptrOf(a.Bytes()) == uintptrOf(b.Bytes()) {
		t.Fatal("two allocations share an address")
	}
}

// The region is a sealed memfd mapped shared: a second mapping of the file
// (what a peer on the same host makes) sees the same bytes both ways, the
// file can neither shrink nor grow, and Free closes it.
func TestMemoryIsSharedSealedMemfd(t *testing.T) {
	m, err := AllocMemory(3 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	fd := m.Fd()
	if fd < 0 {
		t.Fatal("Fd is -1: memory is not memfd-backed")
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatalf("F_GET_SEALS: %v", err)
	}
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL; seals&want != want {
		t.Fatalf("seals %#x, want %#x set", seals, want)
	}
	for _, size := range []int64{4096, 4 * 4096} {
		if err := unix.Ftruncate(fd, size); err == nil {
			t.Fatalf("ftruncate to %d succeeded on a sealed memfd", size)
		}
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := OpenMemory(dup)
	if err != nil {
		t.Fatalf("OpenMemory: %v", err)
	}
	if len(peer.Bytes()) != len(m.Bytes()) {
		t.Fatalf("peer mapping is %d bytes, want %d", len(peer.Bytes()), len(m.Bytes()))
	}
	m.Bytes()[5000] = 0xa5
	peer.Bytes()[9000] = 0x5a
	if peer.Bytes()[5000] != 0xa5 || m.Bytes()[9000] != 0x5a {
		t.Fatal("the two mappings do not share their bytes")
	}
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	if m.Fd() != -1 {
		t.Fatalf("Fd after Free = %d, want -1", m.Fd())
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatalf("fd %d still open after Free (F_GETFD: %v)", fd, err)
	}
	// The peer's mapping outlives the owner's Free.
	if peer.Bytes()[5000] != 0xa5 {
		t.Fatal("peer mapping lost its bytes when the owner freed")
	}
	if err := peer.Free(); err != nil {
		t.Fatal(err)
	}
}

// OpenMemory maps only what AllocMemory makes: a memfd whose size is
// sealed. Anything else is refused with an error that says why, and the fd
// is closed either way.
func TestOpenMemoryRefuses(t *testing.T) {
	unsealed := func(t *testing.T) int {
		fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, 4096); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	cases := []struct {
		name string
		fd   func(t *testing.T) int
		want string
	}{
		{"pipe", func(t *testing.T) int {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			_ = unix.Close(p[1])
			return p[0]
		}, "not a sealable memfd"},
		{"unsealed", unsealed, "seals"},
		{"shrinkable", func(t *testing.T) int {
			fd := unsealed(t)
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
				t.Fatal(err)
			}
			return fd
		}, "seals"},
		{"empty", func(t *testing.T) int {
			fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
				t.Fatal(err)
			}
			return fd
		}, "empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fd := c.fd(t)
			m, err := OpenMemory(fd)
			if err == nil {
				_ = m.Free()
				t.Fatal("OpenMemory succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
				t.Fatalf("fd %d left open after a refused OpenMemory", fd)
			}
		})
	}
}

// Private memory is zeroed and writable end to end, never shareable, and
// starts on a huge page boundary once it spans a huge page; Free unmaps the
// whole range mapped for it, alignment slack included.
func TestAllocPrivateMemory(t *testing.T) {
	const huge = 64 << 10
	cases := []struct {
		name      string
		size      int
		hugePage  int
		wantAlign uintptr
		wantSlack int // mapped beyond size, to find the boundary in
	}{
		{"no huge pages", 3 * huge, 0, 4096, 0},
		{"smaller than a huge page", huge - 1, huge, 4096, 0},
		{"one huge page", huge, huge, huge, huge},
		{"several and a bit", 5*huge + 100, huge, huge, huge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := allocPrivate(c.size, c.hugePage)
			if err != nil {
				t.Fatalf("allocPrivate(%d, %d): %v", c.size, c.hugePage, err)
			}
			b := m.Bytes()
			if len(b) != c.size || cap(b) != c.size {
				t.Fatalf("len %d cap %d, want %d", len(b), cap(b), c.size)
			}
			if addr := uintptrOf(b); addr%c.wantAlign != 0 {
				t.Fatalf("region at %#x is not aligned to %d", addr, c.wantAlign)
			}
			if m.Fd() != -1 {
				t.Fatalf("Fd = %d, want -1: private memory cannot be handed to a peer", m.Fd())
			}
			for i, v := range b {
				if v != 0 {
					t.Fatalf("byte %d is %#x, want zeroed memory", i, v)
				}
				b[i] = byte(i % 251)
			}
			for i, v := range b {
				if v != byte(i%251) {
					t.Fatalf("byte %d reads %#x after writing %#x", i, v, byte(i%251))
				}
			}
			whole := m.mapping
			if len(whole) != c.size+c.wantSlack {
				t.Fatalf("mapped %d bytes for %d, want %d more", len(whole), c.size, c.wantSlack)
			}
			if !mapped(whole) {
				t.Fatal("the mapping is not mapped before Free")
			}
			if err := m.Free(); err != nil {
				t.Fatalf("Free: %v", err)
			}
			if mapped(whole[:1]) || mapped(whole[len(whole)-1:]) {
				t.Fatalf("Free left part of the %d bytes mapped for %d", len(whole), c.size)
			}
			if err := m.Free(); err != nil {
				t.Fatalf("second Free: %v, want nil (idempotent)", err)
			}
		})
	}
	if _, err := allocPrivate(0, huge); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Fatalf("allocPrivate(0) = %v, want a 'must be positive' error", err)
	}
}

// mapped reports whether every page of b is mapped: msync fails with
// ENOMEM on a range with a hole.
func mapped(b []byte) bool {
	back := int(uintptrOf(b) % 4096) // msync wants a page-aligned start
	start := unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), -back)
	return unix.Msync(unsafe.Slice((*byte)(start), back+len(b)), unix.MS_ASYNC) == nil
}

// On this kernel AllocPrivateMemory asks for transparent huge pages: the
// region carries the madvise flag ("hg" in /proc/self/smaps) and starts on
// the kernel's huge page boundary.
func TestAllocPrivateMemoryAdvisesHugePages(t *testing.T) {
	huge := hugePageSize(thpSizeFile)
	if huge == 0 {
		t.Skipf("%s: no transparent huge pages of at most 2 MiB on this kernel", thpSizeFile)
	}
	m, err := AllocPrivateMemory(2 * huge)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Free(); err != nil {
			t.Error(err)
		}
	})
	addr := uintptrOf(m.Bytes())
	if addr%uintptr(huge) != 0 {
		t.Fatalf("region at %#x is not aligned to the %d-byte huge page", addr, huge)
	}
	flags, err := vmFlags(addr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(flags, "hg") {
		t.Fatalf("VmFlags of the region = %v, want hg (MADV_HUGEPAGE)", flags)
	}
	// AllocPrivatePages' memory carries no such flag: the check above
	// tells advised memory from unadvised, and small pages stay small.
	plain, err := AllocPrivatePages(2 * huge)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Free() })
	if flags, err := vmFlags(uintptrOf(plain.Bytes())); err != nil || slices.Contains(flags, "hg") {
		t.Fatalf("VmFlags of unadvised memory = %v, %v; want no hg", flags, err)
	}
}

// vmFlags reads the VmFlags of the mapping that holds addr from
// /proc/self/smaps.
func vmFlags(addr uintptr) ([]string, error) {
	raw, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, err
	}
	inside := false
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok && !strings.HasSuffix(fields[0], ":") {
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			inside = err1 == nil && err2 == nil && uint64(addr) >= start && uint64(addr) < end
			continue
		}
		if inside && fields[0] == "VmFlags:" {
			return fields[1:], nil
		}
	}
	return nil, fmt.Errorf("no mapping in /proc/self/smaps holds %#x", addr)
}

func TestHugePageSize(t *testing.T) {
	cases := []struct {
		name, content string
		want          int
	}{
		{"x86-64", "2097152\n", 2 << 20},
		{"smallest", "65536", 64 << 10},
		{"64 KiB base pages", "536870912\n", 0},
		{"base page", "4096\n", 0},
		{"not a power of two", "3000000\n", 0},
		{"negative", "-2097152\n", 0},
		{"garbage", "huge\n", 0},
		{"empty", "", 0},
	}
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
			if err := os.WriteFile(path, []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := hugePageSize(path); got != c.want {
				t.Fatalf("hugePageSize(%q) = %d, want %d", c.content, got, c.want)
			}
		})
	}
	if got := hugePageSize(filepath.Join(dir, "missing")); got != 0 {
		t.Fatalf("hugePageSize of a missing file = %d, want 0", got)
	}
}

func TestWrapMemory(t *testing.T) {
	region, err := unix.Mmap(-1, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Munmap(region); err != nil {
			t.Error(err)
		}
	})
	part := region[100:4196]
	m, err := WrapMemory(part)
	if err != nil {
		t.Fatalf("WrapMemory: %v", err)
	}
	if got := m.Bytes(); uintptrOf(got) != uintptrOf(part) || len(got) != len(part) {
		t.Fatalf("Bytes = %#x+%d, want the wrapped region %#x+%d", uintptrOf(got), len(got), uintptrOf(part), len(part))
	}
	if m.Fd() != -1 {
		t.Fatalf("Fd = %d, want -1: the caller's memory has no file a peer could map", m.Fd())
	}
	if err := m.Free(); err != nil {
		t.Fatalf("Free: %v", err)
	}
	if m.Bytes() != nil {
		t.Fatalf("Bytes after Free = %d bytes, want nil", len(m.Bytes()))
	}
	// Free forgets the region; it stays the caller's, mapped and usable.
	part[0], part[len(part)-1] = 1, 2
	if part[0] != 1 || part[len(part)-1] != 2 {
		t.Fatal("the wrapped region does not hold what was written after Free")
	}
	if err := m.Free(); err != nil {
		t.Fatalf("second Free: %v, want nil (idempotent)", err)
	}
}

func TestWrapMemoryRefusesAnEmptyRegion(t *testing.T) {
	for _, b := range [][]byte{nil, {}} {
		if m, err := WrapMemory(b); err == nil || m != nil || !strings.Contains(err.Error(), "empty") {
			t.Fatalf("WrapMemory(%v) = %v, %v; want nil and an 'empty' error", b, m, err)
		}
	}
}
