package urma

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Memory is an anonymous mmap'd region that can be registered as a segment.
// It lives outside the Go heap, so the garbage collector never moves or frees
// it while a device may be reading it.
type Memory struct {
	buf []byte
}

// AllocMemory maps size bytes of zeroed, private, anonymous memory.
func AllocMemory(size int) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("alloc registered memory: size %d must be positive", size)
	}
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("alloc registered memory: mmap %d bytes: %w", size, err)
	}
	return &Memory{buf: b}, nil
}

// Bytes is the mapped region.
func (m *Memory) Bytes() []byte { return m.buf }

// Free unmaps the region; it must no longer be registered.
func (m *Memory) Free() error {
	if m.buf == nil {
		return nil
	}
	err := unix.Munmap(m.buf)
	m.buf = nil
	if err != nil {
		return fmt.Errorf("free registered memory: %w", err)
	}
	return nil
}
