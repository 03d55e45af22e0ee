package soft

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// segment is registered mmap'd memory. refs counts the work requests whose
// SGEs point into it: unregistering while any is outstanding fails with
// ErrBusy, so the provider never touches memory the caller has let go of.
type segment struct {
	ctx *devContext
	mem *urma.Memory
	buf []byte
	id  urma.SegmentID
	cfg urma.SegmentConfig

	refs   atomic.Int64
	closed atomic.Bool
	mu     sync.Mutex // serialises Close

	// sharers are the links that shared this segment with their peer
	// (shm: one-copy SENDs, pull.go); unregistering unshares it.
	sharersMu sync.Mutex
	sharers   []sharer
	unshared  bool
}

var _ urma.Segment = (*segment)(nil)

func newSegment(c *devContext, mem *urma.Memory, cfg urma.SegmentConfig) (*segment, error) {
	const op = "register_seg"
	if mem == nil {
		return nil, urma.Errorf(op, urma.CodeInval, "memory is nil; allocate it with urma.AllocMemory")
	}
	buf := mem.Bytes()
	if len(buf) == 0 {
		return nil, urma.Errorf(op, urma.CodeInval, "memory is freed")
	}
	if err := cfg.Access.Validate(); err != nil {
		return nil, err
	}
	if cfg.TokenPolicy > urma.TokenAllEncrypted {
		return nil, urma.Errorf(op, urma.CodeInval, "token policy %d unknown", cfg.TokenPolicy)
	}
	s := &segment{ctx: c, mem: mem, buf: buf, cfg: cfg}
	s.id = urma.SegmentID{
		EID:   c.eid,
		UASID: c.uasid,
		VA:    uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		Len:   uint64(len(buf)),
	}
	// The id is whole before the context adopts the segment: from then on
	// a Provider.Close running meanwhile may unregister it (ForceClose).
	s.id.TokenID = c.dev.addSegment(s)
	if err := c.adopt(s, op); err != nil {
		c.dev.removeSegment(s.id.TokenID)
		return nil, err
	}
	return s, nil
}

func (s *segment) Kind() string { return "segment" }

// ID names the segment for peers to import.
func (s *segment) ID() urma.SegmentID { return s.id }

// Bytes is the registered memory; nil once unregistered.
func (s *segment) Bytes() []byte {
	if s.closed.Load() {
		return nil
	}
	return s.buf
}

// acquire takes a reference for a work request; it fails once the segment is
// closed. Paired with Close's store-then-load, one of the two always sees the
// other.
func (s *segment) acquire() bool {
	s.refs.Add(1)
	if s.closed.Load() {
		s.refs.Add(-1)
		return false
	}
	return true
}

func (s *segment) release() { s.refs.Add(-1) }

// Close unregisters the segment; it fails with ErrBusy while work requests
// still reference it.
func (s *segment) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil
	}
	s.closed.Store(true)
	if n := s.refs.Load(); n != 0 {
		s.closed.Store(false)
		return urma.Errorf("unregister_seg", urma.CodeBusy, "segment %d is referenced by %d outstanding work request SGEs", s.id.TokenID, n)
	}
	s.ctx.dev.removeSegment(s.id.TokenID)
	s.ctx.release(s)
	s.unshareAll()
	return nil
}

// forceClose unregisters regardless of references: Provider.Close has
// already stopped everything that could use them.
func (s *segment) ForceClose() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) {
		return
	}
	s.ctx.dev.removeSegment(s.id.TokenID)
	s.ctx.release(s)
	s.unshareAll()
}

// sharer is a link that shared a segment with its peer and forgets it,
// telling the peer, when the segment is unregistered.
type sharer interface{ unshare(*segment) }

// addSharer records a connection that shares the segment; false once the
// segment is unregistered.
func (s *segment) addSharer(c sharer) bool {
	s.sharersMu.Lock()
	defer s.sharersMu.Unlock()
	if s.unshared {
		return false
	}
	s.sharers = append(s.sharers, c)
	return true
}

// removeSharer forgets a connection that closed, so that a long-lived
// segment does not hold every connection it was ever sent over.
func (s *segment) removeSharer(c sharer) {
	s.sharersMu.Lock()
	defer s.sharersMu.Unlock()
	s.sharers = slices.DeleteFunc(s.sharers, func(x sharer) bool { return x == c })
}

// unshareAll tells every connection that shared the segment to forget it.
func (s *segment) unshareAll() {
	s.sharersMu.Lock()
	sharers := s.sharers
	s.sharers, s.unshared = nil, true
	s.sharersMu.Unlock()
	for _, c := range sharers {
		c.unshare(s)
	}
}

// sgeRef is a validated SGE: the exact bytes, and the segment it holds a
// reference on.
type sgeRef struct {
	seg *segment
	buf []byte
}

// resolveSGE validates an SGE against the context's segments and takes a
// reference; ok is false for a foreign, unregistered or out-of-bounds SGE
// (LOC_ACCESS), in which case nothing is held.
func resolveSGE(c *devContext, sge *urma.SGE) (r sgeRef, ok bool) {
	seg, isOurs := sge.Segment.(*segment)
	if !isOurs || seg == nil || seg.ctx != c {
		return sgeRef{}, false
	}
	size := uint64(len(seg.buf))
	if sge.Offset > size || uint64(sge.Len) > size-sge.Offset {
		return sgeRef{}, false
	}
	if !seg.acquire() {
		return sgeRef{}, false
	}
	return sgeRef{seg: seg, buf: seg.buf[sge.Offset : sge.Offset+uint64(sge.Len) : sge.Offset+uint64(sge.Len)]}, true
}

func releaseSGEs(refs []sgeRef) {
	for i := range refs {
		if refs[i].seg != nil {
			refs[i].seg.release()
		}
		refs[i] = sgeRef{}
	}
}

// scatter copies src into the dst pieces in order; it returns the bytes
// copied, which is len(src) when the pieces are large enough.
func scatter(dst []sgeRef, src []byte) int {
	n := 0
	for i := range dst {
		if len(src) == 0 {
			break
		}
		c := copy(dst[i].buf, src)
		src = src[c:]
		n += c
	}
	return n
}

var _ urma.RemoteSegment = (*remoteSegment)(nil)
