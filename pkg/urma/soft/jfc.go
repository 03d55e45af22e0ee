package soft

import (
	"sync"
	"sync/atomic"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// jfc is a completion queue: a ring of Depth completion records.
//
// Overflow: hardware reports a fatal JFC error when more completions arrive
// than the queue holds. This provider never drops one and never blocks the
// producer (which may be the very goroutine that polls): records beyond the
// depth wait in an overflow list, in order, and the first overflow is logged
// as an error so an undersized queue gets noticed. The list is bounded, since
// each posted work request yields at most one record.
type jfc struct {
	ctx     *devContext
	id      uint32
	depth   uint32
	jfce    *jfce
	userCtx uint64

	mu            sync.Mutex
	ring          []urma.Completion
	head, n       int
	overflow      []urma.Completion
	overflowed    uint64 // records that ever went to the overflow list
	armed         bool
	solicitedOnly bool
	closed        bool
	users         int // JFRs and jetties attached
	acked         uint64
	reported      atomic.Uint64 // events JFCE.Wait returned; counted under the JFCE's lock
	ackedCond     *sync.Cond    // signalled by Ack, for a Close waiting on acks

	// afterPush, set by tests, sees each record as it becomes visible to
	// Poll; it runs under q.mu. It takes a copy: a pointer handed to a
	// function value would move every pushed record to the heap.
	afterPush atomic.Pointer[func(urma.Completion)]
}

var _ urma.JFC = (*jfc)(nil)

func newJFC(c *devContext, cfg urma.JFCConfig) (*jfc, error) {
	const op = "create_jfc"
	if err := cfg.Check(c.dev.caps); err != nil {
		return nil, err
	}
	var e *jfce
	if cfg.JFCE != nil {
		var ok bool
		if e, ok = cfg.JFCE.(*jfce); !ok || e.ctx != c {
			return nil, urma.Errorf(op, urma.CodeInval, "JFCE was not created by this context")
		}
	}
	id, err := c.dev.allocJFC()
	if err != nil {
		return nil, err
	}
	q := &jfc{ctx: c, id: id, depth: cfg.Depth, jfce: e, userCtx: cfg.UserCtx, ring: make([]urma.Completion, cfg.Depth)}
	q.ackedCond = sync.NewCond(&q.mu)
	if e != nil {
		if err := e.attach(); err != nil {
			c.dev.freeJFC()
			return nil, err
		}
	}
	if err := c.adopt(q, op); err != nil {
		if e != nil {
			e.detach()
		}
		c.dev.freeJFC()
		return nil, err
	}
	return q, nil
}

func (q *jfc) Kind() string { return "JFC" }

// ID is the queue's number within its device.
func (q *jfc) ID() uint32 { return q.id }

// push appends one record and fires the JFCE if the queue is armed for it:
// any record when armed for all, a solicited receive or an error record when
// armed for solicited ones only (as on hardware).
func (q *jfc) push(c *urma.Completion, solicited bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if q.n < len(q.ring) && len(q.overflow) == 0 {
		q.ring[(q.head+q.n)%len(q.ring)] = *c
		q.n++
	} else {
		if q.overflowed == 0 {
			q.ctx.prov.log.Error(nil, "JFC overflow: more completions than its depth; keeping them, but hardware would fail this JFC",
				"device", q.ctx.dev.info.Name, "jfc", q.id, "depth", q.depth)
		}
		q.overflowed++
		q.overflow = append(q.overflow, *c)
	}
	if f := q.afterPush.Load(); f != nil {
		(*f)(*c)
	}
	if q.armed && (!q.solicitedOnly || solicited || c.Status != urma.StatusSuccess) {
		q.armed = false
		if q.jfce != nil {
			q.jfce.notify(q)
		}
	}
}

// Poll takes up to len(out) records, oldest first.
func (q *jfc) Poll(out []urma.Completion) (int, error) {
	if sd := q.ctx.dev.side; sd != nil && sd.shm != nil {
		// On shared memory a poller takes what the rings hold itself, with
		// no handoff to the reader goroutines. Only a JFC without a JFCE
		// is polled for its own sake: the Polls that drain a JFC after its
		// event do not put the rings in polling mode.
		sd.drive(q.jfce == nil)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, errClosed("poll_jfc", "JFC")
	}
	total := 0
	for total < len(out) && q.n > 0 {
		k := min(len(out)-total, q.n, len(q.ring)-q.head)
		copy(out[total:], q.ring[q.head:q.head+k])
		q.head = (q.head + k) % len(q.ring)
		q.n -= k
		total += k
		q.refill()
	}
	return total, nil
}

// refill moves overflowed records into the ring as room appears.
func (q *jfc) refill() {
	if len(q.overflow) == 0 {
		return
	}
	m := min(len(q.ring)-q.n, len(q.overflow))
	for _, c := range q.overflow[:m] {
		q.ring[(q.head+q.n)%len(q.ring)] = c
		q.n++
	}
	rest := copy(q.overflow, q.overflow[m:])
	q.overflow = q.overflow[:rest]
	if rest == 0 {
		q.overflow = nil // give the burst's memory back
	}
}

// Rearm asks for one event on the next record (the next solicited or error
// record when solicitedOnly). Records already queued do not fire: poll again
// after rearming.
func (q *jfc) Rearm(solicitedOnly bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return errClosed("rearm_jfc", "JFC")
	}
	if q.jfce == nil {
		return urma.Errorf("rearm_jfc", urma.CodeInval, "JFC %d has no JFCE", q.id)
	}
	q.armed = true
	q.solicitedOnly = solicitedOnly
	return nil
}

// Ack acknowledges n events; Close waits until every event Wait returned
// was acknowledged.
func (q *jfc) Ack(n uint32) {
	q.mu.Lock()
	q.acked += uint64(n)
	q.ackedCond.Broadcast()
	q.mu.Unlock()
}

// Close destroys the JFC; it fails with ErrBusy while JFRs or jetties use
// it. Otherwise it waits until every event JFCE.Wait returned for this JFC
// has been acknowledged, as urma_delete_jfc does (core/urma_cmd.c:1174-1185
// waits on the event condition until comp_events_acked catches up).
func (q *jfc) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	if q.users > 0 {
		n := q.users
		q.mu.Unlock()
		return urma.Errorf("delete_jfc", urma.CodeBusy, "%d JFRs or jetties still use JFC %d", n, q.id)
	}
	q.mu.Unlock()
	q.destroy(true)
	return nil
}

// forceClose does not wait for acks: Provider.Close is tearing down
// everything, including whoever would have acked.
func (q *jfc) ForceClose() { q.destroy(false) }

func (q *jfc) destroy(waitAcks bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	q.n, q.overflow = 0, nil
	if q.jfce != nil {
		// After forget no Wait can return this JFC again, so reported
		// is final.
		q.jfce.forget(q)
	}
	for waitAcks && q.acked < q.reported.Load() {
		q.ackedCond.Wait()
	}
	q.mu.Unlock()
	if q.jfce != nil {
		q.jfce.detach()
	}
	q.ctx.dev.freeJFC()
	q.ctx.release(q)
}

// attach counts a JFR or jetty that completes into this queue.
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

// overflowCount reports how many records went past the depth (tests).
func (q *jfc) overflowCount() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.overflowed
}
