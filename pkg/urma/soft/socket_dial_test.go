package soft

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A dialer told DUPLICATE waits for the peer's own connection, redialing
// with a backoff that doubles from a millisecond up to 100 ms, until the
// dial timeout: against a peer that always says DUPLICATE it dials a
// handful of times, not in a tight loop, and the import then fails: the
// peer is unreachable.
func TestDuplicateRedialBacksOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustOK(t, err, "listen")
	defer ln.Close()
	eid, err := SocketEID(netip.MustParseAddrPort(ln.Addr().String()))
	mustOK(t, err, "EID")
	var dials atomic.Int64
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			var hb [4 + helloLen]byte
			if _, err := io.ReadFull(nc, hb[:]); err == nil {
				var ab [4 + helloAckLen]byte
				_, _ = nc.Write(encodeHelloAck(ab[:], &helloAck{status: helloDuplicate, eid: eid, maxMsg: 1 << 20}))
			}
			_ = nc.Close()
		}
	}()
	opts := socketOpts()
	opts.DialTimeout = time.Second
	a := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
	_, err = a.ctx.ImportJetty(context.Background(), urma.JettyID{EID: eid, ID: 1}, urma.RC, 0)
	if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "connect to") {
		t.Fatalf("import from a peer that always says DUPLICATE: %v", err)
	}
	_ = ln.Close()
	<-served
	// 1+2+4+...+64 ms, then 100 ms at a time: at most 17 dials fit in the
	// second; a slow machine makes fewer.
	if n := dials.Load(); n < 2 || n > 17 {
		t.Errorf("%d dials in a %v dial timeout against DUPLICATE answers, want a few (2..17)", n, opts.DialTimeout)
	}
}

// An idle connection whose peer is alive outlives PeerTimeout many times
// over: each side PINGs when it has written nothing for a watchdog tick, and
// what it reads keeps the connection alive. The test waits for a dozen
// PINGs each way, three PeerTimeouts' worth, on the one connection.
func TestIdleConnectionKeptAliveByPings(t *testing.T) {
	noLeaks(t)
	pa, pb := newProvider(t, socketOpts()), newProvider(t, socketOpts())
	a := newSide(t, pa, urma.JettyConfig{}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	a.importJetty(b)
	ca, cb := pa.conns(), pb.conns()
	if len(ca) != 1 || len(cb) != 1 {
		t.Fatalf("%d and %d connections, want one each", len(ca), len(cb))
	}
	const pings = 12
	startA, startB := ca[0].rx.Load(), cb[0].rx.Load()
	waitUntil(t, "a dozen PINGs each way", func() bool {
		for _, c := range []*conn{ca[0], cb[0]} {
			c.mu.Lock()
			dead, err := c.dead, c.err
			c.mu.Unlock()
			if dead {
				t.Fatalf("the idle connection died: %v", err)
			}
		}
		return ca[0].rx.Load()-startA >= pings*(4+pingLen) && cb[0].rx.Load()-startB >= pings*(4+pingLen)
	})
}

// A connection whose peer says nothing after the handshake is declared dead
// after four watchdog ticks without a byte; meanwhile it PINGs only on a
// tick on which it wrote nothing since the one before: once (twice if the
// first tick came before its import request was out), not on every tick.
func TestSilentPeerPingedOnlyWhenIdle(t *testing.T) {
	noLeaks(t)
	f := newFakePeer(t)
	pings := make(chan int, 1)
	go func() {
		n := 0
		defer func() { pings <- n }()
		nc, err := f.ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		var hb [4 + helloLen]byte
		if _, err := io.ReadFull(nc, hb[:]); err != nil {
			return
		}
		var ab [4 + helloAckLen]byte
		if _, err := nc.Write(encodeHelloAck(ab[:], &helloAck{eid: f.eid, maxMsg: 1 << 20})); err != nil {
			return
		}
		// Frames until the device hangs up; it sends no SEND, so each is
		// its length and that many bytes.
		for {
			var lb [4]byte
			if _, err := io.ReadFull(nc, lb[:]); err != nil {
				return
			}
			b := make([]byte, be.Uint32(lb[:]))
			if _, err := io.ReadFull(nc, b); err != nil {
				return
			}
			if len(b) > 0 && b[0] == framePing {
				n++
			}
		}
	}()
	a := newSide(t, newProvider(t, socketOpts()), urma.JettyConfig{}, 64)
	if _, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9); !errors.Is(err, urma.ErrUnreachable) {
		t.Fatalf("import from a peer that never answers: %v, want unreachable", err)
	}
	if n := <-pings; n < 1 || n > 2 {
		t.Errorf("%d PINGs to a silent peer over the four ticks before it was declared dead, want 1 or 2", n)
	}
}
