package soft

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A peer that dials again replaces its connection, and the old one dies
// only once the new one is in place. The old one's death fails only the
// sends it carried: a send posted while it dies goes out on the new
// connection, the peer takes it there, and it succeeds. Once it completed
// with ACK_TIMEOUT and put the jetty in ERROR.
func TestReplacedConnectionFailsOnlyItsSends(t *testing.T) {
	fabrics := []struct {
		name string
		opts func(t *testing.T) Options
	}{
		{"socket", func(*testing.T) Options { return socketOpts() }},
		{"shm", func(t *testing.T) Options { return shmOpts(t) }},
	}
	for _, f := range fabrics {
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
			pa.devices[0].sock.connDying = func(c *conn) {
				if c == old {
					once.Do(func() { posted <- a.send(target, 8, 0, 64, 0) })
				}
			}
			// Every goroutine that fails a connection locks the device or
			// the old connection first: this orders the hook before them.
			pa.conns()
			_ = old.deathCause()
			pbA, err := pb.devices[0].sock.peer(a.jetty.ID().EID)
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
