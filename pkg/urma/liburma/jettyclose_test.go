//go:build linux && cgo

package liburma

import (
	"errors"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Closing a jetty drops its completions not yet polled: udma's
// urma_delete_jetty removes every record of the jetty from its JFCs
// (hw/udma/udma_u_jfc.c udma_u_clean_jfc), and the provider presents the
// same whether a record is still in liburma or already with the provider.
// Jetty ids are reused, so a record that outlived its jetty would be taken
// for one of the next jetty with that id.
func TestJettyCloseDropsItsCompletions(t *testing.T) {
	t.Run("in-liburma", func(t *testing.T) {
		p := newTestProvider(t)
		a, b := openFlushPeer(t, p, "udma0", 4), openFlushPeer(t, p, "udma1", 4)
		target := importPeer(t, a, b)
		if err := b.jfr.PostRecv(&urma.RecvWR{UserCtx: 9}); err != nil {
			t.Fatal(err)
		}
		if err := a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 1}); err != nil {
			t.Fatal(err)
		}
		if err := a.jetty.Close(); err != nil {
			t.Fatal(err)
		}
		a.jetty = nil
		if n, err := a.jfc.Poll(make([]urma.Completion, 4)); n != 0 || err != nil {
			t.Errorf("poll after the jetty closed: %d records, %v; want its send completion dropped", n, err)
		}
	})
	t.Run("held-by-the-provider", func(t *testing.T) {
		p := newTestProvider(t)
		a, b := openFlushPeer(t, p, "udma0", 4), openFlushPeer(t, p, "udma1", 4)
		target := importPeer(t, a, b)
		// B posts no receive: send 1 waits (RNR, forever), 2 and 3 queue.
		for i := range 3 {
			if err := a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i + 1)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.jetty.SetError(); err != nil {
			t.Fatal(err)
		}
		// Two records fit: the provider keeps send 3's WR_FLUSH_ERR and
		// the FLUSH_ERR_DONE for the next Poll.
		if n, err := a.jfc.Poll(make([]urma.Completion, 2)); n != 2 || err != nil {
			t.Fatalf("poll: %d, %v; want sends 1 and 2", n, err)
		}
		if err := a.jetty.Close(); err != nil {
			t.Fatal(err)
		}
		a.jetty = nil
		got := make([]urma.Completion, 4)
		if n, err := a.jfc.Poll(got); n != 0 || err != nil {
			t.Errorf("poll after the jetty closed: %+v, %v; want the records the provider held for it dropped", got[:n], err)
		}
	})
}

// An RC jetty whose unbind fails stays open and bound: liburma refuses to
// delete a bound RC jetty (URMA_ENOPERM) and to unimport its target, so a
// Close that went on forgot both while liburma kept them, and the target's
// Close then failed in liburma with the import forgotten too. Close fails,
// the target stays busy, and a second Close finishes the job. Provider.Close
// closes the jetty all the same, and reports the failure: nothing may reach
// liburma through it once liburma is uninitialised. liburma then keeps the bound jetty and its
// context (it refuses to delete them), so that case runs on a fake of its
// own: on the shared one they would be there for every later test.
func TestJettyCloseUnbindFails(t *testing.T) {
	t.Run("close", func(t *testing.T) { testJettyCloseUnbindFails(t, newTestProvider(t)) })
	t.Run("provider-close", func(t *testing.T) {
		e := boundRCPair(t, providerOfFake(t, "fakeurma"))
		if err := e.ajetty.(*jetty).ctx.prov.Close(); err == nil || !strings.Contains(err.Error(), "unbind_jetty") {
			t.Errorf("Provider.Close: %v, want the failed unbind reported", err)
		}
		err := e.ajetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Target: e.target, UserCtx: 3})
		if !errors.Is(err, urma.ErrClosed) {
			t.Errorf("post after Provider.Close: %v, want ErrClosed", err)
		}
	})
}

// boundRCPair is an RC pair whose jetty a is bound and whose next unbind
// fails.
func boundRCPair(t *testing.T, p *Provider) *pairEnds {
	t.Helper()
	requireFake(t)
	e := newPairEndsOn(t, p, urma.RC)
	if err := e.bjfr.PostRecv(&urma.RecvWR{UserCtx: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.ajetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Target: e.target, UserCtx: 2}); err != nil {
		t.Fatal(err) // binds
	}
	if err := e.ajetty.(*jetty).ctx.lib.fakeHook("fakeurma_fail_unbind", nil); err != nil {
		t.Fatal(err)
	}
	return e
}

func testJettyCloseUnbindFails(t *testing.T, p *Provider) {
	e := boundRCPair(t, p)
	if err := e.ajetty.Close(); err == nil {
		t.Fatal("jetty Close succeeded though its unbind failed")
	}
	if err := e.target.Close(); !errors.Is(err, urma.ErrBusy) {
		t.Errorf("target Close while the jetty is still bound: %v, want ErrBusy", err)
	}
	if err := e.ajetty.Close(); err != nil {
		t.Errorf("jetty Close again: %v", err)
	}
	if err := e.target.Close(); err != nil {
		t.Errorf("target Close once the jetty is closed: %v", err)
	}
}
