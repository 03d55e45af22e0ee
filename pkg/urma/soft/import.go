package soft

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// remoteJetty is an imported peer jetty: where it lives (a local device or a
// socket peer), its id, and the token every message carries.
type remoteJetty struct {
	ctx    *devContext
	id     urma.JettyID
	mode   urma.TransportMode
	token  urma.Token
	dev    *device // in-process fabric, or this provider's own device
	peer   *peer   // socket fabric
	closed atomic.Bool

	mu    sync.Mutex // orders bind against Close
	bound int        // RC jetties bound to this import
}

func (r *remoteJetty) Kind() string { return "remote jetty" }

func (r *remoteJetty) ID() urma.JettyID { return r.id }

func (r *remoteJetty) sameTarget(o *remoteJetty) bool {
	return r.id.EID == o.id.EID && r.id.ID == o.id.ID
}

// bind records an RC jetty's binding; it fails once the import is closed.
func (r *remoteJetty) bind() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed.Load() {
		return false
	}
	r.bound++
	return true
}

func (r *remoteJetty) unbind() {
	r.mu.Lock()
	r.bound--
	r.mu.Unlock()
}

// Close unimports the jetty; sends already posted to it still go out. An
// RC import bound to a jetty fails with ErrBusy until that jetty is closed,
// as udma_u_unimport_jetty refuses (udma_u_jetty.c:459-463).
func (r *remoteJetty) Close() error {
	r.mu.Lock()
	if r.bound > 0 && !r.closed.Load() {
		n := r.bound
		r.mu.Unlock()
		return urma.Errorf("unimport_jetty", urma.CodeBusy, "RC target %s/%d is bound to %d jetty; close the jetty first", r.id.EID, r.id.ID, n)
	}
	already := r.closed.Swap(true)
	r.mu.Unlock()
	if !already {
		r.ctx.release(r)
	}
	return nil
}

// forceClose unimports regardless of bindings: Provider.Close destroys the
// jetties first.
func (r *remoteJetty) ForceClose() {
	if !r.closed.Swap(true) {
		r.ctx.release(r)
	}
}

func importJetty(ctx context.Context, c *devContext, id urma.JettyID, mode urma.TransportMode, token urma.Token) (*remoteJetty, error) {
	const op = "import_jetty"
	if c.isClosed() {
		return nil, errClosed(op, "context")
	}
	if mode != urma.RC && mode != urma.RM {
		return nil, urma.Errorf(op, urma.CodeInval, "transport mode %d unknown", mode)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	dev, peer, err := c.dev.route(op, id.EID)
	if err != nil {
		return nil, err
	}
	var code urma.Code
	if dev != nil {
		code = dev.checkJettyImport(id.ID, mode)
	} else if code, err = peer.importJetty(ctx, id.ID, mode, token); err != nil {
		return nil, err
	}
	if err := codeErr(op, code, fmt.Sprintf("jetty %s/%d", id.EID, id.ID)); err != nil {
		return nil, err
	}
	r := &remoteJetty{ctx: c, id: id, mode: mode, token: token, dev: dev, peer: peer}
	if err := c.adopt(r, op); err != nil {
		return nil, err
	}
	return r, nil
}

// remoteSegment is an imported peer segment. The provider offers no
// one-sided verbs, so importing checks access and yields a handle.
type remoteSegment struct {
	ctx    *devContext
	id     urma.SegmentID
	closed atomic.Bool
}

func (r *remoteSegment) Kind() string { return "remote segment" }

func (r *remoteSegment) ID() urma.SegmentID { return r.id }

func (r *remoteSegment) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.ctx.release(r)
	return nil
}

func (r *remoteSegment) ForceClose() { _ = r.Close() }

func importSegment(c *devContext, id urma.SegmentID, token urma.Token) (*remoteSegment, error) {
	const op = "import_seg"
	if c.isClosed() {
		return nil, errClosed(op, "context")
	}
	dev, peer, err := c.dev.route(op, id.EID)
	if err != nil {
		return nil, err
	}
	var code urma.Code
	if dev != nil {
		code = dev.checkSegmentImport(id)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), c.prov.opts.DialTimeout)
		defer cancel()
		if code, err = peer.importSegment(ctx, id, token); err != nil {
			return nil, err
		}
	}
	if err := codeErr(op, code, "segment "+id.EID.String()); err != nil {
		return nil, err
	}
	r := &remoteSegment{ctx: c, id: id}
	if err := c.adopt(r, op); err != nil {
		return nil, err
	}
	return r, nil
}

// codeErr turns an import answer into the verb's error.
func codeErr(op string, c urma.Code, what string) error {
	switch c {
	case urma.CodeSuccess:
		return nil
	case urma.CodeNoEnt:
		return urma.Errorf(op, c, "%s does not exist", what)
	case urma.CodeInval:
		return urma.Errorf(op, c, "%s: transport mode differs from the jetty's", what)
	case urma.CodeConnRefused:
		return urma.Errorf(op, c, "%s: device unreachable", what)
	}
	return urma.Errorf(op, c, "%s: refused", what)
}
