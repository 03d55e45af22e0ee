// Package lifecycle keeps liburma's rule for the objects of a context, for
// every provider: a context refuses to go while objects created from it
// live, and a provider that closes destroys them in liburma's order.
package lifecycle

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Child is an object created from a context.
type Child interface {
	// ForceClose destroys the object without asking (the provider is
	// closing).
	ForceClose()
	// Kind names it in errors and orders teardown; one of TeardownOrder.
	Kind() string
}

// TeardownOrder is the order ForceClose destroys children in: what uses an
// object goes before it, as liburma wants.
var TeardownOrder = []string{"jetty", "remote jetty", "remote segment", "JFR", "JFC", "JFCE", "segment"}

// Children is a context's live objects. The zero value is ready.
type Children struct {
	mu     sync.Mutex
	closed bool
	set    map[Child]struct{}
}

// Adopt registers a new child; it fails with ErrClosed once the context is.
func (c *Children) Adopt(ch Child, op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Closed(op, "context")
	}
	if c.set == nil {
		c.set = make(map[Child]struct{})
	}
	c.set[ch] = struct{}{}
	return nil
}

// Release forgets a destroyed child.
func (c *Children) Release(ch Child) {
	c.mu.Lock()
	delete(c.set, ch)
	c.mu.Unlock()
}

// Check fails with ErrClosed once the context is closed.
func (c *Children) Check(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Closed(op, "context")
	}
	return nil
}

// Close marks the context closed when no child lives, and otherwise fails
// with ErrBusy naming what is left. done is false when it was closed
// already (closing twice is a no-op).
func (c *Children) Close(op string) (done bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false, nil
	}
	if len(c.set) > 0 {
		counts := map[string]int{}
		for ch := range c.set {
			counts[ch.Kind()]++
		}
		var parts []string
		for k, n := range counts {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
		sort.Strings(parts)
		return false, urma.Errorf(op, urma.CodeBusy, "context still has %s; destroy them first", strings.Join(parts, ", "))
	}
	c.closed = true
	return true, nil
}

// Reopen undoes a Close whose delete failed: the context is still there,
// and adopts children again.
func (c *Children) Reopen() {
	c.mu.Lock()
	c.closed = false
	c.mu.Unlock()
}

// ForceClose marks the context closed and destroys every child, in
// TeardownOrder.
func (c *Children) ForceClose() {
	c.mu.Lock()
	c.closed = true
	kids := make([]Child, 0, len(c.set))
	for ch := range c.set {
		kids = append(kids, ch)
	}
	c.mu.Unlock()
	for _, k := range TeardownOrder {
		for _, ch := range kids {
			if ch.Kind() == k {
				ch.ForceClose()
			}
		}
	}
}

// Closed is the error every verb returns on a destroyed object.
func Closed(op, what string) error {
	return urma.Errorf(op, urma.ErrClosed.Code, "%s is closed", what)
}
