package soft

import (
	"fmt"
	"io"
	"net"
	"sync/atomic"
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
	local, remote = nc.LocalAddr().String(), nc.RemoteAddr().String()
	defer nc.Close()
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return -1, local, remote, fmt.Errorf("connection %T is not TCP", nc)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return -1, local, remote, fmt.Errorf("take socket of %s: %w", remote, err)
	}
	var derr error
	fd = -1
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

// fdReader reads a blocking descriptor, counting bytes for the watchdog.
type fdReader struct {
	fd int
	n  *atomic.Uint64
}

func (r fdReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := unix.Read(r.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		r.n.Add(uint64(n))
		return n, nil
	}
}

// countReader counts bytes read through another reader (tests, fuzzing).
type countReader struct {
	r io.Reader
	n *atomic.Uint64
}

func (r countReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.n.Add(uint64(n))
	return n, err
}

// iovMax is the kernel's limit on iovecs per writev (UIO_MAXIOV).
const iovMax = 1024

// writevAll writes every buffer with as few writev(2) calls as the kernel
// allows; iov is scratch space, returned for reuse.
func writevAll(fd int, bufs [][]byte, iov []unix.Iovec, count *atomic.Uint64) ([]unix.Iovec, error) {
	iov = iov[:0]
	for _, b := range bufs {
		if len(b) > 0 {
			v := unix.Iovec{Base: unsafe.SliceData(b)}
			v.SetLen(len(b))
			iov = append(iov, v)
		}
	}
	rest := iov
	for len(rest) > 0 {
		k := min(len(rest), iovMax)
		r, _, e := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&rest[0])), uintptr(k))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			clear(iov)
			return iov[:0], e
		}
		n := uint64(r)
		count.Add(n)
		for n > 0 {
			if n >= rest[0].Len {
				n -= rest[0].Len
				rest = rest[1:]
				continue
			}
			rest[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(rest[0].Base), n))
			rest[0].Len -= n
			n = 0
		}
	}
	clear(iov) // drop the pointers into registered memory
	return iov[:0], nil
}
