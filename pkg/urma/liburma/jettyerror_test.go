//go:build linux && cgo

package liburma

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A jetty the device errors on its own (a jetty error event: the JFC gets
// FLUSH_ERR_DONE with no failed send before it) is ERROR in Go once Poll
// meets that record: its outstanding sends complete with WR_FLUSH_ERR,
// later posts fail with ErrInval, and SetError adds the FLUSH_ERR_DONE.
// Left READY, the jetty took posts that udma queues on a flushed jetty and
// never completes.
func TestDeviceErroredJettyIsError(t *testing.T) {
	requireFake(t)
	p := newTestProvider(t)
	a, b := openFlushPeer(t, p, "udma0", 4), openFlushPeer(t, p, "udma1", 4)
	target := importPeer(t, a, b)
	// B posts no receive: send 1 waits for one (RNR, retried forever), and
	// send 2 queues behind it.
	for i := range 2 {
		wr := &urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i + 1)}
		if err := a.jetty.PostSend(wr); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.lib.fakeHook("fakeurma_error_jetty", unsafe.Pointer(a.jetty.(*jetty).c)); err != nil {
		t.Fatal(err)
	}
	buf := make([]urma.Completion, 8)
	n, err := a.jfc.Poll(buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || buf[0].Status != urma.StatusWRFlushErr || buf[0].UserCtx != 1 || buf[1].Status != urma.StatusWRFlushErr || buf[1].UserCtx != 2 {
		t.Fatalf("poll: %+v, want sends 1 and 2 as WR_FLUSH_ERR", buf[:n])
	}
	if s := a.jetty.State(); s != urma.JettyError {
		t.Errorf("jetty %v after the device errored it, want ERROR", s)
	}
	err = a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 3})
	if !errors.Is(err, urma.ErrInval) {
		t.Errorf("post on the errored jetty: %v, want ErrInval (udma queues it on a flushed jetty and never completes it)", err)
	}
	if err := a.jetty.SetError(); err != nil {
		t.Fatal(err)
	}
	if got := pollUntilFlushDone(t, a.jfc); len(got) != 1 {
		t.Errorf("after SetError: %+v, want only WR_FLUSH_ERR_DONE", got)
	}
}
