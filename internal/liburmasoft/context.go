package liburmasoft

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// liburma's constants this package maps (urma_types.h, urma_opcode.h).
const (
	// urma_transport_mode_t bits.
	TMRM = 0x1
	TMRC = 0x2
	TMUM = 0x4

	// urma_target_type_t.
	TargetTypeJFR   = 0
	TargetTypeJetty = 1

	// urma_jetty_attr_mask_t and urma_jetty_state_t.
	AttrRxThreshold  = 0x1
	AttrState        = 0x2
	JettyStateReset  = 0
	JettyStateReady  = 1
	JettyStateError  = 3
	jettyStateMaxVal = 3
)

// importTimeout bounds an import: the provider dials the peer's device.
const importTimeout = 10 * time.Second

// Context is an open device (urma_context_t).
type Context struct {
	ctx  urma.Context
	info urma.DeviceInfo

	mu      sync.RWMutex
	jetties map[uint32]*Jetty // by jetty id, for records that name a jetty
}

// Device is the device the context was opened on.
func (c *Context) Device() urma.DeviceInfo { return c.info }

// EID is the EID the context was opened with.
func (c *Context) EID() urma.EID { return c.ctx.EID() }

// UASID is the context's address space id.
func (c *Context) UASID() uint32 { return c.ctx.UASID() }

// Close is urma_delete_context. While objects of the context live it
// fails with EAGAIN, as liburma does (core/urma_main.c).
func (c *Context) Close() error {
	err := c.ctx.Close()
	if errors.Is(err, urma.ErrBusy) {
		return urma.Errorf("delete_context", urma.CodeAgain, "objects created from the context are still alive")
	}
	return err
}

func (c *Context) jetty(id uint32) *Jetty {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.jetties[id]
}

// hold takes a send's WR_FLUSH_ERR record out of the stream a JFC's poll
// returns, for urma_flush_jetty to return as WR_UNHANDLED, and notes a
// jetty's FLUSH_ERR_DONE. On UB hardware a jetty in ERROR reports
// FLUSH_ERR_DONE on its JFC, and only then does urma_flush_jetty return
// the requests the device never started (hw/udma/udma_u_jfc.c:728-731,
// udma_u_jfs.c:1188); the software provider reports those requests as
// WR_FLUSH_ERR records before its FLUSH_ERR_DONE instead.
func (c *Context) hold(cr *urma.Completion) bool {
	if cr.Recv {
		return false
	}
	switch cr.Status {
	case urma.StatusWRFlushErr:
		if j := c.jetty(cr.LocalID); j != nil {
			j.addUnhandled(cr)
			return true
		}
	case urma.StatusWRFlushErrDone:
		if j := c.jetty(cr.LocalID); j != nil {
			j.setFlushable()
		}
	}
	return false
}

// closeFailed is the status a delete returns for an object still in use:
// URMA_FAIL, as udma's delete ioctls do.
func closeFailed(op string, err error) error {
	if errors.Is(err, urma.ErrBusy) {
		return urma.Errorf(op, urma.CodeFail, "%s", err.Error())
	}
	return err
}

// mode maps urma_transport_mode_t to the Go API's mode.
func mode(op string, tm uint32) (urma.TransportMode, error) {
	switch tm {
	case TMRM:
		return urma.RM, nil
	case TMRC:
		return urma.RC, nil
	}
	return 0, urma.Errorf(op, urma.CodeInval, "transport mode %#x: the software provider has RM (%#x) and RC (%#x)", tm, TMRM, TMRC)
}

// JFCE is a completion event channel (urma_jfce_t).
type JFCE struct {
	ctx *Context
	e   urma.JFCE

	mu   sync.Mutex
	jfcs map[urma.JFC]*JFC // the JFCs on this channel, to name what Wait returns
}

// CreateJFCE is urma_create_jfce.
func (c *Context) CreateJFCE() (*JFCE, error) {
	e, err := c.ctx.CreateJFCE()
	if err != nil {
		return nil, err
	}
	return &JFCE{ctx: c, e: e, jfcs: map[urma.JFC]*JFC{}}, nil
}

// Fd is the channel's eventfd: readable while events wait.
func (e *JFCE) Fd() int { return e.e.Fd() }

// maxWait is the most JFCs one Wait returns.
const maxWait = 16

var waitBufs = sync.Pool{New: func() any { return new([maxWait]urma.JFC) }}

// Wait is urma_wait_jfc: it fills out with the C addresses of the JFCs
// that fired, at most len(out) (and maxWait). timeoutMs 0 does not block,
// a negative one blocks until an event.
func (e *JFCE) Wait(out []uintptr, timeoutMs int) (int, error) {
	if len(out) == 0 {
		return 0, urma.Errorf("wait_jfc", urma.CodeInval, "no room for a JFC")
	}
	buf := waitBufs.Get().(*[maxWait]urma.JFC)
	defer waitBufs.Put(buf)
	timeout := time.Duration(timeoutMs) * time.Millisecond
	if timeoutMs < 0 {
		timeout = -1
	}
	n, err := e.e.Wait(buf[:min(len(out), maxWait)], timeout)
	k := 0
	e.mu.Lock()
	for i := range n {
		if q := e.jfcs[buf[i]]; q != nil {
			out[k] = q.cptr
			k++
		}
		buf[i] = nil
	}
	e.mu.Unlock()
	return k, err
}

// Close is urma_delete_jfce.
func (e *JFCE) Close() error { return closeFailed("delete_jfce", e.e.Close()) }

// Segment is registered local memory (urma_target_seg_t from
// urma_register_seg): the caller's own memory, never copied.
type Segment struct {
	ctx *Context
	seg urma.Segment
	mem *urma.Memory
	va  uint64
}

// RegisterSegment is urma_register_seg over mem, the caller's memory at
// its own address; access and policy are liburma's URMA_ACCESS_* bits and
// URMA_TOKEN_* value.
func (c *Context) RegisterSegment(mem []byte, access, policy, token uint32) (*Segment, error) {
	m, err := urma.WrapMemory(mem)
	if err != nil {
		return nil, urma.Errorf("register_seg", urma.CodeInval, "%w", err)
	}
	s, err := c.ctx.RegisterSegment(m, urma.SegmentConfig{
		Access:      urma.Access(access),
		TokenPolicy: urma.TokenPolicy(policy),
		Token:       urma.Token(token),
	})
	if err != nil {
		return nil, err
	}
	return &Segment{ctx: c, seg: s, mem: m, va: s.ID().VA}, nil
}

// ID is what a peer imports.
func (s *Segment) ID() urma.SegmentID { return s.seg.ID() }

// Close is urma_unregister_seg; it fails with EBUSY while posted work
// requests still use the memory.
func (s *Segment) Close() error {
	if err := s.seg.Close(); err != nil {
		return err
	}
	return s.mem.Free() // forgets the caller's memory, never unmaps it
}

// TargetSegment is an imported peer segment (urma_target_seg_t from
// urma_import_seg).
type TargetSegment struct {
	r urma.RemoteSegment
}

// ImportSegment is urma_import_seg; the token is kept, not checked.
func (c *Context) ImportSegment(id urma.SegmentID, token uint32) (*TargetSegment, error) {
	r, err := c.ctx.ImportSegment(id, urma.Token(token))
	if err != nil {
		return nil, err
	}
	return &TargetSegment{r: r}, nil
}

// Close is urma_unimport_seg.
func (t *TargetSegment) Close() error { return t.r.Close() }

// TargetJetty is an imported peer jetty (urma_target_jetty_t).
type TargetJetty struct {
	ctx  *Context
	r    urma.RemoteJetty
	mode urma.TransportMode

	mu          sync.Mutex
	bound       int    // jetties bound to it with urma_bind_jetty
	softBoundBy *Jetty // the RC jetty the provider bound to it at its first send
}

// ImportJetty is urma_import_jetty. Only jetties are targets here
// (URMA_JETTY); the token travels with every message and the target
// checks it.
func (c *Context) ImportJetty(id urma.JettyID, tm, targetType, token uint32) (*TargetJetty, error) {
	const op = "import_jetty"
	m, err := mode(op, tm)
	if err != nil {
		return nil, err
	}
	if targetType != TargetTypeJetty {
		return nil, urma.Errorf(op, urma.CodeInval, "target type %d: the software provider imports jetties (URMA_JETTY, %d) only", targetType, TargetTypeJetty)
	}
	ctx, cancel := context.WithTimeout(context.Background(), importTimeout)
	defer cancel()
	r, err := c.ctx.ImportJetty(ctx, id, m, urma.Token(token))
	if err != nil {
		return nil, err
	}
	return &TargetJetty{ctx: c, r: r, mode: m}, nil
}

// Close is urma_unimport_jetty. A target bound with urma_bind_jetty
// cannot be unimported (URMA_FAIL, as udma). One the provider still holds
// for an RC jetty, unbound since, goes when that jetty does.
func (t *TargetJetty) Close() error {
	const op = "unimport_jetty"
	t.mu.Lock()
	if t.bound > 0 {
		t.mu.Unlock()
		return urma.Errorf(op, urma.CodeFail, "the target is bound to %d jetties; unbind them first", t.bound)
	}
	j := t.softBoundBy
	t.mu.Unlock()
	err := t.r.Close()
	if err == nil || !errors.Is(err, urma.ErrBusy) || j == nil {
		return err
	}
	if j.deferUnimport(t) {
		return nil
	}
	return t.r.Close() // the jetty went meanwhile, and with it the binding
}
