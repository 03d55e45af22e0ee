package soft

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
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
// what it reads keeps the connection alive. The test waits for six PINGs
// each way, three PeerTimeouts' worth, on the one connection. (A
// PeerTimeout of a second: a loaded machine may hold a goroutine up for a
// good part of the shorter one the other tests use.)
func TestIdleConnectionKeptAliveByPings(t *testing.T) {
	noLeaks(t)
	opts := socketOpts()
	opts.PeerTimeout = time.Second
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	a.importJetty(b)
	ca, cb := pa.conns(), pb.conns()
	if len(ca) != 1 || len(cb) != 1 {
		t.Fatalf("%d and %d connections, want one each", len(ca), len(cb))
	}
	const pings = 6 // a PING every other tick of PeerTimeout/4
	startA, startB := ca[0].rx.Load(), cb[0].rx.Load()
	eventually.Holds(t, "six PINGs each way", 0, func() bool {
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

// When two devices dial each other at once, the connection dialed by the
// device with the smaller EID wins, on both ends: a device that is dialing a
// peer accepts that peer's own dial when the peer's EID is the smaller, and
// answers DUPLICATE when it is the larger (its own dial will win).
func TestCrossedDialsSmallerEIDWins(t *testing.T) {
	low, high := urma.EID{0: 1, 15: 1}, urma.EID{0: 0xff, 15: 1}
	cases := []struct {
		name string
		peer urma.EID
		want uint8
	}{
		{"the peer EID is smaller", low, helloOK},
		{"the peer EID is larger", high, helloDuplicate},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			// The peer's listener takes the device's dial and holds it
			// unanswered: the device is dialing while the peer dials it.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			mustOK(t, err, "listen")
			defer ln.Close()
			dialed := make(chan net.Conn, 1)
			go func() {
				nc, err := ln.Accept()
				if err != nil {
					close(dialed)
					return
				}
				var hb [4 + helloLen]byte
				_, _ = io.ReadFull(nc, hb[:])
				dialed <- nc
			}()
			opts := socketOpts()
			opts.DialTimeout = 20 * time.Second // the device's dial must still be on when the peer's arrives
			opts.Resolver = func(context.Context, urma.EID) (string, error) { return ln.Addr().String(), nil }
			p := newProvider(t, opts)
			dev := p.devices[0].side.eid
			if bytes.Compare(low[:], dev[:]) >= 0 || bytes.Compare(high[:], dev[:]) <= 0 {
				t.Fatalf("device EID %s is not between %s and %s", dev, low, high)
			}
			a := newSide(t, p, urma.JettyConfig{}, 64)
			ctx, cancel := context.WithCancel(t.Context())
			imported := make(chan struct{})
			go func() {
				defer close(imported)
				_, _ = a.ctx.ImportJetty(ctx, urma.JettyID{EID: c.peer, ID: 1}, urma.RC, 0)
			}()
			held, ok := <-dialed
			if !ok {
				t.Fatal("the device did not dial")
			}
			nc, err := net.Dial("tcp", p.addr())
			mustOK(t, err, "dial the device")
			var hb [4 + helloLen]byte
			_, err = nc.Write(encodeHello(hb[:], &hello{session: 1, src: c.peer, dst: dev, maxMsg: 1 << 20}))
			mustOK(t, err, "send HELLO")
			var ab [4 + helloAckLen]byte
			_, err = io.ReadFull(nc, ab[:])
			mustOK(t, err, "read HELLO_ACK")
			ack, err := decodeHelloAck(ab[:])
			mustOK(t, err, "decode HELLO_ACK")
			if ack.status != c.want {
				t.Errorf("device %s answered a dial from %s, while dialing it, with status %d, want %d", dev, c.peer, ack.status, c.want)
			}
			_ = nc.Close()
			_ = held.Close()
			cancel()
			<-imported
		})
	}
}
