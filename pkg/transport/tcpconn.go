package transport

import (
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
)

// tcpConn is a connection that fell back to TCP: the TCP connection itself,
// plus bytes the handshake already read from it (a plain client's first
// bytes, or a foreign server's), which Read returns first. The socket
// enforces its own deadlines; closed, rdl and wdl carry Close and the
// deadlines to what waits outside it (the kept bytes, the zero-copy API's
// heap buffers), as they do for a URMA connection.
type tcpConn struct {
	net.Conn
	role     string
	why      fallback
	version  int // hello version exchanged before falling back; 0 if none
	metrics  *metrics.Metrics
	counters metrics.DataCounters

	readMu  sync.Mutex
	prefix  []byte
	heap    *bufferPool // lazily: ZeroCopyConn over TCP uses heap buffers
	heapMu  sync.Mutex
	bufSize int

	closed   chan struct{}
	rdl, wdl *deadline

	bytesSent, bytesReceived atomic.Uint64
	closeOnce                sync.Once
}

var (
	_ Conn         = (*tcpConn)(nil)
	_ ZeroCopyConn = (*tcpConn)(nil)
)

func newTCPConn(c net.Conn, role string, why fallback, prefix []byte, version int, bufSize int, m *metrics.Metrics) *tcpConn {
	t := &tcpConn{
		Conn: c, role: role, why: why, version: version,
		prefix: prefix, bufSize: bufSize, metrics: m, counters: m.Data(metrics.ModeTCP),
		closed: make(chan struct{}), rdl: newDeadline(), wdl: newDeadline(),
	}
	m.ConnOpened(metrics.ModeTCP, role)
	return t
}

func (c *tcpConn) Mode() Mode             { return ModeTCP }
func (c *tcpConn) FallbackReason() string { return c.why.String() }

// Read returns the kept handshake bytes first, then reads the socket. A
// zero-length read goes to the socket, which answers it whatever is kept.
func (c *tcpConn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	if len(c.prefix) > 0 && len(p) > 0 {
		// The socket would refuse these reads; the kept bytes must too.
		if err := c.readErr(); err != nil {
			c.readMu.Unlock()
			return 0, c.opErr("read", err)
		}
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		if len(c.prefix) == 0 {
			c.prefix = nil
		}
		c.readMu.Unlock()
		c.count(0, n)
		return n, nil
	}
	c.readMu.Unlock()
	n, err := c.Conn.Read(p)
	c.count(0, n)
	return n, err
}

// readErr is why a read cannot be served from the kept bytes: the
// connection is closed or the read deadline has passed.
func (c *tcpConn) readErr() error {
	select {
	case <-c.closed:
		return net.ErrClosed
	default:
	}
	if c.rdl.passed() {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// SetDeadline, SetReadDeadline and SetWriteDeadline fail after Close with
// net.ErrClosed, as the socket's do, and arm nothing then.
func (c *tcpConn) SetDeadline(t time.Time) error {
	if err := c.setErr(); err != nil {
		return err
	}
	c.rdl.set(t)
	c.wdl.set(t)
	return c.Conn.SetDeadline(t)
}

func (c *tcpConn) SetReadDeadline(t time.Time) error {
	if err := c.setErr(); err != nil {
		return err
	}
	c.rdl.set(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *tcpConn) SetWriteDeadline(t time.Time) error {
	if err := c.setErr(); err != nil {
		return err
	}
	c.wdl.set(t)
	return c.Conn.SetWriteDeadline(t)
}

// setErr is why a deadline cannot be set: the connection is closed.
func (c *tcpConn) setErr() error {
	select {
	case <-c.closed:
		return c.opErr("set", net.ErrClosed)
	default:
		return nil
	}
}

func (c *tcpConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.count(n, 0)
	return n, err
}

func (c *tcpConn) count(sent, received int) {
	if sent > 0 {
		c.bytesSent.Add(uint64(sent))
		c.counters.BytesSent.Add(float64(sent))
	}
	if received > 0 {
		c.bytesReceived.Add(uint64(received))
		c.counters.BytesReceived.Add(float64(received))
	}
}

// Close closes the socket once; a later Close fails with net.ErrClosed,
// as the socket's own would.
func (c *tcpConn) Close() error { return c.close(true) }

// abort ends a connection no Accept took (Listener.Close) with a reset, as
// the kernel resets those in a closed listener's queue.
func (c *tcpConn) abort() { _ = c.close(false) }

func (c *tcpConn) close(graceful bool) error {
	err := c.opErr("close", net.ErrClosed)
	c.closeOnce.Do(func() {
		close(c.closed)
		c.rdl.stop()
		c.wdl.stop()
		if graceful {
			err = c.Conn.Close()
		} else {
			abortTCP(c.Conn)
			err = nil
		}
		c.metrics.ConnClosed(metrics.ModeTCP, c.role)
	})
	return err
}

// Debug reports the connection's state.
func (c *tcpConn) Debug() DebugInfo {
	return DebugInfo{
		Mode:             ModeTCP,
		Role:             c.role,
		State:            "FALLBACK_TCP",
		FallbackReason:   c.why.String(),
		HandshakeVersion: c.version,
		LocalAddr:        c.LocalAddr().String(),
		RemoteAddr:       c.RemoteAddr().String(),
		BytesSent:        c.bytesSent.Load(),
		BytesReceived:    c.bytesReceived.Load(),
	}
}

// heapPool returns the connection's heap buffers for the zero-copy API,
// created on first use.
func (c *tcpConn) heapPool() *bufferPool {
	c.heapMu.Lock()
	defer c.heapMu.Unlock()
	if c.heap == nil {
		c.heap = newHeapPool(c.bufSize, tcpZeroCopyBuffers)
	}
	return c.heap
}

// tcpZeroCopyBuffers bounds the heap buffers a TCP-mode connection hands
// out through the zero-copy API.
const tcpZeroCopyBuffers = 16

// AllocBuffer returns a buffer to fill and pass to WriteBuffer. In TCP mode
// it is ordinary memory. While all of them are out it waits, within the
// write deadline, until one comes back or the connection closes.
func (c *tcpConn) AllocBuffer() (*Buffer, error) {
	select {
	case <-c.closed:
		return nil, c.opErr("write", net.ErrClosed)
	default:
	}
	b, err := c.heapPool().get(c.closed, c.wdl.done(), false)
	if err != nil {
		return nil, c.opErr("write", err)
	}
	return b, nil
}

// WriteBuffer writes the first n bytes of b and releases it.
func (c *tcpConn) WriteBuffer(b *Buffer, n int) error {
	if err := claimWriteBuffer(b, n); err != nil {
		return c.opErr("write", err)
	}
	_, err := c.Write(b.data[:n])
	b.pool.put(b)
	return err
}

// ReadBuffer reads what is available, up to one buffer, into a buffer the
// caller must Release. While all buffers are out it waits as AllocBuffer
// does, within the read deadline.
func (c *tcpConn) ReadBuffer() (*Buffer, error) {
	b, err := c.heapPool().get(c.closed, c.rdl.done(), false)
	if err != nil {
		return nil, c.opErr("read", err)
	}
	n, err := c.Read(b.data)
	if n == 0 {
		b.Release()
		return nil, err
	}
	b.off, b.n = 0, n
	return b, nil
}

func (c *tcpConn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
