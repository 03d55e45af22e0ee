package soft

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A peer that dials again replaces its connection, and the old one dies
// only once the new one is in place. The old one's death fails only the
// sends it carried: a send posted while it dies goes out on the new
// connection, the peer takes it there, and it succeeds. Once it completed
// with ACK_TIMEOUT and put the jetty in ERROR.
func TestReplacedConnectionFailsOnlyItsSends(t *testing.T) {
	for _, f := range wireFabrics() {
		t.Run(f.name, func(t *testing.T) {
			noLeaks(t)
			opts := f.opts(t)
			opts.PeerTimeout = time.Minute // only the redial ends a connection
			pa, pb := newProvider(t, opts), newProvider(t, opts)
			a := newSide(t, pa, urma.JettyConfig{}, 64)
			b := newSide(t, pb, urma.JettyConfig{}, 64)
			// B dials A: A's side of the connection is not its own dial, so
			// A takes B's next dial in its place.
			b.importJetty(a)
			target := a.importJetty(b)
			conns := pa.conns()
			if len(conns) != 1 {
				t.Fatalf("%d connections, want 1", len(conns))
			}
			old := conns[0]
			b.postRecv(1, 0, 64)
			posted := make(chan error, 1)
			var once sync.Once
			pa.devices[0].side.connDying = func(c *conn) {
				if c == old {
					once.Do(func() { posted <- a.send(target, 8, 0, 64, 0) })
				}
			}
			// Every goroutine that fails a connection locks the device or
			// the old connection first: this orders the hook before them.
			pa.conns()
			_ = old.deathCause()
			pbA, err := pb.devices[0].side.peer(a.jetty.ID().EID)
			mustOK(t, err, "B's peer A")
			mustOK(t, pbA.dialOnce(t.Context()), "B dials A again")
			select {
			case err := <-posted:
				mustOK(t, err, "send 8 while the replaced connection dies")
			case <-time.After(10 * time.Second):
				t.Fatal("the replaced connection did not die")
			}
			if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.UserCtx != 8 || c.Status != urma.StatusSuccess {
				t.Fatalf("send 8, out on the new connection, completed with %+v", c)
			}
			if r := pollN(t, b.rjfc, 1, 10*time.Second)[0]; r.UserCtx != 1 || r.Status != urma.StatusSuccess {
				t.Fatalf("receive %+v, want send 8 in receive 1", r)
			}
			if st := a.jetty.State(); st != urma.JettyReady {
				t.Fatalf("jetty %v after the replacement, want READY", st)
			}
		})
	}
}

// fakeDial connects to the device as peer src and completes the handshake.
func fakeDial(t *testing.T, addr string, src, dst urma.EID) (net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	mustOK(t, err, "dial")
	var hb [4 + helloLen]byte
	_, err = nc.Write(encodeHello(hb[:], &hello{session: 1, src: src, dst: dst, maxMsg: 1 << 20}))
	mustOK(t, err, "hello")
	br := bufio.NewReader(nc)
	var ab [4 + helloAckLen]byte
	_, err = io.ReadFull(br, ab[:])
	mustOK(t, err, "hello ack")
	a, err := decodeHelloAck(ab[:])
	mustOK(t, err, "decode hello ack")
	if a.status != 0 {
		t.Fatalf("hello ack status %d", a.status)
	}
	return nc, br
}

// A send out on a replaced connection can get no answer any more: it
// fails with ACK_TIMEOUT, and a send posted behind it, on the new
// connection, is flushed after it, in post order, even though the peer
// would answer that one at once.
func TestReplacedConnectionFailsItsSendsFirst(t *testing.T) {
	noLeaks(t)
	opts := socketOpts()
	opts.PeerTimeout = time.Minute // only the redial ends a connection
	p := newProvider(t, opts)
	a := newSide(t, p, urma.JettyConfig{}, 64)
	aEID := a.jetty.ID().EID
	fEID, err := SocketEID(netip.MustParseAddrPort("127.0.0.9:9")) // never dialed: the fake peer dials in
	mustOK(t, err, "EID")
	var peers sync.WaitGroup
	t.Cleanup(peers.Wait) // registered before the provider's close: runs after it hung up
	// The first connection answers the import and reads send 7, unanswered.
	nc1, br1 := fakeDial(t, p.addr(), fEID, aEID)
	defer nc1.Close()
	read7 := make(chan error, 1)
	peers.Add(1)
	go func() {
		defer peers.Done()
		var ib [4 + importJettyLen]byte
		if _, err := io.ReadFull(br1, ib[:]); err != nil {
			read7 <- err
			return
		}
		r, _ := decodeImportJetty(ib[4:])
		var rb [4 + importRespLen]byte
		if _, err := nc1.Write(encodeImportResp(rb[:], r.req, urma.CodeSuccess)); err != nil {
			read7 <- err
			return
		}
		_, err := readSend(br1)
		read7 <- err
		io.Copy(io.Discard, br1) // until the connection is closed
	}()
	target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: fEID, ID: 5}, urma.RC, 9)
	mustOK(t, err, "import from the fake peer")
	defer target.Close()
	mustOK(t, a.send(target, 7, 0, 64, 0), "send 7")
	mustOK(t, <-read7, "the fake peer reads send 7")
	conns := p.conns()
	if len(conns) != 1 {
		t.Fatalf("%d connections, want 1", len(conns))
	}
	old := conns[0]
	// While the old connection dies, send 8 goes out; the hook reports the
	// first completion that follows.
	type outcome struct {
		err   error
		first urma.Completion
	}
	hooked := make(chan outcome, 1)
	var once sync.Once
	p.devices[0].side.connDying = func(c *conn) {
		if c != old {
			return
		}
		once.Do(func() {
			var o outcome
			if o.err = a.send(target, 8, 64, 64, 0); o.err == nil {
				var cs []urma.Completion // the answer comes from another goroutine
				if cs, o.err = pollFor(a.sjfc, 1, 10*time.Second); o.err == nil {
					o.first = cs[0]
				}
			}
			hooked <- o
		})
	}
	p.conns() // orders the hook before the accept that runs it (see above)
	_ = old.deathCause()
	// The fake peer dials again; on the new connection it answers every
	// send at once.
	nc2, br2 := fakeDial(t, p.addr(), fEID, aEID)
	defer nc2.Close()
	peers.Add(1)
	go func() {
		defer peers.Done()
		for {
			h, err := readSend(br2)
			if err != nil {
				return
			}
			var b [4 + ackLen]byte
			if _, err := nc2.Write(encodeAck(b[:], &ackFrame{status: urma.StatusSuccess, src: h.src, dst: h.dst, tag: h.tag})); err != nil {
				return
			}
		}
	}()
	var o outcome
	select {
	case o = <-hooked:
	case <-time.After(10 * time.Second):
		t.Fatal("the replaced connection did not die")
	}
	mustOK(t, o.err, "send 8 while the replaced connection dies, and poll its jetty")
	got := append([]urma.Completion{o.first}, pollN(t, a.sjfc, 1, 10*time.Second)...)
	want := []urma.Completion{{UserCtx: 7, Status: urma.StatusAckTimeout}, {UserCtx: 8, Status: urma.StatusWRFlushErr}}
	wantInOrder(t, got, want)
}

// A long-lived jetty that talks to many short-lived peers, one after the
// other, keeps no record of those gone: its per-peer connection
// generations go with the peers' connections, and with them the last
// hold on the device's peer entries, which the garbage collector then
// frees. The jetty stays READY and reaches each new peer.
func TestJettyForgetsPeersGone(t *testing.T) {
	for _, f := range wireFabrics() {
		t.Run(f.name, func(t *testing.T) {
			noLeaks(t)
			opts := f.opts(t)
			opts.PeerTimeout = time.Minute // only a peer's close ends a connection
			pa := newProvider(t, opts)
			a := newSide(t, pa, urma.JettyConfig{Mode: urma.RM}, 64)
			j := a.jetty.(*jetty)
			sd := pa.devices[0].side
			const peers = 16
			for i := range peers {
				pb := newProvider(t, opts)
				b := newSide(t, pb, urma.JettyConfig{Mode: urma.RM}, 64)
				b.postRecv(1, 0, 64)
				target, err := a.ctx.ImportJetty(t.Context(), b.jetty.ID(), urma.RM, 7)
				mustOK(t, err, "import")
				mustOK(t, a.send(target, uint64(i), 0, 64, 0), "send")
				if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
					t.Fatalf("send to peer %d completed with %+v", i, c)
				}
				mustOK(t, target.Close(), "unimport")
				mustOK(t, pb.Close(), "close the peer")
				// conn.fail told the jetties before it dropped the connection.
				eventually.Holds(t, "the connection to the closed peer to go", 0, func() bool { return len(pa.conns()) == 0 })
			}
			j.mu.Lock()
			records := len(j.peerGen)
			j.mu.Unlock()
			if records != 0 {
				t.Fatalf("the jetty keeps connection records of %d peers, all %d gone", records, peers)
			}
			if st := a.jetty.State(); st != urma.JettyReady {
				t.Fatalf("jetty %v, want READY", st)
			}
			eventually.Holds(t, "the device to drop the entries of the peers gone", 0, func() bool {
				runtime.GC()
				sd.mu.Lock()
				defer sd.mu.Unlock()
				return len(sd.peers) == 0
			})
		})
	}
}
