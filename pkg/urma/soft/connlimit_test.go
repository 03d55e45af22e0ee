package soft

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A device takes at most Options.MaxConns connections from peer devices
// dialing in: one more, when every link is in use, is refused, with the limit named in the dialer's
// error (ErrConnLimit) and in the device's log, and counted
// (ConnLimitRefusals), while the peers it holds keep working,
// one of them may replace its connection, and a new peer gets in once
// another left. Dialers that never say HELLO take at most MaxConns
// handshakes; the next is hung up on at once, not after DialTimeout.
func TestMaxConnsRefusesPeersPastTheLimit(t *testing.T) {
	fabrics := []struct {
		name    string
		opts    func(t *testing.T) Options
		network string
		addr    func(sd *fabricSide) string
	}{
		{"socket", func(*testing.T) Options { return socketOpts() }, "tcp", func(sd *fabricSide) string { return sd.ln.Addr().String() }},
		{"shm", func(t *testing.T) Options { return shmOpts(t) }, "unixpacket", func(sd *fabricSide) string { return sd.shm.path }},
	}
	for _, f := range fabrics {
		t.Run(f.name, func(t *testing.T) {
			noLeaks(t)
			opts := f.opts(t)
			opts.PeerTimeout = time.Minute // only a close ends a connection
			vopts := opts
			var sink logtest.Lines
			vopts.Logger = sink.Logger(nil)
			vopts.MaxConns = 2
			vopts.DialTimeout = time.Minute // a silent dialer holds its handshake that long
			pv := newProvider(t, vopts)
			v := newSide(t, pv, urma.JettyConfig{}, 64)
			type dialer struct {
				p      *Provider
				s      *side
				target urma.RemoteJetty
			}
			dialIn := func() (dialer, error) {
				p := newProvider(t, opts)
				s := newSide(t, p, urma.JettyConfig{}, 64)
				target, err := s.ctx.ImportJetty(t.Context(), v.jetty.ID(), urma.RC, 7)
				return dialer{p, s, target}, err
			}
			recvs := uint64(0)
			sendOK := func(d dialer, what string) {
				t.Helper()
				recvs++
				v.postRecv(recvs, 0, 64)
				mustOK(t, d.s.send(d.target, recvs, 0, 64, 0), what)
				if c := pollN(t, d.s.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
					t.Fatalf("%s: completed with %+v", what, c)
				}
				pollN(t, v.rjfc, 1, 10*time.Second)
			}
			d1, err := dialIn()
			mustOK(t, err, "first peer dials in")
			d2, err := dialIn()
			mustOK(t, err, "second peer dials in")
			// Both links in use (a send of each passed the token check):
			// the device has none to evict for the third.
			sendOK(d1, "send of the first peer")
			sendOK(d2, "send of the second peer")
			_, err = dialIn()
			// The refusal arrives as a status code; the dialer's error still
			// carries ErrConnLimit, for the caller to name its own setting.
			if !errors.Is(err, urma.ErrUnreachable) || !errors.Is(err, ErrConnLimit) || !strings.Contains(err.Error(), "Options.MaxConns") {
				t.Fatalf("third peer, past MaxConns 2: %v, want ErrUnreachable and ErrConnLimit, naming Options.MaxConns", err)
			}
			eventually.Holds(t, "the device to log the refusal", 0, func() bool { return sink.Contains("the most Options.MaxConns allows") })
			if n := pv.ConnLimitRefusals(); n != 1 {
				t.Errorf("ConnLimitRefusals %d after refusing one peer, want 1", n)
			}
			sendOK(d1, "send of the first peer after the refusal")
			sendOK(d2, "send of the second peer after the refusal")
			// At the limit, a peer may still replace its connection.
			old := pv.conns()
			d1v, err := d1.p.devices[0].side.peer(v.ctx.EID())
			mustOK(t, err, "first peer's entry for the device")
			mustOK(t, d1v.dialOnce(t.Context()), "first peer dials again at the limit")
			eventually.Holds(t, "the replaced connection to go", 0, func() bool {
				now := pv.conns()
				return len(now) == 2 && (now[0] != old[0] && now[0] != old[1] || now[1] != old[0] && now[1] != old[1])
			})
			sendOK(d1, "send of the first peer on its new connection")
			// A peer that leaves makes room for another.
			mustOK(t, d2.p.Close(), "second peer leaves")
			eventually.Holds(t, "the device to drop the second peer", 0, func() bool { return len(pv.conns()) == 1 })
			d3, err := dialIn()
			mustOK(t, err, "a new peer dials in once there is room")
			sendOK(d3, "send of the new peer")
			// Silent dialers: MaxConns handshakes wait for a HELLO, the
			// next dial is closed at once.
			for i := range 2 {
				nc, err := net.Dial(f.network, f.addr(pv.devices[0].side))
				mustOK(t, err, "silent dial")
				defer nc.Close()
				eventually.Holds(t, "the device to take the silent dial", 0, func() bool {
					sd := pv.devices[0].side
					sd.mu.Lock()
					defer sd.mu.Unlock()
					return len(sd.handshaking) == i+1
				})
			}
			nc, err := net.Dial(f.network, f.addr(pv.devices[0].side))
			mustOK(t, err, "dial past the handshakes allowed")
			defer nc.Close()
			mustOK(t, nc.SetReadDeadline(time.Now().Add(10*time.Second)), "deadline")
			var b [64]byte
			_, err = nc.Read(b[:])
			var ne net.Error
			if err == nil || errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("dial past MaxConns handshakes: read %v, want the device to hang up", err)
			}
			eventually.Holds(t, "the device to log the refused handshake", 0, func() bool { return sink.Contains("handshakes under way") })
			if n := pv.ConnLimitRefusals(); n != 2 {
				t.Errorf("ConnLimitRefusals %d after refusing a peer and a handshake, want 2", n)
			}
			// The refused dial holds nothing: only the two silent ones wait.
			sd := pv.devices[0].side
			sd.mu.Lock()
			waiting := len(sd.handshaking)
			sd.mu.Unlock()
			if waiting != 2 {
				t.Errorf("%d handshakes recorded after a refused one, want the 2 silent dials", waiting)
			}
		})
	}
}
