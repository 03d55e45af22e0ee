package urma

import (
	"errors"
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
