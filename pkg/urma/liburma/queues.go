//go:build linux && cgo

package liburma

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// jfce is a completion event channel (urma_jfce_t). Its fd is liburma's;
// Wait polls it and then takes events with urma_wait_jfc and timeout 0,
// since a blocking urma_wait_jfc is an ioctl nothing can interrupt
// (core/urma_cmd.c:2545-2571). A second fd of our own, an eventfd, lets
// Close wake a Wait blocked in poll(2).
type jfce struct {
	ctx  *devContext
	c    *C.struct_urma_jfce
	fd   int
	wake int

	mu   sync.Mutex
	cond *sync.Cond // signalled when a waiter leaves poll(2)
	deletion
	waiters int
	users   int
	jfcs    map[*C.struct_urma_jfc]*jfc // the JFCs whose events come here
	// fired is what urma_wait_jfc fills: no more than the ioctl's own
	// array holds (MAX_JFCE_EVENT_CNT, core/include/urma_cmd.h:1204,1222),
	// though liburma asks the kernel for as many as we do.
	fired   [16]*C.struct_urma_jfc
	cerr    C.int // take's error out-parameter: a field, so it never escapes
	waitErr error // a bad event count's error, held for after the JFCs taken with it
}

var _ urma.JFCE = (*jfce)(nil)

func newJFCE(c *devContext) (*jfce, error) {
	const op = "create_jfce"
	if err := c.open(op); err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, urma.Errorf(op, urma.CodeNoMem, "eventfd: %w", err)
	}
	var fd, cerr C.int
	ce := C.shim_create_jfce(c.lib.c, c.c, &fd, &cerr)
	if ce == nil {
		_ = unix.Close(wake)
		return nil, statusErr(op, cerr, "create a JFCE")
	}
	e := &jfce{ctx: c, c: ce, fd: int(fd), wake: wake, jfcs: make(map[*C.struct_urma_jfc]*jfc)}
	e.cond = sync.NewCond(&e.mu)
	// uburma hands out a blocking fd, and Go's poller takes only
	// non-blocking ones: os.NewFile of a blocking fd gives a File whose
	// RawConn.Read fails at once ("waiting for unsupported file type"), so
	// an event loop on it (pkg/transport) would never sleep. urma_wait_jfc
	// is an ioctl with its own timeout (hw/udma/udma_u_jfc.c
	// udma_u_wait_jfc), which O_NONBLOCK does not change; UB users set the
	// flag the same way before putting the fd into epoll.
	if err := unix.SetNonblock(e.fd, true); err != nil {
		_ = e.destroy(true)
		return nil, urma.Errorf(op, urma.CodeFail, "make the JFCE fd non-blocking: %w", err)
	}
	if err := c.adopt(e, op); err != nil {
		_ = e.destroy(true) // the adoption error is the one to report
		return nil, err
	}
	return e, nil
}

func (e *jfce) Kind() string { return "JFCE" }

// Fd is liburma's event fd; -1 once closed.
func (e *jfce) Fd() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -1
	}
	return e.fd
}

// Wait returns the JFCs that fired, at most len(out). Timeout 0 does not
// block; a negative one blocks until an event or Close.
func (e *jfce) Wait(out []urma.JFC, timeout time.Duration) (int, error) {
	const op = "wait_jfc"
	if len(out) == 0 {
		return 0, urma.Errorf(op, urma.CodeInval, "output slice is empty")
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		e.mu.Lock()
		// A Close wakes the waiters; if its delete fails, they wait again.
		if !e.await(&e.mu) {
			e.mu.Unlock()
			return 0, errClosed(op, "JFCE")
		}
		if err := e.waitErr; err != nil {
			e.waitErr = nil
			e.mu.Unlock()
			return 0, err
		}
		n, err := e.take(out)
		if n > 0 || err != nil || timeout == 0 {
			e.mu.Unlock()
			return n, err
		}
		ms := -1
		if timeout > 0 {
			left := time.Until(deadline)
			if left <= 0 {
				e.mu.Unlock()
				return 0, nil
			}
			ms = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		e.waiters++
		fds := [2]unix.PollFd{{Fd: int32(e.fd), Events: unix.POLLIN}, {Fd: int32(e.wake), Events: unix.POLLIN}}
		e.mu.Unlock()
		_, perr := unix.Poll(fds[:], ms)
		e.mu.Lock()
		e.waiters--
		e.cond.Broadcast()
		e.mu.Unlock()
		if perr != nil && !errors.Is(perr, unix.EINTR) {
			return 0, urma.Errorf(op, urma.CodeFail, "poll the JFCE fd: %w", perr)
		}
	}
}

// take collects fired JFCs without blocking; e.mu is held. Each event
// counts against its JFC until acknowledged.
func (e *jfce) take(out []urma.JFC) (int, error) {
	asked := min(len(out), len(e.fired))
	k := int(C.shim_wait(e.ctx.lib.c, e.c, C.int(asked), 0, &e.fired[0], &e.cerr))
	if k < 0 {
		return 0, statusErr("wait_jfc", e.cerr, "take events (urma_wait_jfc returned %d)", k)
	}
	var bad error
	if k > asked {
		// liburma returns the kernel's count as it is, though it wrote at
		// most the JFCs asked for (core/urma_cmd.c:2568-2571): what lies
		// beyond is stale. The events past those are beyond recovery.
		bad = urma.Errorf("wait_jfc", urma.CodeFail,
			"urma_wait_jfc returned %d events for %d asked; the JFCs of the rest are unknown and their events cannot be acknowledged", k, asked)
		k = asked
	}
	n := 0
	for _, cq := range e.fired[:k] {
		if q := e.jfcs[cq]; q != nil {
			q.reported()
			out[n] = q
			n++
		}
	}
	if bad != nil {
		if n == 0 {
			return 0, bad
		}
		e.waitErr = bad // after the JFCs taken, which must be acknowledged
	}
	return n, nil
}

// Close deletes the JFCE; it fails with ErrBusy while JFCs use it. A Wait
// blocked on it returns ErrClosed. When liburma fails to delete it, it
// stays open (Wait waits on): call Close again.
func (e *jfce) Close() error { return e.destroy(false) }

func (e *jfce) ForceClose() { e.ctx.forced(e.destroy(true)) }

// destroy wakes blocked waiters, waits for them to leave poll(2), and then
// deletes the JFCE: its fd must not be closed under a poller.
func (e *jfce) destroy(force bool) error {
	e.mu.Lock()
	if !e.await(&e.mu) {
		e.mu.Unlock()
		return nil
	}
	if e.users > 0 && !force {
		n := e.users
		e.mu.Unlock()
		return urma.Errorf("delete_jfce", urma.CodeBusy, "%d JFCs still use this JFCE", n)
	}
	e.start()
	_, _ = unix.Write(e.wake, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	for e.waiters > 0 {
		e.cond.Wait()
	}
	e.mu.Unlock()
	st := C.shim_delete_jfce(e.ctx.lib.c, e.c)
	if st != 0 && !force {
		// The JFCE stays: empty the wake fd, or every poll(2) of a Wait
		// would return at once.
		var b [8]byte
		_, _ = unix.Read(e.wake, b[:])
		e.end(&e.mu, false)
		return statusErr("delete_jfce", st, "delete the JFCE")
	}
	e.end(&e.mu, true)
	_ = unix.Close(e.wake)
	e.ctx.release(e)
	if st != 0 {
		return statusErr("delete_jfce", st, "delete the JFCE")
	}
	return nil
}

// reserve counts a JFC about to be created on the JFCE as its user, so
// that Close refuses while urma_create_jfc uses it.
func (e *jfce) reserve() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosed("create_jfc", "JFCE")
	}
	e.users++
	return nil
}

// unreserve drops the count of a JFC whose creation failed.
func (e *jfce) unreserve() {
	e.mu.Lock()
	e.users--
	e.mu.Unlock()
}

// register maps a created JFC, reserved before, for Wait.
func (e *jfce) register(q *jfc) {
	e.mu.Lock()
	e.jfcs[q.c] = q
	e.mu.Unlock()
}

func (e *jfce) detach(q *jfc) {
	e.mu.Lock()
	e.users--
	delete(e.jfcs, q.c)
	e.mu.Unlock()
}

// crBatch is how many records one poll asks liburma for (its shim
// converts through a stack buffer of that size).
const crBatch = 32

// jfc is a completion queue (urma_jfc_t).
//
// Flush has two phases on hardware: the JFC reports FLUSH_ERR_DONE first,
// and only then does urma_flush_jetty return the requests the device never
// handled (hw/udma/udma_u_jfc.c:728-731, udma_u_jfs.c:1188). Poll presents
// them as the Go API documents: the unhandled requests as WR_FLUSH_ERR, in
// order, then FLUSH_ERR_DONE, which it holds back until SetError asks for
// it (a jetty that failed on its own has flushed, but nobody asked).
type jfc struct {
	ctx    *devContext
	c      *C.struct_urma_jfc
	id     uint32
	jfce   *jfce               // the caller's; nil for a polling-only JFC
	hidden *C.struct_urma_jfce // liburma wants a JFCE for every JFC

	mu sync.Mutex
	deletion
	users   int
	jetties map[uint32]*jetty  // jetties sending into this JFC, by id
	crs     [crBatch]C.shim_cr // what urma_poll_jfc returned, being taken
	flushed [crBatch]C.shim_cr // what urma_flush_jetty returned: not crs, which a flush interrupts
	pending []urma.Completion  // records made by flushing, not yet polled
	pollErr error              // a failed poll's or flush's error, held for after the records taken before it
	perr    C.int              // shim_poll's error out-parameter: a field, so it never escapes
	ferr    C.int              // shim_flush_jetty's: not perr, which a flush interrupts

	ackMu     sync.Mutex // guards the event counts and the C pointer for Ack
	events    uint64     // events JFCE.Wait returned for this JFC
	acked     uint64
	forced    bool // Provider.Close: acknowledge every event as it is reported
	destroyed bool
	attached  bool // counted as a user of jfce
}

var _ urma.JFC = (*jfc)(nil)

func newJFC(c *devContext, cfg urma.JFCConfig) (*jfc, error) {
	const op = "create_jfc"
	if err := cfg.Check(c.dev.Caps); err != nil {
		return nil, err
	}
	var e *jfce
	if cfg.JFCE != nil {
		var ok bool
		if e, ok = cfg.JFCE.(*jfce); !ok || e.ctx != c {
			return nil, urma.Errorf(op, urma.CodeInval, "JFCE was not created by this context")
		}
	}
	if err := c.open(op); err != nil {
		return nil, err
	}
	q := &jfc{ctx: c, jfce: e, jetties: make(map[uint32]*jetty)}
	ce := (*C.struct_urma_jfce)(nil)
	if e != nil {
		// A user of e from now: JFCE.Close must not delete it under
		// urma_create_jfc.
		if err := e.reserve(); err != nil {
			return nil, err
		}
		ce = e.c
	} else {
		// brpc (AllocateResources): "The SDK requires every JFC to
		// reference a JFCE". A polling-only JFC gets one nobody waits on.
		var fd, cerr C.int
		if q.hidden = C.shim_create_jfce(c.lib.c, c.c, &fd, &cerr); q.hidden == nil {
			return nil, statusErr(op, cerr, "create the JFCE a polling JFC needs")
		}
		ce = q.hidden
	}
	var id C.uint32_t
	var cerr C.int
	if q.c = C.shim_create_jfc(c.lib.c, c.c, C.uint32_t(cfg.Depth), ce, &id, &cerr); q.c == nil {
		if q.deleteHidden() != nil {
			// The creation's error is the one to report; the context
			// deletes the JFCE again before itself.
			c.keepOrphan(q.hidden)
		}
		if e != nil {
			e.unreserve()
		}
		return nil, statusErr(op, cerr, "create a JFC of depth %d", cfg.Depth)
	}
	q.id = uint32(id)
	if e != nil {
		e.register(q)
		q.attached = true
	}
	if err := c.adopt(q, op); err != nil {
		_ = q.destroy(true) // the adoption error is the one to report
		return nil, err
	}
	return q, nil
}

func (q *jfc) Kind() string { return "JFC" }

// ID is the queue's number within its device.
func (q *jfc) ID() uint32 { return q.id }

// Poll takes up to len(out) records, oldest first. It returns records or
// an error, never both: a caller that checks the error first would drop
// the records. When urma_poll_jfc or a flush it sets off fails, the
// records taken before the failure come first, and the error with the
// Poll after them.
func (q *jfc) Poll(out []urma.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, errClosed("poll_jfc", "JFC")
	}
	n := copy(out, q.pending)
	q.pending = q.pending[:copy(q.pending, q.pending[n:])]
	if q.pollErr != nil {
		if n > 0 {
			return n, nil
		}
		err := q.pollErr
		q.pollErr = nil
		return 0, err
	}
	for n < len(out) {
		want := min(len(out)-n, crBatch)
		k := int(C.shim_poll(q.ctx.lib.c, q.c, C.int(want), &q.crs[0], &q.perr))
		for i := range k {
			n = q.take(&q.crs[i], out, n)
		}
		if q.perr != 0 {
			q.hold(urma.Errorf("poll_jfc", urma.CodeFail, "urma_poll_jfc returned %d (asked for %d records)", int(q.perr), want))
		}
		if q.pollErr != nil || k < want {
			break
		}
	}
	if q.pollErr != nil && n == 0 {
		err := q.pollErr
		q.pollErr = nil
		return 0, err
	}
	return n, nil
}

// hold keeps err for the Poll after the records taken before it; q.mu is
// held.
func (q *jfc) hold(err error) {
	if q.pollErr == nil {
		q.pollErr = err
		return
	}
	q.pollErr = errors.Join(q.pollErr, err)
}

// emit hands one record to the caller or, when out is full, keeps it.
func (q *jfc) emit(c urma.Completion, out []urma.Completion, n int) int {
	if n < len(out) {
		out[n] = c
		return n + 1
	}
	q.pending = append(q.pending, c)
	return n
}

// dropPending forgets the records held for a jetty being deleted; q.mu is
// held. urma_delete_jetty drops the rest from liburma's JFC, matching by
// local id alone (hw/udma/udma_u_jfc.c udma_u_clean_jfc), and so does
// this: ids are reused, and a record that outlived its jetty would be
// taken for the next one's.
func (q *jfc) dropPending(localID uint32) {
	k := 0
	for _, c := range q.pending {
		if c.LocalID != localID {
			q.pending[k] = c
			k++
		}
	}
	clear(q.pending[k:])
	q.pending = q.pending[:k]
}

// take applies one record from liburma; q.mu is held. It takes a jetty's
// mu inside it; PostSend never takes q.mu under j.mu.
func (q *jfc) take(cr *C.shim_cr, out []urma.Completion, n int) int {
	c := completion(cr)
	if c.Recv || cr.jetty == 0 {
		return q.emit(c, out, n)
	}
	j := q.jetties[c.LocalID]
	switch c.Status {
	case urma.StatusSuccess, urma.StatusWRFlushErr:
		return q.emit(c, out, n)
	case urma.StatusWRFlushErrDone:
		if j == nil {
			return n // its jetty is gone, and its flush with it
		}
		// The jetty is in ERROR in liburma: SetError, a send error or the
		// device itself (a jetty error event, with no failed send before
		// it) put it there. Mark it under j.mu before the flush, as a send
		// error does: a PostSend past its state check posts first and is
		// flushed, and later ones fail instead of waiting for good.
		j.mu.Lock()
		j.state.Store(uint32(urma.JettyError))
		j.mu.Unlock()
		j.modified = true // already in ERROR: SetError need not ask again
		n = q.flush(j, out, n)
		j.doneSeen = true
		if j.wantDone && !j.doneGiven {
			j.doneGiven = true
			n = q.emit(urma.Completion{Status: urma.StatusWRFlushErrDone, LocalID: c.LocalID}, out, n)
		}
		return n
	}
	// A send failed: the jetty is in ERROR. Ask liburma to flush the rest,
	// so every outstanding send completes, as the Go API promises.
	n = q.emit(c, out, n)
	if j != nil {
		// Under j.mu, as SetError does: a PostSend past its state check
		// posts first, and the flush below collects that send; later ones
		// see ERROR. udma takes a post on a jetty in ERROR, and one made
		// after the flush would never complete.
		j.mu.Lock()
		j.state.Store(uint32(urma.JettyError))
		j.mu.Unlock()
		q.toError(j)
	}
	return n
}

// toError moves j to ERROR in liburma once; q.mu is held and j is
// registered, so it is not deleted meanwhile.
func (q *jfc) toError(j *jetty) {
	if j.modified {
		return
	}
	j.modified = true
	if st := C.shim_jetty_to_error(q.ctx.lib.c, j.c); st != 0 {
		q.ctx.prov.log.Error(statusErr("modify_jetty", st, "move jetty %d to ERROR", j.id.ID), "a flush will not complete")
	}
}

// flush collects the requests liburma never handled, as WR_FLUSH_ERR.
// urma_flush_jetty fails with EINVAL when asked for more records than the
// jetty's SQ depth (core/urma_cp_api.c), so each call asks for at most that.
// When it fails, or returns more records than asked for, the sends it did
// not return never complete: Poll reports that as its error, after the
// records taken before it, so the caller does not wait for them.
func (q *jfc) flush(j *jetty, out []urma.Completion, n int) int {
	want := int(min(j.sqDepth, crBatch))
	for {
		k := int(C.shim_flush_jetty(q.ctx.lib.c, j.c, C.int(want), &q.flushed[0], &q.ferr))
		if q.ferr != 0 {
			q.hold(urma.Errorf("flush_jetty", urma.CodeFail,
				"urma_flush_jetty returned %d (asked for %d records) flushing jetty %d: the sends it never started have no completion",
				int(q.ferr), want, j.id.ID))
			return n
		}
		for i := range k {
			c := completion(&q.flushed[i])
			c.Status = urma.StatusWRFlushErr // WR_UNHANDLED: never started
			n = q.emit(c, out, n)
		}
		if k < want {
			return n
		}
	}
}

// completion converts a record.
func completion(cr *C.shim_cr) urma.Completion {
	c := urma.Completion{
		Status:        urma.Status(cr.status),
		Recv:          cr.recv != 0,
		UserCtx:       uint64(cr.user_ctx),
		CompletionLen: uint32(cr.completion_len),
		LocalID:       uint32(cr.local_id),
		RemoteID:      jettyIDOf(&cr.remote),
	}
	if c.Recv {
		c.Opcode = urma.Opcode(cr.opcode)
		if c.Opcode == urma.CROpSendWithImm || c.Opcode == urma.CROpWriteWithImm {
			c.Imm = uint64(cr.imm)
		}
	}
	if c.Status == urma.StatusWRFlushErrDone {
		c.UserCtx = 0 // liburma leaves it undefined
	}
	return c
}

// Rearm asks for one event on the next record (the next solicited or
// error record when solicitedOnly).
func (q *jfc) Rearm(solicitedOnly bool) error {
	const op = "rearm_jfc"
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return errClosed(op, "JFC")
	}
	if q.jfce == nil {
		return urma.Errorf(op, urma.CodeInval, "JFC %d has no JFCE", q.id)
	}
	s := 0
	if solicitedOnly {
		s = 1
	}
	if st := C.shim_rearm(q.ctx.lib.c, q.c, C.int(s)); st != 0 {
		return statusErr(op, st, "rearm JFC %d", q.id)
	}
	return nil
}

// reported counts an event JFCE.Wait returned for this JFC. Once
// Provider.Close is deleting the JFC, nobody will acknowledge it, so it is
// acknowledged here: urma_delete_jfc waits for that.
func (q *jfc) reported() {
	q.ackMu.Lock()
	q.events++
	if q.forced && !q.destroyed {
		q.acked = q.events
		C.shim_ack(q.ctx.lib.c, q.c, 1)
	}
	q.ackMu.Unlock()
}

// Ack acknowledges n events. Acks beyond the events returned are ignored:
// liburma must never see more acks than events.
func (q *jfc) Ack(n uint32) {
	q.ackMu.Lock()
	defer q.ackMu.Unlock()
	n = uint32(min(uint64(n), q.events-q.acked))
	if n == 0 || q.destroyed {
		return
	}
	q.acked += uint64(n)
	C.shim_ack(q.ctx.lib.c, q.c, C.uint32_t(n))
}

// Close deletes the JFC; it fails with ErrBusy while JFRs or jetties use
// it. Otherwise urma_delete_jfc blocks until every event was acknowledged
// (core/urma_cmd.c:1174-1185), and so does Close. When liburma fails to
// delete it, it stays open: call Close again.
func (q *jfc) Close() error { return q.destroy(false) }

// ForceClose acknowledges what is outstanding first, and every event
// reported from now on: Provider.Close tears down whoever would have. That
// also lets a Close already waiting in urma_delete_jfc return; ForceClose
// waits for whichever delete runs (and deletes the JFC itself when that
// one failed), so that the JFCE and the context go only after the JFC.
func (q *jfc) ForceClose() {
	q.ackMu.Lock()
	q.forced = true
	if left := q.events - q.acked; left > 0 && !q.destroyed {
		q.acked = q.events
		C.shim_ack(q.ctx.lib.c, q.c, C.uint32_t(left))
	}
	q.ackMu.Unlock()
	q.ctx.forced(q.destroy(true))
}

// destroy deletes the JFC; urma_delete_jfc waits for the events reported
// to be acknowledged. The JFCE mapping stays until the delete returns, so
// events Wait takes meanwhile still count. A polling-only JFC's hidden JFCE
// goes after it; when that delete fails, the JFC stays closed to every verb
// (liburma's is gone) but a child of its context, and the next destroy
// deletes only the JFCE.
func (q *jfc) destroy(force bool) error {
	q.mu.Lock()
	inLiburma := q.await(&q.mu)
	if !inLiburma && q.hidden == nil {
		q.mu.Unlock()
		return nil
	}
	if inLiburma && q.users > 0 && !force {
		n := q.users
		q.mu.Unlock()
		return urma.Errorf("delete_jfc", urma.CodeBusy, "%d JFRs or jetties still use JFC %d", n, q.id)
	}
	q.start()
	q.mu.Unlock()
	var err error
	if inLiburma {
		st := C.shim_delete_jfc(q.ctx.lib.c, q.c)
		if st != 0 && !force {
			q.end(&q.mu, false)
			return statusErr("delete_jfc", st, "delete JFC %d", q.id)
		}
		if st != 0 {
			err = statusErr("delete_jfc", st, "delete JFC %d", q.id)
		}
		q.ackMu.Lock()
		q.destroyed = true
		q.ackMu.Unlock()
		if q.attached {
			q.jfce.detach(q)
		}
		q.mu.Lock()
		q.pending = nil
		q.mu.Unlock()
	}
	if herr := q.deleteHidden(); herr != nil {
		err = errors.Join(err, herr)
		if !force {
			q.end(&q.mu, true) // closed for good: only the JFCE is left
			return err
		}
		q.hidden = nil // the provider is closing: nothing reaches liburma after
	}
	q.end(&q.mu, true)
	q.ctx.release(q)
	return err
}

// deleteHidden deletes the JFCE of a polling-only JFC, once the JFC is
// gone. A JFCE liburma fails to delete is kept, to delete again.
func (q *jfc) deleteHidden() error {
	if q.hidden == nil {
		return nil
	}
	if st := C.shim_delete_jfce(q.ctx.lib.c, q.hidden); st != 0 {
		return statusErr("delete_jfce", st, "delete the JFCE of polling JFC %d", q.id)
	}
	q.hidden = nil
	return nil
}

// attach counts a JFR or jetty completing here.
func (q *jfc) attach(op string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return errClosed(op, "JFC")
	}
	q.users++
	return nil
}

func (q *jfc) detach() {
	q.mu.Lock()
	q.users--
	q.mu.Unlock()
}
