package shmring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/memcopy"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/framebound"
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

// ValidSize reports whether n is a ring size a Stream takes: a power of
// two in MinSize..MaxSize.
func ValidSize(n int) bool {
	return n >= MinSize && n <= MaxSize && n&(n-1) == 0
}

// ErrClosed is the error of every wait and transfer of a Stream once it is
// shut down.
var ErrClosed = errors.New("connection closed")

// FaultError is what only a hostile or broken peer makes a Stream fail
// with (an eventfd it made blocking, a counter it filled): the caller
// treats it as a violation of its protocol.
type FaultError struct{ Err error }

func (e FaultError) Error() string { return e.Err.Error() }
func (e FaultError) Unwrap() error { return e.Err }

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

// newEventfd creates the eventfd a sleeping reader or writer waits on. The
// descriptor is shared with the peer, flags included: each side sets
// O_NONBLOCK on the peer's eventfds when it joins them (Join), so
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
		return FaultError{errors.New("peer made its eventfd blocking")}
	}
	if err := addOne(fd); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return FaultError{errors.New("peer's eventfd counter is full")}
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

// errCorrupt says the peer wrote control words no honest peer writes.
var errCorrupt = errors.New("peer's ring control words are inconsistent")

// Stream is a connection's byte stream over two rings: frames are written
// into this side's ring and read from the peer's. Its zero value is joined
// to a peer's ring with Join; from then on one goroutine at a time reads
// (the reader's token: the connection's reader goroutine, or a poller that
// set PollerReads) and one writes (the write lock's holder), while
// WaitWritable, WatchWords, Shutdown and the counters may be called from
// any goroutine. A Stream must not be copied.
type Stream struct {
	local, remote *region
	wsize, wmask  uint64 // this side's ring, written
	rsize, rmask  uint64 // the peer's ring, read
	spin          time.Duration

	// This side's reader and writer sleep on data and space; the peer's
	// eventfds are written to wake the peer.
	data, space             *eventWaiter
	dataFd, spaceFd         int
	peerDataFd, peerSpaceFd int
	// Polls counts the Polls of completion queues without an event
	// channel that drive the rings of the device this stream belongs to,
	// which tell the reader goroutine to enter polling mode (see Idle).
	// Join gives the stream a counter of its own; set it before use.
	Polls *atomic.Uint64

	// localRO is the read-only descriptor of this side's region until it
	// is passed to the peer.
	localRO int

	closed atomic.Bool
	rx, tx atomic.Uint64
	// wakes counts the eventfd writes that woke the peer: what the shm
	// fabric saves is exactly these syscalls.
	wakes atomic.Uint64

	// Reader side (the token's holder): whether the holder is a poller,
	// which must never sleep on the data eventfd (only the reader goroutine
	// may: two sleepers would break the odd/even sleep word); and the peer
	// writer's sleep that was last woken.
	// How far the peer's ring is read is the head word of this side's
	// control page (head), which idle readers and pollers check without
	// the token.
	PollerReads bool
	wokeWrite   uint64
	idlePolls   uint64 // the device's Polls when the reader goroutine last went idle
	pollingMode bool   // see Idle
	// PollingEnd is how many parks in a row without a Poll end polling
	// mode (see Idle); set before use.
	PollingEnd int
	// Stall is how long the reader, or a poller, waits for more of a
	// frame it has started before it fails (waitRest): the connection's
	// PeerTimeout, the bound on a silent peer; set before use. inRest is
	// set meanwhile, for the watchdog to leave that stall to this bound.
	Stall  time.Duration
	inRest atomic.Bool
	// restParks counts a poller's parks in waitRest, for tests: one whose
	// parks do not last shows far more than its wait over PollPark. The
	// reader goroutine's sleeps show in its control word (offReaderWait).
	restParks atomic.Uint64
	// frameWaited is how long the token's holder has waited, in all, for
	// the frame it reads, and frameRx the bytes it had read when the frame
	// began: waitRest bounds the one by framebound.For the bytes read
	// since (BeginFrame).
	frameWaited time.Duration
	frameRx     uint64
	// Writer side: bytes written into this side's ring, and the peer
	// reader's sleep that was last woken.
	tail     uint64
	wokeRead uint64

	closeOnce sync.Once
	// unmapMu orders the watchdog's reading of the control words
	// (WatchWords) before Close unmaps them; unmapped says they are gone.
	unmapMu  sync.RWMutex
	unmapped bool
}

// Ends are the descriptors and regions of one side, before they become
// a Stream.
type Ends struct {
	local           *region
	localRO         int // read-only descriptor of local, for the peer
	dataFd, spaceFd int
}

// NewEnds creates this side's region, with a ring of ringSize bytes (see
// ValidSize), and its two eventfds, to pass to the peer (Fds) and then
// join with the peer's (Stream.Join).
func NewEnds(ringSize int) (*Ends, error) {
	e := &Ends{localRO: -1, dataFd: -1, spaceFd: -1}
	var err error
	if e.local, e.localRO, err = newRegion(ringSize); err != nil {
		return nil, err
	}
	if e.dataFd, err = newEventfd(); err == nil {
		e.spaceFd, err = newEventfd()
	}
	if err != nil {
		e.Release()
		return nil, err
	}
	return e, nil
}

// Release frees what was not handed to a Stream.
func (e *Ends) Release() {
	if e.local != nil {
		e.local.unmap()
	}
	for _, fd := range []int{e.localRO, e.dataFd, e.spaceFd} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// Fds are what the peer gets: the region, read-only, and the two eventfds
// this side sleeps on.
func (e *Ends) Fds() []int { return []int{e.localRO, e.dataFd, e.spaceFd} }

// ClosePassed closes the read-only region descriptor once the peer has its
// copy; the eventfds stay, this side sleeps on them.
func (e *Ends) ClosePassed() {
	if e.localRO >= 0 {
		_ = unix.Close(e.localRO)
		e.localRO = -1
	}
}

// Defaults of a joined Stream's tunables.
const (
	defaultStall = 3 * time.Second
)

// Join joins this side's ends (its ring of ringSize bytes) with the
// peer's, whose ring has peerRing bytes; an idle reader or writer polls
// the ring for spin before it sleeps (negative: never). It takes ownership
// of the ends and of the peer's descriptors (region, data and space
// eventfds), also on error, when it releases them all. The peer's region
// must be a sealed memfd of the size it announced, and its descriptors
// eventfds: anything else is refused.
func (s *Stream) Join(e *Ends, ringSize, peerRing int, peerFds []int, spin time.Duration) error {
	fail := func(err error) error {
		e.Release()
		return err
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
	s.local, s.remote, s.spin, s.localRO = e.local, remote, spin, e.localRO
	s.wsize, s.wmask, s.rsize, s.rmask = uint64(ringSize), uint64(ringSize-1), uint64(peerRing), uint64(peerRing-1)
	s.dataFd, s.spaceFd, s.peerDataFd, s.peerSpaceFd = e.dataFd, e.spaceFd, peerFds[1], peerFds[2]
	s.Polls, s.PollingEnd, s.Stall = new(atomic.Uint64), pollingEnd, defaultStall
	*e = Ends{localRO: -1, dataFd: -1, spaceFd: -1} // s owns them now
	// The eventfds belong to their waiters from here on (os.File closes them).
	if s.data, err = newEventWaiter(s.dataFd, "shm data eventfd"); err == nil {
		s.space, err = newEventWaiter(s.spaceFd, "shm space eventfd")
	}
	if err != nil {
		s.Close()
		return err
	}
	return nil
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

// Counters are the bytes read and written so far, for the watchdog.
func (s *Stream) Counters() (rx, tx *atomic.Uint64) { return &s.rx, &s.tx }

// Wakes counts the eventfd writes that woke the peer: what the shm fabric
// saves is exactly these syscalls.
func (s *Stream) Wakes() uint64 { return s.wakes.Load() }

// Size is this side's ring, in bytes.
func (s *Stream) Size() int { return int(s.wsize) }

// Closed reports whether the stream is shut down.
func (s *Stream) Closed() bool { return s.closed.Load() }

// available is how many bytes of the peer's ring are unread.
func (s *Stream) available() (uint64, error) {
	n := s.remote.word(offTail).Load() - s.head()
	if n > s.rsize {
		return 0, errCorrupt
	}
	return n, nil
}

// Buffered is how many bytes of the peer's ring this side can read
// without waiting (1 when the ring is corrupt: the next read reports it).
func (s *Stream) Buffered() int {
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
func (s *Stream) ready(data bool) bool {
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
func (s *Stream) spinWait(data bool) bool {
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
func (s *Stream) wait(data bool) error {
	if s.spinWait(data) {
		if s.closed.Load() {
			return ErrClosed
		}
		return nil
	}
	return s.sleep(data, time.Time{})
}

// restSpin is how long a poller waiting for the rest of a frame yields
// before it parks: one park (PollPark), the most a park can make it late,
// so that it never burns more time than parking at once could have cost.
// A running writer publishes every publishChunk, tens of microseconds
// of copying: well within it.
const restSpin = PollPark

// BeginFrame starts the count of the time waited for a frame's rest.
func (s *Stream) BeginFrame() {
	s.frameWaited = 0
	s.frameRx = s.rx.Load()
}

// EndFrame says the reader read a whole frame; nothing to do on shared
// memory, where BeginFrame restarts the count.
func (s *Stream) EndFrame() {}

// waitRest waits for the rest of a frame whose start was read: the writer
// is copying it (the link starts a frame only when the ring holds some of
// it). A dead writer's process closes the socket and so the ring, but a
// live one that stops (stopped by SIGSTOP or a debugger, buggy, hostile)
// would hold the reader, or the application's Poll, for good: after
// s.Stall without a byte the wait fails, and with it the connection. So
// would one that trickles the frame, a byte just under every s.Stall: the
// waits for one frame's rest add up, and once they pass framebound.For the
// bytes of it read so far, the wait fails too. Only the time spent waiting
// counts: a frame that takes long because this side copies it slowly is
// not the peer's stall.
//
// The reader goroutine waits as for any data (a short spin, then an
// announced sleep, timed). A poller must not sleep on the data eventfd:
// the reader goroutine may be asleep on it (idle), and two sleepers would
// break the odd/even sleep word, share one read deadline and queue behind
// each other's read. So it yields for restSpin, then parks for PollPark at
// a time, checking the ring after each park: no wake-up to lose.
func (s *Stream) waitRest() error {
	s.inRest.Store(true)
	defer s.inRest.Store(false)
	start := time.Now()
	// The wait ends at the gap's bound or the frame's, whichever comes
	// first.
	bound := framebound.For(s.Stall, s.rx.Load()-s.frameRx)
	wait, whole := s.Stall, false
	if left := bound - s.frameWaited; left < wait {
		wait, whole = max(left, 0), true
	}
	deadline := start.Add(wait)
	if !s.PollerReads {
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
			time.Sleep(min(left, PollPark))
		}
	}
	s.frameWaited += time.Since(start)
	if !s.ready(true) {
		if whole {
			return framebound.Overdue(s.frameWaited, bound)
		}
		return fmt.Errorf("%w for %v", framebound.ErrStalled, s.Stall)
	}
	return s.closedErr()
}

func (s *Stream) closedErr() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// sleep sleeps on the eventfd until ready(data), or until deadline passes
// (zero: none; the caller checks ready), announcing each sleep in this
// side's control page first and checking ready after the announcement, so
// a wake-up that races with it is not lost.
func (s *Stream) sleep(data bool, deadline time.Time) error {
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
		return ErrClosed
	}
	return nil
}

// Polling mode: when pollers polled JFCs without a JFCE at least
// pollingPolls times since the reader goroutine last went idle, they take
// what the rings bring, and the reader goroutine parks for at most PollPark
// at a time without asking the peer for wake-ups, so that no message costs
// a syscall or a goroutine switch. An application in event mode polls JFCs
// that have a JFCE, which do not count. PollingEnd parks in a row without a
// Poll end polling mode: a poller descheduled for a park on a busy machine
// does not.
const (
	pollingPolls = 16
	PollPark     = time.Millisecond
	pollingEnd   = 3
)

// Idle waits, between frames, until the peer's ring has bytes: it spins,
// then sleeps: parked without a wake-up while pollers drive the rings,
// else announced, so that the peer writes the eventfd, once per sleep.
func (s *Stream) Idle() error {
	polls := s.Polls.Load()
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
			if i&63 == 63 && (s.Polls.Load() != polls || time.Since(start) > s.spin) {
				break
			}
		}
	}
	for quiet := 0; s.pollingMode; {
		if err := s.data.sleep(time.Now().Add(PollPark)); err != nil {
			return err
		}
		now := s.Polls.Load()
		if now != s.idlePolls {
			quiet = 0
		} else if quiet++; quiet == s.PollingEnd {
			s.pollingMode = false
		}
		s.idlePolls = now
		if s.ready(true) {
			return s.closedErr()
		}
	}
	return s.sleep(true, time.Time{})
}

// Words is what the watchdog reads of a connection's control words.
type Words struct {
	// The words the peer moves: its ring's tail, its head in ours, the
	// bytes it pulled from this side's memory (AddPulled).
	PeerTail, PeerHead, PeerPulled uint64
	ToRead                         uint64 // bytes of the peer's ring this side has not read
	Unread                         bool   // bytes this side published that the peer has not read
	MidFrame                       bool   // this side waits for the rest of a frame (waitRest)
}

// WatchWords reads the control words for the watchdog, from a goroutine
// that is neither the reader nor the writer; false once the rings are
// unmapped. A corrupt ring counts as bytes to read: the reader reports it.
func (s *Stream) WatchWords() (Words, bool) {
	s.unmapMu.RLock()
	defer s.unmapMu.RUnlock()
	if s.unmapped {
		return Words{}, false
	}
	w := Words{PeerTail: s.remote.word(offTail).Load(), PeerHead: s.remote.word(offHead).Load(),
		PeerPulled: s.remote.word(offPulled).Load()}
	w.ToRead = w.PeerTail - s.head()
	if w.ToRead > s.rsize {
		w.ToRead = 1
	}
	w.Unread = s.local.word(offTail).Load() != w.PeerHead
	w.MidFrame = s.inRest.Load()
	return w, true
}

// WaitWritable waits until this side's ring has room (the writer
// goroutine, without the write lock).
func (s *Stream) WaitWritable() error { return s.wait(false) }

// head is how far this side has read the peer's ring.
func (s *Stream) head() uint64 { return s.local.word(offHead).Load() }

// consumed publishes that this side has read the peer's ring up to h and
// wakes a peer writer that sleeps for space.
func (s *Stream) consumed(h uint64) error {
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
func (s *Stream) take(p []byte, skip int) error {
	want := len(p) + skip
	for first := true; want > 0; first = false {
		n, err := s.available()
		if err != nil {
			return err
		}
		if n == 0 {
			// Every take is part of a frame: the reader goroutine and a
			// poller (the link's Poll) alike start one only when the ring holds
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
		k := int(min(n, uint64(want), publishChunk))
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
func (s *Stream) Peek(p []byte) bool {
	n, err := s.available()
	if err != nil || n < uint64(len(p)) {
		return false
	}
	off := s.head() & s.rmask
	k := copy(p, s.remote.ring[off:])
	copy(p[k:], s.remote.ring)
	return true
}

func (s *Stream) ReadFull(p []byte) error    { return s.take(p, 0) }
func (s *Stream) ReadPayload(p []byte) error { return s.take(p, 0) }
func (s *Stream) Discard(n int) error        { return s.take(nil, n) }

// free is how many bytes this side's ring can take (the write lock's
// holder).
func (s *Stream) free() (uint64, error) { return s.room(s.tail) }

// room is how many bytes this side's ring can take past tail.
func (s *Stream) room(tail uint64) (uint64, error) {
	used := tail - s.remote.word(offHead).Load()
	if used > s.wsize {
		return 0, errCorrupt
	}
	return s.wsize - used, nil
}

// published shows the peer what was written and wakes its reader if it
// sleeps.
func (s *Stream) published() error {
	s.local.word(offTail).Store(s.tail)
	if v := s.remote.word(offReaderWait).Load(); v&1 == 1 && v != s.wokeRead {
		s.wokeRead = v
		s.wakes.Add(1)
		return signal(s.peerDataFd)
	}
	return nil
}

func (s *Stream) Writev(iov []unix.Iovec, wait bool) (rest []unix.Iovec, err error) {
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
			return iov, ErrClosed
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
		k := min(room, iov[0].Len, publishChunk-unpublished)
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
		if unpublished == publishChunk {
			unpublished = 0
			if err := s.published(); err != nil {
				return iov, err
			}
		}
	}
	return iov, nil
}

// PassFds are what the peer gets: this side's region, read-only, and the
// eventfds it sleeps on.
func (s *Stream) PassFds() []int { return []int{s.localRO, s.dataFd, s.spaceFd} }

// ClosePassed closes the read-only region descriptor once the peer has its
// copy.
func (s *Stream) ClosePassed() {
	if s.localRO >= 0 {
		_ = unix.Close(s.localRO)
		s.localRO = -1
	}
}

// Shutdown wakes this side's blocked reader and writer; every later wait
// and transfer fails with ErrClosed. It may be called from any goroutine.
func (s *Stream) Shutdown() {
	s.closed.Store(true)
	wake(s.dataFd)
	wake(s.spaceFd)
}

// Close unmaps the rings and closes the stream's descriptors, once its
// reader and writer are out (after Shutdown); WatchWords reports false
// from then on. It is idempotent.
func (s *Stream) Close() {
	s.closeOnce.Do(func() {
		if s.local == nil {
			return // never joined
		}
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
		fds := []int{s.localRO, s.peerDataFd, s.peerSpaceFd}
		if s.data == nil {
			fds = append(fds, s.dataFd)
		}
		if s.space == nil {
			fds = append(fds, s.spaceFd)
		}
		closeAll(fds)
	})
}

// AddPulled shows the peer's watchdog that this side copies out of the
// peer's shared memory (a one-copy receive): k more bytes pulled, which
// move neither ring word. The caller holds the reader's token.
func (s *Stream) AddPulled(k int) { s.local.word(offPulled).Add(uint64(k)) }

// RestParks counts a poller's parks while it waited for the rest of a
// frame.
func (s *Stream) RestParks() uint64 { return s.restParks.Load() }

// unexpected turns EOF inside a frame into ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
