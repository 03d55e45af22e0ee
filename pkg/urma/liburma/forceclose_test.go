//go:build linux && cgo

package liburma

import (
	"runtime"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Provider.Close acknowledges the events left on a JFC before deleting it,
// also when another goroutine's JFC.Close is already waiting in
// urma_delete_jfc for those acknowledgements: that Close returns, and the
// JFC is gone before Provider.Close deletes its JFCE and the context.
// Skipping a JFC that is closing left its Close blocked for good and tore
// down the JFCE and the context under a live JFC.
func TestProviderCloseUnblocksJFCClose(t *testing.T) {
	p, err := newProvider(Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Open("udma0", 0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.CreateJFCE()
	if err != nil {
		t.Fatal(err)
	}
	q, err := c.CreateJFC(urma.JFCConfig{Depth: 16, JFCE: e})
	if err != nil {
		t.Fatal(err)
	}
	firstEvent(t, c, e, q)
	// The event is not acknowledged, so Close waits in urma_delete_jfc.
	closed := make(chan error, 1)
	go func() { closed <- q.Close() }()
	for !q.(*jfc).isClosed() {
		runtime.Gosched()
	}
	if err := p.Close(); err != nil {
		t.Fatalf("provider Close: %v", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("JFC Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("JFC Close still waits for an acknowledgement after Provider.Close")
	}
}

// firstEvent makes q fire once, through a loopback send on c, and takes
// the event from e without acknowledging it. The queues it creates are
// closed again; q and e stay.
func firstEvent(t *testing.T, c urma.Context, e urma.JFCE, q urma.JFC) {
	t.Helper()
	r, err := c.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 4, JFC: q})
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 4, SendJFC: q, JFR: r})
	if err != nil {
		t.Fatal(err)
	}
	target, err := c.ImportJetty(t.Context(), j.ID(), urma.RM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.PostRecv(&urma.RecvWR{UserCtx: 1}); err != nil {
		t.Fatal(err)
	}
	if err := q.Rearm(false); err != nil {
		t.Fatal(err)
	}
	if err := j.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 2}); err != nil {
		t.Fatal(err)
	}
	var fired [1]urma.JFC
	if n, err := e.Wait(fired[:], 5*time.Second); n != 1 || err != nil || fired[0] != q {
		t.Fatalf("wait for the event: %d, %v", n, err)
	}
	closeAll(t, j, target, r)
}

// isClosed says whether Close or ForceClose has begun destroying q.
func (q *jfc) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}
