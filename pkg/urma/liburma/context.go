//go:build linux && cgo

package liburma

/*
#include "shim.h"
*/
import "C"

import (
	"context"
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

	// deleteOnce guards urma_delete_context, which frees the context:
	// Close and Provider.Close (forceClose, on a context it listed before
	// Close forgot it) can both get there. Once also holds the second
	// caller until the delete returns, so Provider.Close never releases
	// liburma under it.
	deleteOnce sync.Once
	deleteErr  error
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
// from it are alive. Closing twice is a no-op.
func (c *devContext) Close() error {
	c.creating.Lock() // a creation under way is a child: ErrBusy
	done, err := c.children.Close("delete_context")
	c.creating.Unlock()
	if !done {
		return err
	}
	return c.delete()
}

// delete deletes the context in liburma once, however many callers; each
// gets that one call's error.
func (c *devContext) delete() error {
	c.deleteOnce.Do(func() {
		st := C.shim_delete_context(c.lib.c, c.c)
		c.prov.forgetContext(c)
		if st != 0 {
			c.deleteErr = statusErr("delete_context", st, "delete the context")
		}
	})
	return c.deleteErr
}

// forceClose destroys every child in teardown order, then the context,
// unless a Close deleted it already.
func (c *devContext) forceClose() {
	c.creating.Lock() // creations under way finish, and are destroyed
	c.children.ForceClose()
	c.creating.Unlock()
	if err := c.delete(); err != nil {
		c.prov.log.Error(err, "closing the provider")
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

// closeOnce marks an object closed under its lock, and says whether this
// call did: only that caller destroys it.
func closeOnce(mu *sync.Mutex, closed *bool) bool {
	mu.Lock()
	defer mu.Unlock()
	if *closed {
		return false
	}
	*closed = true
	return true
}

// released forgets a child whose liburma object the destroy call that
// returned st has deleted, and reports that call's failure.
func (c *devContext) released(ch lifecycle.Child, st C.int, op, format string, args ...any) error {
	c.release(ch)
	if st != 0 {
		return statusErr(op, st, format, args...)
	}
	return nil
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
