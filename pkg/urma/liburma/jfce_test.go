//go:build linux && cgo

package liburma

import (
	"errors"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A JFCE is not deleted under a JFC being created on it: the JFC counted
// as the JFCE's user only once urma_create_jfc had returned, so
// JFCE.Close found no user and urma_delete_jfce freed the JFCE the
// creation was handing to liburma. The fake's gate holds urma_create_jfc
// and fails it with EFAULT when the JFCE went meanwhile; JFCE.Close must
// refuse (ErrBusy) instead.
func TestJFCECloseDuringJFCCreation(t *testing.T) {
	p := providerOfFake(t, "fakeurma")
	c, err := p.Open("udma0", 0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.CreateJFCE()
	if err != nil {
		t.Fatal(err)
	}
	created := createJFCHeld(t, p, c, urma.JFCConfig{Depth: 16, JFCE: e})
	closeErr := e.Close()
	if err := p.lib.fakeGate(""); err != nil {
		t.Fatal(err)
	}
	cr := <-created
	if !errors.Is(closeErr, urma.ErrBusy) {
		t.Errorf("JFCE Close while a JFC is being created on it: %v, want ErrBusy", closeErr)
	}
	if cr.err != nil {
		t.Fatalf("CreateJFC: %v; the JFCE went under it", cr.err)
	}
	closeAll(t, cr.q, e, c)
}
