package soft

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// readShmMsg reads one message and the descriptors it carries (at most
// maxFds). Descriptors beyond that, or of a truncated message, are closed
// and the read fails.
func readShmMsg(uc *net.UnixConn, buf []byte, maxFds int) (int, []int, error) {
	oob := make([]byte, unix.CmsgSpace(4*shmMaxFds))
	n, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, err
	}
	fds, perr := parseRights(oob[:oobn])
	switch {
	case perr != nil:
		err = perr
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		err = errors.New("message or its descriptors truncated")
	case len(fds) > maxFds:
		err = fmt.Errorf("message carries %d descriptors, at most %d expected", len(fds), maxFds)
	case n == 0:
		err = errors.New("peer closed the connection")
	}
	if err != nil {
		closeAll(fds)
		return 0, nil, err
	}
	return n, fds, nil
}

// parseRights takes the descriptors out of SCM_RIGHTS control messages.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("parse passed descriptors: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// connInode is the inode of a unix connection's socket.
func connInode(uc *net.UnixConn) (uint64, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var ino uint64
	var ierr error
	if err := raw.Control(func(fd uintptr) { ino, ierr = sockInode(int(fd)) }); err != nil {
		return 0, err
	}
	return ino, ierr
}

// handshakeInShm answers a dialer on the shm socket:
//
//	HELLO (dialer: EID, key, nonce) -> HELLO_ACK (acceptor: EID, key,
//	nonce, signature) -> PROOF (dialer: signature, its ring) -> READY
//	(acceptor: its ring)
//
// Nothing of this side is spent on the dialer (a peer entry, a connection
// slot, a ring) before it proved the EID it claims; the rules for
// duplicate connections are the socket fabric's (handshakeIn).
func (sd *fabricSide) handshakeInShm(nc net.Conn, proc procKey) {
	defer sd.endHandshake(nc)
	uc := nc.(*net.UnixConn)
	_ = uc.SetDeadline(time.Now().Add(sd.dialTO))
	var buf [shmMaxMsgLen + 1]byte
	n, _, err := readShmMsg(uc, buf[:], 0)
	var h shmHelloMsg
	if err == nil {
		h, err = decodeShmHello(buf[:n])
	}
	if err == nil && h.typ != shmMsgHello {
		err = errors.New("first message is not a HELLO")
	}
	if err != nil {
		sd.log().Info("refusing shm connection: bad HELLO", "reason", err.Error())
		_ = nc.Close()
		return
	}
	helloMsg := append([]byte(nil), buf[:n]...)
	id := sd.shm.id
	ack := shmHelloMsg{typ: shmMsgHelloAck, session: sd.session, src: sd.eid, dst: h.src,
		maxMsg: sd.dev.caps.MaxMsgSize, bootID: sd.shm.bootID, pid: uint32(os.Getpid()),
		// The acceptor never pays for more ring than the dialer does.
		ringSize: uint32(min(sd.shm.ringSize, int(h.ringSize)))}
	copy(ack.pub[:], id.pub)
	var out [shmMaxMsgLen]byte
	refuse := func(status uint8, why string) {
		ack.status = status
		_, _ = uc.Write(encodeShmHello(out[:], &ack))
		sd.log().Info("refusing shm connection", "from", h.src.String(), "pid", h.pid, "reason", why)
		_ = nc.Close()
	}
	switch {
	case h.dst != sd.eid || h.src == sd.eid:
		refuse(helloWrongEID, fmt.Sprintf("asked for device %s", h.dst))
		return
	case h.bootID != sd.shm.bootID:
		refuse(helloWrongHost, "the dialer has another boot id: not on this host")
		return
	case shmEIDOf(h.pub[:]) != h.src:
		refuse(helloRefused, fmt.Sprintf("the dialer's key is not the key of EID %s", h.src))
		return
	}
	if err := sd.shm.checkCreds(nc); err != nil {
		refuse(helloRefused, err.Error())
		return
	}
	ino, err := connInode(uc)
	if err == nil {
		_, err = rand.Read(ack.nonce[:])
	}
	if err != nil {
		refuse(helloResources, err.Error())
		return
	}
	ackMsg := append([]byte(nil), encodeShmHello(out[:], &ack)...)
	copy(ack.sig[:], ed25519.Sign(id.key, shmTranscript(shmSignAcceptor, helloMsg, ackMsg, ino)))
	if _, err := uc.Write(encodeShmHello(out[:], &ack)); err != nil {
		sd.log().Info("shm handshake failed", "from", h.src.String(), "reason", err.Error())
		_ = nc.Close()
		return
	}
	sd.acceptProved(uc, proc, h, helloMsg, ackMsg, ino)
}

// acceptProved reads the dialer's PROOF and, once it verifies, sets up the
// connection and answers READY with this side's ring.
func (sd *fabricSide) acceptProved(uc *net.UnixConn, proc procKey, h shmHelloMsg, helloMsg, ackMsg []byte, ino uint64) {
	var buf [shmMaxMsgLen + 1]byte
	n, fds, err := readShmMsg(uc, buf[:], shmHelloFds)
	var sig [shmSigLen]byte
	if err == nil {
		sig, err = decodeShmProof(buf[:n])
	}
	if err != nil {
		closeAll(fds)
		sd.log().Info("refusing shm connection: bad PROOF", "from", h.src.String(), "pid", h.pid, "reason", err.Error())
		_ = uc.Close()
		return
	}
	var out [shmReadyLen]byte
	refuse := func(status uint8, why string) {
		closeAll(fds)
		_, _ = uc.Write(encodeShmReady(out[:], status))
		sd.log().Info("refusing shm connection", "from", h.src.String(), "pid", h.pid, "process", proc.String(), "reason", why)
		_ = uc.Close()
	}
	if err := checkShmProof(h.src, h.pub[:], sig[:], shmSignDialer, helloMsg, ackMsg, ino); err != nil {
		refuse(helloRefused, "the dialer "+err.Error())
		return
	}
	if len(fds) != shmHelloFds {
		refuse(helloRefused, fmt.Sprintf("PROOF carries %d descriptors, want %d", len(fds), shmHelloFds))
		return
	}
	p, err := sd.peer(h.src)
	if err != nil {
		refuse(helloResources, err.Error())
		return
	}
	// Before the ring: a refused peer costs this side no shared memory.
	reserved, err := sd.admit(p, proc)
	if err != nil {
		refuse(helloConnLimit, err.Error())
		return
	}
	defer func() {
		if reserved {
			sd.unreserve(proc)
		}
	}()
	ring := min(sd.shm.ringSize, int(h.ringSize))
	ends, err := shmring.NewEnds(ring)
	if err != nil {
		refuse(helloResources, err.Error())
		return
	}
	sio, err := sd.shm.join(ends, ring, int(h.ringSize), fds)
	fds = nil // taken
	if err != nil {
		refuse(helloRefused, err.Error())
		return
	}
	p.mu.Lock()
	peerWins := bytes.Compare(h.src[:], sd.eid[:]) < 0
	mineStands := p.dialing || (p.conn != nil && p.conn.dialedByMe)
	if !peerWins && mineStands {
		p.mu.Unlock()
		sio.Close()
		refuse(helloDuplicate, "a connection dialed the other way wins")
		return
	}
	_, _, err = uc.WriteMsgUnix(encodeShmReady(out[:], helloOK), unix.UnixRights(sio.PassFds()...), nil)
	sio.ClosePassed()
	if err == nil {
		err = sio.attach(uc)
	}
	if err != nil {
		p.mu.Unlock()
		sio.Close()
		sd.log().Info("shm handshake failed", "from", h.src.String(), "reason", err.Error())
		_ = uc.Close()
		return
	}
	sio.Polls = &sd.polls
	c := newConn(sd, p, sio, hello{session: h.session, src: h.src, maxMsg: h.maxMsg}, false, sd.shm.path, fmt.Sprintf("pid %d", h.pid))
	c.proc = proc
	old := sd.adoptLocked(p, c, reserved)
	reserved = false
	p.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection from the peer"))
	}
}

// shmGreeting is a dialer's connection to a socket whose acceptor proved
// the EID the dialer wants: what the PROOF signs.
type shmGreeting struct {
	uc               *net.UnixConn
	path             string
	ack              shmHelloMsg
	helloMsg, ackMsg []byte // as they crossed, the ACK's signature zero
	ino              uint64 // the acceptor's end of the socket
}

// dialOnceShm connects to the peer's shm socket and handshakes once. The
// peer's socket is named after its EID, in the shm directory or one level
// down (each pod its own subdirectory): any process that can write there
// can name a socket after any EID, so the dialer greets each candidate in
// turn and keeps the first whose acceptor proves the EID.
func (p *peer) dialOnceShm(ctx context.Context) error {
	sd := p.sd
	if !IsShmEID(p.eid) {
		return fmt.Errorf("EID %s is not an shm device's", p.eid)
	}
	paths, err := ShmSocketCandidates(sd.shm.dir, p.eid)
	if err != nil {
		return err
	}
	if len(paths) == 0 {
		return fmt.Errorf("no socket %s.sock in %s or its subdirectories (no such device on this host, or another shm directory)", hex.EncodeToString(p.eid[:]), sd.shm.dir)
	}
	var errs []error
	for _, path := range paths {
		g, err := sd.shm.greet(ctx, sd, path, p.eid)
		if err != nil {
			// Someone else's socket named after the EID, or the
			// peer's refusal: either way, the next candidate.
			sd.log().Info("skipping shm socket", "peer", p.eid.String(), "path", path, "reason", err.Error())
			errs = append(errs, err)
			continue
		}
		return p.proveShm(ctx, g)
	}
	return errors.Join(errs...)
}

// greet connects to path, sends HELLO and checks that the HELLO_ACK proves
// want. The connection is closed unless greet succeeds.
func (n *shmSide) greet(ctx context.Context, sd *fabricSide, path string, want urma.EID) (*shmGreeting, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("dial %s (no such device on this host, or another shm directory): %w", path, err)
	}
	uc := nc.(*net.UnixConn)
	fail := func(err error) (*shmGreeting, error) {
		_ = nc.Close()
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	if err := n.checkCreds(nc); err != nil {
		return fail(err)
	}
	h := shmHelloMsg{typ: shmMsgHello, session: sd.session, src: sd.eid, dst: want,
		maxMsg: sd.dev.caps.MaxMsgSize, bootID: n.bootID, ringSize: uint32(n.ringSize), pid: uint32(os.Getpid())}
	copy(h.pub[:], n.id.pub)
	if _, err := rand.Read(h.nonce[:]); err != nil {
		return fail(fmt.Errorf("draw nonce: %w", err))
	}
	var b [shmMaxMsgLen + 1]byte
	helloMsg := append([]byte(nil), encodeShmHello(b[:], &h)...)
	if _, err := uc.Write(helloMsg); err != nil {
		return fail(fmt.Errorf("send HELLO to %s: %w", path, err))
	}
	k, _, err := readShmMsg(uc, b[:], 0)
	var a shmHelloMsg
	if err == nil {
		a, err = decodeShmHello(b[:k])
	}
	if err == nil && a.typ != shmMsgHelloAck {
		err = errors.New("answer is not a HELLO_ACK")
	}
	if err != nil {
		return fail(fmt.Errorf("handshake with %s: %w", path, err))
	}
	// The statuses are the acceptor's word before it proved anything: a
	// reason to try the next candidate, not to believe.
	switch {
	case a.status == helloWrongEID || a.src != want:
		return fail(fmt.Errorf("%s is device %s, not %s", path, a.src, want))
	case a.status == helloWrongHost || a.bootID != n.bootID:
		return fail(fmt.Errorf("%s belongs to a process on another host (boot id differs)", path))
	case a.status == helloRefused:
		return fail(fmt.Errorf("%s refused this process (credentials, or its key)", path))
	case a.status != helloOK:
		return fail(fmt.Errorf("%s could not answer (status %d)", path, a.status))
	case int(a.ringSize) > n.ringSize:
		return fail(fmt.Errorf("%s offers a ring of %d bytes, more than this side's %d", path, a.ringSize, n.ringSize))
	}
	own, err := connInode(uc)
	var ino uint64
	if err == nil {
		ino, err = unixPeerInode(own)
	}
	if err != nil {
		return fail(fmt.Errorf("find the socket at the other end of %s: %w", path, err))
	}
	ackMsg := unsignedShmHello(b[:k])
	if err := checkShmProof(want, a.pub[:], a.sig[:], shmSignAcceptor, helloMsg, ackMsg, ino); err != nil {
		return fail(fmt.Errorf("%s %w", path, err))
	}
	return &shmGreeting{uc: uc, path: path, ack: a, helloMsg: helloMsg, ackMsg: ackMsg, ino: ino}, nil
}

// proveShm sends the PROOF and this side's ring over a greeted connection
// and adopts the connection once the acceptor is READY.
func (p *peer) proveShm(ctx context.Context, g *shmGreeting) error {
	sd := p.sd
	uc, path, a := g.uc, g.path, g.ack
	stop := context.AfterFunc(ctx, func() { _ = uc.Close() })
	defer stop()
	fail := func(err error) error {
		_ = uc.Close()
		return err
	}
	ends, err := shmring.NewEnds(sd.shm.ringSize)
	if err != nil {
		return fail(err)
	}
	sig := ed25519.Sign(sd.shm.id.key, shmTranscript(shmSignDialer, g.helloMsg, g.ackMsg, g.ino))
	var b [shmMaxMsgLen + 1]byte
	_, _, err = uc.WriteMsgUnix(encodeShmProof(b[:], sig), unix.UnixRights(ends.Fds()...), nil)
	ends.ClosePassed()
	if err != nil {
		ends.Release()
		return fail(fmt.Errorf("send PROOF to %s: %w", path, err))
	}
	n, fds, err := readShmMsg(uc, b[:], shmHelloFds)
	var status uint8
	if err == nil {
		status, err = decodeShmReady(b[:n])
	}
	if err == nil && status != helloOK && len(fds) > 0 {
		err = fmt.Errorf("READY of status %d carries descriptors", status)
	}
	if err != nil {
		closeAll(fds)
		ends.Release()
		return fail(fmt.Errorf("handshake with %s: %w", path, err))
	}
	var refused error
	switch status {
	case helloOK:
	case helloDuplicate:
		refused = errDuplicate
	case helloRefused:
		refused = fmt.Errorf("%s refused this process (its proof or its ring)", path)
	case helloConnLimit:
		refused = fmt.Errorf("%s refused the connection: device %s holds as many connections as it may, from this process (its Options.MaxConnsPerProcess) or in all, %w", path, p.eid, ErrConnLimit)
	default:
		refused = fmt.Errorf("%s could not set up its ring", path)
	}
	if refused != nil {
		ends.Release()
		return fail(refused)
	}
	sio, err := sd.shm.join(ends, sd.shm.ringSize, int(a.ringSize), fds)
	if err != nil {
		return fail(err)
	}
	if err := sio.attach(uc); err != nil {
		sio.Close()
		return fail(err)
	}
	sio.Polls = &sd.polls
	c := newConn(sd, p, sio, hello{session: a.session, src: a.src, maxMsg: a.maxMsg}, true, sd.shm.path, fmt.Sprintf("pid %d", a.pid))
	p.mu.Lock()
	old := sd.adoptLocked(p, c, false)
	p.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection"))
	}
	return nil
}
