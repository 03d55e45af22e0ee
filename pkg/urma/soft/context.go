package soft

import (
	"context"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/internal/lifecycle"
)

// devContext is an open device (urma.Context).
type devContext struct {
	prov  *Provider
	dev   *device
	eid   urma.EID
	uasid uint32

	children lifecycle.Children
}

var _ urma.Context = (*devContext)(nil)

func (c *devContext) Device() urma.DeviceInfo { return c.dev.infoCopy() }
func (c *devContext) EID() urma.EID           { return c.eid }
func (c *devContext) UASID() uint32           { return c.uasid }

// adopt registers a new child; it fails once the context is closed.
func (c *devContext) adopt(ch lifecycle.Child, op string) error { return c.children.Adopt(ch, op) }

func (c *devContext) release(ch lifecycle.Child) { c.children.Release(ch) }

func (c *devContext) isClosed() bool { return c.children.Check("") != nil }

// Close destroys the context; it fails with ErrBusy while objects created
// from it are alive. Closing twice is a no-op.
func (c *devContext) Close() error {
	done, err := c.children.Close("delete_context")
	if done {
		c.prov.forgetContext(c)
	}
	return err
}

// forceClose destroys every child, in teardown order, then the context.
func (c *devContext) forceClose() {
	c.children.ForceClose()
	c.prov.forgetContext(c)
}

// CreateJFCE creates a completion event channel.
func (c *devContext) CreateJFCE() (urma.JFCE, error) { return newJFCE(c) }

// CreateJFC creates a completion queue.
func (c *devContext) CreateJFC(cfg urma.JFCConfig) (urma.JFC, error) { return newJFC(c, cfg) }

// CreateJFR creates a receive queue.
func (c *devContext) CreateJFR(cfg urma.JFRConfig) (urma.JFR, error) { return newJFR(c, cfg) }

// CreateJetty creates a jetty.
func (c *devContext) CreateJetty(cfg urma.JettyConfig) (urma.Jetty, error) { return newJetty(c, cfg) }

// RegisterSegment registers mmap'd memory.
func (c *devContext) RegisterSegment(mem *urma.Memory, cfg urma.SegmentConfig) (urma.Segment, error) {
	return newSegment(c, mem, cfg)
}

// ImportSegment imports a peer's segment; the token is stored, not checked.
func (c *devContext) ImportSegment(id urma.SegmentID, token urma.Token) (urma.RemoteSegment, error) {
	return importSegment(c, id, token)
}

// ImportJetty imports a peer's jetty after checking that it exists in mode;
// the token is stored and checked by the target on every message.
func (c *devContext) ImportJetty(ctx context.Context, id urma.JettyID, mode urma.TransportMode, token urma.Token) (urma.RemoteJetty, error) {
	return importJetty(ctx, c, id, mode, token)
}
