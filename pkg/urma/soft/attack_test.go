package soft

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"io"
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

// The attacks on the shm fabric that a process of another pod on the node
// can try: it reaches the shm directory, sees every device's EID in the
// names of their sockets, and can read every public key a device sends.

const (
	attackSocketEnv = "URMA_ATTACK_SOCKET" // the victim device's socket
	attackVictimEnv = "URMA_ATTACK_VICTIM" // the victim device's EID
	attackClaimEnv  = "URMA_ATTACK_CLAIM"  // the EID the attacker claims
	attackPubEnv    = "URMA_ATTACK_PUB"    // the claimed device's public key, in hex
	takeoverSecret  = "tenant-B secret meant for A only"
)

// TestShmTakeoverAttacker is the attacking process of
// TestShmTakeoverAttackFails: it dials B's socket claiming A's EID, with
// A's public key and the best signature it can make, and if B takes it,
// reads what B writes into the ring B shares with it.
func TestShmTakeoverAttacker(t *testing.T) {
	if !isChild("takeover-attacker") {
		t.Skip("helper process for TestShmTakeoverAttackFails")
	}
	victim, err := urma.ParseEID(os.Getenv(attackVictimEnv))
	mustOK(t, err, "victim EID")
	claim, err := urma.ParseEID(os.Getenv(attackClaimEnv))
	mustOK(t, err, "claimed EID")
	pub, err := hex.DecodeString(os.Getenv(attackPubEnv))
	mustOK(t, err, "claimed key")
	ring, why := claimShmIdentity(t, os.Getenv(attackSocketEnv), victim, claim, pub)
	if ring == nil {
		fmt.Printf("HANDSHAKE refused: %s\n", strings.ReplaceAll(why, "\n", " "))
	} else {
		fmt.Println("HANDSHAKE taken")
	}
	parent := newParentLines()
	parent.expect(t, "SCAN")
	if ring != nil && bytes.Contains(ring, []byte(takeoverSecret)) {
		fmt.Printf("SCANNED leaked %s\n", strings.ReplaceAll(takeoverSecret, " ", "_"))
	} else {
		fmt.Println("SCANNED clean")
	}
	parent.waitEOF()
}

// claimShmIdentity handshakes with the device at path as the device claim,
// whose public key is pub, and returns the device's ring mapped, or nil
// and why it was refused. The connection stays open for the process's
// life.
func claimShmIdentity(t *testing.T, path string, victim, claim urma.EID, pub []byte) ([]byte, string) {
	nc, err := net.Dial("unixpacket", path)
	mustOK(t, err, "dial the victim")
	boot, err := BootID()
	mustOK(t, err, "boot id")
	mine := testShmIdentity(t)
	h := shmHelloMsg{typ: shmMsgHello, session: 1, src: claim, dst: victim, maxMsg: 1 << 20, bootID: boot, ringSize: MinShmRing, pid: uint32(os.Getpid())}
	copy(h.pub[:], pub)
	d := shmGreetWith(t, nc.(*net.UnixConn), mine, h)
	if d.ack.status != helloOK {
		return nil, fmt.Sprintf("HELLO_ACK status %d", d.ack.status)
	}
	// The attacker has no key of A's: it signs with its own.
	ends, err := shmring.NewEnds(MinShmRing)
	mustOK(t, err, "ring")
	status, fds, err := d.prove(ed25519.Sign(mine.key, shmTranscript(shmSignDialer, d.helloMsg, d.ackMsg, d.ino)), ends.Fds())
	if err != nil || status != helloOK {
		return nil, fmt.Sprintf("READY status %d, %v", status, err)
	}
	b, err := unix.Mmap(fds[0], 0, shmring.CtlSize+int(d.ack.ringSize), unix.PROT_READ, unix.MAP_SHARED)
	mustOK(t, err, "map the victim's ring")
	return b, ""
}

// Attack 1: a process dials device B's socket claiming device A's EID
// while A and B talk. B must not take it for A: its next message for A
// reaches A, and the attacker reads none of it.
func TestShmTakeoverAttackFails(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an attacking process")
	}
	opts := shmOpts(t)
	pa, pb := newProvider(t, opts), newProvider(t, opts)
	a := newSide(t, pa, urma.JettyConfig{}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	// A dials B: B's side of the connection is not its own dial, the kind
	// a peer's new dial replaces.
	toB := a.importJetty(b)
	toA := b.importJetty(a)
	b.postRecv(1, 0, 64)
	mustOK(t, a.send(toB, 1, 0, 64, 0), "A to B")
	pollN(t, a.sjfc, 1, 10*time.Second)
	pollN(t, b.rjfc, 1, 10*time.Second)

	aEID, bEID := a.jetty.ID().EID, b.jetty.ID().EID
	attacker := startChild(t, "TestShmTakeoverAttacker", "takeover-attacker",
		attackSocketEnv+"="+ShmSocketPath(opts.ShmDir, bEID), attackVictimEnv+"="+bEID.String(),
		attackClaimEnv+"="+aEID.String(), attackPubEnv+"="+hex.EncodeToString(pa.devices[0].side.shm.id.pub))
	got := attacker.expect("HANDSHAKE", childStartTimeout)
	t.Logf("attacker's handshake: %s", strings.Join(got, " "))

	a.postRecv(1, 0, 64)
	copy(b.mem.Bytes()[4096:], takeoverSecret)
	mustOK(t, b.send(toA, 2, 4096, len(takeoverSecret), 0), "B to A")
	rc, recvErr := pollFor(a.rjfc, 1, 5*time.Second)
	attacker.say("SCAN")
	scan := attacker.expect("SCANNED", 10*time.Second)
	t.Logf("attacker's scan of the ring B shares with it: %s", strings.Join(scan, " "))
	if got[0] != "refused:" {
		t.Errorf("B took the attacker's connection as A's")
	}
	if scan[0] != "clean" {
		t.Errorf("the attacker read B's message for A: %s", strings.Join(scan[1:], " "))
	}
	if recvErr != nil {
		t.Fatalf("A did not receive B's message: %v", recvErr)
	}
	if msg := string(a.mem.Bytes()[:rc[0].CompletionLen]); rc[0].Status != urma.StatusSuccess || msg != takeoverSecret {
		t.Fatalf("A received %q (%v), want %q", msg, rc[0].Status, takeoverSecret)
	}
}

// relayShm accepts on ln and relays every message, descriptors and all,
// between each connection and a connection of its own to target: a
// process in the middle, which a dialer that greets ln would reach
// instead of target. It counts the messages that carried descriptors
// towards target.
func relayShm(t *testing.T, ln *net.UnixListener, target string) (fdsRelayed func() int) {
	var mu sync.Mutex
	n := 0
	pump := func(from, to *net.UnixConn, count bool) {
		buf := make([]byte, shmMaxMsgLen+1)
		for {
			k, fds, err := readShmMsg(from, buf, shmMaxFds)
			if err != nil {
				_ = to.Close()
				return
			}
			var oob []byte
			if len(fds) > 0 {
				oob = unix.UnixRights(fds...)
				if count {
					mu.Lock()
					n++
					mu.Unlock()
				}
			}
			_, _, err = to.WriteMsgUnix(buf[:k], oob, nil)
			closeAll(fds)
			if err != nil {
				_ = from.Close()
				return
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			in, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			out, err := net.Dial("unixpacket", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			go pump(in, out.(*net.UnixConn), true)
			go pump(out.(*net.UnixConn), in, false)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// A process that names a socket after B's EID where A looks first and
// relays between A and B, descriptors and all, sits where neither sees it
// but both would share their rings with it. Each side's signature covers
// the socket it is connected to, so the relayed handshake fails: A skips
// the relay's socket for B's own, and nothing of A's reaches B through it.
func TestShmRelayIsRefused(t *testing.T) {
	opts := shmOpts(t)
	var sink logtest.Lines
	bOpts := opts
	bOpts.ShmSocketDir = filepath.Join(opts.ShmDir, "pod-b")
	bOpts.Logger = sink.Logger(nil)
	pa, pb := newProvider(t, opts), newProvider(t, bOpts)
	a := newSide(t, pa, urma.JettyConfig{}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	bEID := b.jetty.ID().EID
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: ShmSocketPath(opts.ShmDir, bEID), Net: "unixpacket"})
	mustOK(t, err, "listen where A looks first")
	relayed := relayShm(t, ln, pb.devices[0].side.shm.path)

	toB := a.importJetty(b)
	b.postRecv(1, 0, 64)
	copy(a.mem.Bytes(), takeoverSecret)
	mustOK(t, a.send(toB, 1, 0, len(takeoverSecret), 0), "A to B")
	if c := pollN(t, b.rjfc, 1, 10*time.Second)[0]; string(b.mem.Bytes()[:c.CompletionLen]) != takeoverSecret {
		t.Fatalf("B received %q", b.mem.Bytes()[:c.CompletionLen])
	}
	if n := relayed(); n != 0 {
		t.Fatalf("the relay passed %d messages with descriptors from A to B", n)
	}
	eventually.Holds(t, "B to log the relay's unfinished handshake", 0, func() bool { return sink.Contains("bad PROOF") })
	if c := pb.conns(); len(c) != 1 || c[0].peerEID != a.jetty.ID().EID {
		t.Fatalf("B holds %d connections, want the one with A", len(c))
	}
}

// sparseSealedMemfd is a memfd of size bytes that holds no page: it costs
// its maker nothing, whatever its size.
func sparseSealedMemfd(t *testing.T, size int64) int {
	t.Helper()
	fd, err := unix.MemfdCreate("sparse", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	mustOK(t, err, "memfd")
	mustOK(t, unix.Ftruncate(fd, size), "size memfd")
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	mustOK(t, err, "seal")
	return fd
}

// Attack 3: a peer shares segments of sparse memfds, terabytes that cost
// it nothing, and the receiver maps them all until its address space is
// gone and its next allocation kills it. The receiver maps at most
// Options.MaxMappedPerConn of one peer's and Options.MaxMappedBytes of all
// peers', refuses the rest (the peer would send from them by copy) and
// logs the bound that refused them.
func TestShmMappingAttackIsBounded(t *testing.T) {
	const segment = 64 << 30 // 64 GiB each, 64 of them: 4 TiB
	cases := []struct {
		name   string
		opts   func(o *Options)
		peers  int
		most   uint64 // the most the receiver may map
		reason string
	}{
		{"one peer, the defaults", func(*Options) {}, 1, DefaultMaxMappedPerConn, "Options.MaxMappedPerConn"},
		{"two peers, a process bound", func(o *Options) { o.MaxMappedPerConn, o.MaxMappedBytes = 96<<30, 100<<30 }, 2, 100 << 30, "Options.MaxMappedBytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := shmOpts(t)
			c.opts(&opts)
			p, sink := loggedProvider(t, opts)
			var fakes []*shmIO
			for range c.peers {
				f, _ := fakeShmPeer(t, p.devices[0].side)
				fakes = append(fakes, f)
			}
			eventually.Holds(t, "the receiver to adopt the peers", 0, func() bool { return len(p.conns()) == c.peers })
			const each = 64
			for _, f := range fakes {
				for h := uint32(1); h <= each; h++ {
					fd := sparseSealedMemfd(t, segment)
					m := encodeShmSeg(make([]byte, shmSegMsgLen), &shmSegMsg{typ: shmMsgSegMap, handle: h, length: segment})
					err := unix.Sendmsg(f.ctlFd, m, unix.UnixRights(fd), nil, unix.MSG_NOSIGNAL)
					_ = unix.Close(fd)
					mustOK(t, err, "SEG_MAP")
				}
			}
			eventually.Holds(t, "the receiver to answer every SEG_MAP", 0, func() bool {
				for _, c := range p.conns() {
					s := c.io.(*shmIO)
					s.pull.mapMu.RLock()
					done := s.pull.announced >= each+1
					s.pull.mapMu.RUnlock()
					if !done {
						return false
					}
				}
				return true
			})
			got := peerMappedBytes(p)
			t.Logf("the receiver maps %d GiB of its peers' segments", got>>30)
			if got > c.most {
				t.Fatalf("the receiver maps %d GiB of %d GiB its peers shared, more than %d GiB", got>>30, uint64(c.peers*each*segment)>>30, c.most>>30)
			}
			if !sink.Contains(c.reason) {
				t.Fatalf("no log line names %s", c.reason)
			}
		})
	}
}

// Attack 4: a peer dials a device over and over under made-up EIDs (fresh
// keys cost nothing), each connection with the smallest ring. The device
// pays for its own ring of each connection, charged to its memory limit:
// never more than the dialer pays for its own.
func TestShmAmplificationAttackIsBounded(t *testing.T) {
	p := newProvider(t, shmOpts(t)) // the default ring, 2 MiB
	sd := p.devices[0].side
	const links = 64
	for range links {
		nc, err := net.Dial("unixpacket", sd.shm.path)
		mustOK(t, err, "dial")
		ends, err := shmring.NewEnds(MinShmRing)
		mustOK(t, err, "the attacker's ring")
		_, fds, _ := shmHello(t, nc, ends, sd)
		closeAll(fds)
		t.Cleanup(func() { _ = nc.Close(); ends.Release() })
	}
	eventually.Holds(t, "the device to adopt every connection", 0, func() bool { return len(p.conns()) == links })
	var victim uint64
	for _, c := range p.conns() {
		victim += uint64(shmring.CtlSize + c.io.(*shmIO).Size())
	}
	attacker := uint64(links * (shmring.CtlSize + MinShmRing))
	t.Logf("%d connections cost the device %d KiB of rings, the attacker %d KiB", links, victim>>10, attacker>>10)
	if victim > attacker {
		t.Fatalf("the device pays %d KiB of rings for %d connections the attacker paid %d KiB for", victim>>10, links, attacker>>10)
	}
}

// The socket fabric's attack: a socket device's EID names the address it
// listens at, and a device took any dialer for the EID its HELLO claims.
// A process that reaches B's port claimed the EID of a device on another
// host; B's import of that device's jetty and its message went to the
// claimant. B refuses a dialer whose connection does not come from the
// address its EID names, so B's import reaches (here: fails to reach) the
// real device, and the claimant reads nothing.
func TestSocketClaimOfAnotherHostsEIDFails(t *testing.T) {
	p := newProvider(t, socketOpts())
	b := newSide(t, p, urma.JettyConfig{}, 64)
	claimed, err := SocketEID(netip.MustParseAddrPort("192.0.2.77:4000")) // a device on another host
	mustOK(t, err, "EID")
	nc, err := net.Dial("tcp", p.addr()) // from 127.0.0.1
	mustOK(t, err, "dial B")
	defer nc.Close()
	var hb [4 + helloLen]byte
	_, err = nc.Write(encodeHello(hb[:], &hello{session: 1, src: claimed, dst: b.jetty.ID().EID, maxMsg: 1 << 20}))
	mustOK(t, err, "HELLO")
	br := bufio.NewReader(nc)
	var ab [4 + helloAckLen]byte
	_, err = io.ReadFull(br, ab[:])
	mustOK(t, err, "HELLO_ACK")
	ack, err := decodeHelloAck(ab[:])
	mustOK(t, err, "decode HELLO_ACK")
	leaked := make(chan int, 1)
	go func() { // the claimant answers B's import and reads B's message
		var ib [4 + importJettyLen]byte
		if _, err := io.ReadFull(br, ib[:]); err != nil {
			leaked <- 0
			return
		}
		r, _ := decodeImportJetty(ib[4:])
		var rb [4 + importRespLen]byte
		_, _ = nc.Write(encodeImportResp(rb[:], r.req, urma.CodeSuccess))
		h, err := readSend(br)
		if err != nil {
			leaked <- 0
			return
		}
		leaked <- int(h.length)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	target, ierr := b.ctx.ImportJetty(ctx, urma.JettyID{EID: claimed, ID: 5}, urma.RC, 7)
	if ierr == nil {
		copy(b.mem.Bytes(), takeoverSecret)
		mustOK(t, b.send(target, 1, 0, len(takeoverSecret), 0), "B's message for the device it imported")
	}
	_ = nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	n := <-leaked
	t.Logf("HELLO_ACK status %d; B's import: %v; the claimant read %d bytes of B's message", ack.status, ierr, n)
	if ack.status == helloOK {
		t.Errorf("B took a connection from 127.0.0.1 as device %s", claimed)
	}
	if n > 0 {
		t.Fatalf("the claimant read B's %d-byte message for device %s", n, claimed)
	}
}

// Which socket-fabric dialers a device takes for the EID they claim.
func TestCheckSourceAddr(t *testing.T) {
	eid := func(s string) urma.EID {
		e, err := SocketEID(netip.MustParseAddrPort(s))
		mustOK(t, err, "EID")
		return e
	}
	from := func(s string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(s), Port: 5555} }
	explicit := urma.EID{0x20, 1}
	cases := []struct {
		name   string
		remote net.Addr
		eid    urma.EID
		ok     bool
	}{
		{"from the EID's address", from("10.0.0.5"), eid("10.0.0.5:4000"), true},
		{"from another address", from("10.0.0.9"), eid("10.0.0.5:4000"), false},
		{"over loopback, a loopback EID", from("127.0.0.1"), eid("127.0.0.9:4000"), true},
		{"over loopback, another host's EID", from("127.0.0.1"), eid("192.0.2.77:4000"), false},
		{"an IPv4-mapped source", from("::ffff:10.0.0.5"), eid("10.0.0.5:4000"), true},
		{"an explicit EID", from("10.0.0.9"), explicit, true},
	}
	for _, c := range cases {
		if err := checkSourceAddr(c.remote, c.eid); (err == nil) != c.ok {
			t.Errorf("%s: %v, want allowed %v", c.name, err, c.ok)
		}
	}
}
