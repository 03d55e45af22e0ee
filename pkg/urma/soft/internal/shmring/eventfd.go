package shmring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

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
