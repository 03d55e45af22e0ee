package urmatest

import (
	"context"
	"errors"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func init() {
	register("TargetJettyDestroyed", testTargetDestroyed)
	register("PeerKilled", testPeerKilled)
}

// Sends to a jetty that no longer exists complete with an error, never hang.
func testTargetDestroyed(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	// One send waits for a receive (RNR, forever) when the target goes.
	a.send(target, 1, 0, 64)
	empty(t, a.sendJFC, "before the target goes")
	must(t, b.jetty.Close(), "destroy target jetty")
	b.jetty = nil
	cs := wait(t, a.sendJFC, 1, pr.PeerGoneTimeout)
	if !statusIn(cs[0].Status, urma.StatusRemAccessAbort, urma.StatusAckTimeout) || cs[0].UserCtx != 1 {
		t.Errorf("send to a destroyed jetty completed as %+v, want REM_ACCESS_ABORT or ACK_TIMEOUT", cs[0])
	}
}

// When the peer vanishes, outstanding sends and new ones complete with
// errors within the bound, and importing from it fails.
func testPeerKilled(t *testing.T, pr Pair) {
	if pr.KillB == nil {
		t.Skip("the pair has no KillB hook")
	}
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	a2 := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	b2 := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	idleTarget := a2.importFrom(b2, b2.cfg.Token)
	// Prove the path works, then leave a send waiting on RNR.
	b2.postRecv(1, 0, 64)
	a2.send(idleTarget, 1, 0, 64)
	wait(t, a2.sendJFC, 1, waitTimeout)
	a.send(target, 7, 0, 64)
	a.send(target, 8, 64, 64)
	empty(t, a.sendJFC, "before the peer vanishes")

	pr.KillB()

	cs := wait(t, a.sendJFC, 2, pr.PeerGoneTimeout)
	if cs[0].Status == urma.StatusSuccess || cs[0].UserCtx != 7 {
		t.Errorf("outstanding send completed as %+v after the peer vanished, want an error", cs[0])
	}
	if cs[1].Status == urma.StatusSuccess || cs[1].UserCtx != 8 {
		t.Errorf("second outstanding send completed as %+v, want an error", cs[1])
	}
	// A jetty that was idle fails its next send.
	if err := a2.jetty.PostSend(a2.sendWR(idleTarget, 9, 0, 64)); err == nil {
		c := wait(t, a2.sendJFC, 1, pr.PeerGoneTimeout)[0]
		if c.Status == urma.StatusSuccess || c.UserCtx != 9 {
			t.Errorf("send to a vanished peer completed as %+v, want an error", c)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), pr.PeerGoneTimeout)
	defer cancel()
	_, err := a.ctx.ImportJetty(ctx, b2.jetty.ID(), urma.RC, b2.cfg.Token)
	if !errors.Is(err, urma.ErrUnreachable) && !errors.Is(err, urma.ErrTimeout) {
		t.Errorf("import from a vanished peer: want ErrUnreachable or ErrTimeout, got %v", err)
	}
}
