package transport

import (
	"errors"
	"fmt"
)

// ZeroCopyConn is the zero-copy API every connection of this package
// implements. In URMA mode the buffers are the registered pool itself: a
// WriteBuffer posts the buffer as it is, a ReadBuffer hands over the receive
// buffer the message landed in, and nothing is copied or allocated on the
// way. In TCP mode the same calls work over ordinary memory.
//
// A buffer from AllocBuffer must be passed to WriteBuffer or Released; a
// buffer from ReadBuffer must be Released, which reposts it and lets the
// peer send again (holding received buffers stalls the peer). The byte
// stream is shared with Read and Write: a ReadBuffer returns the rest of a
// message a Read has started.
type ZeroCopyConn interface {
	Conn
	// AllocBuffer takes a free buffer, waiting within the write deadline
	// while the pool is dry (or failing with ErrPoolExhausted, by
	// configuration).
	AllocBuffer() (*Buffer, error)
	// WriteBuffer sends the first n bytes of b as one message and takes b
	// back, whether it succeeds or not. n must not exceed MaxMessage().
	// With n 0 it sends nothing and reports what Write(nil) would.
	WriteBuffer(b *Buffer, n int) error
	// ReadBuffer returns the next received message (or the rest of one),
	// waiting within the read deadline; io.EOF after the peer closed.
	ReadBuffer() (*Buffer, error)
	// MaxMessage is the most bytes one WriteBuffer may send.
	MaxMessage() int
}

// claimWriteBuffer takes b back from the application for WriteBuffer. The
// compare-and-swap makes a concurrent Release, or a second WriteBuffer, find
// it taken, so the buffer cannot be owned twice. A received buffer is never
// claimed (only Release gives it back). On a nil error the caller owns b
// and must send it or put it back in its pool.
func claimWriteBuffer(b *Buffer, n int) error {
	if b == nil {
		return errors.New("write buffer: nil buffer")
	}
	if !b.held.CompareAndSwap(true, false) {
		return errors.New("write buffer: the buffer was already written or released")
	}
	if b.recv != nil {
		b.held.Store(true) // still the application's, to Release
		return errors.New("write buffer: a received buffer cannot be written back; copy it into one from AllocBuffer")
	}
	if n < 0 || n > len(b.data) {
		b.pool.put(b)
		return fmt.Errorf("write buffer: length %d outside 0..%d", n, len(b.data))
	}
	return nil
}

// MaxMessage is the buffer size in TCP mode.
func (c *tcpConn) MaxMessage() int { return c.bufSize }
