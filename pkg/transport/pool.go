package transport

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// ErrPoolExhausted is returned when the registered buffer pool has no free
// buffer and the configuration says not to wait (Config.FailWhenPoolDry).
// The pool never hands out memory that is not registered.
var ErrPoolExhausted = errors.New("registered buffer pool exhausted")

// Buffer is one fixed-size buffer of the registered pool (or, on a TCP-mode
// connection, of ordinary memory). The zero-copy API hands Buffers out;
// whoever holds one must either pass it to WriteBuffer or Release it.
type Buffer struct {
	pool   *bufferPool
	idx    int32
	data   []byte // the whole buffer
	off, n int    // the valid bytes are data[off:n]
	// recv is the connection whose receive buffer this is, nil for a
	// buffer from the free list, and slot its index there. Releasing a
	// receive buffer reposts it.
	recv *urmaConn
	slot int32
	// held is 1 while the application holds the buffer: Release and
	// WriteBuffer take it back exactly once.
	held atomic.Bool
}

// Bytes is the buffer's content: what was received (ReadBuffer).
func (b *Buffer) Bytes() []byte { return b.data[b.off:b.n] }

// Data is the whole buffer, to fill before WriteBuffer.
func (b *Buffer) Data() []byte { return b.data }

// Len is len(Bytes()).
func (b *Buffer) Len() int { return b.n - b.off }

// Release gives the buffer back: a received buffer is reposted to its
// connection (returning its receive credit to the sender), any other goes
// back to the pool. Releasing twice is a no-op.
func (b *Buffer) Release() {
	if !b.held.CompareAndSwap(true, false) {
		return
	}
	if c := b.recv; c != nil {
		c.recycleRecv(b)
		return
	}
	b.pool.put(b)
}

// bufferPool is a free list over a fixed array of Buffers cut from one
// region, so taking and returning buffers allocates nothing.
type bufferPool struct {
	size int
	bufs []Buffer
	seg  urma.Segment // nil for a heap pool
	mem  *urma.Memory // nil for a heap pool

	mu      sync.Mutex
	free    []int32
	waitCh  chan struct{} // closed when a buffer comes back while someone waits
	outside int           // buffers not on the free list
	waiting int           // callers waiting in get
	retired bool          // the engine is gone: get fails, the last put frees
	onIdle  func()        // after retire: frees the memory once outside is 0
}

// newRegisteredPool cuts count buffers of size bytes from mem, registered as seg.
func newRegisteredPool(mem *urma.Memory, seg urma.Segment, size, count int) *bufferPool {
	p := newPoolOver(mem.Bytes(), size, count)
	p.mem, p.seg = mem, seg
	return p
}

// allocPool maps count buffers of size bytes with alloc and registers them
// with register; nothing stays mapped when it fails.
func allocPool(size, count int, alloc func(int) (*urma.Memory, error), register func(*urma.Memory) (urma.Segment, error)) (*bufferPool, error) {
	mem, err := alloc(size * count)
	if err != nil {
		return nil, fmt.Errorf("allocate %d x %d bytes: %w", count, size, err)
	}
	seg, err := register(mem)
	if err != nil {
		_ = mem.Free()
		return nil, fmt.Errorf("register %d bytes: %w", size*count, err)
	}
	return newRegisteredPool(mem, seg, size, count), nil
}

// unregister ends a registered pool: it unregisters the segment, then
// unmaps the memory once the application has given back every buffer it
// still holds. If the provider refuses the unregistration the memory stays
// mapped: never unmap what a device may still read or write.
func (p *bufferPool) unregister(log logr.Logger, what string) error {
	if err := p.seg.Close(); err != nil {
		return fmt.Errorf("unregister %s (its memory stays mapped): %w", what, err)
	}
	mem := p.mem
	p.retire(func() {
		if err := mem.Free(); err != nil {
			log.Error(err, "unmapping "+what)
		}
	})
	return nil
}

// newHeapPool is a pool of ordinary memory, for TCP-mode connections.
func newHeapPool(size, count int) *bufferPool {
	return newPoolOver(make([]byte, size*count), size, count)
}

func newPoolOver(region []byte, size, count int) *bufferPool {
	p := &bufferPool{size: size, bufs: make([]Buffer, count), free: make([]int32, count)}
	for i := range p.bufs {
		b := &p.bufs[i]
		b.pool, b.idx = p, int32(i)
		b.data = region[i*size : (i+1)*size : (i+1)*size]
		// Lowest indices on top: a lightly used pool keeps touching the
		// same few pages.
		p.free[count-1-i] = int32(i)
	}
	return p
}

// sge describes the first n bytes of b for a work request.
func (p *bufferPool) sge(b *Buffer, n int) urma.SGE {
	return urma.SGE{Segment: p.seg, Offset: uint64(int(b.idx) * p.size), Len: uint32(n)}
}

// get takes a buffer, waiting while the pool is dry until one comes back,
// cancel closes (the connection closed: net.ErrClosed) or expired closes
// (os.ErrDeadlineExceeded). With failFast it returns ErrPoolExhausted at
// once instead of waiting.
func (p *bufferPool) get(cancel, expired <-chan struct{}, failFast bool) (*Buffer, error) {
	return p.getPreferring(nil, cancel, expired, failFast)
}

// getPreferring is get, but takes a buffer of first (when not nil) while
// any is free, and while both pools are dry waits for a buffer to come
// back to either: a writer whose own send buffers come back must not sleep
// on an engine pool that other connections keep dry.
func (p *bufferPool) getPreferring(first *bufferPool, cancel, expired <-chan struct{}, failFast bool) (*Buffer, error) {
	for {
		if first != nil {
			if b := first.tryGet(); b != nil {
				return b, nil
			}
		}
		p.mu.Lock()
		if p.retired {
			p.mu.Unlock()
			return nil, errConnClosed
		}
		if n := len(p.free); n > 0 {
			idx := p.free[n-1]
			p.free = p.free[:n-1]
			p.outside++
			p.mu.Unlock()
			b := &p.bufs[idx]
			b.off, b.n, b.recv = 0, 0, nil
			b.held.Store(true)
			return b, nil
		}
		if failFast {
			p.mu.Unlock()
			return nil, fmt.Errorf("%w: all %d buffers of %d bytes are in use", ErrPoolExhausted, len(p.bufs), p.size)
		}
		ch := p.awaitLocked()
		p.mu.Unlock()
		var firstCh <-chan struct{} // nil without first: never ready
		if first != nil {
			first.mu.Lock()
			firstCh = first.awaitLocked()
			first.mu.Unlock()
			// A buffer put back to first before it was waited on closed
			// no channel: look again now that a put would.
			if b := first.tryGet(); b != nil {
				first.endWait()
				p.endWait()
				return b, nil
			}
		}
		var err error
		select {
		case <-ch:
		case <-firstCh:
		case <-cancel:
			err = errConnClosed
		case <-expired:
			err = os.ErrDeadlineExceeded
		}
		if first != nil {
			first.endWait()
		}
		p.endWait()
		if err != nil {
			return nil, err
		}
	}
}

// awaitLocked registers a waiter and returns the channel that the next
// put closes; p.mu is held. The waiter calls endWait when it stops.
func (p *bufferPool) awaitLocked() <-chan struct{} {
	if p.waitCh == nil {
		p.waitCh = make(chan struct{})
	}
	p.waiting++
	return p.waitCh
}

// endWait ends a wait that awaitLocked registered.
func (p *bufferPool) endWait() {
	p.mu.Lock()
	p.waiting--
	p.mu.Unlock()
}

// waiters is how many callers wait for a buffer.
func (p *bufferPool) waiters() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiting
}

// tryGet takes a buffer if one is free, without waiting.
func (p *bufferPool) tryGet() *Buffer {
	var out [1]*Buffer
	if !p.tryGetN(1, out[:]) {
		return nil
	}
	out[0].held.Store(true)
	return out[0]
}

// tryGetN takes n buffers at once, or none.
func (p *bufferPool) tryGetN(n int, out []*Buffer) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.retired || len(p.free) < n {
		return false
	}
	for i := 0; i < n; i++ {
		idx := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		b := &p.bufs[idx]
		b.off, b.n, b.recv = 0, 0, nil
		out[i] = b
	}
	p.outside += n
	return true
}

// put returns a buffer. The last one back to a retired pool frees its
// memory.
func (p *bufferPool) put(b *Buffer) {
	b.recv = nil
	b.held.Store(false)
	p.mu.Lock()
	p.free = append(p.free, b.idx)
	p.outside--
	if p.waitCh != nil {
		close(p.waitCh)
		p.waitCh = nil
	}
	var free func()
	if p.outside == 0 && p.onIdle != nil {
		free, p.onIdle = p.onIdle, nil
	}
	p.mu.Unlock()
	if free != nil {
		free()
	}
}

// retire ends the pool: get fails from now on, and free runs once every
// buffer is back, at once if they all are. A buffer the application still
// holds after its transport closed so stays mapped until it is released.
func (p *bufferPool) retire(free func()) {
	p.mu.Lock()
	p.retired = true
	if p.outside > 0 {
		p.onIdle = free
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	free()
}

// stats reports free and in-use buffers.
func (p *bufferPool) stats() (free, inUse int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free), p.outside
}
