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

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/internal/lifecycle"
)

// devContext is an open device (urma_context_t).
type devContext struct {
	prov  *Provider
	lib   *library
	c     *C.struct_urma_context
	dev   urma.DeviceInfo
	eid   urma.EID
	uasid uint32

	// children are the objects created from it: liburma destroys nothing
	// on its own.
	children lifecycle.Children

	// creating is held for reading by each creation from its check to its
	// adoption, and for writing while Close or Provider.Close marks the
	// context closed: a creation in liburma is no child yet, and deleting
	// the context (or uninitialising liburma) under it frees what it uses.
	creating sync.RWMutex

	// deleted says urma_delete_context freed the context (or Provider.Close
	// gave up on it); under creating, held for writing. Close and
	// Provider.Close can both get there, and each holds creating for
	// writing across the delete, so the second waits for the first and
	// Provider.Close never releases liburma under it.
	deleted bool
	// orphans are hidden JFCEs of polling JFCs whose creation failed and
	// whose delete failed after it: no JFC holds them, and liburma keeps
	// the context alive while they live, so Close deletes them first.
	orphanMu sync.Mutex
	orphans  []*C.struct_urma_jfce
	// forceErrs are the failures of Provider.Close's teardown of the
	// children; under creating, held for writing by forceClose.
	forceErrs []error
}

var _ urma.Context = (*devContext)(nil)

func (c *devContext) Device() urma.DeviceInfo { return c.dev }
func (c *devContext) EID() urma.EID           { return c.eid }
func (c *devContext) UASID() uint32           { return c.uasid }

// begin holds off Close for a creation until end; it fails once the
// context is closed.
func (c *devContext) begin(op string) error {
	c.creating.RLock()
	if err := c.open(op); err != nil {
		c.creating.RUnlock()
		return err
	}
	return nil
}

func (c *devContext) end() { c.creating.RUnlock() }

// adopt registers a new child; it fails once the context is closed.
func (c *devContext) adopt(ch lifecycle.Child, op string) error { return c.children.Adopt(ch, op) }

func (c *devContext) release(ch lifecycle.Child) { c.children.Release(ch) }

// open checks that the context can still create objects.
func (c *devContext) open(op string) error { return c.children.Check(op) }

// Close deletes the context; it fails with ErrBusy while objects created
// from it are alive. When liburma fails to delete it, the context stays
// open and Close can be called again. Closing twice is a no-op.
func (c *devContext) Close() error {
	c.creating.Lock() // a creation under way is a child: ErrBusy
	defer c.creating.Unlock()
	done, err := c.children.Close("delete_context")
	if !done {
		return err
	}
	if err := c.deleteOrphans(false); err != nil {
		c.children.Reopen()
		return err
	}
	if err := c.delete(false); err != nil {
		c.children.Reopen() // liburma keeps it, and so do we
		return err
	}
	return nil
}

// delete deletes the context in liburma unless deleted already; creating
// is held for writing. A failed delete leaves the context to delete again,
// unless forced: the provider is closing, and the context goes anyway.
func (c *devContext) delete(force bool) error {
	if c.deleted {
		return nil
	}
	st := C.shim_delete_context(c.lib.c, c.c)
	if st != 0 && !force {
		return statusErr("delete_context", st, "delete the context")
	}
	c.deleted = true
	c.prov.forgetContext(c)
	if st != 0 {
		return statusErr("delete_context", st, "delete the context")
	}
	return nil
}

// forceClose destroys every child in teardown order, then the context,
// unless a Close deleted it already, and returns what failed.
func (c *devContext) forceClose() error {
	c.creating.Lock() // creations under way finish, and are destroyed
	defer c.creating.Unlock()
	c.forceErrs = nil
	c.children.ForceClose()
	c.forced(c.deleteOrphans(true))
	return errors.Join(append(c.forceErrs, c.delete(true))...)
}

// keepOrphan hands the context a hidden JFCE that no JFC holds any more
// and that liburma failed to delete, to delete again before the context.
func (c *devContext) keepOrphan(e *C.struct_urma_jfce) {
	c.orphanMu.Lock()
	c.orphans = append(c.orphans, e)
	c.orphanMu.Unlock()
}

// deleteOrphans deletes the orphaned JFCEs; those liburma fails to delete
// stay for the next Close, unless forced: the provider is closing.
func (c *devContext) deleteOrphans(force bool) error {
	c.orphanMu.Lock()
	defer c.orphanMu.Unlock()
	var errs []error
	kept := c.orphans[:0]
	for _, e := range c.orphans {
		if st := C.shim_delete_jfce(c.lib.c, e); st != 0 {
			errs = append(errs, statusErr("delete_jfce", st, "delete the JFCE of a polling JFC whose creation failed"))
			if !force {
				kept = append(kept, e)
			}
		}
	}
	clear(c.orphans[len(kept):])
	c.orphans = kept
	return errors.Join(errs...)
}

// forced records the failure of a child's ForceClose for forceClose, which
// runs it.
func (c *devContext) forced(err error) {
	if err != nil {
		c.forceErrs = append(c.forceErrs, err)
	}
}

// CreateJFCE creates a completion event channel.
func (c *devContext) CreateJFCE() (urma.JFCE, error) {
	if err := c.begin("create_jfce"); err != nil {
		return nil, err
	}
	defer c.end()
	return newJFCE(c)
}

// CreateJFC creates a completion queue.
func (c *devContext) CreateJFC(cfg urma.JFCConfig) (urma.JFC, error) {
	if err := c.begin("create_jfc"); err != nil {
		return nil, err
	}
	defer c.end()
	return newJFC(c, cfg)
}

// CreateJFR creates a receive queue.
func (c *devContext) CreateJFR(cfg urma.JFRConfig) (urma.JFR, error) {
	if err := c.begin("create_jfr"); err != nil {
		return nil, err
	}
	defer c.end()
	return newJFR(c, cfg)
}

// CreateJetty creates a jetty on a shared JFR.
func (c *devContext) CreateJetty(cfg urma.JettyConfig) (urma.Jetty, error) {
	if err := c.begin("create_jetty"); err != nil {
		return nil, err
	}
	defer c.end()
	return newJetty(c, cfg)
}

// RegisterSegment registers memory from urma.AllocMemory or
// urma.AllocPrivateMemory.
func (c *devContext) RegisterSegment(mem *urma.Memory, cfg urma.SegmentConfig) (urma.Segment, error) {
	if err := c.begin("register_seg"); err != nil {
		return nil, err
	}
	defer c.end()
	return registerSegment(c, mem, cfg)
}

// ImportSegment imports a peer's segment; liburma stores the token.
func (c *devContext) ImportSegment(id urma.SegmentID, token urma.Token) (urma.RemoteSegment, error) {
	if err := c.begin("import_seg"); err != nil {
		return nil, err
	}
	defer c.end()
	return importSegment(c, id, token)
}

// ImportJetty imports a peer's jetty; liburma stores the token. The call
// cannot be interrupted once in liburma, so ctx is checked before it (and
// Close waits for it).
func (c *devContext) ImportJetty(ctx context.Context, id urma.JettyID, mode urma.TransportMode, token urma.Token) (urma.RemoteJetty, error) {
	if err := c.begin("import_jetty"); err != nil {
		return nil, err
	}
	defer c.end()
	return importJetty(ctx, c, id, mode, token)
}

// deletion is the state of an object's delete in liburma, under the
// object's mutex. One delete runs at a time, and a Close that finds one
// running waits for its outcome. A delete that fails leaves the object open,
// so that Close returns the error and can be called again, unless it was
// forced: the provider is closing, and nothing may reach liburma through
// the object after.
type deletion struct {
	closed  bool          // no new work: a delete runs, or the object is gone
	running chan struct{} // closed when the running delete returns
}

// await waits for a running delete; mu is held, and released meanwhile.
// It says whether the object is still there to delete.
func (d *deletion) await(mu *sync.Mutex) bool {
	for d.running != nil {
		ch := d.running
		mu.Unlock()
		<-ch
		mu.Lock()
	}
	return !d.closed
}

// start marks a delete running; mu is held.
func (d *deletion) start() {
	d.closed = true
	d.running = make(chan struct{})
}

// end records the outcome of the running delete: the object is gone when
// the delete succeeded or was forced, and open again otherwise.
func (d *deletion) end(mu *sync.Mutex, gone bool) {
	mu.Lock()
	close(d.running)
	d.running = nil
	d.closed = gone
	mu.Unlock()
}

// cEID is an EID as liburma's urma_eid_t raw bytes.
func cEID(e urma.EID) (out [16]C.uint8_t) {
	for i := range e {
		out[i] = C.uint8_t(e[i])
	}
	return out
}

// errClosed builds the error every verb returns on a destroyed object.
func errClosed(op, what string) error { return lifecycle.Closed(op, what) }
