package urma

import (
	"strings"
	"testing"
	"unsafe"
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
