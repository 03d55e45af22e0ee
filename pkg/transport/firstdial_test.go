package transport

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// slowOpenProvider is a provider whose device takes delay to open, as a
// UB device does while a large pool waits to be registered.
type slowOpenProvider struct {
	urma.Provider
	delay time.Duration
}

func (p slowOpenProvider) Open(device string, eidIndex int) (urma.Context, error) {
	time.Sleep(p.delay) // the slow device itself, not a wait for an event
	return p.Provider.Open(device, eidIndex)
}

// TestSlowFirstDialBringUp: a Dialer brings URMA up on its first dial.
// When that takes longer than the server's urma_first_bytes_timeout, the
// bring-up must not happen while the TCP connection is open and silent:
// the server would serve it as a plain TCP client (peer_silent) and hand
// the client's hello to its application as data.
func TestSlowFirstDialBringUp(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	scfg := cfgWith(pa, smallFlags())
	scfg.FirstBytesTimeout = 300 * time.Millisecond
	ccfg := cfgWith(slowOpenProvider{Provider: pb, delay: 3 * scfg.FirstBytesTimeout}, smallFlags())
	ccfg.HandshakeTimeout = 3 * time.Second // a client waiting for a hello that never comes gives up soon
	p := connect(t, scfg, ccfg)
	requireURMA(t, "first dial with a slow bring-up", p.client, p.server)
	exchange(t, p.client, p.server, "after a slow bring-up")
}

// stalledOpenProvider is a provider whose device does not open until the
// test closes gate: a bring-up stalled in the provider. opening is closed
// when Open is first called.
type stalledOpenProvider struct {
	urma.Provider
	gate    <-chan struct{}
	opening chan struct{}
	once    sync.Once
}

func newStalledOpenProvider(p urma.Provider, gate <-chan struct{}) *stalledOpenProvider {
	return &stalledOpenProvider{Provider: p, gate: gate, opening: make(chan struct{})}
}

func (p *stalledOpenProvider) Open(device string, eidIndex int) (urma.Context, error) {
	p.once.Do(func() { close(p.opening) })
	<-p.gate
	return p.Provider.Open(device, eidIndex)
}

// noRoute is a Dialer.routeSource that cannot tell the local address, so
// that the dial brings URMA up after it connects.
func noRoute(context.Context, string, string) (netip.Addr, bool) { return netip.Addr{}, false }

// TestFirstDialBringUpAfterConnecting: when the Dialer cannot tell the
// address a connection will leave from, it brings URMA up after it
// connects, while the connection is open and silent. A quick bring-up
// goes on to the handshake on that connection. One that outlasts the
// server's urma_first_bytes_timeout (the server then serves the silent
// connection as plain TCP, peer_silent) must not send its hello there,
// where the server's application would read it as data: the dial closes
// that connection unused and connects again, and the connection it
// returns runs on URMA. Before, the dial sent its hello on the stale
// connection (the application read it) and then waited in vain for the
// server's.
func TestFirstDialBringUpAfterConnecting(t *testing.T) {
	checkNoLeaks(t)
	const firstBytes = 300 * time.Millisecond
	for _, tc := range []struct {
		name  string
		stall bool // the bring-up waits until the server has served the silent connection
	}{
		{"quick bring-up", false},
		{"bring-up outlasting the server wait", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			gate, unstall := newGate()
			t.Cleanup(unstall)
			if !tc.stall {
				unstall()
			}
			scfg := cfgWith(pa, smallFlags())
			scfg.FirstBytesTimeout = firstBytes
			ccfg := cfgWith(newStalledOpenProvider(pb, gate), smallFlags())
			ccfg.FirstBytesTimeout = firstBytes
			ccfg.HandshakeTimeout = 2 * time.Second // a dial waiting for a hello that never comes gives up soon
			ln, d := listenAndDialer(t, scfg, ccfg)
			d.routeSource = noRoute

			ctx, cancel := context.WithTimeout(t.Context(), stallBound)
			defer cancel()
			dialed := dialAsync(ctx, d, ln.Addr().String())
			if tc.stall {
				// The server serves the silent connection as plain TCP;
				// only then does the bring-up finish.
				a := <-acceptAsync(ln)
				if a.err != nil {
					unstall()
					t.Fatalf("accept: %v", a.err)
				}
				stale := a.c.(Conn)
				defer stale.Close()
				unstall()
				if why := stale.FallbackReason(); !strings.HasPrefix(why, string(ReasonPeerSilent)+":") {
					t.Errorf("the stale connection's server fallback %q; want %s", why, ReasonPeerSilent)
				}
				_ = stale.SetReadDeadline(time.Now().Add(stallBound))
				if n, err := io.ReadFull(stale, make([]byte, handshake.MagicLen)); n != 0 || !errors.Is(err, io.EOF) {
					t.Errorf("the server's application read %d bytes (%v) on the connection open while URMA came up; want EOF and nothing: the hello went to it as data", n, err)
				}
			}
			acc := acceptAsync(ln)
			r := <-dialed
			if r.err != nil {
				t.Fatalf("dial: %v", r.err)
			}
			client := r.c.(Conn)
			defer client.Close()
			a := <-acc
			if a.err != nil {
				t.Fatalf("accept: %v", a.err)
			}
			server := a.c.(Conn)
			defer server.Close()
			requireURMA(t, "the connection the first dial returns", client, server)
			exchange(t, client, server, "after the bring-up")
		})
	}
}

// TestDialCancelledDuringBringUp: a dial whose context ends while the
// provider stalls in the Dialer's first bring-up (before it connects, or
// after, when it cannot tell the local address) fails at once with an
// error that wraps the context's, and closes the connection it opened;
// the bring-up goes on, and the next dial uses it. Before, the dial
// waited for the provider however long it stalled.
func TestDialCancelledDuringBringUp(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range []struct {
		name      string
		knowRoute bool
	}{
		{"before connecting", true},
		{"after connecting", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			gate, unstall := newGate()
			t.Cleanup(unstall) // before the dialer's Close
			prov := newStalledOpenProvider(pb, gate)
			ln, d := listenAndDialer(t, cfgWith(pa, smallFlags()), cfgWith(prov, smallFlags()))
			if !tc.knowRoute {
				d.routeSource = noRoute
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			dialed := dialAsync(ctx, d, ln.Addr().String())
			<-prov.opening
			cancel()
			var err error
			select {
			case r := <-dialed:
				r.closeIfDialed()
				err = r.err
			case <-time.After(stallBound):
				unstall()
				(<-dialed).closeIfDialed()
				t.Fatalf("the dial still waited for the stalled bring-up %s after its context was cancelled", stallBound)
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("dial cancelled during the bring-up: %v; want an error wrapping context.Canceled", err)
			}
			if !tc.knowRoute {
				// The connection it opened is closed, with nothing sent.
				a := <-acceptAsync(ln)
				if a.err != nil {
					t.Fatalf("accept: %v", a.err)
				}
				_ = a.c.SetReadDeadline(time.Now().Add(stallBound))
				if n, err := a.c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
					t.Errorf("the connection of the cancelled dial read %d bytes, %v; want EOF", n, err)
				}
				_ = a.c.Close()
			}
			unstall()
			p := dialAccept(t, ln, d)
			requireURMA(t, "the dial after the bring-up", p.client, p.server)
		})
	}
}

// TestCloseDuringStalledBringUp: a Dialer closed while its first bring-up
// stalls in the provider (the dial that started it gave up) returns at
// once, and what the bring-up makes once the provider returns (the device
// context, the registered pool, the jetty pool's filler) is released then.
// The bring-up holds an engine reference for that: without it the Close
// tore down an engine with nothing in it yet, and the bring-up then left
// its context, pool and goroutines behind for good.
func TestCloseDuringStalledBringUp(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	gate, unstall := newGate()
	t.Cleanup(unstall)
	prov := newStalledOpenProvider(pb, gate)
	ln, d := listenAndDialer(t, cfgWith(pa, smallFlags()), cfgWith(prov, smallFlags()))
	ctx, cancel := context.WithCancel(t.Context())
	dialed := dialAsync(ctx, d, ln.Addr().String())
	<-prov.opening
	cancel()
	r := <-dialed
	r.closeIfDialed()
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("dial cancelled during the bring-up: %v; want an error wrapping context.Canceled", r.err)
	}
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(stallBound):
		unstall()
		<-closed
		t.Fatalf("Close waited for the stalled bring-up over %s", stallBound)
	}
	e := d.e
	unstall()
	<-e.up
	select {
	case <-e.released:
	case <-time.After(stallBound):
		t.Fatalf("the engine was not released %s after its bring-up ended", stallBound)
	}
	if e.uctx != nil || e.pool != nil {
		t.Errorf("after the bring-up that outlived Close: device context %v, pool %v left; want both released", e.uctx != nil, e.pool != nil)
	}
}
