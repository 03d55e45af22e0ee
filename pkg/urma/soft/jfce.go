package soft

import (
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// jfce is a completion event channel over a non-blocking Linux eventfd. The
// fd is readable exactly while events are pending: notify makes it readable
// when the first event arrives and Wait drains it when it takes the last, both
// under mu, so readability and the pending list never disagree.
type jfce struct {
	ctx *devContext

	mu      sync.Mutex
	cond    *sync.Cond // signalled when a waiter leaves Wait
	fd      int
	pending []*jfc
	closed  bool
	waiters int // Waits sleeping on fd
	users   int // JFCs attached
	// idle are descriptors of fd in Go's poller for blocked Waits to sleep
	// on: a sleeping Wait parks its goroutine, not a thread, and the event
	// wakes it through the poller, often on the thread that made it (the
	// shm fabric's reader). Each Wait takes its own, since a deadline
	// belongs to a descriptor; they are kept for the next Waits.
	idle    []*pollFile
	readyFn func(uintptr) bool
}

// pollFile is a duplicate of a JFCE's fd in Go's poller.
type pollFile struct {
	f   *os.File
	raw syscall.RawConn
}

var _ urma.JFCE = (*jfce)(nil)

func newJFCE(c *devContext) (*jfce, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, urma.Errorf("create_jfce", urma.CodeNoMem, "eventfd: %w", err)
	}
	e := &jfce{ctx: c, fd: fd}
	e.cond = sync.NewCond(&e.mu)
	e.readyFn = e.ready
	if err := c.adopt(e, "create_jfce"); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return e, nil
}

func (e *jfce) Kind() string { return "JFCE" }

// Fd is the eventfd; -1 once closed.
func (e *jfce) Fd() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -1
	}
	return e.fd
}

// notify queues an event for q; the caller holds q.mu, and each armed JFC
// fires at most once per arm, so pending never holds a JFC twice.
func (e *jfce) notify(q *jfc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.pending = append(e.pending, q)
	if len(e.pending) == 1 {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(e.fd, one[:]) // cannot fail short of the counter overflowing
	}
}

// forget drops q's pending event (q is being destroyed).
func (e *jfce) forget(q *jfc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, p := range e.pending {
		if p == q {
			e.pending = append(e.pending[:i], e.pending[i+1:]...)
			break
		}
	}
	if len(e.pending) == 0 && !e.closed {
		e.drain()
	}
}

// drain resets the eventfd counter to zero; e.mu is held.
func (e *jfce) drain() {
	var b [8]byte
	_, _ = unix.Read(e.fd, b[:]) // EAGAIN when already zero
}

// Wait returns the JFCs that fired, at most len(out). Timeout 0 does not
// block; a negative timeout blocks until an event arrives or the JFCE closes.
// A timeout that expires returns 0 and no error, as urma_wait_jfc does.
func (e *jfce) Wait(out []urma.JFC, timeout time.Duration) (int, error) {
	if len(out) == 0 {
		return 0, urma.Errorf("wait_jfc", urma.CodeInval, "output slice is empty")
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return 0, errClosed("wait_jfc", "JFCE")
		}
		n := 0
		for n < len(out) && n < len(e.pending) {
			out[n] = e.pending[n]
			e.pending[n].reported.Add(1)
			n++
		}
		if n > 0 {
			rest := copy(e.pending, e.pending[n:])
			clear(e.pending[rest:])
			e.pending = e.pending[:rest]
			if rest == 0 {
				e.drain()
			}
			e.mu.Unlock()
			return n, nil
		}
		if timeout == 0 {
			e.mu.Unlock()
			return 0, nil
		}
		if timeout > 0 && !time.Now().Before(deadline) {
			e.mu.Unlock()
			return 0, nil
		}
		w, err := e.takePollFile()
		if err != nil {
			e.mu.Unlock()
			return 0, urma.Errorf("wait_jfc", urma.CodeFail, "poll eventfd: %w", err)
		}
		e.waiters++
		e.mu.Unlock()
		if err = w.f.SetReadDeadline(deadline); err == nil {
			err = w.raw.Read(e.readyFn)
		}
		e.mu.Lock()
		e.waiters--
		e.idle = append(e.idle, w)
		e.cond.Broadcast()
		e.mu.Unlock()
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, urma.Errorf("wait_jfc", urma.CodeFail, "poll eventfd: %w", err)
		}
	}
}

// ready tells a sleeping Wait whether to stop: an event is pending, or the
// JFCE closed. The fd is readable exactly then, so a Wait that goes on
// sleeping sleeps until it changes.
func (e *jfce) ready(uintptr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed || len(e.pending) > 0
}

// takePollFile gives a Wait a descriptor to sleep on; e.mu is held.
func (e *jfce) takePollFile() (*pollFile, error) {
	if n := len(e.idle); n > 0 {
		w := e.idle[n-1]
		e.idle = e.idle[:n-1]
		return w, nil
	}
	fd, err := unix.FcntlInt(uintptr(e.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "jfce eventfd")
	raw, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return &pollFile{f: f, raw: raw}, nil
}

// Close destroys the JFCE; it fails with ErrBusy while JFCs use it. Blocked
// Waits return ErrClosed.
func (e *jfce) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	if e.users > 0 {
		n := e.users
		e.mu.Unlock()
		return urma.Errorf("delete_jfce", urma.CodeBusy, "%d JFCs still use this JFCE", n)
	}
	e.mu.Unlock()
	e.destroy()
	return nil
}

func (e *jfce) ForceClose() { e.destroy() }

// destroy wakes blocked waiters, waits for them to leave, then closes the
// fd: closing it under a waiter would let the number be reused.
func (e *jfce) destroy() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.pending = nil
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(e.fd, one[:])
	for e.waiters > 0 {
		e.cond.Wait()
	}
	for _, w := range e.idle {
		_ = w.f.Close()
	}
	e.idle = nil
	_ = unix.Close(e.fd)
	e.mu.Unlock()
	e.ctx.release(e)
}

// attach counts a JFC that uses this JFCE.
func (e *jfce) attach() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosed("create_jfc", "JFCE")
	}
	e.users++
	return nil
}

func (e *jfce) detach() {
	e.mu.Lock()
	e.users--
	e.mu.Unlock()
}
