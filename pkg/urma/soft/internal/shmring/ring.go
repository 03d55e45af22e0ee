package shmring

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/memcopy"
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

// BeginFrame starts the count of the time waited for a frame's rest.
func (s *Stream) BeginFrame() {
	s.frameWaited = 0
	s.frameRx = s.rx.Load()
}

// EndFrame says the reader read a whole frame; nothing to do on shared
// memory, where BeginFrame restarts the count.
func (s *Stream) EndFrame() {}

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

func (s *Stream) ReadFull(p []byte) error { return s.take(p, 0) }

func (s *Stream) ReadPayload(p []byte) error { return s.take(p, 0) }

func (s *Stream) Discard(n int) error { return s.take(nil, n) }

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
