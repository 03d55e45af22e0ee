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

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// TestHandshakeStallsAreBounded: a peer that stalls at any step of the
// handshake (on TCP, or on the fabric while we import its jetty) holds our
// side for at most HandshakeTimeout, and the timed-out handshake gives back
// all it took: jetty, budget, receive buffers (issue 9, item 4).
func TestHandshakeStallsAreBounded(t *testing.T) {
	checkNoLeaks(t)
	// The stalling peer's side of each case; it gets its own queues (for
	// a valid hello) and the TCP connection.
	type peer struct {
		r   *rawPeer
		tcp net.Conn
	}
	// A hello of ours (with the extension), so that our side goes as far
	// as importing the peer.
	fullHello := func(p peer) []byte {
		h := p.r.hello()
		h.SQSize = 16
		return handshake.AppendV2(nil, h)
	}
	write := func(c net.Conn, b []byte) error {
		_, err := c.Write(b)
		return err
	}
	for _, tc := range []struct {
		name        string
		ourSide     string // "server": our Listener, a stalling client; "client": our Dialer, a stalling server
		stallImport bool   // our provider never completes the import of the peer's jetty
		peerDoes    func(p peer) error
	}{
		{"client stops mid-hello", "server", false, func(p peer) error {
			return write(p.tcp, fullHello(p)[:20])
		}},
		{"client never sends the ACK", "server", false, func(p peer) error {
			if err := write(p.tcp, fullHello(p)); err != nil {
				return err
			}
			magic := make([]byte, handshake.MagicLen)
			if _, err := io.ReadFull(p.tcp, magic); err != nil {
				return err
			}
			_, _, err := handshake.ReadHello(p.tcp, magic)
			return err
		}},
		{"server imports a jetty never answering", "server", true, func(p peer) error {
			return write(p.tcp, fullHello(p))
		}},
		{"server says nothing", "client", false, func(peer) error { return nil }},
		{"server stops mid-hello", "client", false, func(p peer) error {
			return write(p.tcp, fullHello(p)[:20])
		}},
		{"client imports a jetty never answering", "client", true, func(p peer) error {
			return write(p.tcp, fullHello(p))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			ours := newFaultProvider(pa)
			ours.f.set(func(c *faultConfig) { c.stallImport = tc.stallImport })
			f := smallFlags()
			f.PreparedJettyCnt = 0 // every jetty is the handshake's
			cfg := cfgWith(ours, f)
			cfg.HandshakeTimeout = stallTimeout
			p := peer{r: newRawQueues(t, pb)}

			var e *engine
			if tc.ourSide == "server" {
				ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				e = ln.e
				p.tcp, err = net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer p.tcp.Close()
				if err := tc.peerDoes(p); err != nil {
					t.Fatalf("the stalling client: %v", err)
				}
				// The server drops the connection once it gives up; it
				// released everything before.
				_ = p.tcp.SetReadDeadline(time.Now().Add(stallBound))
				if _, err := io.Copy(io.Discard, p.tcp); isTimeout(err) {
					t.Fatalf("the server still holds the handshake %s after it began", stallBound)
				}
			} else {
				d, err := NewDialer(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer d.Close()
				e = d.e
				addr, peerErr := scriptedPeer(t, func(c net.Conn) error {
					p.tcp = c
					return tc.peerDoes(p)
				})
				ctx, cancel := context.WithTimeout(context.Background(), stallBound)
				defer cancel()
				c, err := d.DialContext(ctx, addr)
				if err := <-peerErr; err != nil {
					t.Errorf("the stalling server: %v", err)
				}
				if p.tcp != nil {
					defer p.tcp.Close()
				}
				if ctx.Err() != nil {
					t.Fatalf("the dial still holds the handshake after %s", stallBound)
				}
				if err == nil {
					// A fallback to TCP is fine too; either way it ended.
					_ = c.Close()
				}
			}
			if _, inUse := e.pool.stats(); inUse != 0 {
				t.Errorf("%d receive buffers still out after the handshake gave up", inUse)
			}
			if n := e.s.budget.InUse(); n != 0 {
				t.Errorf("%d jetties still count against the budget", n)
			}
			if live := ours.f.liveQueues(); len(live) != 0 {
				t.Errorf("queues left after the handshake gave up: %v", live)
			}
		})
	}
}

// TestDialCancelledMidHandshake: cancelling the dial's context while the
// server has not answered ends the handshake at once, and the error wraps
// the context's, so the caller can tell its own cancellation from a peer
// that failed.
func TestDialCancelledMidHandshake(t *testing.T) {
	checkNoLeaks(t)
	_, pb := fabricPair(t)
	d, err := NewDialer(cfgWith(pb, smallFlags())) // HandshakeTimeout: 10 s
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	peerLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peerLn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := peerLn.Accept()
		if err != nil {
			close(accepted)
			return
		}
		// Take the client's hello, then cancel the dial and say nothing.
		_, _ = c.Read(make([]byte, handshake.MagicLen))
		cancel()
		accepted <- c
	}()
	c, err := d.DialContext(ctx, peerLn.Addr().String())
	if peer, ok := <-accepted; ok {
		defer peer.Close()
	}
	if err == nil {
		_ = c.Close()
		t.Fatal("the dial succeeded against a silent server")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("dial cancelled mid-handshake: %v; want an error wrapping context.Canceled", err)
	}
	if strings.Contains(err.Error(), "Config.HandshakeTimeout") {
		t.Errorf("dial cancelled mid-handshake: %v; it was cancelled, not out of time", err)
	}
}

// halfOpen is a client that sends a valid hello of ours, reads the
// server's hello and never sends the ACK, on a TCP connection to addr: a
// client that crashed or hangs between the two, or a hostile one.
func halfOpen(t *testing.T, prov urma.Provider, addr string) net.Conn {
	t.Helper()
	r := newRawQueues(t, prov)
	tcp, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tcp.Close() })
	h := r.hello()
	h.SQSize = 16
	if _, err := tcp.Write(handshake.AppendV2(nil, h)); err != nil {
		t.Fatal(err)
	}
	magic := make([]byte, handshake.MagicLen)
	if _, err := io.ReadFull(tcp, magic); err != nil {
		t.Fatalf("read the server's hello: %v", err)
	}
	sh, _, err := handshake.ReadHello(tcp, magic)
	if err != nil || handshake.IsFallback(sh) {
		t.Fatalf("the server answered %+v, %v; want a hello with its jetty", sh, err)
	}
	return tcp
}

// TestAckTimeoutGivesTheJettyBack: a client that sends its hello and never
// its ACK holds the jetty the server set up for it (its receive buffers,
// its jetty counted against the budget) for urma_ack_timeout, not for the whole
// HandshakeTimeout (here an hour; the bounds here leave an honest client
// room to ACK on a loaded machine), so a few such clients cannot keep
// honest ones on TCP (jetty_budget_exhausted) for long. Once it is
// dropped, the budget's only jetty serves an honest client on URMA.
func TestAckTimeoutGivesTheJettyBack(t *testing.T) {
	checkNoLeaks(t)
	f := smallFlags()
	f.PreparedJettyCnt = 0 // the budget's one jetty is the handshake's
	byFlag := f
	byFlag.AckTimeout = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		cfg  func(c *Config)
	}{
		{"default urma_ack_timeout", func(*Config) {}},
		{"Config.AckTimeout", func(c *Config) { c.AckTimeout = 400 * time.Millisecond }},
		{"--urma_ack_timeout", func(c *Config) { c.Flags = &byFlag }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			cfg := cfgWith(pa, f)
			cfg.JettyBudget = 1
			cfg.HandshakeTimeout = time.Hour
			tc.cfg(&cfg)
			ln, d := listenAndDialer(t, cfg, cfgWith(pb, smallFlags()))

			tcp := halfOpen(t, pb, ln.Addr().String())
			if n := ln.e.s.budget.InUse(); n != 1 {
				t.Fatalf("%d jetties count against the budget while the client owes its ACK, want 1", n)
			}
			// The server drops the connection once it stops waiting; it
			// gave everything back before.
			_ = tcp.SetReadDeadline(time.Now().Add(stallBound))
			if _, err := io.Copy(io.Discard, tcp); isTimeout(err) {
				t.Fatalf("the server still holds the jetty of a client that owes its ACK %s later", stallBound)
			}
			if n := ln.e.s.budget.InUse(); n != 0 {
				t.Errorf("%d jetties still count against the budget after the server dropped the client", n)
			}
			if _, inUse := ln.e.pool.stats(); inUse != 0 {
				t.Errorf("%d receive buffers still out after the server dropped the client", inUse)
			}
			p := dialAccept(t, ln, d)
			requireURMA(t, "an honest client after the drop", p.client, p.server)
		})
	}
}

// TestSlowImportFallsBackWhileTheServerListens: a client whose import of
// the server's jetty does not finish gives up within its urma_ack_timeout
// (three quarters of it), while a server on the same timeout still waits
// for the ACK, so both go on as plain TCP (import_failed) and bytes flow.
// Waiting out the whole handshake instead, the client would fall back onto
// a connection the server had already dropped.
func TestSlowImportFallsBackWhileTheServerListens(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	client := newFaultProvider(pa)
	client.f.set(func(c *faultConfig) { c.stallImport = true })
	// The client's fallback ACK has the last quarter of it to reach the
	// server: half a second, room for a loaded machine's scheduling.
	const ackTimeout = 2 * time.Second
	cfg := func(p urma.Provider) Config {
		c := cfgWith(p, smallFlags())
		c.AckTimeout = ackTimeout
		c.HandshakeTimeout = stallBound
		return c
	}
	ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg(pb))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			_, err = io.Copy(c, io.LimitReader(c, 5))
		}
		served <- err
	}()
	d, err := NewDialer(cfg(client))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := d.DialContext(t.Context(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(Conn)
	if tc.Mode() != ModeTCP || !strings.HasPrefix(tc.FallbackReason(), string(ReasonImportFailed)+":") ||
		!strings.Contains(tc.FallbackReason(), "urma_ack_timeout") {
		t.Fatalf("mode %v, fallback %q; want TCP, %s, given up for urma_ack_timeout", tc.Mode(), tc.FallbackReason(), ReasonImportFailed)
	}
	_ = c.SetDeadline(time.Now().Add(stallBound))
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatalf("write on the fallback connection: %v", err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "hello" {
		t.Fatalf("echo %q, %v; want hello", got, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// TestSlowURMAHalfFallsBack: a handshake whose URMA half (an import of the
// peer's jetty, on either side) does not complete within the handshake's
// time gives a working connection on TCP, on both sides, instead of a
// dial error: the side that imports gives up at three quarters of the
// handshake's time (HandshakeTimeout, or the dial's context deadline if
// sooner) and its fallback hello or fallback ACK reaches a peer that
// still listens. Waiting out the whole handshake, the client failed the
// dial sending its ACK, or found the connection the server had dropped.
func TestSlowURMAHalfFallsBack(t *testing.T) {
	checkNoLeaks(t)
	// Long enough that a loaded machine gets the fallback step across in
	// the last quarter.
	const handshake = 2 * time.Second
	for _, tc := range []struct {
		name         string
		stall        string // whose import never completes: "client" or "server"
		cfg          func(c *Config)
		dialTimeout  time.Duration // 0: the handshake's own bound
		client, peer Reason        // the fallback reasons each side reports
	}{
		{"client import, no urma_ack_timeout", "client",
			func(c *Config) { c.AckTimeout = -1; c.HandshakeTimeout = handshake }, 0,
			ReasonImportFailed, ReasonPeerDeclined},
		{"client import, long urma_ack_timeout", "client",
			func(c *Config) { c.AckTimeout = 2 * handshake; c.HandshakeTimeout = handshake }, 0,
			ReasonImportFailed, ReasonPeerDeclined},
		{"client import, dial context ends first", "client",
			func(c *Config) { c.HandshakeTimeout = stallBound }, handshake,
			ReasonImportFailed, ReasonPeerDeclined},
		{"server import", "server",
			func(c *Config) { c.HandshakeTimeout = handshake }, 0,
			ReasonPeerDeclined, ReasonImportFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			sp, cp := newFaultProvider(pa), newFaultProvider(pb)
			stalled := cp
			if tc.stall == "server" {
				stalled = sp
			}
			stalled.f.set(func(c *faultConfig) { c.stallImport = true })
			scfg, ccfg := cfgWith(sp, smallFlags()), cfgWith(cp, smallFlags())
			tc.cfg(&scfg)
			tc.cfg(&ccfg)
			ln, d := listenAndDialer(t, scfg, ccfg)
			acc := acceptAsync(ln)
			ctx := t.Context()
			if tc.dialTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.dialTimeout)
				defer cancel()
			}
			c, err := d.DialContext(ctx, ln.Addr().String())
			if err != nil {
				t.Fatalf("dial: %v; want a fallback to TCP", err)
			}
			defer c.Close()
			a := <-acc
			if a.err != nil {
				t.Fatalf("accept: %v", a.err)
			}
			defer a.c.Close()
			for _, side := range []struct {
				name string
				c    Conn
				want Reason
			}{{"client", c.(Conn), tc.client}, {"server", a.c.(Conn), tc.peer}} {
				if side.c.Mode() != ModeTCP || !strings.HasPrefix(side.c.FallbackReason(), string(side.want)+":") {
					t.Errorf("%s: mode %s, fallback %q; want TCP, %s", side.name, side.c.Mode(), side.c.FallbackReason(), side.want)
				}
			}
			exchange(t, c, a.c, "over the fallback")
		})
	}
}

// TestSilentServerErrorSaysWhatToRaise: a server whose hello does not
// arrive whole within the handshake's time fails the dial (falling back is
// not safe: it may yet answer our hello, or have taken it for application
// bytes), and the error says what the server sent and names the timeout to
// raise.
func TestSilentServerErrorSaysWhatToRaise(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range []struct {
		name  string
		sends func(r *rawPeer) []byte // what the server sends, then nothing
		says  string
	}{
		{"nothing", func(*rawPeer) []byte { return nil }, "sent 0 bytes"},
		{"half a magic", func(*rawPeer) []byte { return []byte(handshake.MagicV2[:2]) }, "sent 2 bytes"},
		{"half a hello", func(r *rawPeer) []byte { return handshake.AppendV2(nil, r.hello())[:20] }, "began its hello and did not end it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			cfg := cfgWith(pb, smallFlags())
			cfg.HandshakeTimeout = stallTimeout
			d, err := NewDialer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			sends := tc.sends(newRawQueues(t, pa))
			addr, peerErr := scriptedPeer(t, func(c net.Conn) error {
				t.Cleanup(func() { _ = c.Close() })
				_, err := c.Write(sends)
				return err
			})
			c, err := d.DialContext(t.Context(), addr)
			if err := <-peerErr; err != nil {
				t.Fatalf("the silent server: %v", err)
			}
			if err == nil {
				_ = c.Close()
				t.Fatal("the dial succeeded against a server that did not answer")
			}
			if !isTimeout(err) {
				t.Errorf("dial: %v; want an error that wraps the timeout", err)
			}
			for _, want := range []string{tc.says, "raise Config.HandshakeTimeout"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("dial: %v; want it to say %q", err, want)
				}
			}
		})
	}
}

// TestServerClosedErrorSaysWhy: a server that closes the connection
// instead of answering our hello, or partway through its own, fails the
// dial with an error that says so and what it likely means, where it said
// only "EOF"; the error still wraps the EOF.
func TestServerClosedErrorSaysWhy(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range []struct {
		name  string
		sends func(r *rawPeer) []byte // what the server sends before it closes
		says  string
		wraps error
	}{
		{"before answering", func(*rawPeer) []byte { return nil }, "the server closed the connection before answering the URMA handshake: it is likely no urma-k8s or brpc server speaking this protocol, or it refused the connection or was shutting down", io.EOF},
		{"after its magic", func(*rawPeer) []byte { return []byte(handshake.MagicV2) }, "the server closed the connection partway through its hello", io.EOF},
		{"partway through its hello", func(r *rawPeer) []byte { return handshake.AppendV2(nil, r.hello())[:20] }, "the server closed the connection partway through its hello", io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			d, err := NewDialer(cfgWith(pb, smallFlags()))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			sends := tc.sends(newRawQueues(t, pa))
			addr, peerErr := scriptedPeer(t, func(c net.Conn) error {
				defer c.Close()
				// Take the client's hello first, so that the close is a
				// FIN, not a reset for unread bytes.
				magic := make([]byte, handshake.MagicLen)
				if _, err := io.ReadFull(c, magic); err != nil {
					return err
				}
				if _, _, err := handshake.ReadHello(c, magic); err != nil {
					return err
				}
				_, err := c.Write(sends)
				return err
			})
			ctx, cancel := context.WithTimeout(t.Context(), stallBound)
			defer cancel()
			c, err := d.DialContext(ctx, addr)
			if err := <-peerErr; err != nil {
				t.Fatalf("the closing server: %v", err)
			}
			if err == nil {
				_ = c.Close()
				t.Fatal("the dial succeeded against a server that closed")
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("dial: %v; want it to say %q", err, tc.says)
			}
			if !errors.Is(err, tc.wraps) {
				t.Errorf("dial: %v; want an error that wraps %v", err, tc.wraps)
			}
		})
	}
}

// TestStalledJettySetupFallsBack: a server whose provider stalls while it
// sets up a connection's jetty (creating one, or waiting for the pool's
// filler, which is creating the budget's only one) stops waiting at three
// quarters of HandshakeTimeout and answers with its fallback hello, so
// both sides go on as TCP (resource_allocation_failed on the server,
// saying what stalled; peer_declined on the client) and bytes flow. When
// the verb returns, what it made is released, and nothing keeps running
// (checkNoLeaks). Waiting for it, the server never answered and the dial
// failed. A listener runs at most AcceptBacklog setups, those it stopped
// waiting for included: with one stalled, the next client falls back
// without another, so a device that stays stalled leaves a bounded number
// of goroutines behind.
func TestStalledJettySetupFallsBack(t *testing.T) {
	checkNoLeaks(t)
	// Long enough that a loaded machine gets the fallback hello across in
	// the last quarter.
	const handshakeTimeout = 2 * time.Second
	for _, tc := range []struct {
		name             string
		prepared, budget int
	}{
		{"creating its jetty", 0, -1},
		{"waiting for the pool filler", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			sp, unstall := stallJettyCreate(pa)
			f := smallFlags()
			f.PreparedJettyCnt = tc.prepared
			scfg := cfgWith(sp, f)
			scfg.JettyBudget = tc.budget
			scfg.HandshakeTimeout = handshakeTimeout
			scfg.AcceptBacklog = 1
			ccfg := cfgWith(pb, smallFlags())
			ccfg.HandshakeTimeout = handshakeTimeout
			ln, d := listenAndDialer(t, scfg, ccfg)
			t.Cleanup(unstall) // before the listener's Close, which waits for its handshakes

			p := dialAccept(t, ln, d)
			for _, side := range []struct {
				name string
				c    Conn
				want Reason
			}{{"client", p.client, ReasonPeerDeclined}, {"server", p.server, ReasonResources}} {
				if side.c.Mode() != ModeTCP || !strings.HasPrefix(side.c.FallbackReason(), string(side.want)+":") {
					t.Errorf("%s: mode %s, fallback %q; want TCP, %s", side.name, side.c.Mode(), side.c.FallbackReason(), side.want)
				}
			}
			if why := p.server.FallbackReason(); !strings.Contains(why, "did not set up the connection's jetty") {
				t.Errorf("server fallback %q; want it to say what stalled", why)
			}
			exchange(t, p.client, p.server, "over the fallback")

			// The stalled setup holds a reference; the next client's
			// handshake starts no other.
			next := dialAccept(t, ln, d)
			if why := next.server.FallbackReason(); !strings.HasPrefix(why, string(ReasonResources)+":") || !strings.Contains(why, "has not returned") {
				t.Errorf("the next client's server fallback %q; want %s, the earlier setup still running", why, ReasonResources)
			}
			if n := ln.e.refCount(); n != 2 {
				t.Errorf("the engine holds %d references, want 2: the listener's and the one stalled setup's", n)
			}

			checkLateJettyReleased(t, ln.e, unstall)
		})
	}
}

// TestStalledClientJettySetupFallsBack: a client whose provider stalls
// while it sets up the connection's jetty (creating one, or waiting for
// the pool's filler, which is creating the budget's only one), before it
// sends anything, stops waiting at three quarters of the handshake's
// time, or of urma_first_bytes_timeout when that is sooner (a server on
// the same flag would take a hello sent later for application bytes), and
// goes on as the plain TCP client it then is, its hello unsent:
// resource_allocation_failed on the client, saying what stalled and the
// bound; the server serves a plain TCP client (peer_not_urma, as this
// one speaks first), and bytes flow. When the verb returns, what it made
// is released, and nothing keeps running (checkNoLeaks). Waiting for it,
// Dial hung for as long as the provider did, past HandshakeTimeout. A
// Dialer runs a bounded number of setups, those it stopped waiting for
// included: with them all stalled, the next dial falls back without
// starting another.
func TestStalledClientJettySetupFallsBack(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range []struct {
		name                  string
		prepared, budget      int
		handshake, firstBytes time.Duration // the client's; firstBytes -1: none
		bound                 string        // what the client's fallback names
	}{
		// Long enough that a loaded machine sets a jetty up in time when
		// the provider does not stall.
		{"creating its jetty, handshake bound", 0, -1, 2 * time.Second, -1, "three quarters of the handshake's time"},
		{"creating its jetty, first bytes bound", 0, -1, time.Hour, time.Second, "three quarters of urma_first_bytes_timeout (1s)"},
		{"waiting for the pool filler", 1, 1, 2 * time.Second, -1, "three quarters of the handshake's time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			cp, unstall := stallJettyCreate(pb)
			// The server waits its whole HandshakeTimeout for the client's
			// first bytes, so that it reads the ones the client sends
			// after its fallback however late they come.
			scfg := cfgWith(pa, smallFlags())
			scfg.FirstBytesTimeout = -1
			f := smallFlags()
			f.PreparedJettyCnt = tc.prepared
			ccfg := cfgWith(cp, f)
			ccfg.JettyBudget = tc.budget
			ccfg.HandshakeTimeout = tc.handshake
			ccfg.FirstBytesTimeout = tc.firstBytes
			ln, d := listenAndDialer(t, scfg, ccfg)
			// One setup at most (a Dialer's own bound is
			// DefaultAcceptBacklog), so that the stalled one takes it.
			d.e.setups = make(chan struct{}, 1)
			t.Cleanup(unstall) // before the dialer's Close, whose engine waits for the setup

			// The client falls back within three quarters of its bound;
			// one that waits for the provider hangs until unstall.
			bound := tc.handshake
			if tc.firstBytes > 0 {
				bound = min(bound, tc.firstBytes)
			}
			dial := func() pair {
				t.Helper()
				acc := acceptAsync(ln)
				// No deadline: the bound under test is the only one.
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				dialed := dialAsync(ctx, d, ln.Addr().String())
				var r connResult
				select {
				case r = <-dialed:
				case <-time.After(bound + stallBound):
					// Ends a dial that waits for the provider, and the
					// handshake it would go on to.
					cancel()
					unstall()
					(<-dialed).closeIfDialed()
					t.Fatalf("Dial still waited for the stalled jetty setup %s after it began; want a fallback within three quarters of %s", bound+stallBound, bound)
				}
				if r.err != nil {
					t.Fatalf("dial: %v; want a fallback to TCP", r.err)
				}
				client := r.c.(Conn)
				t.Cleanup(func() { _ = client.Close() })
				// A plain TCP client now: the server decides on its first
				// bytes.
				if _, err := client.Write([]byte(syncBytes)); err != nil {
					t.Fatalf("write sync bytes: %v", err)
				}
				a := <-acc
				if a.err != nil {
					t.Fatalf("accept: %v", a.err)
				}
				server := a.c.(Conn)
				t.Cleanup(func() { _ = server.Close() })
				got := make([]byte, len(syncBytes))
				if _, err := io.ReadFull(server, got); err != nil || string(got) != syncBytes {
					t.Fatalf("server read %q, %v; want the client's %q", got, err, syncBytes)
				}
				for _, side := range []struct {
					name string
					c    Conn
					want Reason
				}{{"client", client, ReasonResources}, {"server", server, ReasonPeerNotURMA}} {
					if side.c.Mode() != ModeTCP || !strings.HasPrefix(side.c.FallbackReason(), string(side.want)+":") {
						t.Errorf("%s: mode %s, fallback %q; want TCP, %s", side.name, side.c.Mode(), side.c.FallbackReason(), side.want)
					}
				}
				if v := client.Debug().HandshakeVersion; v != 0 {
					t.Errorf("client handshake version %d; want 0, no hello sent", v)
				}
				exchange(t, client, server, "over the fallback")
				return pair{client: client, server: server}
			}

			p := dial()
			if why := p.client.FallbackReason(); !strings.Contains(why, "did not set up the connection's jetty") || !strings.Contains(why, tc.bound) {
				t.Errorf("client fallback %q; want it to say what stalled and name %q", why, tc.bound)
			}

			// The stalled setup still counts among the engine's setups and
			// holds a reference; the next dial starts no other.
			next := dial()
			if why := next.client.FallbackReason(); !strings.Contains(why, "has not returned") || !strings.Contains(why, tc.bound) {
				t.Errorf("the next dial's fallback %q; want it to say the earlier setup still runs, naming %q", why, tc.bound)
			}
			if n := d.e.refCount(); n != 2 {
				t.Errorf("the engine holds %d references, want 2: the dialer's and the one stalled setup's", n)
			}

			checkLateJettyReleased(t, d.e, unstall)
		})
	}
}

// TestDialCancelledDuringJettySetup: cancelling the dial's context while
// the provider stalls in the connection's jetty setup ends the dial at
// once with an error that wraps the context's, as it does later in the
// handshake, rather than a fallback the caller no longer wants; the late
// jetty is released when the provider returns. Waiting for the provider,
// the dial outlived its context.
func TestDialCancelledDuringJettySetup(t *testing.T) {
	checkNoLeaks(t)
	_, pb := fabricPair(t)
	cp, unstall := stallJettyCreate(pb)
	f := smallFlags()
	f.PreparedJettyCnt = 0 // the dial creates the only jetty
	cfg := cfgWith(cp, f)
	cfg.HandshakeTimeout = time.Hour
	cfg.FirstBytesTimeout = -1 // the dial's context is the only bound
	d, err := NewDialer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Cleanup(unstall) // before the dialer's Close
	peerLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peerLn.Close()
	acc := acceptAsync(peerLn)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dialed := dialAsync(ctx, d, peerLn.Addr().String())
	eventually.Holds(t, "the dial to create its jetty", stallBound, func() bool { return cp.f.attempts("jetty") > 0 })
	cancel()
	var r connResult
	select {
	case r = <-dialed:
	case <-time.After(stallBound):
		unstall()
		(<-dialed).closeIfDialed()
		t.Fatalf("the dial still waited for the stalled jetty setup %s after its context was cancelled", stallBound)
	}
	if r.err == nil {
		_ = r.c.Close()
		t.Fatal("the dial cancelled during its jetty setup succeeded")
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("dial cancelled during its jetty setup: %v; want an error wrapping context.Canceled", r.err)
	}
	(<-acc).closeIfDialed() // connected before the setup began
	checkLateJettyReleased(t, d.e, unstall)
}

// checkLateJettyReleased lets a stalled jetty setup's verb return (unstall)
// and checks that the jetty it made goes back, and with it the engine
// reference the stalled call held: e is left with one reference, no
// receive buffer out and no connection's jetty.
func checkLateJettyReleased(t *testing.T, e *engine, unstall func()) {
	t.Helper()
	unstall()
	eventually.Holds(t, "the late jetty to be released", stallBound, func() bool { return e.refCount() == 1 })
	if _, inUse := e.pool.stats(); inUse != 0 {
		t.Errorf("%d receive buffers still out after the late jetty was released", inUse)
	}
	if prepared, live := e.jetties.stats(); live != prepared {
		t.Errorf("%d jetties count against the budget, %d of them prepared: a connection's is left", live, prepared)
	}
}

// TestSetupPastItsDeadlineStartsNone: a handshake whose time for its
// jetty setup has already passed when it comes to the setup (its own
// bound, or the handshake's context) falls back, resource_allocation_failed
// saying no time was left, and starts no setup, though one of the
// engine's setups is free. Selecting between the free setup and the ended
// deadline, it started one half the time: a quick one then carried the
// handshake on as URMA past its bound, a slow one was work for nothing.
// Each case tries many times, so that a coin toss cannot pass it.
func TestSetupPastItsDeadlineStartsNone(t *testing.T) {
	checkNoLeaks(t)
	const tries = 200
	for _, tc := range []struct {
		name string
		ctx  func(t *testing.T) context.Context
		end  time.Time
	}{
		{"its bound passed", func(t *testing.T) context.Context { return t.Context() }, time.Now().Add(-time.Millisecond)},
		{"the handshake time passed", func(t *testing.T) context.Context {
			ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Millisecond))
			t.Cleanup(cancel)
			return ctx
		}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pb := fabricPair(t)
			prov := newFaultProvider(pb)
			f := smallFlags()
			f.PreparedJettyCnt = 0 // every setup creates its jetty, which counts it
			d, err := NewDialer(cfgWith(prov, f))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			d.e.start(netip.MustParseAddr("127.0.0.1")) // as its first dial does
			if fb := d.e.unavailable(); fb != nil {
				t.Fatalf("URMA unavailable: %s", fb)
			}
			local, remote := net.Pipe()
			defer local.Close()
			defer remote.Close()
			ctx := tc.ctx(t)
			var made, other int
			var otherWhy string
			for range tries {
				c, fb := d.e.setUpBy(ctx, local, metrics.RoleClient, d.e.spec(), tc.end, "the test's bound", "the test goes on as TCP")
				switch {
				case c != nil:
					c.release()
					made++
				case fb == nil || fb.reason != ReasonResources || !strings.Contains(fb.detail, "no time was left"):
					other++
					otherWhy = fmt.Sprint(fb)
				}
			}
			if made != 0 {
				t.Errorf("%d of %d setups past their deadline made a URMA connection; want a fallback", made, tries)
			}
			if other != 0 {
				t.Errorf("%d of %d fallbacks were not %s saying no time was left, the last %q", other, tries, ReasonResources, otherWhy)
			}
			if n := prov.f.attempts("jetty"); n != 0 {
				t.Errorf("%d of %d setups past their deadline created a jetty; want none started", n, tries)
			}
			if n := len(d.e.setups); n != 0 {
				t.Errorf("%d of the engine's setups taken after the calls returned; want none", n)
			}
		})
	}
}
