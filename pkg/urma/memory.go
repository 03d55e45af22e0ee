package urma

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Memory is an mmap'd region that can be registered as a segment. It lives
// outside the Go heap, so the garbage collector never moves or frees it
// while a device may be reading it.
//
// The region is a shared mapping of a sealed memfd, so a provider can hand
// the file to a peer on the same host (the software provider's shm fabric
// lets a receiver copy a message straight out of the sender's memory). The
// seals forbid shrinking and growing the file, so no mapping of it can ever
// fault past its end. Where memfd_create is unavailable the region is
// private anonymous memory and Fd is -1.
type Memory struct {
	buf []byte
	fd  int
}

// memfdSeals are the seals every Memory file carries: its size is fixed for
// good, whoever holds the file.
const memfdSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// AllocMemory maps size bytes of zeroed memory: a sealed memfd, mapped
// shared, or private anonymous memory where memfd_create is unavailable.
// Pages are charged to the memory cgroup of whoever touches them first,
// which for a message is its writer.
func AllocMemory(size int) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("alloc registered memory: size %d must be positive", size)
	}
	fd, err := unix.MemfdCreate("urma-mem", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// No memfd (an old kernel, a seccomp profile): memory that cannot
		// be shared, which every provider can still register.
		b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return nil, fmt.Errorf("alloc registered memory: mmap %d bytes: %w", size, err)
		}
		return &Memory{buf: b, fd: -1}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("alloc registered memory: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("alloc registered memory: size memfd to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, memfdSeals); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("alloc registered memory: seal memfd: %w", err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("alloc registered memory: mmap %d bytes: %w", size, err)
	}
	return &Memory{buf: b, fd: fd}, nil
}

// OpenMemory maps a whole memfd that another process allocated with
// AllocMemory and passed over a unix socket, read-write and shared: both
// processes then see the same bytes. It takes ownership of fd, also on
// error. The file must carry AllocMemory's seals, so that its owner can
// never shrink it under this mapping.
func OpenMemory(fd int) (*Memory, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("open shared memory: fd %d is not a sealable memfd: %w", fd, err)
	}
	if seals&memfdSeals != memfdSeals {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("open shared memory: memfd seals %#x lack %#x (shrink, grow, seal)", seals, memfdSeals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("open shared memory: stat fd %d: %w", fd, err)
	}
	if st.Size <= 0 {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("open shared memory: memfd is empty")
	}
	b, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("open shared memory: mmap %d bytes: %w", st.Size, err)
	}
	return &Memory{buf: b, fd: fd}, nil
}

// Bytes is the mapped region.
func (m *Memory) Bytes() []byte { return m.buf }

// Fd is the sealed memfd behind the region, for a provider to share with a
// peer on the same host; -1 when the region is not shareable or is freed.
// The Memory keeps ownership: do not close it.
func (m *Memory) Fd() int {
	if m.buf == nil {
		return -1
	}
	return m.fd
}

// Free unmaps the region and closes its file; it must no longer be
// registered. A peer that mapped the file keeps its pages until it unmaps.
func (m *Memory) Free() error {
	if m.buf == nil {
		return nil
	}
	err := unix.Munmap(m.buf)
	m.buf = nil
	if m.fd >= 0 {
		err = errors.Join(err, unix.Close(m.fd))
		m.fd = -1
	}
	if err != nil {
		return fmt.Errorf("free registered memory: %w", err)
	}
	return nil
}
