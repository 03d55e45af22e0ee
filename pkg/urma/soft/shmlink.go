package soft

import (
	"errors"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// shmIO is what an shm connection runs on: the byte stream over the two
// rings (shmring.Stream, embedded, so that the reader and writer reach it
// with no pointer in between), the unix socket that stays open as the
// liveness signal and carries the sharing of registered memory, and that
// sharing (pull.go). It implements linkIO.
type shmIO struct {
	shmring.Stream

	// ctlFd is the connection's unix socket once the handshake is done:
	// the liveness signal and the channel for sharing memory. watchers
	// counts the goroutine reading it.
	ctlFd    int
	watchers sync.WaitGroup

	// pulls counts the SENDs that went by reference.
	pulls atomic.Uint64
	// pollerBudget is how long a Poll reads frames (pollerReadBudget).
	pollerBudget time.Duration

	closeOnce sync.Once

	pull pullState // one-copy SENDs (pull.go)
	// refusedMap, when set, hears of each peer segment refused (logs).
	refusedMap func(handle uint32, err error)
	// afterPullChunk, set by tests, runs after each chunk a pull copies.
	afterPullChunk atomic.Pointer[func()]
}

// newShmIO joins this side's ends (its ring of ringSize bytes) with the
// peer's, whose ring has peerRing bytes (see shmring.Stream.Join, which
// takes ownership of the ends and the peer's descriptors, also on error).
func newShmIO(e *shmring.Ends, ringSize, peerRing int, peerFds []int, spin time.Duration) (*shmIO, error) {
	s := &shmIO{ctlFd: -1, pollerBudget: pollerReadBudget}
	if err := s.Join(e, ringSize, peerRing, peerFds, spin); err != nil {
		return nil, err
	}
	s.Stall = defaultPeerTimeout
	s.pull.budget = newMapBudget(Options{}) // its own; shmSide.join gives the provider's
	return s, nil
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

// Shutdown wakes this side's blocked reader, writer and control reader;
// every later wait fails.
func (s *shmIO) Shutdown() {
	s.Stream.Shutdown()
	if s.ctlFd >= 0 {
		_ = unix.Shutdown(s.ctlFd, unix.SHUT_RDWR)
	}
}

// Close releases everything once the reader, the writer and the control
// reader are out.
func (s *shmIO) Close() {
	s.closeOnce.Do(func() {
		s.watchers.Wait()
		s.pull.shareMu.Lock()
		s.pull.ctlClosed = true // unshare must not write to a closed, maybe reused, number
		shared := slices.Collect(maps.Keys(s.pull.shared))
		s.pull.shareMu.Unlock()
		if s.ctlFd >= 0 {
			_ = unix.Shutdown(s.ctlFd, unix.SHUT_RDWR) // wakes sendQueued, if Shutdown did not
		}
		s.pull.sender.Wait()         // it writes to ctlFd, closed below
		for _, seg := range shared { // outside shareMu: unshareAll locks the segment first
			seg.removeSharer(s)
		}
		s.pull.unmapAll()
		s.Stream.Close()
		closeAll([]int{s.ctlFd})
	})
}

// watch reads the control socket until it breaks: the peer's death (or its
// orderly close) fails the connection (fail).
func (s *shmIO) watch(fail func(error)) {
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
			fail(err)
			return
		}
		fds, perr := parseRights(oob[:oobn])
		if perr == nil && flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			perr = errors.New("control message or its descriptors truncated")
		}
		if perr != nil {
			closeAll(fds)
			fail(protocolError{perr})
			return
		}
		// onControl tells the peer's violations (protocolError) from a
		// peer that hung up before its answer, which is no violation.
		if err := s.onControl(buf[:n], fds); err != nil {
			fail(err)
			return
		}
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}
