package liburmasoft

import (
	"errors"
	"sync"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// JFC is a completion queue (urma_jfc_t).
type JFC struct {
	ctx  *Context
	q    urma.JFC
	jfce *JFCE
	cptr uintptr // the urma_jfc_t, which urma_wait_jfc returns

	mu sync.Mutex
	// pending are records taken from the provider and not yet polled: a
	// jetty's deletion takes every record out to drop the jetty's.
	pending []urma.Completion
}

// CreateJFC is urma_create_jfc; cptr is the urma_jfc_t the caller gets,
// jfce nil for a JFC that is polled only.
func (c *Context) CreateJFC(depth uint32, jfce *JFCE, userCtx uint64, cptr uintptr) (*JFC, error) {
	cfg := urma.JFCConfig{Depth: depth, UserCtx: userCtx}
	if jfce != nil {
		if jfce.ctx != c {
			return nil, urma.Errorf("create_jfc", urma.CodeInval, "the JFCE belongs to another context")
		}
		cfg.JFCE = jfce.e
	}
	q, err := c.ctx.CreateJFC(cfg)
	if err != nil {
		return nil, err
	}
	j := &JFC{ctx: c, q: q, jfce: jfce, cptr: cptr}
	if jfce != nil {
		jfce.mu.Lock()
		jfce.jfcs[q] = j
		jfce.mu.Unlock()
	}
	return j, nil
}

// ID is the JFC's id.
func (q *JFC) ID() uint32 { return q.q.ID() }

// Poll is urma_poll_jfc: up to len(out) records, with the sends flushed
// from a jetty in ERROR left for urma_flush_jetty (Context.hold).
func (q *JFC) Poll(out []urma.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := copy(out, q.pending)
	q.pending = q.pending[:copy(q.pending, q.pending[n:])]
	for n < len(out) {
		want := len(out) - n
		k, err := q.q.Poll(out[n:])
		if err != nil {
			if n > 0 {
				return n, nil // the error comes back with the next poll
			}
			return 0, err
		}
		for _, cr := range out[n : n+k] {
			if !q.ctx.hold(&cr) {
				out[n] = cr
				n++
			}
		}
		if k < want {
			break
		}
	}
	return n, nil
}

// drop removes every record naming the jetty id from the JFC, sends and
// receives, as udma's urma_delete_jetty does (hw/udma/udma_u_jfc.c
// udma_u_clean_jfc): ids are reused, and a new jetty must not get them.
func (q *JFC) drop(jettyID uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var buf [64]urma.Completion
	for {
		k, err := q.q.Poll(buf[:])
		q.pending = append(q.pending, buf[:k]...)
		if err != nil || k < len(buf) {
			break
		}
	}
	kept := q.pending[:0]
	for _, cr := range q.pending {
		if cr.LocalID != jettyID {
			kept = append(kept, cr)
		}
	}
	q.pending = kept
}

// Rearm is urma_rearm_jfc.
func (q *JFC) Rearm(solicitedOnly bool) error { return q.q.Rearm(solicitedOnly) }

// Ack is urma_ack_jfc for this JFC.
func (q *JFC) Ack(n uint32) { q.q.Ack(n) }

// Close is urma_delete_jfc: it blocks until every event urma_wait_jfc
// returned for the JFC was acknowledged.
func (q *JFC) Close() error {
	if err := q.q.Close(); err != nil {
		return closeFailed("delete_jfc", err)
	}
	if q.jfce != nil {
		q.jfce.mu.Lock()
		delete(q.jfce.jfcs, q.q)
		q.jfce.mu.Unlock()
	}
	return nil
}

// SGE is one element of a work request as liburma names it: an address,
// a length, and the registered segment it lies in (nil when the caller
// named none of this context's).
type SGE struct {
	Addr uint64
	Len  uint32
	Seg  *Segment
}

// sge converts s for the provider. An SGE outside a segment of ctx goes
// with no segment, or with an offset past its end, so that it completes
// with LOC_ACCESS as the provider's own checks decide.
func (s *SGE) sge(ctx *Context) urma.SGE {
	if s.Seg == nil || s.Seg.ctx != ctx {
		return urma.SGE{Len: s.Len}
	}
	return urma.SGE{Segment: s.Seg.seg, Offset: s.Addr - s.Seg.va, Len: s.Len}
}

// JFRConfig is urma_jfr_cfg_t with liburma's values.
type JFRConfig struct {
	Mode        uint32 // URMA_TM_*
	Depth       uint32
	MaxSGE      uint32
	MinRNRTimer uint8
	JFC         *JFC
	TokenPolicy uint32
	Token       uint32
}

// JFR is a receive queue (urma_jfr_t).
type JFR struct {
	ctx  *Context
	r    urma.JFR
	jfc  *JFC
	mode uint32

	mu   sync.Mutex // guards wr, reused for every post
	wr   urma.RecvWR
	sges []urma.SGE
}

// CreateJFR is urma_create_jfr.
func (c *Context) CreateJFR(cfg JFRConfig) (*JFR, error) {
	const op = "create_jfr"
	m, err := mode(op, cfg.Mode)
	if err != nil {
		return nil, err
	}
	if cfg.JFC == nil || cfg.JFC.ctx != c {
		return nil, urma.Errorf(op, urma.CodeInval, "the JFR needs a JFC of its context")
	}
	r, err := c.ctx.CreateJFR(urma.JFRConfig{
		Mode:        m,
		Depth:       cfg.Depth,
		MaxSGE:      max(cfg.MaxSGE, 1),
		JFC:         cfg.JFC.q,
		MinRNRTimer: cfg.MinRNRTimer,
		TokenPolicy: urma.TokenPolicy(cfg.TokenPolicy),
		Token:       urma.Token(cfg.Token),
	})
	if err != nil {
		return nil, err
	}
	return &JFR{ctx: c, r: r, jfc: cfg.JFC, mode: cfg.Mode, sges: make([]urma.SGE, 0, urmaMaxSGE)}, nil
}

// urmaMaxSGE is the most SGEs a work request here carries, the software
// provider's limit.
const urmaMaxSGE = 16

// ID is the JFR's id.
func (r *JFR) ID() urma.JettyID { return r.r.ID() }

// PostRecv posts one receive of urma_post_jfr_wr's chain. A full queue is
// URMA_ENOMEM, as udma's (hw/udma/udma_u_jfr.c:457-460).
func (r *JFR) PostRecv(userCtx uint64, sges []SGE) error {
	if len(sges) > urmaMaxSGE {
		return urma.Errorf("post_jfr_wr", urma.CodeInval, "%d SGEs, at most %d", len(sges), urmaMaxSGE)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sges = r.sges[:0]
	for i := range sges {
		r.sges = append(r.sges, sges[i].sge(r.ctx))
	}
	r.wr = urma.RecvWR{UserCtx: userCtx, SGEs: r.sges}
	err := r.r.PostRecv(&r.wr)
	clear(r.sges)
	return queueFull(err)
}

// queueFull maps a full queue to URMA_ENOMEM, what udma returns.
func queueFull(err error) error {
	var e *urma.Error
	if errors.As(err, &e) && e.Code == urma.CodeAgain {
		return urma.Errorf(e.Op, urma.CodeNoMem, "%s", e.Detail)
	}
	return err
}

// Close is urma_delete_jfr.
func (r *JFR) Close() error { return closeFailed("delete_jfr", r.r.Close()) }
