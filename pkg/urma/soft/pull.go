package soft

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// One-copy SEND on the shm fabric. A segment registered with remote read
// access, on memory from urma.AllocMemory (a sealed memfd), is shared with
// the peer the first time a SEND from it goes there: the sender passes a
// read-only descriptor over the connection's unix socket (SEG_MAP) under a
// handle of its choosing, and the peer maps it (SEG_MAPPED). From then on a
// SEND from that segment crosses the ring as a SEND_REF, the references of
// its payload, and the receiver copies the bytes once, from the sender's
// memory straight into the posted receive buffer. The sender's slot holds
// the segment until the receiver's answer, so the memory stays put while it
// is read; unregistering the segment unshares it (SEG_UNMAP).
//
// Sharing hands the peer a read-only view of the whole segment: register
// with remote access only memory that every peer you send from it may read.
// The view is read-only by its descriptor only: the segment's memfd
// (urma.AllocMemory, which may be opened read-write on purpose, see
// urma.OpenMemory) cannot be sealed against writers, so a hostile peer can
// reopen it writable through /proc/self/fd. Share only memory whose
// contents that peer may also change: the transport's connections share
// their own send buffers, which hold only what goes to that one peer.
// Local-only segments (the transport's buffer pool, by default) always
// cross the ring as copies.

const (
	// pullMin is the smallest payload sent by reference: below it the
	// ring's copy costs less than the receiver's reach into other memory.
	pullMin = 4 << 10
)

// share is a segment this side shared with the peer, or tried to.
type share struct {
	handle uint32
	ready  bool // the peer mapped it
	failed bool // it cannot be shared: send from it by copy
}

// pullState is a shm connection's sharing, both ways.
type pullState struct {
	// Sending: what this side shared, by segment.
	shareMu    sync.Mutex
	shared     map[*segment]*share
	byHandle   map[uint32]*share
	nextHandle uint32
	ctlClosed  bool // the unix socket is closed: send nothing on it
	// queued are the SEG_UNMAPs and SEG_MAPPED answers that found the unix
	// socket full, in order: sendQueued sends them, waiting for room, while
	// sending is set (sender counts it). Neither unregistering nor the
	// control reader may wait for room: two readers that each waited to
	// answer the other's SEG_MAPs, each socket full of its own side's,
	// would wait for each other for good. A lost SEG_UNMAP would leave
	// the peer mapping memory this side unregistered, and counting it
	// against Options.MaxPeerSegments, for the connection's life; a lost answer
	// would leave the peer copying from that segment. answers counts the
	// SEG_MAPPEDs among queued (maxQueuedAnswers).
	queued  []shmSegMsg
	answers int
	sending bool
	sender  sync.WaitGroup
	ctlErr  error // why sendQueued gave up on a live socket

	// Receiving: the peer's segments this side mapped, by handle. Readers
	// hold mapMu while they copy, so an unmap waits for them.
	mapMu  sync.RWMutex
	mapped map[uint32][]byte
	// mappedBytes is the sum of mapped's lengths, bounded by
	// budget.perConn; the provider's budget holds them too.
	mappedBytes uint64
	budget      *mapBudget
	// announced is one past the highest handle the peer announced in a
	// SEG_MAP, mapped or refused (0: none). The peer allocates handles
	// increasing and never reuses one, so a handle below announced that is
	// not mapped was refused or unmapped since: one word remembers them
	// all, whatever the peer sends.
	announced uint64
}

// retired reports whether handle, which is not mapped, is one the peer
// announced: refused, or unmapped since. The caller holds mapMu.
func (p *pullState) retired(handle uint32) bool {
	return uint64(handle) < p.announced
}

// shareable reports whether a segment may be shared with peers: remote
// read access on memory another process can map.
func (s *segment) shareable() bool {
	return s.cfg.Access&urma.AccessRead != 0 && s.mem != nil && s.mem.Fd() >= 0
}

// refsFor describes payload as references into shared segments, starting
// to share those that are not yet; ok is false when any is not shareable or
// not yet mapped by the peer (the send then goes by copy).
func (s *shmIO) refsFor(payload []sgeRef, out []payloadRef) ([]payloadRef, bool) {
	for i := range payload {
		r := &payload[i]
		if len(r.buf) == 0 {
			continue
		}
		if !r.seg.shareable() {
			return out, false
		}
		handle, ready := s.share(r.seg)
		if !ready {
			return out, false
		}
		off := uintptr(unsafe.Pointer(unsafe.SliceData(r.buf))) - uintptr(unsafe.Pointer(unsafe.SliceData(r.seg.buf)))
		out = append(out, payloadRef{handle: handle, length: uint32(len(r.buf)), offset: uint64(off)})
	}
	return out, len(out) > 0
}

// share returns seg's handle and whether the peer has mapped it, sending
// SEG_MAP the first time.
func (s *shmIO) share(seg *segment) (uint32, bool) {
	p := &s.pull
	p.shareMu.Lock()
	defer p.shareMu.Unlock()
	if sh, ok := p.shared[seg]; ok {
		return sh.handle, sh.ready && !sh.failed
	}
	p.nextHandle++
	sh := &share{handle: p.nextHandle}
	if p.shared == nil {
		p.shared, p.byHandle = make(map[*segment]*share), make(map[uint32]*share)
	}
	p.shared[seg], p.byHandle[sh.handle] = sh, sh
	if p.ctlClosed || !seg.addSharer(s) {
		sh.failed = true // the connection or the segment is going away
		return sh.handle, false
	}
	ro, err := shmring.ReopenReadOnly(seg.mem.Fd())
	if err == nil {
		var b [shmSegMsgLen]byte
		msg := encodeShmSeg(b[:], &shmSegMsg{typ: shmMsgSegMap, handle: sh.handle, length: uint64(len(seg.buf))})
		err = unix.Sendmsg(s.ctlFd, msg, unix.UnixRights(ro), nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		_ = unix.Close(ro)
	}
	if err != nil {
		sh.failed = true
	}
	return sh.handle, false
}

// unshare forgets seg, which is being unregistered, and tells the peer to
// unmap it.
func (s *shmIO) unshare(seg *segment) {
	p := &s.pull
	p.shareMu.Lock()
	defer p.shareMu.Unlock()
	sh, ok := p.shared[seg]
	if !ok {
		return
	}
	delete(p.shared, seg)
	delete(p.byHandle, sh.handle)
	if sh.failed {
		return // the peer never mapped it
	}
	// Unregistering must not block on the peer: what does not fit now
	// waits in the queue. A hung-up peer takes its mapping with it.
	_ = s.sendCtlLocked(shmSegMsg{typ: shmMsgSegUnmap, handle: sh.handle})
}

// sendCtlLocked sends m, which carries no descriptor, on the unix socket
// without waiting for room: at once when nothing is queued and the socket
// has room, else after what is queued, by sendQueued. It fails only when
// the peer hung up (peerHungUp: nothing to send to) or, for an answer,
// when the peer leaves more than maxQueuedAnswers of them unread. The
// caller holds shareMu.
func (s *shmIO) sendCtlLocked(m shmSegMsg) error {
	p := &s.pull
	if p.ctlClosed {
		return nil // the connection is gone, and with it what m says
	}
	if !p.sending {
		err := sendSeg(s.ctlFd, &m, unix.MSG_DONTWAIT)
		if err == nil || peerHungUp(err) {
			return err
		}
		// Full (EAGAIN), or short of memory: sendQueued waits and retries.
		p.sending = true
		p.sender.Add(1)
		go s.sendQueued()
	}
	if m.typ == shmMsgSegMapped {
		if p.answers >= maxQueuedAnswers {
			return fmt.Errorf("peer leaves its shm socket unread: %d answers to its SEG_MAPs wait", p.answers)
		}
		p.answers++
	}
	p.queued = append(p.queued, m)
	return nil
}

// maxQueuedAnswers bounds the answers to a peer's SEG_MAPs that wait for
// it to read its socket. A peer's reader reads on while its answers wait
// (they are queued too), so an honest peer leaves answers unread only for
// the moment its reader is busy, far fewer than this; one that sends
// SEG_MAPs and never reads would otherwise grow the queue without end.
const maxQueuedAnswers = 4 * DefaultMaxPeerSegments

// sendQueued sends the queued control messages in order, each waiting for
// room in the unix socket, until none is left or the socket breaks. It
// runs apart from the control reader, which reads on meanwhile, so the
// peer's reader is never kept waiting on this side. shutdown wakes it;
// close waits for it.
func (s *shmIO) sendQueued() {
	p := &s.pull
	defer p.sender.Done()
	p.shareMu.Lock()
	defer p.shareMu.Unlock()
	for len(p.queued) > 0 && !p.ctlClosed {
		m := p.queued[0]
		p.shareMu.Unlock()
		err := sendSeg(s.ctlFd, &m, 0)
		p.shareMu.Lock()
		if err != nil {
			if !peerHungUp(err) {
				// The peer would keep a mapping, or wait for an answer:
				// end the connection, and with it both (watch reports why).
				what := "SEG_UNMAP"
				if m.typ == shmMsgSegMapped {
					what = "answer to SEG_MAP"
				}
				p.ctlErr = fmt.Errorf("send %s: %w", what, err)
				_ = unix.Shutdown(s.ctlFd, unix.SHUT_RDWR)
			}
			break
		}
		p.queued = p.queued[1:]
		if m.typ == shmMsgSegMapped {
			p.answers--
		}
	}
	p.queued, p.answers, p.sending = nil, 0, false
}

// sendSeg sends one SEG_UNMAP or SEG_MAPPED with flags (MSG_DONTWAIT or 0).
func sendSeg(fd int, m *shmSegMsg, flags int) error {
	var b [shmSegMsgLen]byte
	msg := encodeShmSeg(b[:], m)
	for {
		err := unix.Sendmsg(fd, msg, nil, nil, flags|unix.MSG_NOSIGNAL)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// peerHungUp reports whether a send on the unix socket failed because it
// is closed, at either end.
func peerHungUp(err error) bool {
	return errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET)
}

// onControl handles one control message after the handshake; it owns fds.
// What the peer got wrong comes back as a protocolError; a failure to
// answer it is the socket's, most often a peer that hung up meanwhile.
func (s *shmIO) onControl(msg []byte, fds []int) error {
	m, err := decodeShmSeg(msg)
	if err != nil {
		closeAll(fds)
		return protocolError{err}
	}
	want := 0
	if m.typ == shmMsgSegMap {
		want = shmSegMapFds
	}
	if len(fds) != want {
		closeAll(fds)
		return protocolError{fmt.Errorf("shm message type %d with %d descriptors, want %d", m.typ, len(fds), want)}
	}
	p := &s.pull
	switch m.typ {
	case shmMsgSegMap:
		status := uint8(0)
		if err := s.mapPeerSegment(m.handle, m.length, fds[0]); err != nil {
			status = 1 // refused: the peer sends by copy
			if s.refusedMap != nil {
				s.refusedMap(m.handle, err)
			}
		}
		// Never a blocking send: this goroutine must read on (sendCtlLocked).
		p.shareMu.Lock()
		err := s.sendCtlLocked(shmSegMsg{typ: shmMsgSegMapped, status: status, handle: m.handle})
		p.shareMu.Unlock()
		if err != nil {
			if peerHungUp(err) {
				return fmt.Errorf("peer closed its shm socket before the answer to its SEG_MAP: %w", err)
			}
			return err
		}
	case shmMsgSegMapped:
		p.shareMu.Lock()
		if sh := p.byHandle[m.handle]; sh != nil {
			sh.ready, sh.failed = m.status == 0, sh.failed || m.status != 0
		}
		p.shareMu.Unlock()
	case shmMsgSegUnmap:
		p.mapMu.Lock()
		b, ok := p.mapped[m.handle]
		if ok {
			p.unmapLocked(m.handle, b)
		}
		retired := !ok && p.retired(m.handle)
		p.mapMu.Unlock()
		switch {
		case ok:
		case !retired:
			return protocolError{fmt.Errorf("SEG_UNMAP of handle %d, which the peer never shared", m.handle)}
		}
		// A handle this side refused (the peer unregistered the segment
		// before the refusal reached it) or unmapped already: nothing to do.
	}
	return nil
}

// mapPeerSegment maps a segment the peer shares, read-only. It takes
// ownership of fd.
func (s *shmIO) mapPeerSegment(handle uint32, length uint64, fd int) error {
	defer unix.Close(fd)
	p := &s.pull
	p.mapMu.Lock()
	_, dup := p.mapped[handle]
	reused := !dup && p.retired(handle)
	n := len(p.mapped)
	// Announced, whether this side maps it or not: a SEND_REF or
	// SEG_UNMAP naming it later is not a protocol error (retired). This
	// happens before the answer, the only thing the peer waits for.
	p.announced = max(p.announced, uint64(handle)+1)
	p.mapMu.Unlock()
	b := p.budget
	switch {
	case dup:
		return fmt.Errorf("handle %d is already mapped", handle)
	case reused:
		return fmt.Errorf("handle %d was shared before", handle)
	case n >= b.perConnCount:
		return fmt.Errorf("the peer shares more than %d segments, the most Options.MaxPeerSegments allows", b.perConnCount)
	case length == 0:
		return errors.New("segment of 0 bytes")
	}
	size, err := shmring.SealedSize(fd)
	if err != nil {
		return err
	}
	if uint64(size) < length {
		return fmt.Errorf("segment memfd of %d bytes, %d announced", size, length)
	}
	// Reserve before mapping, both bounds, so that no two SEG_MAPs pass
	// one bound together.
	p.mapMu.Lock()
	if length > b.perConn || p.mappedBytes > b.perConn-length {
		p.mapMu.Unlock()
		return fmt.Errorf("a segment of %d bytes would make %d bytes mapped from this peer, more than Options.MaxMappedPerConn (%d) allows", length, p.mappedBytes+length, b.perConn)
	}
	if err := b.take(length); err != nil {
		p.mapMu.Unlock()
		return err
	}
	p.mappedBytes += length
	p.mapMu.Unlock()
	m, err := unix.Mmap(fd, 0, int(length), unix.PROT_READ, unix.MAP_SHARED)
	p.mapMu.Lock()
	defer p.mapMu.Unlock()
	if err != nil {
		p.mappedBytes -= length
		b.give(length)
		return fmt.Errorf("map the peer's segment of %d bytes: %w", length, err)
	}
	if p.mapped == nil {
		p.mapped = make(map[uint32][]byte)
	}
	p.mapped[handle] = m
	return nil
}

// unmapLocked unmaps a peer segment and returns its bytes to the bounds;
// the caller holds mapMu.
func (p *pullState) unmapLocked(handle uint32, b []byte) {
	delete(p.mapped, handle)
	_ = unix.Munmap(b)
	p.mappedBytes -= uint64(len(b))
	p.budget.give(uint64(len(b)))
}

// unmapAll drops every peer segment (the connection is gone).
func (p *pullState) unmapAll() {
	p.mapMu.Lock()
	defer p.mapMu.Unlock()
	for h, b := range p.mapped {
		p.unmapLocked(h, b)
	}
}

var errUnknownHandle = errors.New("SEND_REF names a segment the peer has not shared")

// errRetiredHandle says a SEND_REF names a segment the peer shared and
// then unshared (its SEG_UNMAP, on the unix socket, overtook the SEND_REF
// in the ring: the peer unregistered the segment after closing the
// sending jetty), or that this side refused to map: not a protocol error,
// the receiver answers REM_ACCESS_ABORT.
var errRetiredHandle = errors.New("SEND_REF names a segment the peer no longer shares")

// pullChunk is the most a pull copies at a time (see refPayload.read):
// a few milliseconds of copying at most, and at least the size from which
// Go's copy streams (1 MiB), so that a large pull copies as it did whole.
const pullChunk = 4 << 20

// refPayload is a SEND_REF's payload: slices of the peer's mapped segments,
// read in order. Its holder holds mapMu (read) until it is done. s is the
// connection it came on (nil in tests of resolve).
type refPayload struct {
	parts [MaxSGE][]byte
	n, i  int
	s     *shmIO
}

// resolve checks refs against the mapped segments and points the payload
// at them; the caller holds p.mapMu for reading. A reference to a retired
// handle makes it return errRetiredHandle, unless another breaks the
// protocol.
func (p *pullState) resolve(refs []payloadRef, out *refPayload) error {
	out.n, out.i = 0, 0
	var retired bool
	for _, r := range refs {
		b, ok := p.mapped[r.handle]
		if !ok {
			if !p.retired(r.handle) {
				return errUnknownHandle
			}
			retired = true
			continue
		}
		if r.offset > uint64(len(b)) || uint64(r.length) > uint64(len(b))-r.offset {
			return fmt.Errorf("SEND_REF reaches past its segment (%d+%d of %d bytes)", r.offset, r.length, len(b))
		}
		if r.length > 0 {
			out.parts[out.n] = b[r.offset : r.offset+uint64(r.length)]
			out.n++
		}
	}
	if retired {
		clear(out.parts[:out.n])
		out.n = 0
		return errRetiredHandle
	}
	return nil
}

// read copies the next bytes into dst, at most pullChunk at a time.
func (r *refPayload) read(dst []byte) error {
	for len(dst) > 0 {
		if r.i >= r.n {
			return errors.New("SEND_REF payload shorter than its length")
		}
		k := copy(dst[:min(len(dst), pullChunk)], r.parts[r.i])
		r.parts[r.i] = r.parts[r.i][k:]
		if len(r.parts[r.i]) == 0 {
			r.i++
		}
		dst = dst[k:]
		if r.s != nil {
			r.s.pulledChunk(k)
		}
	}
	return nil
}

// pulledChunk shows the peer's watchdog that a pull progresses: it moves
// neither ring word, and a large one takes long (see watchShm). The
// caller holds the reader's token.
func (s *shmIO) pulledChunk(k int) {
	s.AddPulled(k)
	if f := s.afterPullChunk.Load(); f != nil {
		(*f)()
	}
}

func (r *refPayload) skip() error { return nil }

// release drops the slices, which point into the peer's memory.
func (r *refPayload) release() { clear(r.parts[:r.n]) }
