package soft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// madeUpLink is a connection a test holds at a device under an identity
// it made up for it: what an attacker that reaches the device's socket
// can have for free (a fresh key on shm, a port of its own address on the
// socket fabric).
type madeUpLink struct {
	nc     net.Conn
	eid    urma.EID
	status uint8 // the device's answer: helloOK, or why it refused
}

// closed reports whether the device hung up on the link (after taking
// it), waiting up to 10s.
func (l *madeUpLink) closed(t *testing.T) bool {
	t.Helper()
	mustOK(t, l.nc.SetReadDeadline(time.Now().Add(10*time.Second)), "deadline")
	var b [256]byte
	for {
		_, err := l.nc.Read(b[:])
		var ne net.Error
		switch {
		case err == nil:
			continue // a PING, on the socket fabric
		case errors.As(err, &ne) && ne.Timeout():
			return false
		}
		return true
	}
}

// dialMadeUp makes link i to the device under a made-up identity and
// completes the handshake as far as the device lets it. The link is held
// until the test ends.
func dialMadeUp(t *testing.T, fabric string, sd *fabricSide, i int) *madeUpLink {
	t.Helper()
	if fabric == "shm" {
		return dialMadeUpShm(t, sd.shm.path, sd.eid, sd.shm.bootID)
	}
	src, err := SocketEID(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(20000+i)))
	mustOK(t, err, "made-up EID")
	nc, err := net.Dial("tcp", sd.ln.Addr().String())
	mustOK(t, err, "dial")
	t.Cleanup(func() { _ = nc.Close() })
	var hb [4 + helloLen]byte
	_, err = nc.Write(encodeHello(hb[:], &hello{session: 1, src: src, dst: sd.eid, maxMsg: 1 << 20}))
	mustOK(t, err, "HELLO")
	var ab [4 + helloAckLen]byte
	_, err = io.ReadFull(nc, ab[:])
	mustOK(t, err, "HELLO_ACK")
	a, err := decodeHelloAck(ab[:])
	mustOK(t, err, "decode HELLO_ACK")
	return &madeUpLink{nc: nc, eid: src, status: a.status}
}

// dialMadeUpShm makes a link to the shm device eid, listening at path on
// the host of boot id boot, under a fresh key.
func dialMadeUpShm(t *testing.T, path string, eid urma.EID, boot [bootIDLen]byte) *madeUpLink {
	t.Helper()
	nc, err := net.Dial("unixpacket", path)
	mustOK(t, err, "dial")
	t.Cleanup(func() { _ = nc.Close() })
	d := shmGreetAs(t, nc.(*net.UnixConn), testShmIdentity(t), eid, boot, MinShmRing)
	if d.ack.status != helloOK {
		return &madeUpLink{nc: nc, eid: d.id.eid, status: d.ack.status}
	}
	ends, err := shmring.NewEnds(MinShmRing)
	mustOK(t, err, "the made-up peer's ring")
	t.Cleanup(ends.Release)
	status, fds, err := d.prove(d.sign(), ends.Fds())
	ends.ClosePassed()
	closeAll(fds)
	mustOK(t, err, "READY")
	return &madeUpLink{nc: nc, eid: d.id.eid, status: status}
}

// Attack 4 of issue 40, the connection slots: made-up identities cost
// nothing, so a process that reaches a device's socket can fill all of
// its MaxConns links with proven but useless ones. A legitimate peer
// still gets in: the device makes room by evicting the oldest link it
// took in and never used, which is the attacker's own, and a link the
// device uses (its own dial, an import over it, a send from the peer that
// passed a token check) is never evicted. Only once every link is in use
// is a dialer refused, naming Options.MaxConns.
func TestMadeUpIdentitiesCannotTakeEverySlot(t *testing.T) {
	for _, f := range wireFabrics() {
		t.Run(f.name, func(t *testing.T) {
			noLeaks(t)
			opts := f.opts(t)
			opts.PeerTimeout = time.Minute // only eviction ends a made-up link
			vopts := opts
			var sink logtest.Lines
			vopts.Logger = sink.Logger(nil)
			vopts.MaxConns = 4
			pv := newProvider(t, vopts)
			v := newSide(t, pv, urma.JettyConfig{}, 64)
			sd := pv.devices[0].side
			var made []*madeUpLink
			held := func(eid urma.EID) bool {
				for _, c := range pv.conns() {
					if c.peerEID == eid {
						return true
					}
				}
				return false
			}
			// dialMadeUp makes the next made-up link and, when the device
			// takes it, waits until the device holds it: the device
			// answers an shm dialer before it adopts the link.
			dialMadeUp := func() *madeUpLink {
				t.Helper()
				l := dialMadeUp(t, f.name, sd, len(made))
				made = append(made, l)
				if l.status == helloOK {
					eventually.Holds(t, "the device to hold the made-up link", 0, func() bool { return held(l.eid) })
				}
				return l
			}
			for i := range 4 {
				if l := dialMadeUp(); l.status != helloOK {
					t.Fatalf("made-up link %d refused with status %d while the device has room", i, l.status)
				}
			}

			recvs := uint64(0)
			type legit struct {
				s      *side
				target urma.RemoteJetty
			}
			// sendOK sends from a legitimate peer to the device's jetty,
			// with the token of its JFR.
			sendOK := func(l legit, what string) {
				t.Helper()
				recvs++
				v.postRecv(recvs, 0, 64)
				mustOK(t, l.s.send(l.target, recvs, 0, 64, 0), what)
				if c := pollN(t, l.s.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
					t.Fatalf("%s: completed with %+v", what, c)
				}
				pollN(t, v.rjfc, 1, 10*time.Second)
			}
			dialIn := func(what string) legit {
				t.Helper()
				s := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
				target, err := s.ctx.ImportJetty(t.Context(), v.jetty.ID(), urma.RC, 7)
				if err != nil {
					t.Fatalf("%s, with every slot held by made-up identities: %v", what, err)
				}
				return legit{s, target}
			}
			connOf := func(eid urma.EID) *conn {
				t.Helper()
				for _, c := range pv.conns() {
					if c.peerEID == eid {
						return c
					}
				}
				t.Fatalf("the device has no connection to %s", eid)
				return nil
			}

			// Each link taken in while the device is full evicts the
			// oldest made-up link still open.
			evicted := 0
			wantEvicted := func(what string) {
				t.Helper()
				if !made[evicted].closed(t) {
					t.Fatalf("%s: made-up link %d, the oldest still open, was not evicted", what, evicted)
				}
				evicted++
			}
			// A legitimate peer gets in, at the cost of the oldest
			// made-up link, and uses its link: a send with the token.
			l1 := dialIn("a legitimate peer dials in")
			wantEvicted("the first legitimate peer")
			sendOK(l1, "the legitimate peer's send")
			eventually.Holds(t, "the device to log the eviction", 0, func() bool { return sink.Contains("evicting") })
			// A second peer dials in and only imports; the device then
			// imports over that link: the device's own use.
			l2 := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
			l2.importJetty(v)
			wantEvicted("the second legitimate peer")
			v.importJetty(l2)
			// The device dials a third peer: its own dial, never evicted.
			l3 := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
			v.importJetty(l3)
			used := []*conn{connOf(l1.s.ctx.EID()), connOf(l2.ctx.EID()), connOf(l3.ctx.EID())}

			// The attacker goes on making up identities: each gets in by
			// evicting one of its own links, never one the device uses.
			for i := range 8 {
				if l := dialMadeUp(); l.status != helloOK {
					t.Fatalf("made-up link %d refused with status %d while the device holds made-up links it never used", len(made)-1, l.status)
				}
				wantEvicted(fmt.Sprintf("made-up dial %d", i))
			}
			for i, c := range used {
				if now := connOf(c.peerEID); now != c {
					t.Fatalf("the device's connection to legitimate peer %d changed while made-up links came and went", i+1)
				}
			}
			sendOK(l1, "the first legitimate peer's send after the made-up links came and went")

			// Two more legitimate peers take the slots of the last two
			// made-up links (the device's own dial holds one past
			// MaxConns); now every link is in use, and a made-up
			// identity is refused.
			for i := 4; i <= 5; i++ {
				what := fmt.Sprintf("legitimate peer %d", i)
				sendOK(dialIn(what+" dials in"), what+"'s send")
				wantEvicted(what)
			}
			if evicted != len(made) {
				t.Fatalf("%d of %d made-up links evicted, want all", evicted, len(made))
			}
			if l := dialMadeUp(); l.status != helloConnLimit {
				t.Fatalf("a made-up link while every link is in use: status %d, want %d (the connection limit)", l.status, helloConnLimit)
			}
			eventually.Holds(t, "the device to log the refusal", 0, func() bool { return sink.Contains("the most Options.MaxConns allows") })
			if n := pv.ConnLimitRefusals(); n != 1 {
				t.Errorf("ConnLimitRefusals %d, want 1: the one refusal once every link was in use", n)
			}
		})
	}
}

// One process that dials a device holds at most
// Options.MaxConnsPerProcess of its links (and of its handshakes), however
// many identities it makes up: past it, the device refuses the process,
// naming the bound, while a peer in another process still gets in. This
// bounds what a process that can make its links used (one that knows a
// token of the device's) may pin.
func TestMaxConnsPerProcessBoundsOneDialer(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	opts.PeerTimeout = time.Minute
	opts.DialTimeout = time.Minute // a silent dialer holds its handshake that long
	var sink logtest.Lines
	opts.Logger = sink.Logger(nil)
	opts.MaxConns = 8
	opts.MaxConnsPerProcess = 2
	pv := newProvider(t, opts)
	v := newSide(t, pv, urma.JettyConfig{}, 64)
	sd := pv.devices[0].side
	dial := func() *madeUpLink { return dialMadeUpShm(t, sd.shm.path, sd.eid, sd.shm.bootID) }
	first := dial()
	for i, l := range []*madeUpLink{first, dial()} {
		if l.status != helloOK {
			t.Fatalf("link %d of this process refused with status %d, within Options.MaxConnsPerProcess 2", i, l.status)
		}
	}
	if l := dial(); l.status != helloConnLimit {
		t.Fatalf("a third link of this process: status %d, want %d (a connection limit)", l.status, helloConnLimit)
	}
	eventually.Holds(t, "the device to log the bound", 0, func() bool {
		return sink.Contains("holds 2 connections at this device, the most Options.MaxConnsPerProcess allows")
	})
	if n := pv.ConnLimitRefusals(); n != 1 {
		t.Errorf("ConnLimitRefusals %d after refusing the process once, want 1", n)
	}

	// A peer in another process is not this process: it gets in.
	rp := startRemoteProc(t)
	t.Cleanup(rp.kill)
	rc, err := newRemoteProvider(t, rp, opts.ShmDir).Open("", 0)
	mustOK(t, err, "open the other process's device")
	_, err = rc.ImportJetty(t.Context(), v.jetty.ID(), urma.RC, 7)
	mustOK(t, err, "a peer in another process dials in while this one is at its bound")

	// A link the process gives up makes room for another of its own.
	mustOK(t, first.nc.Close(), "close the first link")
	eventually.Holds(t, "the device to drop the closed link", 0, func() bool { return len(pv.conns()) == 2 })
	if l := dial(); l.status != helloOK {
		t.Fatalf("a link of this process after it closed one: status %d, want OK", l.status)
	}

	// Handshakes: two silent dials wait for a HELLO, the process's next
	// one is hung up on at once. The device answers a dialer before its
	// handshake ends: wait until none is under way.
	handshakes := func() int {
		sd.mu.Lock()
		defer sd.mu.Unlock()
		return len(sd.handshaking)
	}
	eventually.Holds(t, "the last link's handshake to end", 0, func() bool { return handshakes() == 0 })
	for i := range 2 {
		nc, err := net.Dial("unixpacket", sd.shm.path)
		mustOK(t, err, "silent dial")
		t.Cleanup(func() { _ = nc.Close() })
		eventually.Holds(t, "the device to take the silent dial", 0, func() bool { return handshakes() == i+1 })
	}
	nc, err := net.Dial("unixpacket", sd.shm.path)
	mustOK(t, err, "a third silent dial")
	defer nc.Close()
	mustOK(t, nc.SetReadDeadline(time.Now().Add(10*time.Second)), "deadline")
	var b [64]byte
	_, err = nc.Read(b[:])
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a third handshake of this process: read %v, want the device to hang up", err)
	}
	eventually.Holds(t, "the device to log the refused handshake", 0, func() bool {
		return sink.Contains("handshakes under way from process")
	})
}

// kernelNamesPeerProcesses reports whether the kernel names the process
// at the other end of a unix socket in any pid namespace (SO_PEERPIDFD on
// pidfs, Linux 6.9).
func kernelNamesPeerProcesses(t *testing.T) bool {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	mustOK(t, err, "socketpair")
	defer closeAll(fds[:])
	pidfd, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err != nil {
		return false
	}
	defer unix.Close(pidfd)
	var fs unix.Statfs_t
	return unix.Fstatfs(pidfd, &fs) == nil && fs.Type == unix.PID_FS_MAGIC
}

// The pods' case: the device runs in a pid namespace of its own, so
// SO_PEERCRED reports the dialing process (this one) as pid 0. The bound
// holds all the same, where the kernel names processes by pidfs.
func TestMaxConnsPerProcessAcrossPidNamespaces(t *testing.T) {
	if !kernelNamesPeerProcesses(t) {
		t.Skip("this kernel has no pidfs (Linux 6.9): a dialer of another pid namespace is bounded by MaxConns alone")
	}
	opts := shmOpts(t)
	rp := startRemoteProcIn(t, syscall.CLONE_NEWPID)
	t.Cleanup(rp.kill)
	rc, err := newRemoteProviderBounded(t, rp, opts.ShmDir, 2).Open("", 0)
	mustOK(t, err, "open the device in its own pid namespace")
	boot, err := BootID()
	mustOK(t, err, "boot id")
	path := ShmSocketPath(opts.ShmDir, rc.EID())
	for i := range 2 {
		if l := dialMadeUpShm(t, path, rc.EID(), boot); l.status != helloOK {
			t.Fatalf("link %d refused with status %d, within Options.MaxConnsPerProcess 2", i, l.status)
		}
	}
	if l := dialMadeUpShm(t, path, rc.EID(), boot); l.status != helloConnLimit {
		t.Fatalf("a third link from a process the device sees as pid 0: status %d, want %d (a connection limit)", l.status, helloConnLimit)
	}
}
