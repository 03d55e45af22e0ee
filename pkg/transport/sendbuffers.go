package transport

import (
	"errors"
	"fmt"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// The connection's own send buffers (urma_shm_send_buffers, urmaConn.ownSend)
// are a pool of sq buffers, registered with remote read under a token
// nobody is told. The shm fabric shares a segment that allows remote read
// with the peer a SEND from it goes to, which then copies the payload once,
// straight from this memory, instead of through the ring. The engine pool
// cannot be shared that way without showing every peer the receive buffers
// of every connection; this region only ever holds what the connection
// sends to that one peer.

// wantsSendBuffers says whether connections get send buffers of their own:
// only on the shm fabric (the one fabric that sends by reference), and not
// when the whole pool is shared already (urma_pool_remote_read).
func (e *engine) wantsSendBuffers() bool {
	f := e.s.flags
	return e.fabric.name == FabricShm && f.ShmSendBuffers && !f.PoolRemoteRead
}

// newConnSendBuffers maps and registers count buffers of the engine's size.
func (e *engine) newConnSendBuffers(count int) (*bufferPool, error) {
	pool, err := allocPool(e.bufSize, count, urma.AllocMemory, func(mem *urma.Memory) (urma.Segment, error) {
		// A token of its own, never sent in a hello: no peer can import
		// the segment for a READ; only the fabric's SEND by reference
		// reaches it.
		return e.uctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessRead, TokenPolicy: urma.TokenPlainText, Token: randomToken()})
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
