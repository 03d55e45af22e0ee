package urma

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memory is an mmap'd region that can be registered as a segment. It lives
// outside the Go heap, so the garbage collector never moves or frees it
// while a device may be reading it.
//
// AllocMemory's region is a shared mapping of a sealed memfd, so a provider
// can hand the file to a peer on the same host (the software provider's shm
// fabric lets a receiver copy a message straight out of the sender's
// memory). The seals forbid shrinking and growing the file, so no mapping of
// it can ever fault past its end. AllocPrivateMemory's region is private
// anonymous memory, which no peer can map (Fd is -1) but the kernel can back
// with huge pages.
type Memory struct {
	buf     []byte
	mapping []byte // the whole mmap'd range buf lies in, for Free; nil for WrapMemory's
	fd      int
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
		return allocPrivate(size, 0)
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
	return &Memory{buf: b, mapping: b, fd: fd}, nil
}

// AllocPrivateMemory maps size bytes of zeroed anonymous memory that only
// this process maps, for a provider that never hands its memory to a peer:
// hardware through liburma, or the software provider's socket fabric.
//
// A region of at least one transparent huge page starts on a huge page
// boundary and is advised MADV_HUGEPAGE, so that a kernel that grants huge
// pages on request (transparent_hugepage "madvise" or "always") backs it
// with them: copying a 1 MiB message into or out of a pool that cycles
// through many megabytes then walks one or two page-table entries instead of
// 256. AllocMemory's memfd cannot have that where shared memory stays on
// small pages (shmem_enabled "never", the kernel's default). The advice is
// only advice: without huge pages the region works the same on small ones.
func AllocPrivateMemory(size int) (*Memory, error) {
	return allocPrivate(size, hugePageSize(thpSizeFile))
}

// AllocPrivatePages maps size bytes of zeroed anonymous memory that only
// this process maps, on small pages: it is charged a page at a time as it
// is touched, where AllocPrivateMemory's huge pages would charge 2 MiB for
// the first byte. For memory of which only a part may ever be touched, such
// as receive buffers sized for the largest message that mostly hold small
// ones.
func AllocPrivatePages(size int) (*Memory, error) {
	return allocPrivate(size, 0)
}

// allocPrivate maps private anonymous memory aligned to hugePage and
// advised for huge pages when it spans one; hugePage 0 maps it plainly.
func allocPrivate(size, hugePage int) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("alloc registered memory: size %d must be positive", size)
	}
	huge := hugePage > 0 && size >= hugePage
	span := size
	if huge {
		// The kernel puts huge pages only on aligned ranges: map one huge
		// page more and start at the first boundary inside.
		span += hugePage
	}
	whole, err := unix.Mmap(-1, 0, span, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("alloc registered memory: mmap %d bytes: %w", span, err)
	}
	if !huge {
		return &Memory{buf: whole, mapping: whole, fd: -1}, nil
	}
	off := 0
	if rem := int(uintptr(unsafe.Pointer(unsafe.SliceData(whole))) % uintptr(hugePage)); rem != 0 {
		off = hugePage - rem
	}
	b := whole[off : off+size : off+size]
	// A kernel built without transparent huge pages refuses the advice
	// (EINVAL); the memory is as good on small pages, so that is no error.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return &Memory{buf: b, mapping: whole, fd: -1}, nil
}

// thpSizeFile is where the kernel says how large a transparent huge page is.
const thpSizeFile = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"

// maxHugePage is the largest huge page AllocPrivateMemory asks for. A pool
// is charged to the pod a whole huge page at a time as it is touched: 2 MiB
// (x86-64, arm64 with 4 KiB pages) is a few buffers, but arm64's 512 MiB
// with 64 KiB pages would be the whole default pool at the first message.
const maxHugePage = 2 << 20

// hugePageSize reads the transparent huge page size from path: 0, so that
// memory is mapped plainly, when the kernel has none or the file does not
// hold a power of two from 64 KiB to maxHugePage.
func hugePageSize(path string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || n < 64<<10 || n > maxHugePage || n&(n-1) != 0 {
		return 0
	}
	return n
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
	return &Memory{buf: b, mapping: b, fd: fd}, nil
}

// WrapMemory makes memory that the caller mapped, and keeps mapped, a
// Memory a provider can register: a C program's own buffer, registered
// through liburma's ABI, is its memory, not the provider's. b must lie
// outside the Go heap (mmap'd or C-allocated memory), which the garbage
// collector would otherwise free under a device still using it, and must
// stay mapped, readable and writable until Free. Free forgets it without
// unmapping it. Its Fd is -1: a provider cannot hand it to a peer, so on the
// shm fabric it travels by copy.
func WrapMemory(b []byte) (*Memory, error) {
	if len(b) == 0 {
		return nil, errors.New("wrap registered memory: the region is empty")
	}
	return &Memory{buf: b, fd: -1}, nil
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
// A WrapMemory region is only forgotten: its owner unmaps it.
func (m *Memory) Free() error {
	if m.buf == nil {
		return nil
	}
	if m.mapping == nil {
		m.buf = nil
		return nil
	}
	err := unix.Munmap(m.mapping)
	m.buf, m.mapping = nil, nil
	if m.fd >= 0 {
		err = errors.Join(err, unix.Close(m.fd))
		m.fd = -1
	}
	if err != nil {
		return fmt.Errorf("free registered memory: %w", err)
	}
	return nil
}
