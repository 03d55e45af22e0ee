package soft

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// Messages of every size, up to many times the ring, arrive whole and in
// order both ways, however they wrap around the rings.
func TestShmMessagesLargerThanTheRing(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	opts.ShmRingSize = MinShmRing
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	if pa.Name() != "soft-shm" {
		t.Fatalf("provider name %q", pa.Name())
	}
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	ta, tb := a.importJetty(b), b.importJetty(a)
	rng := rand.New(rand.NewPCG(1, 2))
	const half = 512 << 10
	for _, n := range []int{1, 100, MinShmRing - 37, MinShmRing, 3*MinShmRing + 5, half} {
		for _, dir := range []struct {
			from, to *side
			target   urma.RemoteJetty
		}{{a, b, ta}, {b, a, tb}} {
			src := dir.from.mem.Bytes()[:n]
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			dir.to.postRecv(1, half, half)
			mustOK(t, dir.from.send(dir.target, 1, 0, n, 0), "send")
			if c := pollN(t, dir.from.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
				t.Fatalf("send of %d bytes: %+v", n, c)
			}
			c := pollN(t, dir.to.rjfc, 1, 10*time.Second)[0]
			if c.Status != urma.StatusSuccess || c.CompletionLen != uint32(n) {
				t.Fatalf("receive of %d bytes: %+v", n, c)
			}
			if !bytes.Equal(dir.to.mem.Bytes()[half:half+n], src) {
				t.Fatalf("%d bytes arrived changed", n)
			}
		}
	}
}

// With no spinning every wait goes to sleep on the eventfd; a wake-up lost
// between "ring empty" and "asleep" would hang this ping-pong.
func TestShmNoLostWakeUp(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	opts.ShmSpin = -1
	opts.ShmRingSize = MinShmRing
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	ta, tb := a.importJetty(b), b.importJetty(a)
	const rounds = 2000
	for i := 0; i < rounds; i++ {
		b.postRecv(uint64(i), 0, 64)
		a.postRecv(uint64(i), 0, 64)
		mustOK(t, a.send(ta, uint64(i), 4096, 64, 0), "ping")
		pollN(t, b.rjfc, 1, 10*time.Second)
		mustOK(t, b.send(tb, uint64(i), 4096, 64, 0), "pong")
		pollN(t, a.rjfc, 1, 10*time.Second)
		pollN(t, a.sjfc, 1, 10*time.Second)
		pollN(t, b.sjfc, 1, 10*time.Second)
	}
}

// A device on another host (another boot id), one whose user is refused,
// and an EID of another fabric are unreachable, each with an error that
// says why; the refusing side logs the reason.
func TestShmRendezvousRefusals(t *testing.T) {
	opts := shmOpts(t)
	b := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
	import1 := func(p *Provider, id urma.JettyID) error {
		a := newSide(t, p, urma.JettyConfig{}, 64)
		_, err := a.ctx.ImportJetty(t.Context(), id, urma.RC, 7)
		return err
	}
	// acceptor is a device of its own subtest, whose log only it sees: the
	// acceptor may log after the dialer has its answer, so the subtest
	// waits for its line rather than expecting it at once.
	acceptor := func(t *testing.T, opts Options) (*side, *logtest.Lines) {
		sink := &logtest.Lines{}
		opts.Logger = sink.Logger(nil)
		return newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64), sink
	}
	t.Run("another host", func(t *testing.T) {
		c, sink := acceptor(t, opts)
		pa := newProvider(t, opts)
		pa.devices[0].side.shm.bootID[0] ^= 0xff
		err := import1(pa, c.jetty.ID())
		if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "another host") {
			t.Fatalf("import from another boot: %v", err)
		}
		eventually.Holds(t, "the acceptor to log why", 0, func() bool { return sink.Contains("another boot id") })
	})
	t.Run("user refused by the acceptor", func(t *testing.T) {
		strict := opts
		strict.ShmAllowUID = func(uint32) bool { return false }
		c, sink := acceptor(t, strict)
		err := import1(newProvider(t, opts), c.jetty.ID())
		if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("import from a device that refuses us: %v", err)
		}
		eventually.Holds(t, "the acceptor to log why", 0, func() bool { return sink.Contains("ShmAllowUID refuses") })
	})
	t.Run("user refused by the dialer", func(t *testing.T) {
		strict := opts
		strict.ShmAllowUID = func(uint32) bool { return false }
		err := import1(newProvider(t, strict), b.jetty.ID())
		if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "ShmAllowUID") {
			t.Fatalf("import from a device whose user we refuse: %v", err)
		}
	})
	t.Run("not an shm EID", func(t *testing.T) {
		sock, _ := SocketEID(mustAddrPort("127.0.0.1:9"))
		err := import1(newProvider(t, opts), urma.JettyID{EID: sock, ID: 1})
		if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "not an shm device") {
			t.Fatalf("import of a socket EID over shm: %v", err)
		}
	})
	t.Run("another directory", func(t *testing.T) {
		err := import1(newProvider(t, shmOpts(t)), b.jetty.ID())
		if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "another shm directory") {
			t.Fatalf("import from a device in another directory: %v", err)
		}
	})
	// The device still serves honest peers.
	a := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	b.postRecv(1, 0, 64)
	mustOK(t, a.send(target, 1, 0, 64, 0), "send")
	if c := pollN(t, a.sjfc, 1, 5*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("send after refusals: %+v", c)
	}
}

// Hostile rendezvous messages are refused and logged, descriptors and all,
// and never crash the device: a bad HELLO, and a PROOF after an honest
// HELLO that is bad or carries bad descriptors.
func TestShmHostileHandshakes(t *testing.T) {
	opts := shmOpts(t)
	var sink logtest.Lines
	opts.Logger = sink.Logger(nil)
	p := newProvider(t, opts)
	sd := p.devices[0].side
	me := testShmIdentity(t)
	good := func() shmHelloMsg {
		h := shmHelloMsg{typ: shmMsgHello, src: me.eid, dst: sd.eid, maxMsg: 1 << 20, bootID: sd.shm.bootID, ringSize: MinShmRing}
		copy(h.pub[:], me.pub)
		return h
	}
	enc := func(h shmHelloMsg) []byte { return encodeShmHello(make([]byte, shmMaxMsgLen), &h) }
	pipeFds := func(t *testing.T) []int {
		var p [2]int
		mustOK(t, unix.Pipe2(p[:], unix.O_CLOEXEC), "pipe")
		return p[:]
	}
	honestRing := func(t *testing.T) []int {
		e, err := shmring.NewEnds(MinShmRing)
		mustOK(t, err, "ends")
		t.Cleanup(e.Release)
		fds := make([]int, 3)
		for i, fd := range e.Fds() {
			fds[i], err = unix.Dup(fd)
			mustOK(t, err, "dup")
		}
		return fds
	}
	cases := []struct {
		name  string
		hello func() []byte                 // nil: an honest HELLO, then a PROOF
		fds   func(t *testing.T) []int      // with the HELLO, or with the PROOF
		sig   func(d *testShmDialer) []byte // nil: an honest signature
		log   string
	}{
		{"garbage", func() []byte { return []byte("GET / HTTP/1.1") }, nil, nil, "bad HELLO"},
		{"wrong version", func() []byte { b := enc(good()); b[4] = 1; return b }, nil, nil, "version"},
		{"short", func() []byte { return enc(good())[:40] }, nil, nil, "bytes"},
		{"odd ring size", func() []byte { h := good(); h.ringSize = 100000; return enc(h) }, nil, nil, "power of two"},
		{"descriptors with the HELLO", func() []byte { return enc(good()) }, honestRing, nil, "descriptors"},
		{"a key that is not the key of the EID", func() []byte { h := good(); h.pub[0] ^= 1; return enc(h) }, nil, nil, "is not the key of EID"},
		{"a signature of another transcript", nil, honestRing, func(d *testShmDialer) []byte {
			return ed25519.Sign(d.id.key, shmTranscript(shmSignDialer, d.helloMsg, d.ackMsg, d.ino+1))
		}, "signature of the handshake does not verify"},
		{"the acceptor signature played back", nil, honestRing, func(d *testShmDialer) []byte {
			b := make([]byte, shmMaxMsgLen)
			return encodeShmHello(b, &d.ack)[shmMsgHdrLen+136 : shmMsgHdrLen+200]
		}, "does not verify"},
		{"no descriptors", nil, nil, nil, "descriptors"},
		{"pipes for eventfds", nil, func(t *testing.T) []int {
			fds := honestRing(t)
			closeAll(fds[1:])
			return append(fds[:1], pipeFds(t)...)
		}, nil, "not an eventfd"},
		{"unsealed ring", nil, func(t *testing.T) []int {
			fd, err := unix.MemfdCreate("x", unix.MFD_CLOEXEC)
			mustOK(t, err, "memfd")
			mustOK(t, unix.Ftruncate(fd, shmring.CtlSize+MinShmRing), "truncate")
			e1, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
			e2, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
			return []int{fd, e1, e2}
		}, nil, "seals"},
		// Sealed, but a page its owner punches out would SIGBUS our next
		// read of it once the huge page pool is empty.
		{"ring on hugetlbfs", nil, func(t *testing.T) []int {
			fd, err := unix.MemfdCreate("x", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_HUGETLB)
			if err != nil {
				t.Skipf("no hugetlbfs memfd here: %v", err)
			}
			mustOK(t, unix.Ftruncate(fd, 2<<20), "truncate")
			_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
			mustOK(t, err, "seal")
			e1, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
			e2, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
			return []int{fd, e1, e2}
		}, nil, "hugetlbfs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nc, err := net.Dial("unixpacket", sd.shm.path)
			mustOK(t, err, "dial")
			defer nc.Close()
			uc := nc.(*net.UnixConn)
			var fds []int
			if c.fds != nil {
				fds = c.fds(t)
				defer closeAll(fds)
			}
			if c.hello != nil {
				var oob []byte
				if len(fds) > 0 {
					oob = unix.UnixRights(fds...)
				}
				_, _, err = uc.WriteMsgUnix(c.hello(), oob, nil)
				mustOK(t, err, "write")
			} else {
				d := shmGreetWith(t, uc, me, good())
				if d.ack.status != helloOK {
					t.Fatalf("honest HELLO answered %+v", d.ack)
				}
				sig := d.sign()
				if c.sig != nil {
					sig = c.sig(d)
				}
				status, got, err := d.prove(sig, fds)
				closeAll(got)
				if err == nil && status == helloOK {
					t.Fatal("READY OK to a hostile PROOF")
				}
			}
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 256)
			for {
				if _, err := nc.Read(buf); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Fatal("device kept a hostile connection open")
					}
					break
				}
			}
			eventually.Holds(t, "the device to log why", 0, func() bool { return sink.Contains(c.log) })
			if n := len(p.conns()); n != 0 {
				t.Fatalf("the device holds %d connections after a hostile handshake", n)
			}
		})
	}
}

// fakeShmPeer handshakes with a device's shm socket as a dialer would and
// hands the test its end of the rings, to misbehave with.
func fakeShmPeer(t *testing.T, sd *fabricSide) (*shmIO, urma.EID) {
	t.Helper()
	nc, err := net.Dial("unixpacket", sd.shm.path)
	mustOK(t, err, "dial")
	ends, err := shmring.NewEnds(MinShmRing)
	mustOK(t, err, "ends")
	me, fds, peerRing := shmHello(t, nc, ends, sd)
	sio, err := newShmIO(ends, MinShmRing, peerRing, fds, -1)
	mustOK(t, err, "join rings")
	mustOK(t, sio.attach(nc), "attach")
	t.Cleanup(func() { sio.Shutdown(); sio.Close() })
	return sio, me
}

// shmHello handshakes over nc as a dialer would, with a key of its own,
// passing ends' descriptors, and returns the EID it proved, the device's
// descriptors and ring size.
func shmHello(t *testing.T, nc net.Conn, ends *shmring.Ends, sd *fabricSide) (me urma.EID, fds []int, peerRing int) {
	t.Helper()
	d := shmGreetAs(t, nc.(*net.UnixConn), testShmIdentity(t), sd.eid, sd.shm.bootID, MinShmRing)
	if d.ack.status != helloOK {
		t.Fatalf("HELLO_ACK %+v", d.ack)
	}
	status, fds, err := d.prove(d.sign(), ends.Fds())
	ends.ClosePassed()
	if err != nil || status != helloOK {
		closeAll(fds)
		t.Fatalf("READY %d, %v", status, err)
	}
	return d.id.eid, fds, int(d.ack.ringSize)
}

// A peer whose ring control words make no sense breaks the protocol: the
// connection closes, and says why.
func TestShmCorruptRing(t *testing.T) {
	for _, c := range []struct {
		name    string
		corrupt func(f *shmIO)
	}{
		{"tail past the ring", func(f *shmIO) { f.Word(shmring.WordTail).Store(uint64(f.Size()) + 1) }},
		{"head past what was written", func(f *shmIO) { f.Word(shmring.WordHead).Store(12345) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, sink := loggedProvider(t, shmOpts(t))
			sd := p.devices[0].side
			f, fake := fakeShmPeer(t, sd)
			// The device's writer meets the corrupt head when it next
			// writes: an import request makes it write.
			a := newSide(t, p, urma.JettyConfig{}, 64)
			deadline := time.Now().Add(5 * time.Second)
			c.corrupt(f)
			mustOK(t, f.WakePeer(), "wake the device")
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, _ = a.ctx.ImportJetty(ctx, urma.JettyID{EID: fake, ID: 1}, urma.RC, 7)
			}()
			for !sink.Contains("inconsistent") {
				if time.Now().After(deadline) {
					t.Fatalf("no log line says the ring is inconsistent: %q", sink.All())
				}
				time.Sleep(time.Millisecond) // polling deadline: the device logs as it closes the connection
			}
		})
	}
}

// Close removes the device's socket from the shm directory.
func TestShmCloseRemovesSocket(t *testing.T) {
	opts := shmOpts(t)
	p, err := New(opts)
	mustOK(t, err, "new")
	path := p.devices[0].side.shm.path
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("socket missing: %v", err)
	}
	mustOK(t, p.Close(), "close")
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
}

// Options that cannot work fail New with a reason.
func TestShmOptionsRefused(t *testing.T) {
	long := "/tmp/" + strings.Repeat("d", 90)
	key := testShmIdentity(t).key
	otherEID, err := ShmEID()
	mustOK(t, err, "EID")
	cases := []struct {
		name string
		opts Options
		want string
	}{
		{"both fabrics", Options{Fabric: NewFabric(), ShmDir: t.TempDir()}, "choose one fabric"},
		{"ring size", Options{ShmDir: t.TempDir(), ShmRingSize: 3 << 20}, "power of two"},
		{"ring too small", Options{ShmDir: t.TempDir(), ShmRingSize: 4096}, "power of two"},
		{"path too long", Options{ShmDir: long}, "shorter URMA_SHM_DIR"},
		{"two EIDs", Options{ShmDir: t.TempDir(), Devices: []DeviceSpec{{EIDs: []urma.EID{{1}, {2}}}}}, "one EID"},
		{"an EID without its key", Options{ShmDir: t.TempDir(), Devices: []DeviceSpec{{EIDs: []urma.EID{otherEID}}}}, "without its key"},
		{"an EID that is not the EID of the key", Options{ShmDir: t.TempDir(), Devices: []DeviceSpec{{EIDs: []urma.EID{otherEID}, ShmKey: key}}}, "is not the EID of DeviceSpec.ShmKey"},
		{"a key of the wrong size", Options{ShmDir: t.TempDir(), Devices: []DeviceSpec{{ShmKey: key[:31]}}}, "ed25519 private key"},
	}
	defer os.RemoveAll(long)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := New(c.opts)
			if err == nil {
				_ = p.Close()
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
}

// Devices dialing each other at once over shm end with one connection.
func TestShmOneConnectionPerDevicePair(t *testing.T) {
	for round := 0; round < 10; round++ {
		func() {
			noLeaks(t)
			opts := shmOpts(t)
			pa, pb := newProvider(t, opts), newProvider(t, opts)
			a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
			b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errs := make(chan error, 2)
			var ta, tb urma.RemoteJetty
			go func() { var err error; ta, err = a.ctx.ImportJetty(ctx, b.jetty.ID(), urma.RC, 7); errs <- err }()
			go func() { var err error; tb, err = b.ctx.ImportJetty(ctx, a.jetty.ID(), urma.RC, 7); errs <- err }()
			mustOK(t, <-errs, "import")
			mustOK(t, <-errs, "import")
			defer ta.Close()
			defer tb.Close()
			if na, nb := len(pa.conns()), len(pb.conns()); na != 1 || nb != 1 {
				t.Fatalf("round %d: %d and %d connections", round, na, nb)
			}
			a.postRecv(1, 0, 64)
			b.postRecv(1, 0, 64)
			mustOK(t, a.send(ta, 1, 0, 64, 0), "send")
			mustOK(t, b.send(tb, 1, 0, 64, 0), "send")
			pollN(t, a.rjfc, 1, 5*time.Second)
			pollN(t, b.rjfc, 1, 5*time.Second)
		}()
	}
}

func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// sleepsAgain reports whether every reader sleeps announced, each in a
// sleep that began after the one in before (a writer wakes each sleep
// once: a reader still to run after its wake-up needs no other).
func sleepsAgain(before, now []uint64) bool {
	if len(now) != len(before) {
		return false
	}
	for i, w := range now {
		if w&1 == 0 || w == before[i] {
			return false
		}
	}
	return true
}

// While both sides poll, the pollers take the frames from the rings
// themselves: the reader goroutines stay parked and a ping-pong costs no
// wake-up of the peer, however many messages go.
func TestShmPollingCostsNoWakeUps(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	opts.ShmSpin = -1 // idle readers sleep at once: every wake-up would show
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	keepPollingMode(pa)
	keepPollingMode(pb)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	ta, tb := a.importJetty(b), b.importJetty(a)
	for _, c := range append(pa.conns(), pb.conns()...) {
		if got := c.io.(*shmIO).PollingEnd; got != math.MaxInt {
			t.Fatalf("connection ends polling mode after %d parks, want the device's %d", got, math.MaxInt)
		}
	}
	const rounds = 500
	pingPong := func() {
		for i := 0; i < rounds; i++ {
			b.postRecv(uint64(i), 0, 64)
			a.postRecv(uint64(i), 0, 64)
			mustOK(t, a.send(ta, uint64(i), 4096, 64, 0), "ping")
			pollUntil(t, b.rjfc, 1)
			mustOK(t, b.send(tb, uint64(i), 4096, 64, 0), "pong")
			pollUntil(t, a.rjfc, 1)
			pollUntil(t, a.sjfc, 1)
			pollUntil(t, b.sjfc, 1)
		}
	}
	pingPong() // warm up: the Polls put the rings in polling mode
	before := pa.wakes() + pb.wakes()
	pingPong()
	// Not quite zero: a reader that had not entered polling mode when the
	// warm-up ended may still sleep announced once. Without polling mode,
	// or without Polls driving the rings, it is one or more per message.
	if n := pa.wakes() + pb.wakes() - before; n > rounds/100 {
		t.Errorf("%d wake-ups for %d polled round trips, want next to none", n, rounds)
	}
}

// Without polling mode (Polls too few to enter it, and pollingEnd parks
// without one to leave it), the readers sleep announced and each message
// wakes its reader: none is lost, or the test would wait for it forever.
func TestShmUnpolledMessagesWakeTheirReader(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	opts.ShmSpin = -1
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	ta := a.importJetty(b)
	const slow = 20
	before := pa.wakes() + pb.wakes()
	sleptA, sleptB := []uint64{0}, []uint64{0} // one connection each, not yet asleep
	for i := 0; i < slow; i++ {
		b.postRecv(uint64(i), 0, 64)
		eventually.Holds(t, "both readers to sleep announced again", 0, func() bool {
			return sleepsAgain(sleptA, readerSleeps(pa)) && sleepsAgain(sleptB, readerSleeps(pb))
		})
		sleptA, sleptB = readerSleeps(pa), readerSleeps(pb)
		mustOK(t, a.send(ta, uint64(i), 4096, 64, 0), "ping")
		pollUntil(t, b.rjfc, 1)
		pollUntil(t, a.sjfc, 1)
	}
	// Each message wakes b's reader and its ACK wakes a's.
	if n := pa.wakes() + pb.wakes() - before; n < 2*slow {
		t.Errorf("%d wake-ups for %d messages to sleeping readers, want at least %d", n, slow, 2*slow)
	}
}

// Pollers on both sides stream messages several times the ring size: a
// poller in the middle of a frame never sleeps on the reader's eventfd
// (two sleepers there would lose wake-ups) and writes what the writer
// goroutine has not.
func TestShmPollingLargeMessages(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	opts.ShmRingSize = MinShmRing
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	ta := a.importJetty(b)
	const size, n = 200 << 10, 40
	for i := 0; i < 4; i++ {
		b.postRecv(uint64(i), (i%4)*size, size)
	}
	sent, got := 0, 0
	for got < n {
		for sent < n && sent-got < 4 {
			mustOK(t, a.send(ta, uint64(sent), 0, size, 0), "send")
			sent++
		}
		for _, c := range pollUntil(t, b.rjfc, 1) {
			if c.Status != urma.StatusSuccess || c.CompletionLen != size {
				t.Fatalf("receive %d: %+v", got, c)
			}
			got++
			if got+3 < n {
				b.postRecv(c.UserCtx, int(c.UserCtx%4)*size, size)
			}
		}
		a.sjfc.Poll(make([]urma.Completion, 8))
	}
}

// A SEND from a segment registered with remote read access crosses the
// ring as references once the peer maps the segment: the receiver copies
// the bytes straight from the sender's memory. Unregistering the segment
// unmaps it at the peer. A local-only segment is always copied.
func TestShmOneCopySend(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7, MaxSGE: 2}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	target := a.importJetty(b)
	const size = 64 << 10
	send := func(seg urma.Segment, mem []byte, i int) {
		t.Helper()
		for k := range mem[:size] {
			mem[k] = byte(i*7 + k)
		}
		b.postRecv(uint64(i), 0, size)
		mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i),
			SGEs: []urma.SGE{{Segment: seg, Offset: 0, Len: size / 2}, {Segment: seg, Offset: size / 2, Len: size / 2}}}), "send")
		if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
			t.Fatalf("send %d: %+v", i, c)
		}
		c := pollN(t, b.rjfc, 1, 10*time.Second)[0]
		if c.Status != urma.StatusSuccess || c.CompletionLen != size || !bytes.Equal(b.mem.Bytes()[:size], mem[:size]) {
			t.Fatalf("receive %d: %+v, bytes equal %v", i, c, bytes.Equal(b.mem.Bytes()[:size], mem[:size]))
		}
	}
	// Local-only (the side's own segment): copied, never shared.
	for i := 0; i < 3; i++ {
		send(a.seg, a.mem.Bytes(), i)
	}
	if pa.pulls() != 0 || pb.mappedSegments() != 0 {
		t.Fatalf("local-only memory went by reference (%d) or was mapped (%d)", pa.pulls(), pb.mappedSegments())
	}
	seg, mem := shareableSegment(t, a, urma.AccessRead|urma.AccessWrite)
	send(seg, mem.Bytes(), 10) // by copy; the peer is asked to map the segment
	eventually.Holds(t, "the peer to map the segment", 0, func() bool { return pb.mappedSegments() == 1 })
	// The sender learns it from the peer's answer, which may come later.
	eventually.Holds(t, "the peer's answer that it mapped the segment", 0, func() bool { return pa.readyShares() == 1 })
	for i := 11; i < 15; i++ {
		send(seg, mem.Bytes(), i)
	}
	if got := pa.pulls(); got != 4 {
		t.Fatalf("%d sends by reference after the segment was mapped, want all 4", got)
	}
	mustOK(t, seg.Close(), "unregister")
	eventually.Holds(t, "the peer to unmap the segment", 0, func() bool { return pb.mappedSegments() == 0 })
}

// A segment shared over a connection forgets the connection when it
// closes: a long-lived segment must not hold every connection it was ever
// sent over.
func TestShmSegmentForgetsClosedConnection(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	target := a.importJetty(b)
	useg, _ := shareableSegment(t, a, urma.AccessRead)
	b.postRecv(1, 0, 64<<10)
	mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target,
		SGEs: []urma.SGE{{Segment: useg, Len: 64 << 10}}}), "send")
	if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("send: %+v", c)
	}
	seg := useg.(*segment)
	sharers := func() int {
		seg.sharersMu.Lock()
		defer seg.sharersMu.Unlock()
		return len(seg.sharers)
	}
	if sharers() != 1 {
		t.Fatalf("the segment is shared over %d connections, want 1", sharers())
	}
	mustOK(t, pb.Close(), "close the peer")
	eventually.Holds(t, "the segment to forget the closed connection", 0, func() bool { return sharers() == 0 })
}

// SEND_REF frames that name memory the peer never shared, or reach past
// it, break the protocol; so does a SEND_REF on the socket fabric.
func TestShmHostileSendRef(t *testing.T) {
	cases := []struct {
		name string
		refs []payloadRef
		log  string
	}{
		{"unknown handle", []payloadRef{{handle: 77, length: 10}}, "not shared"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, f, sink := loggedShmDeviceAndFakePeer(t)
			var b [maxFrameHdr]byte
			frame := encodeSendRef(b[:], &sendHeader{opcode: urma.OpSend, dst: 1, token: 7, tag: 1}, c.refs)
			if rest, err := f.Writev(appendIov(nil, frame), true); err != nil || len(rest) != 0 {
				t.Fatalf("write frame: %v", err)
			}
			eventually.Holds(t, "the device to log the violation", 0, func() bool { return sink.Contains(c.log) })
		})
	}
	// The socket fabric knows no shared memory.
	var sink logtest.Lines
	sopts := socketOpts()
	sopts.Logger = sink.Logger(nil)
	ps := newProvider(t, sopts)
	nc, err := net.Dial("tcp", ps.addr())
	mustOK(t, err, "dial")
	defer nc.Close()
	src, _ := SocketEID(netip.MustParseAddrPort("127.0.0.9:9"))
	var hb [4 + helloLen]byte
	var fb [maxFrameHdr]byte
	_, err = nc.Write(append(encodeHello(hb[:], &hello{session: 1, src: src, dst: ps.devices[0].side.eid, maxMsg: 1 << 20}),
		encodeSendRef(fb[:], &sendHeader{opcode: urma.OpSend, dst: 1, token: 7, tag: 1}, []payloadRef{{handle: 1, length: 8}})...))
	mustOK(t, err, "write")
	eventually.Holds(t, "the socket device to refuse SEND_REF", 0, func() bool { return sink.Contains("SEND_REF on a connection without shared memory") })
}

// A poller that drives the rings (a JFC without a JFCE) while peers come
// and go must never touch the rings of a connection that closed: the
// connection unmaps them only once no poller is inside, and no later one
// gets in (before, a poller holding an old list of connections read an
// unmapped ring and the process died with SIGSEGV).
func TestShmPollerRacesConnectionClose(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	pa := newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]urma.Completion, 8)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = a.sjfc.Poll(buf) // a sends nothing: this only drives the rings
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for i := range 30 {
		pb := newProvider(t, opts)
		b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
		target := b.importJetty(a)
		a.postRecv(uint64(i), 0, 64)
		mustOK(t, b.send(target, uint64(i), 0, 64, 0), "send")
		if c := pollN(t, b.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
			t.Fatalf("send %d: %+v", i, c)
		}
		if c := pollN(t, a.rjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess || c.UserCtx != uint64(i) {
			t.Fatalf("receive %d: %+v", i, c)
		}
		mustOK(t, pb.Close(), "close the peer")
	}
}

// Without Options.ShmAllowUID a device accepts peers of every user: the
// identity proof, not the user, says who a peer is.
func TestShmDefaultAllowsEveryUser(t *testing.T) {
	allow := newProvider(t, shmOpts(t)).devices[0].side.shm.allowUID
	for _, uid := range []uint32{0, uint32(os.Geteuid()), uint32(os.Geteuid()) + 1, 65534} {
		if !allow(uid) {
			t.Errorf("uid %d refused by default", uid)
		}
	}
}

// The longest socket path a unix socket takes (107 bytes) is accepted and
// serves peers; a byte more is refused with the reason.
func TestShmSocketPathLimit(t *testing.T) {
	base := shmOpts(t)
	// dirOf returns a directory under base.ShmDir whose sockets' paths are n bytes.
	dirOf := func(n int) string {
		pad := n - len(ShmSocketPath(base.ShmDir, urma.EID{})) - len("/")
		if pad < 1 {
			t.Fatalf("temporary directory %s too long for a %d-byte path", base.ShmDir, n)
		}
		return base.ShmDir + "/" + strings.Repeat("d", pad)
	}
	t.Run("longest", func(t *testing.T) {
		opts := base
		opts.ShmDir = dirOf(maxSocketPath)
		pa, pb := newProvider(t, opts), newProvider(t, opts)
		if n := len(pb.devices[0].side.shm.path); n != maxSocketPath {
			t.Fatalf("socket path is %d bytes, want %d", n, maxSocketPath)
		}
		a := newSide(t, pa, urma.JettyConfig{}, 64)
		b := newSide(t, pb, urma.JettyConfig{}, 64)
		target := a.importJetty(b)
		b.postRecv(1, 0, 64)
		mustOK(t, a.send(target, 1, 0, 64, 0), "send")
		if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
			t.Fatalf("send: %+v", c)
		}
	})
	t.Run("one byte more", func(t *testing.T) {
		opts := base
		opts.ShmDir = dirOf(maxSocketPath + 1)
		p, err := New(opts)
		if err == nil {
			_ = p.Close()
			t.Fatal("New succeeded")
		}
		if !strings.Contains(err.Error(), "shorter URMA_SHM_DIR") {
			t.Fatalf("error %q does not say to shorten URMA_SHM_DIR", err)
		}
	})
}

// A device given its key (DeviceSpec.ShmKey) has that key's EID, with or
// without the EID spelled out, and proves it to its peers.
func TestShmDeviceWithItsKey(t *testing.T) {
	key := testShmIdentity(t).key
	eid, err := ShmEIDOfKey(key)
	mustOK(t, err, "EID of the key")
	for _, spec := range []DeviceSpec{{ShmKey: key}, {ShmKey: key, EIDs: []urma.EID{eid}}} {
		opts := shmOpts(t)
		opts.Devices = []DeviceSpec{spec}
		b := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
		if got := b.jetty.ID().EID; got != eid {
			t.Fatalf("device EID %s, want the key's %s", got, eid)
		}
		a := newSide(t, newProvider(t, Options{ShmDir: opts.ShmDir, PeerTimeout: opts.PeerTimeout}), urma.JettyConfig{}, 64)
		roundTrip(t, a, a.importJetty(b), b)
	}
}

// The sockets a dialer greets for an EID: the one in the shm directory
// first, then those one level down, at most maxShmSocketsTried, never
// through a symbolic link, never a path too long to dial, never a file
// that is not a socket.
func TestShmSocketCandidates(t *testing.T) {
	dir := shmOpts(t).ShmDir
	e, err := ShmEID()
	mustOK(t, err, "EID")
	name := hex.EncodeToString(e[:]) + ".sock"
	listen := func(path string) {
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
		mustOK(t, err, "listen")
		t.Cleanup(func() { _ = ln.Close() })
	}
	got, err := ShmSocketCandidates(dir, e)
	if err != nil || len(got) != 0 {
		t.Fatalf("empty directory: %v, %v", got, err)
	}
	listen(filepath.Join(dir, name))
	for i := range maxShmSocketsTried + 4 {
		sub := filepath.Join(dir, fmt.Sprintf("pod%02d", i))
		mustOK(t, os.Mkdir(sub, 0o700), "subdirectory")
		listen(filepath.Join(sub, name))
	}
	plain := filepath.Join(dir, "plain")
	mustOK(t, os.Mkdir(plain, 0o700), "subdirectory")
	mustOK(t, os.WriteFile(filepath.Join(plain, name), nil, 0o600), "a file named after the EID")
	mustOK(t, os.Symlink(filepath.Join(dir, "pod00"), filepath.Join(dir, "link")), "symlink")
	got, err = ShmSocketCandidates(dir, e)
	mustOK(t, err, "candidates")
	if len(got) != maxShmSocketsTried || got[0] != filepath.Join(dir, name) {
		t.Fatalf("%d candidates starting %v, want %d starting with the top-level socket", len(got), got[:1], maxShmSocketsTried)
	}
	for _, p := range got {
		if strings.Contains(p, "/link/") || strings.Contains(p, "/plain/") {
			t.Errorf("candidate %s", p)
		}
	}
	if _, err := ShmSocketCandidates(filepath.Join(dir, "absent"), e); err != nil {
		t.Errorf("absent directory: %v", err)
	}
}

// A dialer whose peer listens in a subdirectory of the shm directory (its
// pod's) greets every socket named after the peer's EID and connects to
// the one that proves it, past sockets of other processes named the same.
func TestShmDialerSkipsSquatters(t *testing.T) {
	opts := shmOpts(t)
	bOpts := opts
	bOpts.ShmSocketDir = filepath.Join(opts.ShmDir, "pod-b")
	var sink logtest.Lines
	aOpts := opts
	aOpts.Logger = sink.Logger(nil)
	pa, pb := newProvider(t, aOpts), newProvider(t, bOpts)
	a := newSide(t, pa, urma.JettyConfig{}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	bEID := b.jetty.ID().EID
	squatter := testShmIdentity(t)
	// Squatters: one in a pod directory of its own that hangs up (greeted
	// or not, as the directory lists it before or after B's), one that
	// answers with a key of its own where A looks first.
	for _, pod := range []string{"pod-a0", ""} {
		sub := filepath.Join(opts.ShmDir, pod)
		if pod != "" {
			mustOK(t, os.Mkdir(sub, 0o700), "pod directory")
		}
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: ShmSocketPath(sub, bEID), Net: "unixpacket"})
		mustOK(t, err, "squat")
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				uc, err := ln.AcceptUnix()
				if err != nil {
					return
				}
				buf := make([]byte, shmMaxMsgLen+1)
				if _, fds, err := readShmMsg(uc, buf, shmMaxFds); err == nil && pod == "" {
					closeAll(fds)
					m := shmHelloMsg{typ: shmMsgHelloAck, src: bEID, dst: a.jetty.ID().EID, maxMsg: 1 << 20, bootID: pa.devices[0].side.shm.bootID, ringSize: MinShmRing}
					copy(m.pub[:], squatter.pub)
					_, _ = uc.Write(encodeShmHello(make([]byte, shmMaxMsgLen), &m))
					_, _ = uc.Read(buf) // until the dialer hangs up
				}
				_ = uc.Close()
			}
		}()
	}
	roundTrip(t, a, a.importJetty(b), b)
	if !sink.Contains("key's hash is not EID") {
		t.Fatalf("A did not log the squatter it skipped: %q", sink.All())
	}
}

// A dialer refuses an answer that is not a HELLO_ACK, however well formed,
// and says so.
func TestShmDialerRefusesHostileAnswers(t *testing.T) {
	opts := shmOpts(t)
	p := newProvider(t, opts)
	sd := p.devices[0].side
	cases := []struct {
		name  string
		reply func(fake urma.EID, h shmHelloMsg) []byte
		want  string
	}{
		{"a HELLO", func(fake urma.EID, h shmHelloMsg) []byte {
			m := shmHelloMsg{typ: shmMsgHello, src: fake, dst: h.src, maxMsg: 1 << 20, bootID: sd.shm.bootID, ringSize: MinShmRing}
			return encodeShmHello(make([]byte, shmMaxMsgLen), &m)
		}, "not a HELLO_ACK"},
		{"garbage", func(urma.EID, shmHelloMsg) []byte { return []byte("HTTP/1.1 400 Bad Request") }, "magic"},
		// A squatter: a socket named after the EID, answering with a key
		// of its own and a good signature under it.
		{"an ACK signed with another key", func(fake urma.EID, h shmHelloMsg) []byte {
			squatter := testShmIdentity(t)
			m := shmHelloMsg{typ: shmMsgHelloAck, src: fake, dst: h.src, maxMsg: 1 << 20, bootID: sd.shm.bootID, ringSize: MinShmRing}
			copy(m.pub[:], squatter.pub)
			ack := encodeShmHello(make([]byte, shmMaxMsgLen), &m)
			hello := encodeShmHello(make([]byte, shmMaxMsgLen), &h)
			copy(m.sig[:], ed25519.Sign(squatter.key, shmTranscript(shmSignAcceptor, hello, ack, 0)))
			return encodeShmHello(make([]byte, shmMaxMsgLen), &m)
		}, "its key's hash is not EID"},
		{"an ACK without a signature", func(fake urma.EID, h shmHelloMsg) []byte {
			m := shmHelloMsg{typ: shmMsgHelloAck, src: fake, dst: h.src, maxMsg: 1 << 20, bootID: sd.shm.bootID, ringSize: MinShmRing}
			return encodeShmHello(make([]byte, shmMaxMsgLen), &m)
		}, "does not prove the EID"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fake, err := ShmEID()
			mustOK(t, err, "EID")
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: ShmSocketPath(opts.ShmDir, fake), Net: "unixpacket"})
			mustOK(t, err, "listen")
			defer ln.Close()
			served := make(chan struct{})
			go func() {
				defer close(served)
				uc, err := ln.AcceptUnix()
				if err != nil {
					return
				}
				defer uc.Close()
				buf := make([]byte, shmMaxMsgLen+1)
				n, fds, err := readShmMsg(uc, buf, shmHelloFds)
				if err != nil {
					return
				}
				closeAll(fds)
				h, err := decodeShmHello(buf[:n])
				if err != nil {
					return
				}
				_, _ = uc.Write(c.reply(fake, h))
				_, _ = uc.Read(buf) // until the dialer hangs up
			}()
			a := newSide(t, p, urma.JettyConfig{}, 64)
			_, err = a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: fake, ID: 1}, urma.RC, 7)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("import through a hostile acceptor: %v, want an error that says %q", err, c.want)
			}
			<-served
		})
	}
}

// Once the peer maps a segment, a SEND from it goes by reference from
// pullMin bytes on, as many pieces as a work request takes; a smaller one is
// copied. Either way the bytes arrive whole.
func TestShmSendByReferenceSizes(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7, MaxSGE: MaxSGE}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	target := a.importJetty(b)
	seg, mem := shareableSegment(t, a, urma.AccessRead|urma.AccessWrite)
	// pieces are n SGEs of size bytes each, a gap between them.
	pieces := func(n, size int) []urma.SGE {
		sges := make([]urma.SGE, n)
		for i := range sges {
			sges[i] = urma.SGE{Segment: seg, Offset: uint64(i * 2 * size), Len: uint32(size)}
		}
		return sges
	}
	send := func(i int, sges []urma.SGE) {
		t.Helper()
		var want []byte
		for k, s := range sges {
			piece := mem.Bytes()[s.Offset : s.Offset+uint64(s.Len)]
			for x := range piece {
				piece[x] = byte(i*13 + k*7 + x)
			}
			want = append(want, piece...)
		}
		b.postRecv(uint64(i), 0, len(want))
		mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: uint64(i), SGEs: sges}), "send")
		if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
			t.Fatalf("send %d: %+v", i, c)
		}
		c := pollN(t, b.rjfc, 1, 10*time.Second)[0]
		if c.Status != urma.StatusSuccess || c.CompletionLen != uint32(len(want)) || !bytes.Equal(b.mem.Bytes()[:len(want)], want) {
			t.Fatalf("receive %d: %+v, bytes equal %v", i, c, bytes.Equal(b.mem.Bytes()[:len(want)], want))
		}
	}
	send(0, pieces(1, 2*pullMin)) // by copy; the peer is asked to map the segment
	eventually.Holds(t, "the peer's answer that it mapped the segment", 0, func() bool { return pa.readyShares() == 1 })
	cases := []struct {
		name  string
		sges  []urma.SGE
		byRef bool
	}{
		{"pullMin bytes", pieces(1, pullMin), true},
		{"a byte less", pieces(1, pullMin-1), false},
		{"MaxSGE pieces", pieces(MaxSGE, pullMin/MaxSGE), true},
	}
	for i, c := range cases {
		before := pa.pulls()
		send(i+1, c.sges)
		if got := pa.pulls() - before; got != map[bool]uint64{true: 1, false: 0}[c.byRef] {
			t.Errorf("%s: %d sends by reference, want by reference %v", c.name, got, c.byRef)
		}
	}
}

// The ring sizes at both bounds are accepted, and used; zero means
// DefaultShmRing; the next power of two past the largest is refused.
func TestShmRingSizeBounds(t *testing.T) {
	cases := []struct {
		size, want int // want 0: refused
	}{
		{MinShmRing, MinShmRing},
		{MaxShmRing, MaxShmRing},
		{0, DefaultShmRing},
		{MinShmRing / 2, 0},
		{2 * MaxShmRing, 0},
	}
	for _, c := range cases {
		opts := shmOpts(t)
		opts.ShmRingSize = c.size
		p, err := New(opts)
		if (err == nil) != (c.want != 0) {
			t.Errorf("ring of %d bytes: %v, want accepted %v", c.size, err, c.want != 0)
		}
		if err != nil {
			continue
		}
		if got := p.devices[0].side.shm.ringSize; c.want != 0 && got != c.want {
			t.Errorf("ShmRingSize %d: the device's rings are %d bytes, want %d", c.size, got, c.want)
		}
		mustOK(t, p.Close(), "close")
	}
}

// ringMappings counts this process's mappings of shm rings, its own and
// its peers'.
func ringMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	mustOK(t, err, "read mappings")
	return strings.Count(string(b), "urma-shm-ring")
}

// A connection that ends unmaps both rings, this side's and the peer's.
func TestShmClosedConnectionUnmapsRings(t *testing.T) {
	noLeaks(t)
	before := ringMappings(t)
	opts := shmOpts(t)
	pa, err := New(opts)
	mustOK(t, err, "new")
	pb, err := New(opts)
	mustOK(t, err, "new")
	func() {
		a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
		b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
		target, err := a.ctx.ImportJetty(t.Context(), b.jetty.ID(), urma.RC, 7)
		mustOK(t, err, "import")
		defer target.Close()
		b.postRecv(1, 0, 64)
		mustOK(t, a.send(target, 1, 0, 64, 0), "send")
		pollN(t, a.sjfc, 1, 10*time.Second)
		if n := ringMappings(t) - before; n < 4 {
			t.Fatalf("%d ring mappings while connected, want both rings mapped on both sides", n)
		}
	}()
	mustOK(t, pa.Close(), "close")
	mustOK(t, pb.Close(), "close")
	eventually.Holds(t, "the rings to be unmapped", 0, func() bool { return ringMappings(t) == before })
}

// openFds counts this process's open descriptors.
func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	mustOK(t, err, "list descriptors")
	return len(ents)
}

// ringFds counts this process's open descriptors of shm rings.
func ringFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	mustOK(t, err, "list descriptors")
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.Contains(target, "urma-shm-ring") {
			n++
		}
	}
	return n
}

// Connections over shm, refused rendezvous and hostile HELLOs leave no
// descriptor open and no ring mapped once they are over, on either side.
// Each case runs once first, so that what the runtime opens once (its
// poller) is in the baseline.
func TestShmNoDescriptorOrRingLeaks(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, opts Options)
	}{
		{"connection", func(t *testing.T, opts Options) {
			pa, pb := newProvider(t, opts), newProvider(t, opts)
			a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
			b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
			target := a.importJetty(b)
			b.postRecv(1, 0, 64)
			mustOK(t, a.send(target, 1, 0, 64, 0), "send")
			pollN(t, a.sjfc, 1, 10*time.Second)
			// Both rings are mapped on both sides; the read-only descriptor
			// each side passed was closed once sent.
			if n := ringFds(t); n != 0 {
				t.Errorf("%d descriptors of rings open while connected, want none", n)
			}
		}},
		{"refused by the acceptor", func(t *testing.T, opts Options) {
			strict := opts
			strict.ShmAllowUID = func(uint32) bool { return false }
			b := newSide(t, newProvider(t, strict), urma.JettyConfig{}, 64)
			a := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
			if _, err := a.ctx.ImportJetty(t.Context(), b.jetty.ID(), urma.RC, 7); err == nil {
				t.Fatal("import through a refusing acceptor succeeded")
			}
		}},
		{"refused by the dialer", func(t *testing.T, opts Options) {
			b := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
			strict := opts
			strict.ShmAllowUID = func(uint32) bool { return false }
			a := newSide(t, newProvider(t, strict), urma.JettyConfig{}, 64)
			if _, err := a.ctx.ImportJetty(t.Context(), b.jetty.ID(), urma.RC, 7); err == nil {
				t.Fatal("import from a refused acceptor succeeded")
			}
		}},
		{"pipes for eventfds", func(t *testing.T, opts Options) {
			sd := newProvider(t, opts).devices[0].side
			nc, err := net.Dial("unixpacket", sd.shm.path)
			mustOK(t, err, "dial")
			defer nc.Close()
			e, err := shmring.NewEnds(MinShmRing)
			mustOK(t, err, "ends")
			defer e.Release()
			var pipe [2]int
			mustOK(t, unix.Pipe2(pipe[:], unix.O_CLOEXEC), "pipe")
			defer closeAll(pipe[:])
			d := shmGreetAs(t, nc.(*net.UnixConn), testShmIdentity(t), sd.eid, sd.shm.bootID, MinShmRing)
			status, fds, err := d.prove(d.sign(), []int{e.Fds()[0], pipe[0], pipe[1]})
			closeAll(fds)
			if err == nil && status != helloRefused {
				t.Fatalf("READY %d: want a refusal", status)
			}
			_, _ = nc.Read(make([]byte, 16)) // until the device hangs up
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := shmOpts(t)
			t.Run("warm-up", func(t *testing.T) { c.run(t, opts) })
			fds, rings := openFds(t), ringMappings(t)
			t.Run("counted", func(t *testing.T) { c.run(t, opts) })
			eventually.Holds(t, "descriptors and rings to be released", 0, func() bool {
				return openFds(t) == fds && ringMappings(t) == rings
			})
		})
	}
}

// A sender that gives up on a send that met "receiver not ready" cancels
// the RNR block the receiver kept for it, so the receiver's blocks (at most
// maxBlocked a connection) do not pile up with senders that come and go.
func TestShmCancelDropsRNRBlock(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 0}, 64) // no retry: the first RNR fails the send
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	mustOK(t, a.send(target, 1, 0, 64, 0), "send") // b posted no receive
	if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusRNRRetryCntExc {
		t.Fatalf("send to a receiver with nothing posted: %+v, want RNR_RETRY_CNT_EXC", c)
	}
	eventually.Holds(t, "the receiver to drop the cancelled block", 0, func() bool { return pb.blocks() == 0 })
}

// Only Polls of a JFC without a JFCE (a polling application) count towards
// the rings' polling mode; the Polls that drain a JFC after its event do not,
// so an application in event mode keeps its reader goroutines sleeping
// announced, woken by every message.
func TestShmOnlyPollingModeJFCsCount(t *testing.T) {
	opts := shmOpts(t)
	p := newProvider(t, opts)
	a := newSide(t, p, urma.JettyConfig{}, 64)
	a.importJetty(newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)) // a connection for Polls to drive
	ctx := a.ctx
	jfce, err := ctx.CreateJFCE()
	mustOK(t, err, "create JFCE")
	defer jfce.Close()
	evented, err := ctx.CreateJFC(urma.JFCConfig{Depth: 16, JFCE: jfce})
	mustOK(t, err, "create JFC with a JFCE")
	defer evented.Close()
	polled, err := ctx.CreateJFC(urma.JFCConfig{Depth: 16})
	mustOK(t, err, "create JFC")
	defer polled.Close()
	polls := &p.devices[0].side.polls
	buf := make([]urma.Completion, 4)
	for _, c := range []struct {
		name string
		q    urma.JFC
		want uint64
	}{{"with a JFCE", evented, 0}, {"without", polled, 3}} {
		before := polls.Load()
		for range 3 {
			_, err := c.q.Poll(buf)
			mustOK(t, err, "poll")
		}
		if got := polls.Load() - before; got != c.want {
			t.Errorf("3 Polls of a JFC %s counted %d polling-mode Polls, want %d", c.name, got, c.want)
		}
	}
}

// A Poll stops reading the rings once it has read for its budget and
// leaves the rest to the reader goroutine. With the budget at its extreme
// (one frame per Poll), a stream that both a poller and the reader
// goroutine take frames from arrives whole and in order.
func TestShmPollerLeavesFramesToTheReader(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	for _, d := range pb.devices {
		d.side.shm.pollerBudget = -1
	}
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	ta := a.importJetty(b)
	for _, c := range pb.conns() {
		if got := c.io.(*shmIO).pollerBudget; got != -1 {
			t.Fatalf("connection's poller budget %v, want the device's -1", got)
		}
	}
	// Each payload has a pattern of its own.
	const msgs, size = 48, 8 << 10
	for i := 0; i < msgs; i++ {
		b.postRecv(uint64(i), i*size, size)
		chunk := a.mem.Bytes()[i*size : (i+1)*size]
		for k := range chunk {
			chunk[k] = byte(i + k)
		}
	}
	for i := 0; i < msgs; i++ {
		mustOK(t, a.send(ta, uint64(i), i*size, size, 0), "send")
	}
	got := pollUntil(t, b.rjfc, msgs)
	for i, c := range got {
		if c.Status != urma.StatusSuccess || c.UserCtx != uint64(i) || c.CompletionLen != size {
			t.Fatalf("completion %d: %+v, want receive %d of %d bytes", i, c, i, size)
		}
		if !bytes.Equal(b.mem.Bytes()[i*size:(i+1)*size], a.mem.Bytes()[i*size:(i+1)*size]) {
			t.Fatalf("message %d arrived changed", i)
		}
	}
	pollUntil(t, a.sjfc, msgs)
}

// A Poll of a JFC without a JFCE reads the rings itself (conn.drive). A
// large message that streams through the ring into a receive of two SGEs
// makes the poller start the second SGE's copy with the ring empty, the
// writer still copying: the poller must wait for the rest of the frame,
// never sleep on the data eventfd, where only the reader goroutine sleeps
// (its park took the wake-up and the connection hung for good).
func TestShmPollerNeverSleepsOnDataEventfd(t *testing.T) {
	opts := shmOpts(t)
	opts.ShmRingSize = MinShmRing
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7, SQDepth: 64}, 256)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	ta := a.importJetty(b)
	cb := pb.conns()[0]
	const (
		size   = 256 << 10 // four rings' worth: it streams through the ring
		half   = size / 2
		n      = 200
		window = 4
	)
	recv := func(i int) error {
		return b.jfr.PostRecv(&urma.RecvWR{UserCtx: uint64(i), SGEs: []urma.SGE{
			{Segment: b.seg, Len: half}, {Segment: b.seg, Offset: half, Len: half}}})
	}
	for i := range window {
		mustOK(t, recv(i), "post receive")
	}
	stop := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		cs := make([]urma.Completion, 64)
		for i := 0; i < n; {
			select {
			case <-stop:
				return
			default:
			}
			if a.send(ta, uint64(i), 0, size, 0) == nil {
				i++
			} else {
				_, _ = a.sjfc.Poll(cs) // the send queue is full
			}
		}
	}()
	defer func() { close(stop); <-sent }()
	// The receiving loop runs aside: a poller asleep on the eventfd never
	// comes back to see its deadline (closing the provider wakes it).
	progress := make(chan int, n)
	failed := make(chan string, 1)
	stopPoll, pollDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pollDone)
		cs := make([]urma.Completion, window)
		for got := 0; got < n; {
			select {
			case <-stopPoll:
				return
			default:
			}
			k, err := b.rjfc.Poll(cs) // drives the rings: no JFCE
			if err != nil {
				failed <- fmt.Sprintf("poll: %v", err)
				return
			}
			for _, c := range cs[:k] {
				if c.Status != urma.StatusSuccess || c.UserCtx != uint64(got) || c.CompletionLen != size {
					failed <- fmt.Sprintf("receive %d: %+v", got, c)
					return
				}
				got++
				if got+window-1 < n {
					if err := recv(got + window - 1); err != nil {
						failed <- fmt.Sprintf("post receive: %v", err)
						return
					}
				}
				progress <- got
			}
		}
	}()
	for got := 0; got < n; {
		select {
		case got = <-progress:
		case msg := <-failed:
			t.Fatal(msg)
		case <-time.After(10 * time.Second):
			t.Errorf("the receiver is stuck after %d of %d messages", got, n)
			// Free the poller asleep on the eventfd (the reader goroutine
			// may take each wake-up), so that the cleanups can close its
			// JFR.
			close(stopPoll)
			cb.fail(errors.New("test gives up"))
			for {
				cb.io.(*shmIO).WakeSelf()
				select {
				case <-pollDone:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
	}
}

// The peer creates the eventfds it passes, and their flags belong to an
// open file description it shares: it can make its data eventfd blocking,
// at the handshake or later, and fill its counter (0xfffffffffffffffe).
// A wake-up, write(2) of 1, would then block forever on whatever goroutine
// writes (here ImportJetty, whose context cannot interrupt a syscall; as
// well PostSend or Provider.Close). The device fails that connection
// instead, and closes cleanly.
func TestShmHostileBlockingEventfd(t *testing.T) {
	cases := []struct {
		name      string
		afterJoin bool   // blocking only once the device has joined the eventfd
		log       string // why the device drops the connection
	}{
		{"blocking at the handshake", false, "counter is full"},
		{"made blocking after the handshake", true, "made its eventfd blocking"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, sink := loggedProvider(t, shmOpts(t))
			sd := p.devices[0].side
			nc, err := net.Dial("unixpacket", sd.shm.path)
			mustOK(t, err, "dial")
			defer nc.Close()
			ends, err := shmring.NewEnds(MinShmRing)
			mustOK(t, err, "ends")
			defer ends.Release()
			hostile := func() {
				mustOK(t, unix.SetNonblock(ends.Fds()[1], false), "make the data eventfd blocking")
				var full [8]byte
				binary.NativeEndian.PutUint64(full[:], 0xfffffffffffffffe)
				_, err := unix.Write(ends.Fds()[1], full[:])
				mustOK(t, err, "fill the counter")
			}
			if !c.afterJoin {
				hostile()
			}
			me, fds, _ := shmHello(t, nc, ends, sd)
			closeAll(fds)
			if c.afterJoin {
				hostile()
			}
			ends.Word(shmring.WordReaderSleeps).Store(1) // "my reader sleeps: wake me"

			s := newSide(t, p, urma.JettyConfig{}, 64)
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err := s.ctx.ImportJetty(ctx, urma.JettyID{EID: me, ID: 1}, urma.RC, 7)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("ImportJetty from a peer that never answers succeeded")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("ImportJetty is stuck: write(2) to the peer's blocking eventfd")
			}
			eventually.Holds(t, "the device to drop the connection", 0, func() bool { return sink.Contains(c.log) })
		})
	}
}

// roundTrip sends one message from a to b, its import target, and checks
// that it arrives: the connection between the two devices works.
func roundTrip(t *testing.T, a *side, target urma.RemoteJetty, b *side) {
	t.Helper()
	b.postRecv(1000, 0, 64)
	mustOK(t, a.send(target, 1, 0, 64, 0), "send")
	if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("round trip, send: %+v", c)
	}
	if c := pollN(t, b.rjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("round trip, receive: %+v", c)
	}
}

// alive fails the test if the connection c died.
func alive(t *testing.T, c *conn) {
	t.Helper()
	select {
	case <-c.done:
		t.Fatalf("the connection died: %v", c.deathCause())
	default:
	}
}

// shareableSegment registers 1 MiB of memory another process can map, with
// access, on s's context; it is unregistered and freed at cleanup.
func shareableSegment(t *testing.T, s *side, access urma.Access) (urma.Segment, *urma.Memory) {
	t.Helper()
	mem, err := urma.AllocMemory(1 << 20)
	mustOK(t, err, "alloc")
	t.Cleanup(func() { _ = mem.Free() })
	seg, err := s.ctx.RegisterSegment(mem, urma.SegmentConfig{Access: access, TokenPolicy: urma.TokenPlainText, Token: 99})
	mustOK(t, err, "register shareable segment")
	t.Cleanup(func() { _ = seg.Close() })
	return seg, mem
}

// loggedShmPair is two providers on the shm fabric, the second logging
// into sink, a side on each and a's import of b's jetty.
func loggedShmPair(t *testing.T) (pa, pb *Provider, sink *logtest.Lines, a, b *side, target urma.RemoteJetty) {
	t.Helper()
	opts := shmOpts(t)
	pa = newProvider(t, opts)
	pb, sink = loggedProvider(t, opts)
	a = newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b = newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	return pa, pb, sink, a, b, a.importJetty(b)
}

func TestShmUnmapOvertakesSendRef(t *testing.T) {
	pa, pb, sink, a, b, target := loggedShmPair(t)
	// Another jetty, made now: one made after a.jetty closes could take
	// its number, and a late answer to a.jetty's send with it.
	a2 := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	target2 := a2.importJetty(b)
	seg, _ := shareableSegment(t, a, urma.AccessRead)
	send := func(what string) {
		t.Helper()
		mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target,
			SGEs: []urma.SGE{{Segment: seg, Len: 64 << 10}}}), what)
	}
	b.postRecv(1, 0, 64<<10)
	send("send by copy, sharing the segment")
	if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("send: %+v", c)
	}
	pollN(t, b.rjfc, 1, 10*time.Second)
	eventually.Holds(t, "the share to be ready", 0, func() bool { return pa.readyShares() == 1 })

	cb := pb.conns()[0]
	cb.readMu.Lock() // the receiver's reader is busy (descheduled, copying...)
	b.postRecv(2, 0, 64<<10)
	before := pa.pulls()
	send("send by reference")
	eventually.Holds(t, "the SEND_REF to be written", 0, func() bool { return pa.pulls() == before+1 })
	mustOK(t, a.jetty.Close(), "close the jetty")
	mustOK(t, seg.Close(), "unregister") // no outstanding WR holds it any more
	eventually.Holds(t, "SEG_UNMAP to be handled", 0, func() bool { return pb.mappedSegments() == 0 })
	cb.readMu.Unlock()

	roundTrip(t, a2, target2, b) // behind the SEND_REF in the ring
	alive(t, cb)
	if sink.Contains("broke the protocol") {
		t.Fatalf("the receiver calls it a protocol violation: %q", sink.All())
	}
}

// The sender may unregister a segment before the receiver's answer to its
// SEG_MAP comes back, so SEG_UNMAP may name a handle the receiver refused
// to map (it maps maxPeerSegments already, or the descriptor was not
// acceptable); a repeated SEG_UNMAP is as harmless. The receiver ignores
// SEG_UNMAP of any handle it was announced; only one never announced
// breaks the protocol.
func TestShmUnmapOfRefusedOrRetiredHandle(t *testing.T) {
	unsealed := func(t *testing.T) int {
		fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
		mustOK(t, err, "memfd")
		mustOK(t, unix.Ftruncate(fd, 4096), "size memfd")
		return fd
	}
	sealed := readOnlyMemfd
	type msg struct {
		typ    uint8
		handle uint32
		fd     func(*testing.T) int // SEG_MAP's segment
	}
	cases := []struct {
		name  string
		msgs  []msg
		fatal string // what the receiver logs when it drops the connection
	}{
		{"SEG_UNMAP of a refused handle", []msg{{shmMsgSegMap, 1000, unsealed}, {typ: shmMsgSegUnmap, handle: 1000}}, ""},
		{"SEG_UNMAP twice", []msg{{shmMsgSegMap, 1000, sealed}, {typ: shmMsgSegUnmap, handle: 1000}, {typ: shmMsgSegUnmap, handle: 1000}}, ""},
		{"SEG_UNMAP of an older handle", []msg{{shmMsgSegMap, 1000, sealed}, {typ: shmMsgSegUnmap, handle: 999}}, ""},
		{"SEG_UNMAP of a handle never announced", []msg{{shmMsgSegMap, 1000, sealed}, {typ: shmMsgSegUnmap, handle: 1001}}, "never shared"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pa, pb, sink, a, b, target := loggedShmPair(t)
			sa, cb := pa.conns()[0].io.(*shmIO), pb.conns()[0]
			// Written straight on the sender's unix socket: the sender
			// ignores the answers, which name no share of its own. A last
			// SEG_MAP marks the end, except where the receiver hangs up
			// (a message sent after it would meet a closed socket).
			msgs := c.msgs
			if c.fatal == "" {
				msgs = append(msgs, msg{shmMsgSegMap, 2000, sealed})
			}
			for _, m := range msgs {
				var rights []byte
				if m.fd != nil {
					fd := m.fd(t)
					defer unix.Close(fd)
					rights = unix.UnixRights(fd)
				}
				sm := shmSegMsg{typ: m.typ, handle: m.handle}
				if m.typ == shmMsgSegMap {
					sm.length = 4096
				}
				b := encodeShmSeg(make([]byte, shmSegMsgLen), &sm)
				mustOK(t, unix.Sendmsg(sa.ctlFd, b, rights, nil, unix.MSG_NOSIGNAL), "send control message")
			}
			if c.fatal != "" {
				eventually.Holds(t, "the receiver to drop the connection", 0, func() bool { return sink.Contains(c.fatal) })
				return
			}
			// The last SEG_MAP, handled in order, is mapped after the rest.
			eventually.Holds(t, "the messages to be handled", 0, func() bool {
				select {
				case <-cb.done:
					return true // alive says why
				default:
				}
				if pb.mappedSegments() > 0 {
					cb.io.(*shmIO).pull.mapMu.RLock()
					defer cb.io.(*shmIO).pull.mapMu.RUnlock()
					_, ok := cb.io.(*shmIO).pull.mapped[2000]
					return ok
				}
				return false
			})
			roundTrip(t, a, target, b)
			alive(t, cb)
		})
	}
}
