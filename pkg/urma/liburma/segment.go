//go:build linux && cgo

package liburma

/*
#include "shim.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// segment is registered memory (urma_target_seg_t).
type segment struct {
	ctx *devContext
	c   *C.struct_urma_target_seg
	buf []byte
	va  uint64
	id  urma.SegmentID

	mu   sync.Mutex
	idle sync.Cond // signalled when the last post naming it returns; L is &mu
	deletion
	// posting counts the posts inside liburma that name the segment: they
	// pass s.c, which urma_unregister_seg frees, so Close waits for them.
	posting int
}

var _ urma.Segment = (*segment)(nil)

func registerSegment(c *devContext, mem *urma.Memory, cfg urma.SegmentConfig) (*segment, error) {
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
	if err := c.open(op); err != nil {
		return nil, err
	}
	// The memory is mmap'd, outside the Go heap: its address is no Go
	// pointer and liburma may keep it.
	va := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	var id C.shim_seg_id
	var cerr C.int
	sc := C.shim_register_seg(c.lib.c, c.c, C.uint64_t(va), C.uint64_t(len(buf)), C.uint32_t(cfg.Access),
		C.uint32_t(cfg.TokenPolicy), C.uint32_t(cfg.Token), &id, &cerr)
	if sc == nil {
		return nil, statusErr(op, cerr, "register %d bytes", len(buf))
	}
	s := &segment{ctx: c, c: sc, buf: buf, va: va, id: segmentIDOf(&id)}
	s.idle.L = &s.mu
	if err := c.adopt(s, op); err != nil {
		_ = s.unregister(true) // the adoption error is the one to report
		return nil, err
	}
	return s, nil
}

func segmentIDOf(id *C.shim_seg_id) urma.SegmentID {
	var e urma.EID
	copy(e[:], C.GoBytes(unsafe.Pointer(&id.eid[0]), 16))
	return urma.SegmentID{EID: e, UASID: uint32(id.uasid), VA: uint64(id.va), Len: uint64(id.len), TokenID: uint32(id.token_id)}
}

func (s *segment) Kind() string { return "segment" }

// ID names the segment for peers to import.
func (s *segment) ID() urma.SegmentID { return s.id }

// Bytes is the registered memory; nil once unregistered.
func (s *segment) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	return s.buf
}

// Close unregisters the segment. The device may still be using memory that
// outstanding work requests name: wait for their completions first. A post
// naming the segment that is inside liburma finishes first, since it reads
// the urma_target_seg_t that urma_unregister_seg frees; posts after Close
// fail with ErrClosed. When liburma fails to unregister it, it stays
// registered: call Close again.
func (s *segment) Close() error { return s.unregister(false) }

func (s *segment) ForceClose() { s.ctx.forced(s.unregister(true)) }

func (s *segment) unregister(force bool) error {
	s.mu.Lock()
	if !s.await(&s.mu) {
		s.mu.Unlock()
		return nil
	}
	s.start()
	for s.posting > 0 {
		s.idle.Wait()
	}
	s.mu.Unlock()
	st := C.shim_unregister_seg(s.ctx.lib.c, s.c)
	s.end(&s.mu, st == 0 || force)
	if st == 0 || force {
		s.ctx.release(s)
	}
	if st != 0 {
		return statusErr("unregister_seg", st, "unregister segment %d", s.id.TokenID)
	}
	return nil
}

// pin holds the segment registered while a post that names it is in
// liburma; false once it is unregistered.
func (s *segment) pin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.posting++
	return true
}

func (s *segment) unpin() {
	s.mu.Lock()
	if s.posting--; s.posting == 0 && s.closed {
		s.idle.Broadcast()
	}
	s.mu.Unlock()
}

// pins are the segments one post has pinned. A queue keeps one under its
// lock, beside its scratch work request, so posting allocates nothing.
type pins struct {
	n    int
	segs [C.SHIM_MAX_SGE]*segment
}

// release unpins every segment once the post has returned from liburma.
func (p *pins) release() {
	for i := range p.n {
		p.segs[i].unpin()
		p.segs[i] = nil
	}
	p.n = 0
}

// sge converts an SGE for liburma and pins its segment in p; the caller
// releases p after the post. Only memory this context registered, and only
// within its bounds, reaches the device: liburma would hand anything else
// to it. An unregistered segment fails the post with ErrClosed: its
// urma_target_seg_t is freed, and liburma would read it.
func (c *devContext) sge(op string, in *urma.SGE, out *C.shim_sge, p *pins) error {
	s, ok := in.Segment.(*segment)
	if !ok || s == nil || s.ctx != c {
		return urma.Errorf(op, urma.CodeInval, "SGE segment was not registered by this context")
	}
	size := uint64(len(s.buf))
	if in.Offset > size || uint64(in.Len) > size-in.Offset {
		return urma.Errorf(op, urma.CodeInval, "SGE of %d bytes at offset %d is outside the %d-byte segment", in.Len, in.Offset, size)
	}
	if !s.pin() {
		return urma.Errorf(op, urma.ErrClosed.Code, "SGE names segment %d, which is unregistered", s.id.TokenID)
	}
	p.segs[p.n] = s
	p.n++
	out.addr, out.len, out.tseg = C.uint64_t(s.va+in.Offset), C.uint32_t(in.Len), s.c
	return nil
}

// remoteSegment is an imported segment.
type remoteSegment struct {
	ctx *devContext
	c   *C.struct_urma_target_seg
	id  urma.SegmentID

	mu sync.Mutex
	deletion
}

var _ urma.RemoteSegment = (*remoteSegment)(nil)

func importSegment(c *devContext, id urma.SegmentID, token urma.Token) (*remoteSegment, error) {
	const op = "import_seg"
	if err := c.open(op); err != nil {
		return nil, err
	}
	cid := C.shim_seg_id{eid: cEID(id.EID), uasid: C.uint32_t(id.UASID), token_id: C.uint32_t(id.TokenID), va: C.uint64_t(id.VA), len: C.uint64_t(id.Len)}
	var cerr C.int
	sc := C.shim_import_seg(c.lib.c, c.c, &cid, C.uint32_t(token), &cerr)
	if sc == nil {
		return nil, statusErr(op, cerr, "import segment %s token id %d", id.EID, id.TokenID)
	}
	r := &remoteSegment{ctx: c, c: sc, id: id}
	if err := c.adopt(r, op); err != nil {
		_ = r.unimport(true) // the adoption error is the one to report
		return nil, err
	}
	return r, nil
}

func (r *remoteSegment) Kind() string       { return "remote segment" }
func (r *remoteSegment) ID() urma.SegmentID { return r.id }

// Close unimports the segment. When liburma fails to unimport it, it stays
// imported: call Close again.
func (r *remoteSegment) Close() error { return r.unimport(false) }

func (r *remoteSegment) ForceClose() { r.ctx.forced(r.unimport(true)) }

func (r *remoteSegment) unimport(force bool) error {
	r.mu.Lock()
	if !r.await(&r.mu) {
		r.mu.Unlock()
		return nil
	}
	r.start()
	r.mu.Unlock()
	st := C.shim_unimport_seg(r.ctx.lib.c, r.c)
	r.end(&r.mu, st == 0 || force)
	if st == 0 || force {
		r.ctx.release(r)
	}
	if st != 0 {
		return statusErr("unimport_seg", st, "unimport segment %d", r.id.TokenID)
	}
	return nil
}
