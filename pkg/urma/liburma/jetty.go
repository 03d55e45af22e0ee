//go:build linux && cgo

package liburma

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// jfr is a receive queue (urma_jfr_t) that jetties share.
type jfr struct {
	ctx    *devContext
	c      *C.struct_urma_jfr
	id     urma.JettyID
	mode   urma.TransportMode
	maxSGE uint32
	jfc    *jfc

	mu sync.Mutex
	deletion
	users   int
	scratch C.shim_recv // the work request being posted, under mu
	pins    pins        // the segments scratch names, under mu
}

var _ urma.JFR = (*jfr)(nil)

func newJFR(c *devContext, cfg urma.JFRConfig) (*jfr, error) {
	const op = "create_jfr"
	if err := cfg.Check(c.dev.Caps); err != nil {
		return nil, err
	}
	q, ok := cfg.JFC.(*jfc)
	if !ok || q == nil || q.ctx != c {
		return nil, urma.Errorf(op, urma.CodeInval, "JFC is missing or was not created by this context")
	}
	if err := q.attach(op); err != nil {
		return nil, err
	}
	r := &jfr{ctx: c, mode: cfg.Mode, maxSGE: max(cfg.MaxSGE, 1), jfc: q}
	in := C.shim_jfr_cfg{
		depth: C.uint32_t(cfg.Depth), mode: C.uint32_t(modeBits(cfg.Mode)), max_sge: C.uint32_t(r.maxSGE),
		min_rnr_timer: C.uint32_t(cfg.MinRNRTimer), token_policy: C.uint32_t(cfg.TokenPolicy), token: C.uint32_t(cfg.Token),
	}
	var id C.shim_id
	var cerr C.int
	if r.c = C.shim_create_jfr(c.lib.c, c.c, &in, q.c, &id, &cerr); r.c == nil {
		q.detach()
		return nil, statusErr(op, cerr, "create a JFR of depth %d", cfg.Depth)
	}
	r.id = jettyIDOf(&id)
	if err := c.adopt(r, op); err != nil {
		_ = r.destroy(true) // the adoption error is the one to report
		return nil, err
	}
	return r, nil
}

// modeBits is urma_transport_mode_t.
func modeBits(m urma.TransportMode) urma.TransMode {
	if m == urma.RC {
		return urma.TransModeRC
	}
	return urma.TransModeRM
}

func (r *jfr) Kind() string { return "JFR" }

// ID names the JFR.
func (r *jfr) ID() urma.JettyID { return r.id }

// PostRecv posts one receive; a full queue fails with ErrAgain. An SGE
// outside a segment of this context fails the call: liburma would hand it
// to the device.
func (r *jfr) PostRecv(wr *urma.RecvWR) error {
	const op = "post_jfr_wr"
	if err := wr.CheckPost(r.maxSGE); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errClosed(op, "JFR")
	}
	defer r.pins.release() // before the unlock: pins is under r.mu
	s := &r.scratch
	s.user_ctx, s.nsge = C.uint64_t(wr.UserCtx), C.uint32_t(len(wr.SGEs))
	for i := range wr.SGEs {
		if err := r.ctx.sge(op, &wr.SGEs[i], &s.sges[i], &r.pins); err != nil {
			return err
		}
	}
	// &r.scratch, spelled out: cgo then checks only that field for Go
	// pointers, not the whole jfr.
	if st := C.shim_post_recv(r.ctx.lib.c, r.c, &r.scratch); st != 0 {
		return postErr(op, st, "post a receive to JFR %d", r.id.ID)
	}
	return nil
}

// Close deletes the JFR; it fails with ErrBusy while jetties share it.
// When liburma fails to delete it, it stays open: call Close again.
func (r *jfr) Close() error { return r.destroy(false) }

func (r *jfr) ForceClose() { r.ctx.forced(r.destroy(true)) }

func (r *jfr) destroy(force bool) error {
	r.mu.Lock()
	if !r.await(&r.mu) {
		r.mu.Unlock()
		return nil
	}
	if r.users > 0 && !force {
		n := r.users
		r.mu.Unlock()
		return urma.Errorf("delete_jfr", urma.CodeBusy, "%d jetties still use JFR %d", n, r.id.ID)
	}
	r.start()
	r.mu.Unlock()
	st := C.shim_delete_jfr(r.ctx.lib.c, r.c)
	r.end(&r.mu, st == 0 || force)
	if st == 0 || force {
		r.jfc.detach()
		r.ctx.release(r)
	}
	if st != 0 {
		return statusErr("delete_jfr", st, "delete JFR %d", r.id.ID)
	}
	return nil
}

func (r *jfr) attach() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errClosed("create_jetty", "JFR")
	}
	r.users++
	return nil
}

func (r *jfr) detach() {
	r.mu.Lock()
	r.users--
	r.mu.Unlock()
}

// jetty is a send queue on a shared JFR (urma_jetty_t).
type jetty struct {
	ctx       *devContext
	c         *C.struct_urma_jetty
	id        urma.JettyID
	mode      urma.TransportMode
	maxSGE    uint32
	maxInline uint32
	sqDepth   uint32
	sendJFC   *jfc
	jfr       *jfr
	state     atomic.Uint32 // urma.JettyState

	mu sync.Mutex // orders posts, the RC binding and Close
	deletion
	bound   *remoteJetty // RC: bound at the first send
	scratch C.shim_send  // the work request being posted, under mu
	pins    pins         // the segments scratch names, under mu

	// Flush state, under sendJFC.mu: see jfc.
	modified  bool // asked liburma to move the jetty to ERROR
	wantDone  bool // SetError was called
	doneSeen  bool // liburma reported FLUSH_ERR_DONE
	doneGiven bool // FLUSH_ERR_DONE was handed to the caller
}

var _ urma.Jetty = (*jetty)(nil)

func newJetty(c *devContext, cfg urma.JettyConfig) (*jetty, error) {
	const op = "create_jetty"
	q, ok := cfg.SendJFC.(*jfc)
	if !ok || q == nil || q.ctx != c {
		return nil, urma.Errorf(op, urma.CodeInval, "send JFC is missing or was not created by this context")
	}
	r, ok := cfg.JFR.(*jfr)
	if !ok || r == nil || r.ctx != c {
		return nil, urma.Errorf(op, urma.CodeInval, "JFR is missing or was not created by this context")
	}
	if err := cfg.Check(c.dev.Caps, r.mode); err != nil {
		return nil, err
	}
	if err := q.attach(op); err != nil {
		return nil, err
	}
	if err := r.attach(); err != nil {
		q.detach()
		return nil, err
	}
	j := &jetty{ctx: c, mode: cfg.Mode, maxSGE: max(cfg.MaxSGE, 1), maxInline: cfg.MaxInline, sqDepth: cfg.SQDepth, sendJFC: q, jfr: r}
	in := C.shim_jetty_cfg{
		depth: C.uint32_t(cfg.SQDepth), mode: C.uint32_t(modeBits(cfg.Mode)), priority: C.uint32_t(cfg.Priority),
		max_sge: C.uint32_t(j.maxSGE), max_inline: C.uint32_t(cfg.MaxInline),
		rnr_retry: C.uint32_t(cfg.RNRRetry), err_timeout: C.uint32_t(cfg.ErrTimeout),
	}
	var id C.shim_id
	var cerr C.int
	if j.c = C.shim_create_jetty(c.lib.c, c.c, &in, q.c, r.c, &id, &cerr); j.c == nil {
		r.detach()
		q.detach()
		return nil, statusErr(op, cerr, "create a jetty of SQ depth %d", cfg.SQDepth)
	}
	j.id = jettyIDOf(&id)
	q.mu.Lock()
	q.jetties[j.id.ID] = j
	q.mu.Unlock()
	if err := c.adopt(j, op); err != nil {
		_ = j.close(true) // the adoption error is the one to report
		return nil, err
	}
	return j, nil
}

func (j *jetty) Kind() string { return "jetty" }

// ID names the jetty.
func (j *jetty) ID() urma.JettyID { return j.id }

// State is READY or ERROR.
func (j *jetty) State() urma.JettyState { return urma.JettyState(j.state.Load()) }

// PostSend posts one send: a full queue fails with ErrAgain, a jetty in
// ERROR with ErrInval. An RC jetty is bound (urma_bind_jetty) to the target
// of its first send and ignores wr.Target after.
func (j *jetty) PostSend(wr *urma.SendWR) error {
	const op = "post_jetty_send_wr"
	if err := wr.CheckPost(j.maxSGE); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.closed:
		return errClosed(op, "jetty")
	case j.State() != urma.JettyReady:
		return urma.Errorf(op, urma.CodeInval, "jetty %d is in ERROR", j.id.ID)
	}
	t := j.bound // a bound target cannot be unimported
	if t == nil {
		var err error
		if t, err = j.target(op, wr.Target); err != nil {
			return err
		}
		// Hold the import: it must not be unimported under the post.
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.closed {
			return errClosed(op, "target jetty")
		}
	}
	defer j.pins.release() // before the unlock: pins is under j.mu
	s := &j.scratch
	s.opcode, s.user_ctx, s.imm = C.uint32_t(wr.Opcode), C.uint64_t(wr.UserCtx), C.uint64_t(wr.Imm)
	s.complete, s.solicited, s.inline_data = flag(wr.Flags, urma.SendCompleteEnable), flag(wr.Flags, urma.SendSolicitedEnable), flag(wr.Flags, urma.SendInline)
	s.nsge = C.uint32_t(len(wr.SGEs))
	var total uint64
	for i := range wr.SGEs {
		if err := j.ctx.sge(op, &wr.SGEs[i], &s.sges[i], &j.pins); err != nil {
			return err
		}
		total += uint64(wr.SGEs[i].Len)
	}
	if s.inline_data != 0 && total > uint64(j.maxInline) {
		return urma.Errorf(op, urma.CodeInval, "%d bytes inline, the jetty takes at most %d", total, j.maxInline)
	}
	if j.mode == urma.RC && j.bound == nil {
		if err := j.bind(t); err != nil {
			return err
		}
	}
	if st := C.shim_post_send(j.ctx.lib.c, j.c, t.c, &j.scratch); st != 0 {
		return postErr(op, st, "post a send on jetty %d", j.id.ID)
	}
	return nil
}

func flag(f, bit urma.SendFlags) C.uint32_t {
	if f&bit != 0 {
		return 1
	}
	return 0
}

// target checks the target of an RM send or an RC jetty's first send.
func (j *jetty) target(op string, target urma.RemoteJetty) (*remoteJetty, error) {
	t, ok := target.(*remoteJetty)
	switch {
	case !ok || t == nil || t.ctx != j.ctx:
		return nil, urma.Errorf(op, urma.CodeInval, "target was not imported by this jetty's context")
	case t.mode != j.mode:
		return nil, urma.Errorf(op, urma.CodeInval, "target imported as %s, jetty is %s", t.mode, j.mode)
	}
	return t, nil
}

// bind binds an RC jetty to its target; j.mu and t.mu are held.
func (j *jetty) bind(t *remoteJetty) error {
	if st := C.shim_bind_jetty(j.ctx.lib.c, j.c, t.c); st != 0 {
		return statusErr("bind_jetty", st, "bind jetty %d to %s/%d", j.id.ID, t.id.EID, t.id.ID)
	}
	t.bound++
	j.bound = t
	return nil
}

// SetError moves the jetty to ERROR. Its sends complete with WR_FLUSH_ERR,
// then one WR_FLUSH_ERR_DONE follows; only the first call produces it.
func (j *jetty) SetError() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return errClosed("modify_jetty", "jetty")
	}
	j.state.Store(uint32(urma.JettyError))
	j.mu.Unlock()
	q := j.sendJFC
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.jetties[j.id.ID] != j {
		return errClosed("modify_jetty", "jetty") // closed meanwhile
	}
	q.toError(j)
	j.wantDone = true
	if j.doneSeen && !j.doneGiven {
		// liburma's FLUSH_ERR_DONE came (after a send error); the flushed
		// sends went before it.
		j.doneGiven = true
		q.pending = append(q.pending, urma.Completion{Status: urma.StatusWRFlushErrDone, LocalID: j.id.ID})
	}
	return nil
}

// Close deletes the jetty, unbinding an RC target first. Outstanding sends
// are dropped without completions, and so are the jetty's records not yet
// polled, as udma's urma_delete_jetty drops them from its JFCs. When the
// unbind fails the jetty stays open and bound, and Close can be retried:
// liburma refuses to delete a bound RC jetty (URMA_ENOPERM) and to
// unimport its target. When the delete fails the jetty stays open too
// (unbound), and Close can be retried.
func (j *jetty) Close() error { return j.close(false) }

// ForceClose closes the jetty also when its unbind or delete fails: the
// provider is closing, and nothing may reach liburma through the jetty
// after.
func (j *jetty) ForceClose() { j.ctx.forced(j.close(true)) }

func (j *jetty) close(force bool) error {
	j.mu.Lock()
	if !j.await(&j.mu) {
		j.mu.Unlock()
		return nil
	}
	var err error
	if t := j.bound; t != nil {
		if st := C.shim_unbind_jetty(j.ctx.lib.c, j.c); st != 0 {
			err = statusErr("unbind_jetty", st, "unbind jetty %d from %s/%d", j.id.ID, t.id.EID, t.id.ID)
			if !force {
				j.mu.Unlock()
				return err
			}
		}
		t.mu.Lock() // under j.mu, as in PostSend
		t.bound--
		t.mu.Unlock()
		j.bound = nil
	}
	j.start()
	j.mu.Unlock()
	q := j.sendJFC
	q.mu.Lock()
	delete(q.jetties, j.id.ID) // Poll no longer touches it
	q.dropPending(j.id.ID)
	q.mu.Unlock()
	st := C.shim_delete_jetty(j.ctx.lib.c, j.c)
	if st != 0 && !force {
		// liburma keeps the jetty: Poll flushes it again.
		q.mu.Lock()
		q.jetties[j.id.ID] = j
		q.mu.Unlock()
		j.end(&j.mu, false)
		return statusErr("delete_jetty", st, "delete jetty %d", j.id.ID)
	}
	j.end(&j.mu, true)
	if st != 0 {
		err = errors.Join(err, statusErr("delete_jetty", st, "delete jetty %d", j.id.ID))
	}
	j.jfr.detach()
	q.detach()
	j.ctx.release(j)
	return err
}

// remoteJetty is an imported jetty (urma_target_jetty_t).
type remoteJetty struct {
	ctx  *devContext
	c    *C.struct_urma_target_jetty
	id   urma.JettyID
	mode urma.TransportMode

	mu sync.Mutex
	deletion
	bound int // RC jetties bound to it
}

var _ urma.RemoteJetty = (*remoteJetty)(nil)

func importJetty(ctx context.Context, c *devContext, id urma.JettyID, mode urma.TransportMode, token urma.Token) (*remoteJetty, error) {
	const op = "import_jetty"
	if err := c.open(op); err != nil {
		return nil, err
	}
	if mode != urma.RC && mode != urma.RM {
		return nil, urma.Errorf(op, urma.CodeInval, "transport mode %d unknown", mode)
	}
	if ctx != nil {
		if err := ctx.Err(); err != nil {
			return nil, urma.Errorf(op, urma.CodeTimeout, "import jetty %s/%d: %w", id.EID, id.ID, err)
		}
	}
	cid := C.shim_id{eid: cEID(id.EID), uasid: C.uint32_t(id.UASID), id: C.uint32_t(id.ID)}
	var cerr C.int
	tc := C.shim_import_jetty(c.lib.c, c.c, &cid, C.uint32_t(modeBits(mode)), C.uint32_t(token), &cerr)
	if tc == nil {
		return nil, statusErr(op, cerr, "import jetty %s/%d", id.EID, id.ID)
	}
	r := &remoteJetty{ctx: c, c: tc, id: id, mode: mode}
	if err := c.adopt(r, op); err != nil {
		_ = r.unimport(true) // the adoption error is the one to report
		return nil, err
	}
	return r, nil
}

func (r *remoteJetty) Kind() string     { return "remote jetty" }
func (r *remoteJetty) ID() urma.JettyID { return r.id }

// Close unimports the jetty. A bound RC target cannot be unimported
// (hw/udma/udma_u_jetty.c:459-463): ErrBusy until its jetty is closed.
// When liburma fails to unimport it, it stays imported: call Close again.
func (r *remoteJetty) Close() error { return r.unimport(false) }

// ForceClose unimports regardless: Provider.Close deletes the jetties first.
func (r *remoteJetty) ForceClose() { r.ctx.forced(r.unimport(true)) }

func (r *remoteJetty) unimport(force bool) error {
	r.mu.Lock()
	if !r.await(&r.mu) {
		r.mu.Unlock()
		return nil
	}
	if r.bound > 0 && !force {
		r.mu.Unlock()
		return urma.Errorf("unimport_jetty", urma.CodeBusy, "RC target %s/%d is bound to a jetty; close the jetty first", r.id.EID, r.id.ID)
	}
	r.start()
	r.mu.Unlock()
	st := C.shim_unimport_jetty(r.ctx.lib.c, r.c)
	r.end(&r.mu, st == 0 || force)
	if st == 0 || force {
		r.ctx.release(r)
	}
	if st != 0 {
		return statusErr("unimport_jetty", st, "unimport jetty %s/%d", r.id.EID, r.id.ID)
	}
	return nil
}
