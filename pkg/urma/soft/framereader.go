package soft

import (
	"errors"
	"io"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// frameSource is where a connection's reader takes frames from: a socket
// or a shared-memory ring. Header bytes are copied out (so nothing the peer
// changes afterwards matters); payloads go straight into their destination.
type frameSource interface {
	// ReadFull fills p, waiting for bytes as needed; io.EOF when the
	// stream ends before the first byte, io.ErrUnexpectedEOF after it.
	ReadFull(p []byte) error
	// ReadPayload fills p with the next payload bytes, copying each byte
	// once where the source allows it.
	ReadPayload(p []byte) error
	// Discard skips n bytes.
	Discard(n int) error
	// Buffered is how many bytes can be read without waiting.
	Buffered() int
	// BeginFrame says that the reader starts a frame, EndFrame that it
	// read the whole of it: the bound on how long the peer may take over
	// the frame's rest (framebound.For) starts again with each frame.
	BeginFrame()
	EndFrame()
}

// directReadMin is the payload remainder from which sockReader reads into
// the destination itself, instead of through its buffer.
const directReadMin = 16 << 10

// sockReader reads a blocking socket through a buffer for headers and small
// payloads, and straight into the destination for large ones: one readv(2)
// fills the rest of the payload and reads ahead into the buffer, so a large
// payload costs one copy and no extra syscall.
type sockReader struct {
	fd   int       // blocking descriptor; -1 reads src instead
	src  io.Reader // tests and fuzzing
	n    *atomic.Uint64
	buf  []byte
	r, w int
	// frame counts the frames read, twice each: it is odd from a frame's
	// first byte to its end, for the watchdog to time the frame
	// (fabricSide.watchFrame). frameNext says that a frame began before
	// its first byte came: fill counts it when it does, so that a reader
	// waiting between frames for an idle peer is not in a frame.
	frame     atomic.Uint64
	frameNext bool
}

func newSockReader(fd int, src io.Reader, n *atomic.Uint64) *sockReader {
	return &sockReader{fd: fd, src: src, n: n, buf: make([]byte, ioBufSize)}
}

func (s *sockReader) Buffered() int { return s.w - s.r }

func (s *sockReader) BeginFrame() {
	if s.r < s.w {
		s.frame.Add(1)
	} else {
		s.frameNext = true
	}
}

func (s *sockReader) EndFrame() { s.frame.Add(1) }

// fill reads at least one more byte into the buffer.
func (s *sockReader) fill() error {
	if s.r > 0 {
		s.w = copy(s.buf, s.buf[s.r:s.w])
		s.r = 0
	}
	n, err := s.read(s.buf[s.w:], nil)
	s.w += n
	if n > 0 && s.frameNext {
		s.frameNext = false
		s.frame.Add(1)
	}
	return err
}

// read reads into p, then q, with one syscall; it never returns 0 bytes
// without an error.
func (s *sockReader) read(p, q []byte) (int, error) {
	if s.fd < 0 {
		n, err := s.src.Read(p)
		if n == 0 && err == nil {
			err = io.ErrNoProgress
		}
		s.n.Add(uint64(n))
		return n, err
	}
	for {
		var n int
		var err error
		if len(q) == 0 {
			n, err = unix.Read(s.fd, p)
		} else {
			iov := [2]unix.Iovec{{Base: unsafe.SliceData(p)}, {Base: unsafe.SliceData(q)}}
			iov[0].SetLen(len(p))
			iov[1].SetLen(len(q))
			r, _, e := unix.Syscall(unix.SYS_READV, uintptr(s.fd), uintptr(unsafe.Pointer(&iov[0])), 2)
			n = int(r)
			if e != 0 {
				n, err = 0, e
			}
		}
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		s.n.Add(uint64(n))
		return n, nil
	}
}

func (s *sockReader) ReadFull(p []byte) error {
	for first := true; len(p) > 0; first = false {
		if s.r == s.w {
			if err := s.fill(); err != nil {
				if first {
					return err // EOF between frames is a clean end
				}
				return unexpected(err)
			}
		}
		k := copy(p, s.buf[s.r:s.w])
		s.r += k
		p = p[k:]
	}
	return nil
}

func (s *sockReader) ReadPayload(p []byte) error {
	k := copy(p, s.buf[s.r:s.w])
	s.r += k
	p = p[k:]
	for len(p) >= directReadMin && s.fd >= 0 {
		s.r, s.w = 0, 0
		n, err := s.read(p, s.buf)
		if err != nil {
			return unexpected(err)
		}
		if n <= len(p) {
			p = p[n:]
			continue
		}
		s.w = n - len(p)
		p = nil
	}
	return s.ReadFull(p)
}

func (s *sockReader) Discard(n int) error {
	for n > 0 {
		if s.r == s.w {
			if err := s.fill(); err != nil {
				return unexpected(err)
			}
		}
		k := min(n, s.w-s.r)
		s.r += k
		n -= k
	}
	return nil
}

// unexpected turns EOF inside a frame into ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

const ioBufSize = 128 << 10
