package transport

import (
	"errors"
	"fmt"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// The connection's own send buffers (urmaConn.ownSend) are a pool of one
// buffer per slot of its send window. On the shm fabric
// (urma_shm_send_buffers) they are registered with remote read under a
// token nobody is told: the fabric shares a segment that allows remote
// read with the peer a SEND from it goes to, which then copies the payload
// once, straight from this memory, instead of through the ring. The engine
// pool cannot be shared that way without showing every peer the receive
// buffers of every connection; this region only ever holds what the
// connection sends to that one peer. When the transport sizes buffers
// itself (bufferplan.go) every connection to a peer of ours has them, each
// as large as the peer's receive buffer, so that one SEND carries as much
// as the peer takes.

// sharesSendBuffers says whether the connection's own send buffers are
// shared with its peer: only on the shm fabric (the one fabric that sends
// by reference), and not when the whole pool is shared already
// (urma_pool_remote_read).
func (c *urmaConn) sharesSendBuffers() bool {
	f := c.e.s.flags
	return c.fabricName() == FabricShm && f.ShmSendBuffers && !f.PoolRemoteRead
}

// setUpSends decides, once the peer's hello is applied, what the
// connection sends from and so how large a message is (chunk): buffers of
// its own when it shares them with its peer or the transport sizes them,
// else the engine pool. A connection that cannot have its own says so in
// the log and sends from the pool.
func (c *urmaConn) setUpSends() {
	size := c.e.bufSize
	shared := c.sharesSendBuffers()
	if c.e.autoSized && c.recv.own {
		// A peer of ours, whose buffers are the peer's to size.
		size = min(c.peerBufSize, autoMaxBuffer)
	}
	if shared || size != c.e.bufSize {
		sb, err := c.e.newConnSendBuffers(size, c.windowCap, shared)
		if err != nil {
			// Not fatal: sends from the pool cross the ring by copy.
			c.log.Info("sending from the shared pool", "error", err.Error())
			size = c.e.bufSize
		}
		c.ownSend = sb
	}
	c.chunk = min(size, c.peerBufSize)
}

// newConnSendBuffers maps and registers count buffers of size bytes:
// shared, for the shm fabric's SEND by reference, or private, on small
// pages, touched only as far as messages fill them.
func (e *engine) newConnSendBuffers(size, count int, shared bool) (*bufferPool, error) {
	alloc, cfg := urma.AllocPrivatePages, urma.SegmentConfig{Access: urma.AccessLocalOnly}
	if shared {
		// A token of its own, never sent in a hello: no peer can import
		// the segment for a READ; only the fabric's SEND by reference
		// reaches it.
		alloc, cfg = urma.AllocMemory, urma.SegmentConfig{Access: urma.AccessRead, TokenPolicy: urma.TokenPlainText, Token: randomToken()}
	}
	pool, err := allocPool(size, max(count, 1), alloc, func(mem *urma.Memory) (urma.Segment, error) {
		return e.uctx.RegisterSegment(mem, cfg)
	})
	if err != nil {
		return nil, fmt.Errorf("send buffers: %w", err)
	}
	return pool, nil
}

// ownSendCount is how many send buffers the connection has of its own.
func (c *urmaConn) ownSendCount() int {
	if c.ownSend == nil {
		return 0
	}
	return len(c.ownSend.bufs)
}

// ownsSendBuffer reports whether b is one of the connection's own send
// buffers.
func (c *urmaConn) ownsSendBuffer(b *Buffer) bool {
	return c.ownSend != nil && b.pool == c.ownSend
}

// sendCtxOwn marks the user context of a SEND from the connection's own
// send buffers; without it the context (buffer index + 1) names a buffer of
// the engine pool. Zero is a credit message.
const sendCtxOwn = 1 << 32

// sendCtx is the user context of a SEND of b.
func (c *urmaConn) sendCtx(b *Buffer) uint64 {
	ctx := uint64(b.idx) + 1
	if b.pool != c.pool {
		ctx |= sendCtxOwn
	}
	return ctx
}

// errNoOwnSendBuffers is a send completion that names the connection's own
// send buffers on a connection without them.
var errNoOwnSendBuffers = errors.New("send completion names the connection's own send buffers, which it does not have")

// sentBuffer is the buffer whose SEND completed with user context ctx (not
// zero).
func (c *urmaConn) sentBuffer(ctx uint64) (*Buffer, error) {
	p := c.pool
	if ctx&sendCtxOwn != 0 {
		if c.ownSend == nil {
			return nil, errNoOwnSendBuffers
		}
		p, ctx = c.ownSend, ctx&^sendCtxOwn
	}
	idx := ctx - 1
	if idx >= uint64(len(p.bufs)) {
		return nil, fmt.Errorf("send completion names buffer %d of %d", idx, len(p.bufs))
	}
	return &p.bufs[idx], nil
}
