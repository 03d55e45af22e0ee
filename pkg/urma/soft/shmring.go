package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/memcopy"
)

// Shared memory of the shm fabric. Each side of a connection owns one
// region, a sealed memfd: a control page, then the ring it writes its frames
// into, a byte stream like a socket's. The peer maps it read-only. Every
// word a side writes lives in its own region, and whatever the peer's region
// says is checked before it is used. The peer gets a read-only descriptor,
// and the region is sealed against new writable mappings and write(2)
// (F_SEAL_FUTURE_WRITE) once its owner mapped it, since a read-only
// descriptor alone does not stop the peer from reopening the file
// read-write through /proc/self/fd.
//
// Control page words (8 bytes, each on its own cache line):
//
//	magic     "URMASHM1", then version u32 and ring size u32
//	tail      bytes written into this side's ring, ever
//	head      bytes this side consumed from the peer's ring, ever
//	rsleep    odd while this side's reader sleeps and wants a data wake-up
//	wsleep    odd while this side's writer sleeps and wants a space wake-up
//	pulled    bytes this side copied out of the peer's shared memory, ever
//	          (one-copy SENDs, pull.go): the progress of a long pull, which
//	          moves neither tail nor head, for the peer's watchdog; a peer
//	          that never moves it (an older one) is watched as before
//
// Wake-ups cost a syscall only for a side that sleeps. A writer stores tail
// and then loads the peer's rsleep; a reader stores an odd rsleep and then
// loads the peer's tail before it blocks. Go's atomics are sequentially
// consistent, so at least one of the two sees the other's store: no wake-up
// is lost. The same pair guards space with head and wsleep.
const (
	shmCtlSize    = 4096
	shmMagic      = "URMASHM1"
	shmVersion    = 1
	offVersion    = 8
	offRingSize   = 12
	offTail       = 64
	offHead       = 128
	offReaderWait = 192
	offWriterWait = 256
	offPulled     = 320

	// MinShmRing and MaxShmRing bound Options.ShmRingSize.
	MinShmRing = 64 << 10
	MaxShmRing = 256 << 20
	// DefaultShmRing is the ring each side of an shm connection writes
	// into. It is charged to the memory cgroup of the process that
	// creates it, once per peer device.
	DefaultShmRing = 2 << 20
	// DefaultShmSpin is how long an idle shm reader or writer polls
	// shared memory before it sleeps on its eventfd.
	DefaultShmSpin = 2 * time.Microsecond

	// shmPublishChunk is how many bytes a writer copies before it shows
	// them to the reader, and a reader before it frees them: large messages
	// stream through the ring, both sides copying at once, while a frame
	// below it appears whole, so that a poller can take it (conn.drive).
	shmPublishChunk = 256 << 10
)

// shmRegion is a mapped region: this side's (read-write) or the peer's
// (read-only).
type shmRegion struct {
	mem  []byte
	ring []byte
}

func (r *shmRegion) word(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.mem[off]))
}

func (r *shmRegion) unmap() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem, r.ring = nil, nil
	}
}

// newShmRegion creates this side's region: a sealed memfd of the control
// page plus ringSize bytes, mapped and faulted in at once so that its pages
// are charged to this process. It returns the mapping and a read-only
// descriptor of it for the peer.
func newShmRegion(ringSize int) (*shmRegion, int, error) {
	fd, err := unix.MemfdCreate("urma-shm-ring", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("create ring memfd: %w", err)
	}
	defer unix.Close(fd)
	size := shmCtlSize + ringSize
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
	copy(mem, shmMagic)
	binary.LittleEndian.PutUint32(mem[offVersion:], shmVersion)
	binary.LittleEndian.PutUint32(mem[offRingSize:], uint32(ringSize))
	ro, err := reopenReadOnly(fd)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, -1, err
	}
	return &shmRegion{mem: mem, ring: mem[shmCtlSize:]}, ro, nil
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

// reopenReadOnly opens a second, read-only descriptor of a memfd, so that
// the peer it is passed to can map it for reading only.
func reopenReadOnly(fd int) (int, error) {
	ro, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("reopen memfd %d read-only through /proc/self/fd: %w", fd, err)
	}
	return ro, nil
}

// mapPeerRegion maps the peer's region read-only, after checking that it is
// a sealed memfd of exactly the announced ring size: a region that could
// shrink would fault this process on access. It takes ownership of fd.
func mapPeerRegion(fd, ringSize int) (*shmRegion, error) {
	defer unix.Close(fd)
	size, err := sealedSize(fd)
	if err != nil {
		return nil, fmt.Errorf("peer ring: %w", err)
	}
	if size != int64(shmCtlSize+ringSize) {
		return nil, fmt.Errorf("peer ring memfd is %d bytes, want %d", size, shmCtlSize+ringSize)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map peer ring: %w", err)
	}
	r := &shmRegion{mem: mem, ring: mem[shmCtlSize:]}
	switch {
	case string(mem[:8]) != shmMagic:
		err = fmt.Errorf("peer ring magic %q, want %q", mem[:8], shmMagic)
	case binary.LittleEndian.Uint32(mem[offVersion:]) != shmVersion:
		err = fmt.Errorf("peer ring version %d, want %d", binary.LittleEndian.Uint32(mem[offVersion:]), shmVersion)
	case binary.LittleEndian.Uint32(mem[offRingSize:]) != uint32(ringSize):
		err = fmt.Errorf("peer ring says %d bytes, its hello %d", binary.LittleEndian.Uint32(mem[offRingSize:]), ringSize)
	}
	if err != nil {
		r.unmap()
		return nil, err
	}
	return r, nil
}

// sealedSize is the size of a memfd that can neither shrink nor grow.
func sealedSize(fd int) (int64, error) {
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

// newEventfd creates the eventfd a sleeping reader or writer waits on. The
// descriptor is shared with the peer, flags included: each side sets
// O_NONBLOCK on the peer's eventfds when it joins them (newShmIO), so
// nothing may rely on blocking mode.
func newEventfd() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("create eventfd: %w", err)
	}
	return fd, nil
}

// signal wakes the peer's reader or writer, which sleeps on the eventfd
// fd. write(2) to an eventfd blocks only when its counter is full
// (2^64-2, which only a peer that writes its own eventfd arranges) and the
// descriptor is blocking; the caller may be an application's PostSend or
// Close, which must not block on the peer. O_NONBLOCK, set at join, is a
// flag of the open file description the peer shares, so the peer can
// clear it again: signal checks it first (F_GETFL, the cheapest check:
// no wait queue, unlike poll(2)) and writes only to a non-blocking
// descriptor. A blocking descriptor or a full counter (EAGAIN) is the
// peer's doing and fails the connection, so a peer that would block this
// side by racing its flag against the check gets one try per connection.
// A signal costs the fcntl only when the peer sleeps, which costs the peer
// a wake-up many times dearer.
func signal(fd int) error {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return fmt.Errorf("wake peer: %w", err)
	}
	if fl&unix.O_NONBLOCK == 0 {
		return protocolError{errors.New("peer made its eventfd blocking")}
	}
	if err := addOne(fd); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return protocolError{errors.New("peer's eventfd counter is full")}
		}
		return fmt.Errorf("wake peer: %w", err)
	}
	return nil
}

// wake wakes this side's own sleeper on the eventfd fd (shutdown). The
// peer shares the descriptor and may have cleared O_NONBLOCK: set it again
// before writing. A full counter (EAGAIN) means the sleeper is awake anyway.
func wake(fd int) {
	_ = unix.SetNonblock(fd, true)
	_ = addOne(fd)
}

// addOne adds 1 to the counter of the eventfd fd: the write that wakes
// whoever sleeps on it.
func addOne(fd int) error {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, err := unix.Write(fd, one[:])
	return err
}

// eventWaiter sleeps on an eventfd through Go's network poller: a
// goroutine that waits costs no thread, and when it is woken the thread that
// runs it is often the one that also runs the goroutine it then wakes (the
// completion channel's reader), so a message costs one wake-up of the
// process, as with a socket.
type eventWaiter struct {
	f     *os.File
	raw   syscall.RawConn
	drain func(fd uintptr) bool // made once: a closure per sleep would allocate
	buf   [8]byte
	iov   unix.Iovec // over buf, for preadv2
	timed bool       // a deadline is set
	// noNowait says this kernel refused RWF_NOWAIT on an eventfd: plain
	// read(2), which blocks if the peer cleared O_NONBLOCK.
	noNowait bool
}

func newEventWaiter(fd int, name string) (*eventWaiter, error) {
	f := os.NewFile(uintptr(fd), name)
	raw, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("poll %s: %w", name, err)
	}
	w := &eventWaiter{f: f, raw: raw}
	w.iov.Base = &w.buf[0]
	w.iov.SetLen(len(w.buf))
	w.drain = func(fd uintptr) bool {
		return !errors.Is(w.reset(fd), unix.EAGAIN)
	}
	return w, nil
}

// reset reads the eventfd's counter back to zero; EAGAIN when it is zero
// already. It never blocks: the peer shares the descriptor and may clear
// O_NONBLOCK, and a read(2) of a zero counter would then hold the thread
// past any deadline (a stalled peer would never be failed). preadv2 with
// RWF_NOWAIT does not wait whatever the flag says (Linux 5.12 and later;
// an older kernel refuses it, and gets read(2)).
func (w *eventWaiter) reset(fd uintptr) error {
	if !w.noNowait {
		// Offset -1: the file's own position, as eventfds have no other.
		_, _, e := unix.Syscall6(unix.SYS_PREADV2, fd, uintptr(unsafe.Pointer(&w.iov)), 1, ^uintptr(0), 0, unix.RWF_NOWAIT)
		switch e {
		case 0:
			return nil
		case unix.EOPNOTSUPP, unix.EINVAL, unix.ENOSYS:
			w.noNowait = true
		default:
			return e
		}
	}
	_, err := unix.Read(int(fd), w.buf[:])
	return err
}

// sleep waits until the eventfd is signalled (and resets it) or deadline
// passes (zero: no deadline); both return nil.
func (w *eventWaiter) sleep(deadline time.Time) error {
	if !deadline.IsZero() || w.timed {
		if err := w.f.SetReadDeadline(deadline); err != nil {
			return err
		}
		w.timed = !deadline.IsZero()
	}
	err := w.raw.Read(w.drain)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	return err
}

// errRingCorrupt says the peer wrote control words no honest peer writes.
var errRingCorrupt = errors.New("peer's ring control words are inconsistent")

// shmIO is a connection's byte stream over two rings: frames are written
// into this side's ring and read from the peer's. It implements linkIO.
type shmIO struct {
	local, remote *shmRegion
	wsize, wmask  uint64 // this side's ring, written
	rsize, rmask  uint64 // the peer's ring, read
	spin          time.Duration

	// This side's reader and writer sleep on data and space; the peer's
	// eventfds are written to wake the peer.
	data, space             *eventWaiter
	dataFd, spaceFd         int
	peerDataFd, peerSpaceFd int
	// pollers is what Polls driving this device's rings tell the reader
	// goroutine (see idle).
	pollers *pollStats

	// localRO is the read-only descriptor of this side's region until it
	// is passed to the peer.
	localRO int
	// ctlFd is the connection's unix socket once the handshake is done:
	// the liveness signal and the channel for sharing memory. watchers
	// counts the goroutine reading it.
	ctlFd    int
	watchers sync.WaitGroup

	closed atomic.Bool
	rx, tx atomic.Uint64
	// wakes counts the eventfd writes that woke the peer: what the shm
	// fabric saves is exactly these syscalls. pulls counts the SENDs that
	// went by reference.
	wakes, pulls atomic.Uint64

	// Reader side (the token's holder): whether the holder is a poller,
	// which must never sleep on the data eventfd (only the reader goroutine
	// may: two sleepers would break the odd/even sleep word); and the peer
	// writer's sleep that was last woken.
	// How far the peer's ring is read is the head word of this side's
	// control page (head), which idle readers and pollers check without
	// the token.
	pollerReads bool
	wokeWrite   uint64
	idlePolls   uint64 // the device's Polls when the reader goroutine last went idle
	pollingMode bool   // see idle
	pollingEnd  int    // parks in a row without a Poll that end polling mode
	// pollerBudget is how long a Poll reads frames (pollerReadBudget).
	pollerBudget time.Duration
	// stall is how long the reader, or a poller, waits for more of a
	// frame it has started before it fails the connection (waitRest):
	// Options.PeerTimeout, the bound on a silent peer. inRest is set
	// meanwhile, for the watchdog to leave that stall to this bound.
	stall  time.Duration
	inRest atomic.Bool
	// restParks counts a poller's parks in waitRest, for tests: one whose
	// parks do not last shows far more than its wait over pollPark. The
	// reader goroutine's sleeps show in its control word (offReaderWait).
	restParks atomic.Uint64
	// frameWaited is how long the token's holder has waited, in all, for
	// the frame it reads, and frameRx the bytes it had read when the frame
	// began: waitRest bounds the one by frameBound of the bytes read since
	// (beginFrame).
	frameWaited time.Duration
	frameRx     uint64
	// Writer side: bytes written into this side's ring, and the peer
	// reader's sleep that was last woken.
	tail     uint64
	wokeRead uint64

	closeOnce sync.Once
	// unmapMu orders the watchdog's reading of the control words
	// (watchWords) before close unmaps them; unmapped says they are gone.
	unmapMu  sync.RWMutex
	unmapped bool

	pull pullState // one-copy SENDs (pull.go)
	// refusedMap, when set, hears of each peer segment refused (logs).
	refusedMap func(handle uint32, err error)
	// afterPullChunk, set by tests, runs after each chunk a pull copies.
	afterPullChunk atomic.Pointer[func()]
}

// shmEnds are the descriptors and regions of one side, before they become
// a shmIO.
type shmEnds struct {
	local           *shmRegion
	localRO         int // read-only descriptor of local, for the peer
	dataFd, spaceFd int
}

func newShmEnds(ringSize int) (*shmEnds, error) {
	e := &shmEnds{localRO: -1, dataFd: -1, spaceFd: -1}
	var err error
	if e.local, e.localRO, err = newShmRegion(ringSize); err != nil {
		return nil, err
	}
	if e.dataFd, err = newEventfd(); err == nil {
		e.spaceFd, err = newEventfd()
	}
	if err != nil {
		e.release()
		return nil, err
	}
	return e, nil
}

// release frees what was not handed to a shmIO.
func (e *shmEnds) release() {
	if e.local != nil {
		e.local.unmap()
	}
	for _, fd := range []int{e.localRO, e.dataFd, e.spaceFd} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// fds are what the peer gets: the region and the two eventfds.
func (e *shmEnds) fds() []int { return []int{e.localRO, e.dataFd, e.spaceFd} }

// closePassed closes the read-only region descriptor once the peer has its
// copy; the eventfds stay, this side sleeps on them.
func (e *shmEnds) closePassed() {
	if e.localRO >= 0 {
		_ = unix.Close(e.localRO)
		e.localRO = -1
	}
}

// newShmIO joins this side's ends (its ring of ringSize bytes) with the
// peer's, whose ring has peerRing bytes. It takes ownership of the ends and
// of the peer's descriptors (region, data and space eventfds), also on
// error, when it releases them all.
func newShmIO(e *shmEnds, ringSize, peerRing int, peerFds []int, spin time.Duration) (*shmIO, error) {
	fail := func(err error) (*shmIO, error) {
		e.release()
		return nil, err
	}
	if len(peerFds) != 3 {
		closeAll(peerFds)
		return fail(fmt.Errorf("peer passed %d descriptors, want 3", len(peerFds)))
	}
	for _, fd := range peerFds[1:] {
		err := checkEventfd(fd)
		if err == nil {
			// The peer created its eventfds and may have made them
			// blocking: a wake-up must never block (see signal).
			err = unix.SetNonblock(fd, true)
		}
		if err != nil {
			closeAll(peerFds)
			return fail(err)
		}
	}
	remote, err := mapPeerRegion(peerFds[0], peerRing)
	if err != nil {
		closeAll(peerFds[1:])
		return fail(err)
	}
	sio := &shmIO{
		local: e.local, remote: remote, spin: spin, localRO: e.localRO, ctlFd: -1,
		wsize: uint64(ringSize), wmask: uint64(ringSize - 1), rsize: uint64(peerRing), rmask: uint64(peerRing - 1),
		dataFd: e.dataFd, spaceFd: e.spaceFd, peerDataFd: peerFds[1], peerSpaceFd: peerFds[2],
		pollers: new(pollStats), pollingEnd: pollingEnd, pollerBudget: pollerReadBudget,
		stall: defaultPeerTimeout,
	}
	sio.pull.budget = newMapBudget(Options{})          // its own; shmNet.join gives the provider's
	*e = shmEnds{localRO: -1, dataFd: -1, spaceFd: -1} // sio owns them now
	// The eventfds belong to their waiters from here on (os.File closes them).
	if sio.data, err = newEventWaiter(sio.dataFd, "shm data eventfd"); err == nil {
		sio.space, err = newEventWaiter(sio.spaceFd, "shm space eventfd")
	}
	if err != nil {
		sio.close()
		return nil, err
	}
	return sio, nil
}

// checkEventfd refuses a descriptor that is not an eventfd: writing to
// anything else could block or do harm.
func checkEventfd(fd int) error {
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return fmt.Errorf("inspect descriptor from peer: %w", err)
	}
	if target != "anon_inode:[eventfd]" {
		return fmt.Errorf("descriptor from peer is %q, not an eventfd", target)
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

func (s *shmIO) counters() (rx, tx *atomic.Uint64) { return &s.rx, &s.tx }

// available is how many bytes of the peer's ring are unread.
func (s *shmIO) available() (uint64, error) {
	n := s.remote.word(offTail).Load() - s.head()
	if n > s.rsize {
		return 0, errRingCorrupt
	}
	return n, nil
}

func (s *shmIO) buffered() int {
	n, err := s.available()
	if err != nil {
		return 1 // let the next read report it
	}
	return int(n)
}

// ready reports whether a reader (data) or writer (not data) has what it
// waits for: bytes in the peer's ring, room in this side's; a corrupt ring
// counts as ready, so that the next access reports it. A writer waits
// without the write lock, so it reckons with the published tail (the lock's
// holder publishes what it wrote before it lets go).
func (s *shmIO) ready(data bool) bool {
	var n uint64
	var err error
	if data {
		n, err = s.available()
	} else {
		n, err = s.room(s.local.word(offTail).Load())
	}
	return n > 0 || err != nil || s.closed.Load()
}

// spinWait polls ready for the spin budget; it reports whether it came
// true. Polling shared memory costs no syscall while the peer is busy.
func (s *shmIO) spinWait(data bool) bool {
	if s.spin <= 0 {
		return s.ready(data)
	}
	start := time.Now()
	for i := 0; ; i++ {
		if s.ready(data) {
			return true
		}
		if i&63 == 63 && time.Since(start) > s.spin {
			return false
		}
	}
}

// wait blocks until ready(data): it spins, then sleeps on its eventfd.
func (s *shmIO) wait(data bool) error {
	if s.spinWait(data) {
		if s.closed.Load() {
			return errConnDead
		}
		return nil
	}
	return s.sleep(data, time.Time{})
}

// errPeerStalled says that the peer stopped writing in the middle of a
// frame for the connection's stall bound (shmIO.stall).
var errPeerStalled = errors.New("peer stalled mid-frame")

// errPeerNotReading and errPeerNotAnswering say that a live peer left what
// this side wrote unread, or the sends it read unanswered, for PeerTimeout
// (sockDevice.watchShm).
var (
	errPeerNotReading   = errors.New("peer stopped reading")
	errPeerNotAnswering = errors.New("peer stopped answering")
)

// restSpin is how long a poller waiting for the rest of a frame yields
// before it parks: one park (pollPark), the most a park can make it late,
// so that it never burns more time than parking at once could have cost.
// A running writer publishes every shmPublishChunk, tens of microseconds
// of copying: well within it.
const restSpin = pollPark

// beginFrame starts the count of the time waited for a frame's rest.
func (s *shmIO) beginFrame() {
	s.frameWaited = 0
	s.frameRx = s.rx.Load()
}

func (s *shmIO) endFrame() {}

// waitRest waits for the rest of a frame whose start was read: the writer
// is copying it (readFrame starts a frame only when the ring holds some of
// it). A dead writer's process closes the socket and so the ring, but a
// live one that stops (stopped by SIGSTOP or a debugger, buggy, hostile)
// would hold the reader, or the application's Poll, for good: after
// s.stall without a byte the wait fails, and with it the connection. So
// would one that trickles the frame, a byte just under every s.stall: the
// waits for one frame's rest add up, and once they pass frameBound of the
// bytes of it read so far, the wait fails too. Only the time spent waiting
// counts: a frame that takes long because this side copies it slowly is
// not the peer's stall.
//
// The reader goroutine waits as for any data (a short spin, then an
// announced sleep, timed). A poller must not sleep on the data eventfd:
// the reader goroutine may be asleep on it (idle), and two sleepers would
// break the odd/even sleep word, share one read deadline and queue behind
// each other's read. So it yields for restSpin, then parks for pollPark at
// a time, checking the ring after each park: no wake-up to lose.
func (s *shmIO) waitRest() error {
	s.inRest.Store(true)
	defer s.inRest.Store(false)
	start := time.Now()
	// The wait ends at the gap's bound or the frame's, whichever comes
	// first.
	bound := frameBound(s.stall, s.rx.Load()-s.frameRx)
	wait, whole := s.stall, false
	if left := bound - s.frameWaited; left < wait {
		wait, whole = max(left, 0), true
	}
	deadline := start.Add(wait)
	if !s.pollerReads {
		if !s.spinWait(true) {
			if err := s.sleep(true, deadline); err != nil {
				return err
			}
		}
	} else {
		for i := 0; !s.ready(true); i++ {
			if i&63 == 63 && time.Since(start) > restSpin {
				break
			}
			runtime.Gosched()
		}
		for !s.ready(true) {
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			s.restParks.Add(1)
			time.Sleep(min(left, pollPark))
		}
	}
	s.frameWaited += time.Since(start)
	if !s.ready(true) {
		if whole {
			return frameOverdue(s.frameWaited, bound)
		}
		return fmt.Errorf("%w for %v", errPeerStalled, s.stall)
	}
	return s.closedErr()
}

func (s *shmIO) closedErr() error {
	if s.closed.Load() {
		return errConnDead
	}
	return nil
}

// sleep sleeps on the eventfd until ready(data), or until deadline passes
// (zero: none; the caller checks ready), announcing each sleep in this
// side's control page first and checking ready after the announcement, so
// a wake-up that races with it is not lost.
func (s *shmIO) sleep(data bool, deadline time.Time) error {
	off, ew := offWriterWait, s.space
	if data {
		off, ew = offReaderWait, s.data
	}
	w := s.local.word(off)
	for !s.ready(data) {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return nil
		}
		w.Add(1) // odd: wake me
		var err error
		if !s.ready(data) {
			err = ew.sleep(deadline)
		}
		w.Add(1)
		if err != nil {
			return fmt.Errorf("sleep on eventfd: %w", err)
		}
	}
	if s.closed.Load() {
		return errConnDead
	}
	return nil
}

// pollStats counts the Polls of JFCs without a JFCE that drive a device's
// rings (conn.drive): polling-mode Polls.
type pollStats struct{ polls atomic.Uint64 }

// Polling mode: when pollers polled JFCs without a JFCE at least
// pollingPolls times since the reader goroutine last went idle, they take
// what the rings bring, and the reader goroutine parks for at most pollPark
// at a time without asking the peer for wake-ups, so that no message costs
// a syscall or a goroutine switch. An application in event mode polls JFCs
// that have a JFCE, which do not count. pollingEnd parks in a row without a
// Poll end polling mode: a poller descheduled for a park on a busy machine
// does not.
const (
	pollingPolls = 16
	pollPark     = time.Millisecond
	pollingEnd   = 3
)

// idle waits, between frames, until the peer's ring has bytes: it spins,
// then sleeps: parked without a wake-up while pollers drive the rings,
// else announced, so that the peer writes the eventfd, once per sleep.
func (s *shmIO) idle() error {
	polls := s.pollers.polls.Load()
	if polls-s.idlePolls >= pollingPolls {
		s.pollingMode = true
	}
	s.idlePolls = polls
	if s.spin > 0 && !s.pollingMode {
		start := time.Now()
		for i := 0; ; i++ {
			if s.ready(true) {
				return s.closedErr()
			}
			if i&63 == 63 && (s.pollers.polls.Load() != polls || time.Since(start) > s.spin) {
				break
			}
		}
	}
	for quiet := 0; s.pollingMode; {
		if err := s.data.sleep(time.Now().Add(pollPark)); err != nil {
			return err
		}
		now := s.pollers.polls.Load()
		if now != s.idlePolls {
			quiet = 0
		} else if quiet++; quiet == s.pollingEnd {
			s.pollingMode = false
		}
		s.idlePolls = now
		if s.ready(true) {
			return s.closedErr()
		}
	}
	return s.sleep(true, time.Time{})
}

// shmWords is what the watchdog reads of a connection's control words.
type shmWords struct {
	// The words the peer moves: its ring's tail, its head in ours, the
	// bytes it pulled from this side's memory.
	peerTail, peerHead, peerPulled uint64
	toRead                         uint64 // bytes of the peer's ring this side has not read
	unread                         bool   // bytes this side published that the peer has not read
	midFrame                       bool   // this side waits for the rest of a frame (waitRest)
}

// watchWords reads the control words for the watchdog, from a goroutine
// that is neither the reader nor the writer; false once the rings are
// unmapped. A corrupt ring counts as bytes to read: the reader reports it.
func (s *shmIO) watchWords() (shmWords, bool) {
	s.unmapMu.RLock()
	defer s.unmapMu.RUnlock()
	if s.unmapped {
		return shmWords{}, false
	}
	w := shmWords{peerTail: s.remote.word(offTail).Load(), peerHead: s.remote.word(offHead).Load(),
		peerPulled: s.remote.word(offPulled).Load()}
	w.toRead = w.peerTail - s.head()
	if w.toRead > s.rsize {
		w.toRead = 1
	}
	w.unread = s.local.word(offTail).Load() != w.peerHead
	w.midFrame = s.inRest.Load()
	return w, true
}

// waitWritable waits until this side's ring has room (the writer
// goroutine, without the write lock).
func (s *shmIO) waitWritable() error { return s.wait(false) }

// head is how far this side has read the peer's ring.
func (s *shmIO) head() uint64 { return s.local.word(offHead).Load() }

// consumed publishes that this side has read the peer's ring up to h and
// wakes a peer writer that sleeps for space.
func (s *shmIO) consumed(h uint64) error {
	s.local.word(offHead).Store(h)
	if v := s.remote.word(offWriterWait).Load(); v&1 == 1 && v != s.wokeWrite {
		s.wokeWrite = v
		s.wakes.Add(1)
		return signal(s.peerSpaceFd)
	}
	return nil
}

// take copies the next bytes of the peer's ring into p (or skips them, p
// nil and skip bytes), waiting for them as needed.
func (s *shmIO) take(p []byte, skip int) error {
	want := len(p) + skip
	for first := true; want > 0; first = false {
		n, err := s.available()
		if err != nil {
			return err
		}
		if n == 0 {
			// Every take is part of a frame: the reader goroutine and a
			// poller (conn.drive) alike start one only when the ring holds
			// some of it, so every byte a take waits for is one the peer
			// is copying (waitRest), at the start of a take (the payload
			// after its header, the next SGE of a receive) or within.
			if err := s.waitRest(); err != nil {
				if first {
					return err
				}
				return unexpected(err)
			}
			continue
		}
		k := int(min(n, uint64(want), shmPublishChunk))
		if p != nil {
			off := s.head() & s.rmask
			c := copy(p[:k], s.remote.ring[off:])
			copy(p[c:k], s.remote.ring)
			p = p[k:]
		}
		s.rx.Add(uint64(k))
		want -= k
		if err := s.consumed(s.head() + uint64(k)); err != nil {
			return err
		}
	}
	return nil
}

// peek copies the next len(p) bytes of the peer's ring into p without
// reading them, and reports whether the ring holds that many.
func (s *shmIO) peek(p []byte) bool {
	n, err := s.available()
	if err != nil || n < uint64(len(p)) {
		return false
	}
	off := s.head() & s.rmask
	k := copy(p, s.remote.ring[off:])
	copy(p[k:], s.remote.ring)
	return true
}

func (s *shmIO) readFull(p []byte) error    { return s.take(p, 0) }
func (s *shmIO) readPayload(p []byte) error { return s.take(p, 0) }
func (s *shmIO) discard(n int) error        { return s.take(nil, n) }

// free is how many bytes this side's ring can take (the write lock's
// holder).
func (s *shmIO) free() (uint64, error) { return s.room(s.tail) }

// room is how many bytes this side's ring can take past tail.
func (s *shmIO) room(tail uint64) (uint64, error) {
	used := tail - s.remote.word(offHead).Load()
	if used > s.wsize {
		return 0, errRingCorrupt
	}
	return s.wsize - used, nil
}

// published shows the peer what was written and wakes its reader if it
// sleeps.
func (s *shmIO) published() error {
	s.local.word(offTail).Store(s.tail)
	if v := s.remote.word(offReaderWait).Load(); v&1 == 1 && v != s.wokeRead {
		s.wokeRead = v
		s.wakes.Add(1)
		return signal(s.peerDataFd)
	}
	return nil
}

func (s *shmIO) writev(iov []unix.Iovec, wait bool) (rest []unix.Iovec, err error) {
	var unpublished uint64
	defer func() {
		if unpublished > 0 {
			if perr := s.published(); err == nil {
				err = perr
			}
		}
	}()
	for len(iov) > 0 {
		if s.closed.Load() {
			return iov, errConnDead
		}
		room, err := s.free()
		if err != nil {
			return iov, err
		}
		if room == 0 {
			if unpublished > 0 {
				unpublished = 0
				if err := s.published(); err != nil {
					return iov, err
				}
			}
			if !wait {
				return iov, unix.EAGAIN
			}
			if err := s.wait(false); err != nil {
				return iov, err
			}
			continue
		}
		k := min(room, iov[0].Len, shmPublishChunk-unpublished)
		src := unsafe.Slice(iov[0].Base, k)
		off := s.tail & s.wmask
		// The peer reads the ring from another core: stream into it.
		c := memcopy.Stream(s.local.ring[off:], src)
		memcopy.Stream(s.local.ring, src[c:])
		s.tail += k
		s.tx.Add(k)
		unpublished += k
		if k == iov[0].Len {
			iov = iov[1:]
		} else {
			iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(iov[0].Base), k))
			iov[0].Len -= k
		}
		if unpublished == shmPublishChunk {
			unpublished = 0
			if err := s.published(); err != nil {
				return iov, err
			}
		}
	}
	return iov, nil
}

// passFds are what the peer gets: this side's region, read-only, and the
// eventfds it sleeps on.
func (s *shmIO) passFds() []int { return []int{s.localRO, s.dataFd, s.spaceFd} }

// closePassed closes the read-only region descriptor once the peer has its
// copy.
func (s *shmIO) closePassed() {
	if s.localRO >= 0 {
		_ = unix.Close(s.localRO)
		s.localRO = -1
	}
}

// attach takes the handshaken unix socket as the connection's control
// channel: a blocking descriptor, read by watch.
func (s *shmIO) attach(nc net.Conn) error {
	fd, _, _, err := detachFD(nc)
	if err != nil {
		return err
	}
	s.ctlFd = fd
	return nil
}

// shutdown wakes this side's blocked reader, writer and control reader;
// every later wait fails.
func (s *shmIO) shutdown() {
	s.closed.Store(true)
	wake(s.dataFd)
	wake(s.spaceFd)
	if s.ctlFd >= 0 {
		_ = unix.Shutdown(s.ctlFd, unix.SHUT_RDWR)
	}
}

// close releases everything once the reader, the writer and the control
// reader are out.
func (s *shmIO) close() {
	s.closeOnce.Do(func() {
		s.watchers.Wait()
		s.pull.shareMu.Lock()
		s.pull.ctlClosed = true // unshare must not write to a closed, maybe reused, number
		shared := slices.Collect(maps.Keys(s.pull.shared))
		s.pull.shareMu.Unlock()
		if s.ctlFd >= 0 {
			_ = unix.Shutdown(s.ctlFd, unix.SHUT_RDWR) // wakes sendQueued, if shutdown did not
		}
		s.pull.sender.Wait()         // it writes to ctlFd, closed below
		for _, seg := range shared { // outside shareMu: unshareAll locks the segment first
			seg.removeSharer(s)
		}
		s.pull.unmapAll()
		s.unmapMu.Lock()
		s.unmapped = true
		s.unmapMu.Unlock()
		s.local.unmap()
		s.remote.unmap()
		for _, w := range []*eventWaiter{s.data, s.space} {
			if w != nil {
				_ = w.f.Close()
			}
		}
		fds := []int{s.localRO, s.ctlFd, s.peerDataFd, s.peerSpaceFd}
		if s.data == nil {
			fds = append(fds, s.dataFd)
		}
		if s.space == nil {
			fds = append(fds, s.spaceFd)
		}
		closeAll(fds)
	})
}

// watch reads the control socket until it breaks: the peer's death (or its
// orderly close) fails the connection.
func (s *shmIO) watch(c *conn) {
	defer s.watchers.Done()
	var buf [shmMaxMsgLen + 1]byte
	oob := make([]byte, unix.CmsgSpace(4*shmMaxFds))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(s.ctlFd, buf[:], oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil && n == 0 {
			err = errors.New("peer closed its shm socket")
			s.pull.shareMu.Lock()
			if s.pull.ctlErr != nil {
				err = s.pull.ctlErr // sendQueued shut the socket down
			}
			s.pull.shareMu.Unlock()
		}
		if err != nil {
			c.fail(err)
			return
		}
		fds, perr := parseRights(oob[:oobn])
		if perr == nil && flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			perr = errors.New("control message or its descriptors truncated")
		}
		if perr != nil {
			closeAll(fds)
			c.fail(protocolError{perr})
			return
		}
		// onControl tells the peer's violations (protocolError) from a
		// peer that hung up before its answer, which is no violation.
		if err := s.onControl(buf[:n], fds); err != nil {
			c.fail(err)
			return
		}
	}
}
