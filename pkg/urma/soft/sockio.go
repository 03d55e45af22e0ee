package soft

import (
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Established fabric connections run on raw, blocking file descriptors
// rather than through Go's network poller. Readiness found by the poller is
// noticed only when a P looks for it; goroutines that busy-poll completion
// queues (runtime.Gosched in a loop, as a polling transport does) keep every
// P busy, and the poller is then consulted about every 10ms. A thread that
// returns from a blocking read(2) instead queues its goroutine at once.

// detachFD takes the socket out of a handshaken net.Conn: a duplicate
// descriptor in blocking mode, the original closed (and deregistered from
// the poller).
func detachFD(nc net.Conn) (fd int, local, remote string, err error) {
	local, remote = addrString(nc.LocalAddr()), addrString(nc.RemoteAddr())
	defer nc.Close()
	tc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, local, remote, fmt.Errorf("connection %T has no descriptor", nc)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return -1, local, remote, fmt.Errorf("take socket of %s: %w", remote, err)
	}
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, local, remote, fmt.Errorf("take socket of %s: %w", remote, err)
	}
	if derr != nil {
		return -1, local, remote, fmt.Errorf("duplicate socket of %s: %w", remote, derr)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		_ = unix.Close(fd)
		return -1, local, remote, fmt.Errorf("make socket of %s blocking: %w", remote, err)
	}
	return fd, local, remote, nil
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// sockIO is a connection's TCP socket: a blocking descriptor, read through
// a sockReader and written with sendmsg.
type sockIO struct {
	*sockReader
	fd     int
	rx, tx atomic.Uint64
}

// newSockIO wraps a blocking descriptor; src, when not nil, is read
// instead of it (tests and fuzzing).
func newSockIO(fd int, src io.Reader) *sockIO {
	s := &sockIO{fd: fd}
	rfd := fd
	if src != nil {
		rfd = -1
	}
	s.sockReader = newSockReader(rfd, src, &s.rx)
	return s
}

func (s *sockIO) Counters() (rx, tx *atomic.Uint64) { return &s.rx, &s.tx }

func (s *sockIO) Writev(iov []unix.Iovec, wait bool) ([]unix.Iovec, error) {
	return sendIov(s.fd, iov, wait, &s.tx)
}

// shutdown wakes the reader and writer out of blocking calls; the
// descriptor stays open until close, so its number cannot be reused under
// them.
func (s *sockIO) Shutdown() { _ = unix.Shutdown(s.fd, unix.SHUT_RDWR) }

func (s *sockIO) Close() { _ = unix.Close(s.fd) }

// iovMax is the kernel's limit on iovecs per sendmsg (UIO_MAXIOV).
const iovMax = 1024

// appendIov adds b to iov.
func appendIov(iov []unix.Iovec, b []byte) []unix.Iovec {
	if len(b) == 0 {
		return iov
	}
	v := unix.Iovec{Base: unsafe.SliceData(b)}
	v.SetLen(len(b))
	return append(iov, v)
}

// sendIov writes as much of iov as one sendmsg(2) takes and returns what is
// left. With wait false it never blocks (MSG_DONTWAIT) and reports EAGAIN
// when the socket is full. MSG_NOSIGNAL: a broken connection is an error,
// not a SIGPIPE.
func sendIov(fd int, iov []unix.Iovec, wait bool, count *atomic.Uint64) ([]unix.Iovec, error) {
	flags := unix.MSG_NOSIGNAL
	if !wait {
		flags |= unix.MSG_DONTWAIT
	}
	for {
		var msg unix.Msghdr
		msg.Iov = &iov[0]
		msg.SetIovlen(min(len(iov), iovMax))
		r, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), uintptr(flags))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return iov, e
		}
		n := uint64(r)
		count.Add(n)
		for n > 0 {
			if n >= iov[0].Len {
				n -= iov[0].Len
				iov = iov[1:]
				continue
			}
			iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(iov[0].Base), n))
			iov[0].Len -= n
			n = 0
		}
		return iov, nil
	}
}
