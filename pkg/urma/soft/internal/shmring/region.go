package shmring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Layout of a region's control page: 8-byte words, each on its own cache
// line (see the package documentation).
const (
	// CtlSize is the control page in front of each ring: a region is
	// CtlSize plus its ring's bytes.
	CtlSize       = 4096
	magic         = "URMASHM1"
	version       = 1
	offVersion    = 8
	offRingSize   = 12
	offTail       = 64
	offHead       = 128
	offReaderWait = 192
	offWriterWait = 256
	offPulled     = 320

	// MinSize and MaxSize bound a ring's size, a power of two.
	MinSize = 64 << 10
	MaxSize = 256 << 20

	// publishChunk is how many bytes a writer copies before it shows
	// them to the reader, and a reader before it frees them: large messages
	// stream through the ring, both sides copying at once, while a frame
	// below it appears whole, so that a poller can take it.
	publishChunk = 256 << 10
)

// region is a mapped region: this side's (read-write) or the peer's
// (read-only).
type region struct {
	mem  []byte
	ring []byte
}

func (r *region) word(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.mem[off]))
}

func (r *region) unmap() {
	if r != nil && r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem, r.ring = nil, nil
	}
}

// newRegion creates this side's region: a sealed memfd of the control
// page plus ringSize bytes, mapped and faulted in at once so that its pages
// are charged to this process. It returns the mapping and a read-only
// descriptor of it for the peer.
func newRegion(ringSize int) (*region, int, error) {
	fd, err := unix.MemfdCreate("urma-shm-ring", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("create ring memfd: %w", err)
	}
	defer unix.Close(fd)
	size := CtlSize + ringSize
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, -1, fmt.Errorf("size ring memfd to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		return nil, -1, fmt.Errorf("seal ring memfd: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, -1, fmt.Errorf("map %d bytes of ring: %w", size, err)
	}
	if err := sealAgainstWriters(fd); err != nil {
		_ = unix.Munmap(mem)
		return nil, -1, err
	}
	copy(mem, magic)
	binary.LittleEndian.PutUint32(mem[offVersion:], version)
	binary.LittleEndian.PutUint32(mem[offRingSize:], uint32(ringSize))
	ro, err := ReopenReadOnly(fd)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, -1, err
	}
	return &region{mem: mem, ring: mem[CtlSize:]}, ro, nil
}

// sealAgainstWriters seals the memfd fd, which its owner has mapped
// writable already, against every later writable mapping and write(2)
// (F_SEAL_FUTURE_WRITE: the owner's mapping keeps working), and against
// further seals. A kernel before 5.1 does not know the write seal: the
// file is then only sealed, and the peer's view read-only by its
// descriptor alone.
func sealAgainstWriters(fd int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE|unix.F_SEAL_SEAL)
	if errors.Is(err, unix.EINVAL) {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL)
	}
	if err != nil {
		return fmt.Errorf("seal ring memfd against writers: %w", err)
	}
	return nil
}

// ReopenReadOnly opens a second, read-only descriptor of a memfd, so that
// the peer it is passed to can map it for reading only.
func ReopenReadOnly(fd int) (int, error) {
	ro, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("reopen memfd %d read-only through /proc/self/fd: %w", fd, err)
	}
	return ro, nil
}

// mapPeerRegion maps the peer's region read-only, after checking that it is
// a sealed memfd of exactly the announced ring size: a region that could
// shrink would fault this process on access. It takes ownership of fd.
func mapPeerRegion(fd, ringSize int) (*region, error) {
	defer unix.Close(fd)
	size, err := SealedSize(fd)
	if err != nil {
		return nil, fmt.Errorf("peer ring: %w", err)
	}
	if size != int64(CtlSize+ringSize) {
		return nil, fmt.Errorf("peer ring memfd is %d bytes, want %d", size, CtlSize+ringSize)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map peer ring: %w", err)
	}
	r := &region{mem: mem, ring: mem[CtlSize:]}
	switch {
	case string(mem[:8]) != magic:
		err = fmt.Errorf("peer ring magic %q, want %q", mem[:8], magic)
	case binary.LittleEndian.Uint32(mem[offVersion:]) != version:
		err = fmt.Errorf("peer ring version %d, want %d", binary.LittleEndian.Uint32(mem[offVersion:]), version)
	case binary.LittleEndian.Uint32(mem[offRingSize:]) != uint32(ringSize):
		err = fmt.Errorf("peer ring says %d bytes, its hello %d", binary.LittleEndian.Uint32(mem[offRingSize:]), ringSize)
	}
	if err != nil {
		r.unmap()
		return nil, err
	}
	return r, nil
}

// SealedSize is the size of a memfd that can neither shrink nor grow.
func SealedSize(fd int) (int64, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return 0, fmt.Errorf("not a sealable memfd: %w", err)
	}
	if seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return 0, fmt.Errorf("memfd seals %#x do not forbid shrinking and growing", seals)
	}
	// On hugetlbfs a page the peer punches out (fallocate) is faulted in
	// again from the huge page pool on our next read of it, and SIGBUS kills
	// us when the pool is empty; on shmem it reads back as zeros.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return 0, fmt.Errorf("statfs memfd: %w", err)
	}
	if fs.Type == unix.HUGETLBFS_MAGIC {
		return 0, errors.New("memfd is on hugetlbfs: a page its owner punches out would crash this process (SIGBUS) on the next read; share plain memfds")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat memfd: %w", err)
	}
	return st.Size, nil
}
