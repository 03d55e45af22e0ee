package liburmasoft

import (
	"sync"
	"syscall"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Opcodes of urma_jfs_wr_t (urma_opcode_t) this package maps.
const (
	OpcWrite    = 0x00
	OpcWriteImm = 0x01
	OpcRead     = 0x10
	OpcSend     = 0x40
	OpcSendImm  = 0x41
)

// codeNoPerm is URMA_ENOPERM, what liburma's own checks of binding and
// deleting RC jetties return.
const codeNoPerm = urma.Code(syscall.EPERM)

// JettyConfig is urma_jetty_cfg_t with liburma's values.
type JettyConfig struct {
	ShareJFR   bool   // flag.bs.share_jfr: the only kind of jetty here
	Mode       uint32 // URMA_TM_*
	Depth      uint32
	Priority   uint8
	MaxSGE     uint8
	MaxInline  uint32
	RNRRetry   uint8
	ErrTimeout uint8
	SendJFC    *JFC
	JFR        *JFR
}

// Jetty is a send queue with a shared receive queue (urma_jetty_t).
type Jetty struct {
	ctx   *Context
	j     urma.Jetty
	mode  urma.TransportMode
	depth uint32
	id    uint32
	jfc   *JFC
	jfr   *JFR

	mu        sync.Mutex
	wr        urma.SendWR // reused for every post, as its SGEs
	sges      []urma.SGE
	bound     *TargetJetty // urma_bind_jetty's target (RC)
	softBound *TargetJetty // the target the provider bound at the first send (RC)
	unhandled []urma.Completion
	flushable bool // FLUSH_ERR_DONE was polled: urma_flush_jetty may return unhandled
	closed    bool
	deferred  []*TargetJetty // unimported while the provider still held them bound
}

// CreateJetty is urma_create_jetty.
func (c *Context) CreateJetty(cfg JettyConfig) (*Jetty, error) {
	const op = "create_jetty"
	m, err := mode(op, cfg.Mode)
	switch {
	case err != nil:
		return nil, err
	case !cfg.ShareJFR:
		return nil, urma.Errorf(op, urma.CodeInval, "the jetty has no shared JFR (flag.bs.share_jfr): a JFR of its own (jfr_cfg) is not supported")
	case cfg.JFR == nil || cfg.JFR.ctx != c:
		return nil, urma.Errorf(op, urma.CodeInval, "the jetty needs a JFR of its context (shared.jfr)")
	case cfg.SendJFC == nil || cfg.SendJFC.ctx != c:
		return nil, urma.Errorf(op, urma.CodeInval, "the jetty needs a JFC of its context (jfs_cfg.jfc)")
	}
	j, err := c.ctx.CreateJetty(urma.JettyConfig{
		Mode:       m,
		SQDepth:    cfg.Depth,
		MaxSGE:     max(uint32(cfg.MaxSGE), 1),
		MaxInline:  cfg.MaxInline,
		SendJFC:    cfg.SendJFC.q,
		JFR:        cfg.JFR.r,
		RNRRetry:   cfg.RNRRetry,
		ErrTimeout: cfg.ErrTimeout,
		Priority:   cfg.Priority,
	})
	if err != nil {
		return nil, err
	}
	jt := &Jetty{
		ctx: c, j: j, mode: m, depth: cfg.Depth, id: j.ID().ID,
		jfc: cfg.SendJFC, jfr: cfg.JFR, sges: make([]urma.SGE, 0, urmaMaxSGE),
	}
	c.mu.Lock()
	c.jetties[jt.id] = jt
	c.mu.Unlock()
	return jt, nil
}

// ID is the jetty's id.
func (j *Jetty) ID() urma.JettyID { return j.j.ID() }

// JFR is the jetty's shared JFR, where urma_post_jetty_recv_wr posts.
func (j *Jetty) JFR() *JFR { return j.jfr }

// Send is one work request of urma_post_jetty_send_wr's chain.
type Send struct {
	Opcode    uint32 // URMA_OPC_*
	Complete  bool   // flag.bs.complete_enable
	Solicited bool   // flag.bs.solicited_enable
	Inline    bool   // flag.bs.inline_flag
	Target    *TargetJetty
	UserCtx   uint64
	Imm       uint64
	SGEs      []SGE
}

// PostSend posts one send. An RC jetty sends to the target urma_bind_jetty
// bound, whatever the request says (hw/udma/udma_u_jfs.c:960-963), and
// posting on one not bound fails with EINVAL; a full queue is
// URMA_ENOMEM (udma_u_jfs.c:945-947).
func (j *Jetty) PostSend(w *Send) error {
	const op = "post_jetty_send_wr"
	var opc urma.Opcode
	switch w.Opcode {
	case OpcSend:
		opc = urma.OpSend
	case OpcSendImm:
		opc = urma.OpSendWithImm
	default:
		return urma.Errorf(op, urma.CodeInval, "opcode %#x: the software provider posts SEND (%#x) and SEND_IMM (%#x)", w.Opcode, OpcSend, OpcSendImm)
	}
	if len(w.SGEs) > urmaMaxSGE {
		return urma.Errorf(op, urma.CodeInval, "%d SGEs, at most %d", len(w.SGEs), urmaMaxSGE)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	t := w.Target
	if j.mode == urma.RC {
		t = j.bound
		if t == nil {
			return urma.Errorf(op, urma.CodeInval, "RC jetty %d is not bound to a target (urma_bind_jetty)", j.id)
		}
	}
	if t == nil {
		return urma.Errorf(op, urma.CodeInval, "the work request names no target jetty")
	}
	var flags urma.SendFlags
	if w.Complete {
		flags |= urma.SendCompleteEnable
	}
	if w.Solicited {
		flags |= urma.SendSolicitedEnable
	}
	if w.Inline {
		flags |= urma.SendInline
	}
	j.sges = j.sges[:0]
	for i := range w.SGEs {
		j.sges = append(j.sges, w.SGEs[i].sge(j.ctx))
	}
	j.wr = urma.SendWR{Opcode: opc, Flags: flags, Target: t.r, UserCtx: w.UserCtx, SGEs: j.sges, Imm: w.Imm}
	err := j.j.PostSend(&j.wr)
	clear(j.sges)
	j.wr = urma.SendWR{}
	if err == nil && j.mode == urma.RC && j.softBound == nil {
		j.softBound = t
		t.mu.Lock()
		t.softBoundBy = j
		t.mu.Unlock()
	}
	return queueFull(err)
}

// Bind is urma_bind_jetty: an RC jetty to an RC target. The software
// provider binds a jetty to the target of its first send for the jetty's
// life, so a jetty that has sent binds again only to that target.
func (j *Jetty) Bind(t *TargetJetty) error {
	const op = "bind_jetty"
	if j.mode != urma.RC || t.mode != urma.RC {
		// liburma's own check (core/urma_cp_api.c): URMA_ENOPERM
		return urma.Errorf(op, codeNoPerm, "jetty %d (%s) and its target (%s) must both be RC", j.id, j.mode, t.mode)
	}
	if t.ctx != j.ctx {
		return urma.Errorf(op, urma.CodeInval, "the target was imported by another context")
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.bound != nil:
		return urma.Errorf(op, urma.CodeInval, "jetty %d is bound already; unbind it first", j.id)
	case j.softBound != nil && j.softBound != t:
		return urma.Errorf(op, urma.CodeInval, "jetty %d has sent to another target, and the software provider binds an RC jetty to one target for its life", j.id)
	}
	j.bound = t
	t.mu.Lock()
	t.bound++
	t.mu.Unlock()
	return nil
}

// Unbind is urma_unbind_jetty.
func (j *Jetty) Unbind() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	t := j.bound
	if t == nil {
		return urma.Errorf("unbind_jetty", urma.CodeInval, "jetty %d is not bound", j.id)
	}
	j.bound = nil
	t.mu.Lock()
	t.bound--
	t.mu.Unlock()
	return nil
}

// Modify is urma_modify_jetty. The state can be moved to ERROR only
// (what flushes a jetty); a mask naming nothing changes nothing.
func (j *Jetty) Modify(mask, state uint32) error {
	const op = "modify_jetty"
	switch {
	case mask&^(AttrRxThreshold|AttrState) != 0:
		return urma.Errorf(op, urma.CodeInval, "attribute mask %#x names an unknown attribute", mask)
	case mask&AttrRxThreshold != 0:
		return urma.Errorf(op, urma.CodeInval, "the software provider has no receive threshold (JETTY_RX_THRESHOLD)")
	case mask&AttrState == 0:
		return nil
	case state != JettyStateError:
		return urma.Errorf(op, urma.CodeInval, "state %d: the software provider moves a jetty to ERROR (%d) only", state, JettyStateError)
	}
	return j.j.SetError()
}

func (j *Jetty) addUnhandled(cr *urma.Completion) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.unhandled = append(j.unhandled, *cr)
}

func (j *Jetty) setFlushable() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.flushable = true
}

// Flush is urma_flush_jetty: once the jetty's FLUSH_ERR_DONE was polled,
// the sends it never carried out, in post order, as WR_UNHANDLED; at most
// the SQ depth per call, as liburma checks.
func (j *Jetty) Flush(out []urma.Completion) (int, error) {
	if len(out) == 0 || uint64(len(out)) > uint64(j.depth) {
		return 0, urma.Errorf("flush_jetty", urma.CodeInval, "%d records asked for, want 1..%d (the SQ depth)", len(out), j.depth)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.flushable {
		return 0, nil
	}
	n := copy(out, j.unhandled)
	for i := range out[:n] {
		out[i].Status = urma.StatusWRUnhandled
	}
	j.unhandled = j.unhandled[:copy(j.unhandled, j.unhandled[n:])]
	return n, nil
}

// deferUnimport keeps t, unimported while the provider held it bound to
// this jetty, until the jetty goes; false when it went already.
func (j *Jetty) deferUnimport(t *TargetJetty) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return false
	}
	j.deferred = append(j.deferred, t)
	return true
}

// Close is urma_delete_jetty. A jetty bound with urma_bind_jetty is not
// deleted (URMA_ENOPERM, liburma's "try unbind first"). Its records not
// yet polled go with it, as udma's delete removes them from its JFCs.
func (j *Jetty) Close() error {
	const op = "delete_jetty"
	j.mu.Lock()
	if j.bound != nil {
		j.mu.Unlock()
		return urma.Errorf(op, codeNoPerm, "RC jetty %d is bound; unbind it first", j.id)
	}
	j.mu.Unlock()
	if err := j.j.Close(); err != nil {
		return closeFailed(op, err)
	}
	j.ctx.mu.Lock()
	if j.ctx.jetties[j.id] == j {
		delete(j.ctx.jetties, j.id)
	}
	j.ctx.mu.Unlock()
	j.jfc.drop(j.id)
	if j.jfr.jfc != j.jfc {
		j.jfr.jfc.drop(j.id)
	}
	j.mu.Lock()
	j.closed = true
	deferred := j.deferred
	j.deferred, j.unhandled = nil, nil
	j.mu.Unlock()
	var first error
	for _, t := range deferred {
		if err := t.r.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
