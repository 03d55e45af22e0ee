package soft

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// peer is a remote device this device talks to.
type peer struct {
	sd  *fabricSide
	eid urma.EID
	// used says this side uses its link to the peer: it dialed the peer,
	// imported or sent over the link, or a send of the peer's passed a
	// token check. A link dialed in that is not used may be evicted to
	// make room (connslots.go). It outlives a connection for as long as
	// the entry does, so a peer that replaces its link keeps it used.
	used atomic.Bool

	mu       sync.Mutex
	conn     *conn
	dialing  bool
	dialDone chan struct{} // closed when the current dial ends
	lastErr  error         // why the last dial failed
	pending  []txItem      // sends waiting for a connection
	// gen is the generation the pending sends go out on: the next
	// connection adopted takes it, and a dial that ends without one
	// fails it; either way the next pending send gets a new one.
	gen uint64
}

// send queues a transmission of a jetty's slot of length bytes and returns
// the connection to kick once j.mu is released (nil while a connection is
// being dialed) and the generation of the connection that carries it (see
// jetty.peerDown). Otherwise the status says why not: ACK_TIMEOUT, the
// peer cannot be reached now; LOC_LEN, the message is longer than the
// connected peer takes (found here, the failing send stops its jetty's
// queue before anything behind it goes out). j.mu is held.
func (p *peer) send(j *jetty, seq uint64, tx, length uint32) (*conn, uint64, urma.Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.used.Load() {
		p.used.Store(true)
	}
	if c := p.conn; c != nil {
		switch {
		case uint64(length) > c.peerMax:
			return nil, c.gen, urma.StatusLocLen
		case c.enqueue(&txItem{j: j, seq: seq, tx: tx}) != nil:
			return nil, c.gen, urma.StatusAckTimeout
		}
		return c, c.gen, urma.StatusSuccess
	}
	if p.sd.ctx.Err() != nil {
		return nil, p.gen, urma.StatusAckTimeout
	}
	p.pending = append(p.pending, txItem{j: j, seq: seq, tx: tx})
	p.startDialLocked()
	return nil, p.gen, urma.StatusSuccess
}

// cancel tells the peer to drop the RNR block of the send tagged
// (j, seq) at jetty dst. j.mu is held.
func (p *peer) cancel(j *jetty, seq uint64, dst uint32) {
	p.mu.Lock()
	c := p.conn
	p.mu.Unlock()
	if c == nil {
		return // no connection, no block
	}
	_ = c.cancelBlock(j.id.ID, dst, uint64(j.instance)<<32|uint64(uint32(seq)), false) // never refused
}

func (p *peer) startDialLocked() {
	p.used.Store(true)
	if p.dialing {
		return
	}
	p.dialing = true
	p.dialDone = make(chan struct{})
	p.sd.prov.goTracked(p.dialLoop)
}

// connect returns the peer's connection, dialing if needed.
func (p *peer) connect(ctx context.Context) (*conn, error) {
	p.mu.Lock()
	if p.conn != nil {
		c := p.conn
		p.mu.Unlock()
		return c, nil
	}
	p.startDialLocked()
	done := p.dialDone
	p.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, urma.Errorf("import", urma.CodeTimeout, "connect to %s: %w", p.eid, ctx.Err())
	case <-p.sd.ctx.Done():
		return nil, errClosed("import", "device")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		return p.conn, nil
	}
	if p.lastErr == nil {
		return nil, urma.Errorf("import", urma.CodeConnRefused, "connect to %s: the connection closed", p.eid)
	}
	// The cause stays reachable: errors.Is answers both ErrUnreachable
	// (the code) and, say, ErrConnLimit.
	return nil, urma.Errorf("import", urma.CodeConnRefused, "connect to %s: %w", p.eid, p.lastErr)
}

var errDuplicate = errors.New("peer kept the connection it dialed")

// dialLoop connects to the peer, retrying while the peer answers DUPLICATE
// (its own dial to us wins and should arrive shortly), for at most the dial
// timeout. If no connection results, the sends waiting for one fail.
func (p *peer) dialLoop() {
	sd := p.sd
	ctx, cancel := context.WithTimeout(sd.ctx, sd.dialTO)
	defer cancel()
	var err error
	for backoff := time.Millisecond; ; backoff = min(2*backoff, 100*time.Millisecond) {
		if err = p.dialOnce(ctx); err == nil {
			break
		}
		p.mu.Lock()
		up := p.conn != nil
		p.mu.Unlock()
		if up || !errors.Is(err, errDuplicate) {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			err = fmt.Errorf("%w; the peer's own connection did not arrive in %v", err, sd.dialTO)
		}
		if ctx.Err() != nil {
			break
		}
	}
	p.mu.Lock()
	p.dialing = false
	failed := p.conn == nil
	gen := p.gen
	if failed {
		p.lastErr = err
		clear(p.pending)
		p.pending = p.pending[:0]
		p.gen++ // a send posted from now on waits for the next dial
	}
	close(p.dialDone)
	p.mu.Unlock()
	if failed {
		sd.log().Info("cannot reach peer", "peer", p.eid.String(), "reason", fmt.Sprint(err))
		sd.dev.forEachJetty(func(j *jetty) { j.peerDown(p, gen) })
	}
}

// dialOnce dials and handshakes once, over the fabric of the device's side.
func (p *peer) dialOnce(ctx context.Context) error {
	if p.sd.shm != nil {
		return p.dialOnceShm(ctx)
	}
	return p.dialOnceTCP(ctx)
}

// importJetty asks the peer whether id may be imported with token.
func (p *peer) importJetty(ctx context.Context, id uint32, mode urma.TransportMode, token urma.Token) (urma.Code, error) {
	return p.ask(ctx, "import_jetty", func(b []byte, req uint32) []byte {
		return encodeImportJetty(b, &importJettyReq{mode: mode, req: req, jetty: id, token: uint32(token)})
	})
}

// importSegment asks the peer whether a segment may be imported with token.
func (p *peer) importSegment(ctx context.Context, id urma.SegmentID, token urma.Token) (urma.Code, error) {
	return p.ask(ctx, "import_seg", func(b []byte, req uint32) []byte {
		return encodeImportSeg(b, &importSegReq{req: req, uasid: id.UASID, tokenID: id.TokenID, va: id.VA, len: id.Len, token: uint32(token)})
	})
}

func (p *peer) ask(ctx context.Context, op string, encode func([]byte, uint32) []byte) (urma.Code, error) {
	p.used.Store(true)
	c, err := p.connect(ctx)
	if err != nil {
		return 0, err
	}
	ch := make(chan urma.Code, 1)
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return 0, urma.Errorf(op, urma.CodeConnRefused, "connection to %s broke: %w", p.eid, c.err)
	}
	c.nextReq++
	req := c.nextReq
	c.imports[req] = ch
	c.mu.Unlock()
	var it txItem
	it.n = uint8(len(encode(it.ctl[:], req)))
	if c.enqueue(&it) == nil {
		c.kick()
	}
	code, answered, broke := awaitAnswer(ctx, ch, c.done)
	switch {
	case answered:
		return code, nil
	case broke:
		return 0, urma.Errorf(op, urma.CodeConnRefused, "connection to %s broke: %w", p.eid, c.deathCause())
	}
	c.mu.Lock()
	delete(c.imports, req)
	c.mu.Unlock()
	return 0, urma.Errorf(op, urma.CodeTimeout, "no answer from %s: %w", p.eid, ctx.Err())
}

// awaitAnswer waits for the answer to a request on a connection that may
// die (done) or be given up on (ctx). An answer that came before the
// connection died wins: the reader delivers it before it reads on and
// meets the end, but a select with both ready would pick either.
func awaitAnswer(ctx context.Context, ch <-chan urma.Code, done <-chan struct{}) (code urma.Code, answered, broke bool) {
	select {
	case code = <-ch:
		return code, true, false
	case <-done:
		select {
		case code = <-ch:
			return code, true, false
		default:
			return 0, false, true
		}
	case <-ctx.Done():
		return 0, false, false
	}
}
