package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// The attacks of issue 40 on the transport: a third party that completed a
// handshake of its own with a Listener (so it holds a token that Listener
// sent) aims SENDs at the jetty of another client's connection, whose id it
// guesses (jetty ids are small numbers; the tests read it from Debug). A
// connection's bytes must reach only its two ends: the victim reads only
// its peer's bytes, is neither ended nor broken, and its credits do not
// move.

// foreignAttack is one send a third party aims at a victim's jetty.
type foreignAttack struct {
	name    string
	op      urma.Opcode
	payload []byte
	imm     uint64
	// primeWindow has the victim write to its peer first, which does not
	// read, so that its remote receive window is below its capacity and a
	// credit would fit.
	primeWindow bool
}

var foreignAttacks = []foreignAttack{
	{name: "injected data", op: urma.OpSend, payload: []byte(injected)},
	{name: "a close marker", op: urma.OpSendWithImm, imm: closeMarkerImm},
	{name: "credits beyond the window", op: urma.OpSendWithImm, imm: 1000},
	{name: "credits within the window", op: urma.OpSendWithImm, imm: 1, primeWindow: true},
	{name: "a zero-length message", op: urma.OpSend},
	{name: "oversized message", op: urma.OpSend, payload: make([]byte, rawBuf)},
}

// TestForeignJettyCannotReachAConnection is attack 2 of issue 40: a second
// client of a Listener sends, with the token from its own handshake, to
// the jetty of the Listener's connection with a first client. With a token
// per connection the provider refuses the send (REM_ACCESS_ABORT at the
// attacker); on a Listener without tokens (Config.NoToken, as for brpc
// clients) the message reaches the jetty, and the receiver drops it for
// its source, reposts the receive and counts it. Either way the victim
// reads only its client's bytes, is neither ended nor broken, and its
// credits do not move.
func TestForeignJettyCannotReachAConnection(t *testing.T) {
	checkNoLeaks(t)
	for _, mode := range []struct {
		name    string
		noToken bool
	}{
		{"tokens", false},
		{"source check", true},
	} {
		for _, attack := range foreignAttacks {
			t.Run(mode.name+"/"+attack.name, func(t *testing.T) {
				ps := fabricOf(t, 3)
				reg := prometheus.NewRegistry()
				scfg := cfgWith(ps[0], smallFlags())
				scfg.Registerer, scfg.NoToken = reg, mode.noToken
				ln, d := listenAndDialer(t, scfg, cfgWith(ps[1], smallFlags()))
				victim := dialAccept(t, ln, d)
				requireURMA(t, "victim", victim.client, victim.server)
				attacker := newOurRawPeer(t, ps[2], ln.Addr().String())
				ac, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = ac.Close() })

				var primed []byte
				if attack.primeWindow {
					primed = []byte("held by the client, unread")
					if _, err := victim.server.Write(primed); err != nil {
						t.Fatal(err)
					}
				}
				before := victim.server.Debug()
				target := before.LocalJetty // guessable: ids are small numbers
				st := attacker.injectInto(target, urma.Token(attacker.server.Token), attack.op, attack.payload, attack.imm)
				t.Logf("the attacker's send completed with %s", st)
				if !mode.noToken && st != urma.StatusRemAccessAbort {
					t.Errorf("the attacker's send to another connection's jetty completed with %s, want %s: the token of its own handshake opened it", st, urma.StatusRemAccessAbort)
				}

				// The victim's client writes; the server reads exactly that.
				// An injected message would come first (it completed before
				// this write began), an end or a break would be an error.
				legit := "legit bytes from the victim's client"
				if _, err := victim.client.Write([]byte(legit)); err != nil {
					t.Fatal(err)
				}
				_ = victim.server.SetReadDeadline(time.Now().Add(10 * time.Second))
				got := make([]byte, len(legit))
				if _, err := io.ReadFull(victim.server, got); err != nil || string(got) != legit {
					t.Fatalf("the victim read %q, %v; want only its client's %q (state %s)", got, err, legit, victim.server.Debug().State)
				}
				after := victim.server.Debug()
				if after.RemoteRQWindow != before.RemoteRQWindow {
					t.Errorf("the victim's remote receive window moved from %d to %d: a foreign message returned credits", before.RemoteRQWindow, after.RemoteRQWindow)
				}
				want := 0.0
				if mode.noToken {
					want = 1 // it reached the jetty: dropped and counted
				}
				if v := counterValue(t, reg, "urma_transport_foreign_messages_total", map[string]string{"role": "server"}); v != want {
					t.Errorf("urma_transport_foreign_messages_total = %v, want %v", v, want)
				}

				// The other direction still works: the credits were not
				// corrupted.
				back := "the server's answer"
				if _, err := victim.server.Write([]byte(back)); err != nil {
					t.Fatal(err)
				}
				wantBack := string(primed) + back
				got = make([]byte, len(wantBack))
				_ = victim.client.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.ReadFull(victim.client, got); err != nil || string(got) != wantBack {
					t.Fatalf("the victim's client read %q, %v; want %q", got, err, wantBack)
				}
			})
		}
	}
}

// TestOldPeerCannotReachANewConnection is the third part of attack 2: a
// peer whose connection ended keeps its import of the server's jetty; the
// jetty is destroyed, and a new connection's jetty gets the same id (ids
// are reused, lowest first). The old peer's sends must not reach the new
// connection.
func TestOldPeerCannotReachANewConnection(t *testing.T) {
	checkNoLeaks(t)
	for _, noToken := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoToken=%v", noToken), func(t *testing.T) {
			ps := fabricOf(t, 3)
			reg := prometheus.NewRegistry()
			sf := smallFlags()
			sf.PreparedJettyCnt = 0 // the new connection's jetty is made when it comes
			scfg := cfgWith(ps[0], sf)
			scfg.Registerer, scfg.NoToken = reg, noToken
			ln := listenLoopback(t, scfg)

			// The victim's dialer is up, its one jetty prepared, before the
			// old peer's jetty is destroyed, so that no jetty but the
			// server's is created in between (the fake liburma's providers
			// share one id table).
			cf := smallFlags()
			cfg := cfgWith(ps[1], cf)
			cfg.JettyBudget = 1
			d, err := NewDialer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			bringUp(t, d)

			old := newOurRawPeer(t, ps[2], ln.Addr().String())
			oc, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			reused := oc.(Conn).Debug().LocalJetty
			if err := oc.Close(); err != nil {
				t.Fatal(err)
			}
			victim := dialAccept(t, ln, d)
			requireURMA(t, "victim", victim.client, victim.server)
			if id := victim.server.Debug().LocalJetty; id.ID != reused.ID {
				t.Fatalf("the new connection's jetty is %d, not the ended one's %d: the provider did not reuse the id", id.ID, reused.ID)
			}

			// The old peer sends on its old import, with its old token.
			copy(old.mem.Bytes()[20*rawBuf:], injected)
			st := old.send(len(injected), 0)
			t.Logf("the old peer's send completed with %s", st)
			if !noToken && st != urma.StatusRemAccessAbort {
				t.Errorf("the old peer's send to a reused jetty id completed with %s, want %s", st, urma.StatusRemAccessAbort)
			}
			legit := "the new client's bytes"
			if _, err := victim.client.Write([]byte(legit)); err != nil {
				t.Fatal(err)
			}
			_ = victim.server.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, len(legit))
			if _, err := io.ReadFull(victim.server, got); err != nil || string(got) != legit {
				t.Fatalf("the new connection read %q, %v; want only its client's %q", got, err, legit)
			}
			want := 0.0
			if noToken {
				want = 1
			}
			if v := counterValue(t, reg, "urma_transport_foreign_messages_total", map[string]string{"role": "server"}); v != want {
				t.Errorf("urma_transport_foreign_messages_total = %v, want %v", v, want)
			}
		})
	}
}

// bringUp brings d's URMA up without a connection (a dial of a closed port
// brings it up before connecting) and waits until its jetty pool has
// prepared what its budget allows.
func bringUp(t *testing.T, d *Dialer) {
	t.Helper()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.Addr().String()
	_ = closed.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := d.DialContext(ctx, addr); err == nil {
		_ = c.Close()
		t.Fatalf("dialed the closed port %s", addr)
	}
	if !d.e.isUp() || d.e.unavailable() != nil {
		t.Fatalf("the dialer is not up: %s", d.FallbackReason())
	}
	eventually.Holds(t, "the dialer's prepared jetty", 10*time.Second, func() bool {
		prepared, _ := d.e.jetties.stats()
		return prepared == d.e.jetties.target
	})
}

// TestSocketFabricDialsOnlyTheClientsAddress is attack 7b of issue 40: on
// the socket fabric a device's EID encodes the IPv4 address and port it
// listens on, and importing the segment and jetty a client's hello names
// makes the server connect there. A client whose hello names a device at
// an address other than the one its connection comes from must not make
// the server connect anywhere: the server falls back
// (peer_address_mismatch) and a bystander at that address sees nothing.
func TestSocketFabricDialsOnlyTheClientsAddress(t *testing.T) {
	checkNoLeaks(t)
	bystander, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan int, 1)
	go func() {
		n := 0
		for {
			c, err := bystander.Accept()
			if err != nil {
				accepted <- n
				return
			}
			n++
			_ = c.Close() // the server's import fails at once instead of waiting
		}
	}()
	cfg := fabricCfg(FabricSocket, t.TempDir(), nil)
	ln := listenLoopback(t, cfg)
	if reason := ln.FallbackReason(); reason != "" {
		t.Fatalf("the listener cannot use the socket fabric: %s", reason)
	}
	elsewhere, err := soft.SocketEID(netip.MustParseAddrPort(bystander.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	hello := handshake.Hello{
		BufferSize: rawBuf, RecvBufferCnt: 15, JettyID: 1, EID: elsewhere, TPType: handshake.TPCTP,
		SegEID: elsewhere, SegVA: 0x10000, SegLen: rawBuf, SegTokenID: 1,
		SQSize: 16, Token: 1, HasToken: true, CloseMarker: true,
	}
	tcp, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	_ = tcp.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := tcp.Write(handshake.AppendV2(nil, hello)); err != nil {
		t.Fatal(err)
	}
	magic := make([]byte, handshake.MagicLen)
	if _, err := io.ReadFull(tcp, magic); err != nil {
		t.Fatal(err)
	}
	reply, _, err := handshake.ReadHello(tcp, magic)
	if !errors.Is(err, handshake.ErrInvalidHello) || !handshake.IsFallback(reply) {
		t.Errorf("the server answered %+v, %v; want its fallback hello", reply, err)
	}
	if _, err := tcp.Write(handshake.AppendAck(nil, false)); err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = bystander.Close()
	if n := <-accepted; n != 0 {
		t.Errorf("the server connected %d time(s) to %s, the address the client's hello named, not the one it connects from", n, bystander.Addr())
	}
	reason := c.(Conn).FallbackReason()
	if !strings.HasPrefix(reason, string(ReasonPeerAddress)) || !strings.Contains(reason, bystander.Addr().String()) || !strings.Contains(reason, "127.0.0.1") {
		t.Errorf("fallback %q, want peer_address_mismatch naming %s and the client's address 127.0.0.1", reason, bystander.Addr())
	}
}

// TestPoolTokenNeverSent is attack 7a of issue 40: a provider that refuses
// a local-only registration gets the buffer pool registered with remote
// access, and then under a token of its own that no hello carries, so no
// peer can reach the pool, which holds every connection's data.
func TestPoolTokenNeverSent(t *testing.T) {
	checkNoLeaks(t)
	for _, noToken := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoToken=%v", noToken), func(t *testing.T) {
			pa, pb := fabricPair(t)
			ours := newFaultProvider(pa)
			ours.f.set(func(c *faultConfig) { c.refuseLocalOnly = true })
			scfg := cfgWith(ours, smallFlags())
			scfg.NoToken = noToken
			ln := listenLoopback(t, scfg)
			r := newOurRawPeer(t, pb, ln.Addr().String())
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.(Conn).Mode() != ModeURMA {
				t.Fatalf("mode %s (%s)", c.(Conn).Mode(), c.(Conn).FallbackReason())
			}
			pool := ln.e.pool.seg.ID()
			var poolReg *segmentReg
			for _, reg := range ours.f.registrations() {
				if reg.id.VA == pool.VA {
					poolReg = &reg
				}
			}
			if poolReg == nil {
				t.Fatalf("no registration of the pool at %#x among %+v", pool.VA, ours.f.registrations())
			}
			if poolReg.cfg.Access == urma.AccessLocalOnly {
				t.Fatal("the provider took a local-only pool: the test's refusal did not apply")
			}
			if poolReg.cfg.TokenPolicy == urma.TokenNone {
				t.Errorf("the remotely accessible pool is registered without a token (policy %d)", poolReg.cfg.TokenPolicy)
			}
			if r.server.HasToken && urma.Token(r.server.Token) == poolReg.cfg.Token {
				t.Errorf("the hello carries the pool's token %#x: the peer may reach every connection's buffers", r.server.Token)
			}
			if st := r.send(64, 0); st != urma.StatusSuccess {
				t.Errorf("the peer's send completed with %s", st)
			}
		})
	}
}

// TestTokenPerConnection: every connection's jetty and hello page carry a
// token of their own, drawn for it and sent only in its hello: two clients
// of one Listener get different tokens, each hello page is registered with
// its connection's token, every receive queue the Listener creates has a
// token no other has, and a client presenting its own token reaches its
// connection and no other.
func TestTokenPerConnection(t *testing.T) {
	checkNoLeaks(t)
	ps := fabricOf(t, 3)
	ours := newFaultProvider(ps[0])
	ln := listenLoopback(t, cfgWith(ours, smallFlags()))
	var peers []*rawPeer
	var conns []Conn
	for _, p := range ps[1:] {
		r := newOurRawPeer(t, p, ln.Addr().String())
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		peers, conns = append(peers, r), append(conns, c.(Conn))
	}
	a, b := peers[0].server, peers[1].server
	if !a.HasToken || !b.HasToken || a.Token == 0 || b.Token == 0 || a.Token == b.Token {
		t.Fatalf("hello tokens %#x (%v) and %#x (%v): want two different, non-zero tokens", a.Token, a.HasToken, b.Token, b.HasToken)
	}
	if a.SegVA == b.SegVA {
		t.Errorf("both hellos name the hello page at %#x: want one per connection", a.SegVA)
	}
	regs := ours.f.registrations()
	for _, h := range []handshake.Hello{a, b} {
		found := false
		for _, reg := range regs {
			if reg.id.VA == h.SegVA {
				found = true
				if reg.cfg.TokenPolicy != urma.TokenPlainText || reg.cfg.Token != urma.Token(h.Token) {
					t.Errorf("the hello page at %#x is registered with token %#x (policy %d), want its connection's %#x", h.SegVA, reg.cfg.Token, reg.cfg.TokenPolicy, h.Token)
				}
			}
		}
		if !found {
			t.Errorf("no registration of the hello page at %#x", h.SegVA)
		}
	}
	seen := map[urma.Token]bool{}
	for _, cfg := range ours.f.receiveQueues() {
		if cfg.TokenPolicy != urma.TokenPlainText || cfg.Token == 0 || seen[cfg.Token] {
			t.Errorf("a receive queue with token %#x (policy %d): want a token no other has", cfg.Token, cfg.TokenPolicy)
		}
		seen[cfg.Token] = true
	}
	if !seen[urma.Token(a.Token)] || !seen[urma.Token(b.Token)] {
		t.Errorf("the hello tokens %#x and %#x are not those of the receive queues made", a.Token, b.Token)
	}
	for i, r := range peers {
		if st := r.send(64, 0); st != urma.StatusSuccess {
			t.Errorf("client %d's send to its own connection completed with %s", i, st)
		}
		if n := conns[i].Debug().MessagesReceived; n != 1 {
			eventually.Holds(t, fmt.Sprintf("connection %d's message", i), 10*time.Second, func() bool { return conns[i].Debug().MessagesReceived == 1 })
		}
	}
	if st := peers[0].injectInto(conns[1].Debug().LocalJetty, urma.Token(a.Token), urma.OpSend, []byte(injected), 0); st != urma.StatusRemAccessAbort {
		t.Errorf("client 0's send with its token to client 1's connection completed with %s, want %s", st, urma.StatusRemAccessAbort)
	}
}

// TestForeignMessageNeverPlacedInARead: a Read that waits offers its slice
// to the software provider for the next message (urma_read_direct), which
// then copies that message straight into it and completes the read before
// the receive's completion, which names the source, is handled. A
// foreign message must pass the offer by (Placement.From): the reader
// returns only its peer's bytes.
func TestForeignMessageNeverPlacedInARead(t *testing.T) {
	checkNoLeaks(t)
	ps := make([]urma.Provider, 3)
	for i := range ps {
		p, err := soft.New(soft.Options{Listen: "127.0.0.1:0", Logger: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		ps[i] = p
	}
	reg := prometheus.NewRegistry()
	scfg := cfgWith(ps[0], smallFlags())
	scfg.Registerer, scfg.NoToken = reg, true // the message reaches the jetty
	ln, d := listenAndDialer(t, scfg, cfgWith(ps[1], smallFlags()))
	victim := dialAccept(t, ln, d)
	requireURMA(t, "victim", victim.client, victim.server)
	attacker := newOurRawPeer(t, ps[2], ln.Addr().String())
	ac, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ac.Close() })

	type read struct {
		b   []byte
		err error
	}
	got := make(chan read, 1)
	go func() {
		buf := make([]byte, 64<<10) // room to offer: urma_zerocopy_min_size and more
		_ = victim.server.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := victim.server.Read(buf)
		got <- read{buf[:n], err}
	}()
	uc := victim.server.(*urmaConn)
	eventually.Holds(t, "the victim's read to wait with its slice offered", 10*time.Second, func() bool { return uc.readSleeps.Load() > 0 })
	payload := []byte(strings.Repeat(injected, 30))[:800] // above urma_zerocopy_min_size, within a buffer
	if st := attacker.injectInto(victim.server.Debug().LocalJetty, 0, urma.OpSend, payload, 0); st != urma.StatusSuccess {
		t.Fatalf("the attacker's send completed with %s; the test needs it delivered", st)
	}
	legit := "legit bytes from the victim's client"
	if _, err := victim.client.Write([]byte(legit)); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || string(r.b) != legit {
		t.Fatalf("the victim's read returned %q, %v; want only its client's %q", r.b, r.err, legit)
	}
	if v := counterValue(t, reg, "urma_transport_foreign_messages_total", map[string]string{"role": "server"}); v != 1 {
		t.Errorf("urma_transport_foreign_messages_total = %v, want 1", v)
	}
}
