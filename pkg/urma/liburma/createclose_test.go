//go:build linux && cgo

package liburma

import (
	"errors"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A context is not deleted, nor liburma uninitialised, under a creation in
// liburma: the object is no child yet, so without a hold Close found the
// context empty and deleted it while urma_create_jfc used it (a use after
// free in liburma). The fake's gate holds urma_create_jfc in the middle and
// fails it with EFAULT when the context went meanwhile. Context.Close must
// wait and then refuse (ErrBusy: the JFC is a child by then);
// Provider.Close must wait and then destroy the JFC with the rest.
func TestCloseWaitsForACreation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		blocked string // where Close waits
		close   func(p *Provider, c urma.Context) error
		want    error // Close's error
	}{
		{"context", "liburma.(*devContext).Close", func(_ *Provider, c urma.Context) error { return c.Close() }, urma.ErrBusy},
		{"provider", "liburma.(*devContext).forceClose", func(p *Provider, _ urma.Context) error { return p.Close() }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := providerOfFake(t, "fakeurma")
			c, err := p.Open("udma0", 0)
			if err != nil {
				t.Fatal(err)
			}
			created := createJFCHeld(t, p, c, urma.JFCConfig{Depth: 16})
			closed := make(chan struct{})
			var closeErr error
			go func() {
				defer close(closed)
				closeErr = tc.close(p, c)
			}()
			if !waitBlockedIn(closed, tc.blocked) {
				t.Errorf("%s Close returned (%v) while a JFC was being created on the context", tc.name, closeErr)
			}
			if err := p.lib.fakeGate(""); err != nil {
				t.Fatal(err)
			}
			cr := <-created
			<-closed
			if cr.err != nil {
				t.Errorf("CreateJFC: %v; the context went under it", cr.err)
			}
			if tc.want == nil && closeErr != nil || tc.want != nil && !errors.Is(closeErr, tc.want) {
				t.Errorf("Close: %v, want %v", closeErr, tc.want)
			}
			if cr.err == nil && tc.want != nil {
				closeAll(t, cr.q, c)
			}
		})
	}
}

// jfcCreation is what a CreateJFC run by createJFCHeld returned.
type jfcCreation struct {
	q   urma.JFC
	err error
}

// createJFCHeld starts c.CreateJFC(cfg) and returns once the fake's gate
// holds it in the middle of urma_create_jfc; opening the gate
// (p.lib.fakeGate("")) lets it finish into the channel.
func createJFCHeld(t *testing.T, p *Provider, c urma.Context, cfg urma.JFCConfig) <-chan jfcCreation {
	t.Helper()
	if err := p.lib.fakeGate("urma_create_jfc"); err != nil {
		t.Fatal(err)
	}
	created := make(chan jfcCreation, 1)
	go func() {
		q, err := c.CreateJFC(cfg)
		created <- jfcCreation{q, err}
	}()
	if err := p.lib.fakeHook("fakeurma_wait_gated", nil); err != nil {
		t.Fatal(err)
	}
	return created
}
