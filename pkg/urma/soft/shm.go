package soft

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// The shm fabric: devices of processes on one host exchange frames through
// shared memory. Each device listens on a unix socket in a directory every
// process reaches ($URMA_SHM_DIR in a pod; the device plugin mounts the
// host's), named after its EID. Dialing it rendezvous: both sides check each
// other's credentials (SO_PEERCRED) and boot id, and pass their ring's
// memfd and two eventfds with SCM_RIGHTS. The socket then stays open as the
// liveness signal and carries the sharing of registered memory for
// one-copy SENDs; the frames, the same as the socket fabric's, go through
// the rings.

// shmNet is a device's presence on the shm fabric.
type shmNet struct {
	dir      string
	path     string // this device's socket
	ringSize int
	spin     time.Duration
	bootID   [bootIDLen]byte
	allowUID func(uid uint32) bool
	// pollingEnd overrides the parks without a Poll that end a reader's
	// polling mode (0: the default), for tests that must not depend on
	// how promptly a loaded machine schedules them.
	pollingEnd int
	// pollerBudget overrides pollerReadBudget (0: the default; negative:
	// a Poll reads one frame at most), for tests of the reader goroutine
	// taking what a Poll leaves.
	pollerBudget time.Duration
	// peerTO is Options.PeerTimeout: how long a peer may stop writing in
	// the middle of a frame, and with frameBound how long it may take
	// over one (shmIO.stall).
	peerTO time.Duration
}

// join makes a connection's shmIO from this side's ends and the peer's
// descriptors (see newShmIO).
func (n *shmNet) join(ends *shmEnds, peerRing int, peerFds []int) (*shmIO, error) {
	sio, err := newShmIO(ends, n.ringSize, peerRing, peerFds, n.spin)
	if err == nil && n.pollingEnd > 0 {
		sio.pollingEnd = n.pollingEnd
	}
	if err == nil && n.pollerBudget != 0 {
		sio.pollerBudget = n.pollerBudget
	}
	if err == nil && n.peerTO > 0 {
		sio.stall = n.peerTO
	}
	return sio, err
}

// maxSocketPath is the longest path a unix socket address holds.
const maxSocketPath = len(unix.RawSockaddrUnix{}.Path) - 1

// ShmEID draws a fresh EID for an shm device: it names the device's socket
// in the shm directory, so it must not collide with any other device's.
func ShmEID() (urma.EID, error) {
	var e urma.EID
	copy(e[:6], eidPrefix[:])
	e[6] = eidKindShm
	if _, err := rand.Read(e[8:]); err != nil {
		return urma.EID{}, fmt.Errorf("draw shm EID: %w", err)
	}
	return e, nil
}

// ShmSocketPath is where the shm device with EID e listens in dir.
func ShmSocketPath(dir string, e urma.EID) string {
	return filepath.Join(dir, hex.EncodeToString(e[:])+".sock")
}

// IsShmEID reports whether e is an shm device's EID (see ShmEID).
func IsShmEID(e urma.EID) bool {
	return [6]byte(e[:6]) == eidPrefix && e[6] == eidKindShm && e[7] == 0
}

// BootID reads the kernel's boot id: two processes with the same one run
// on the same host, in the same boot.
func BootID() ([bootIDLen]byte, error) {
	var id [bootIDLen]byte
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id, fmt.Errorf("read boot id: %w", err)
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err != nil || len(raw) != bootIDLen {
		return id, fmt.Errorf("boot id %q is not a UUID", strings.TrimSpace(string(b)))
	}
	copy(id[:], raw)
	return id, nil
}

// sameUser is the default credential check: a peer runs as this process's
// user, or as root.
func sameUser(uid uint32) bool { return uid == 0 || uid == uint32(os.Geteuid()) }

// listenShm opens the device's unix socket in the shm directory.
func listenShm(sd *sockDevice, spec DeviceSpec, opts Options) error {
	ring := opts.ShmRingSize
	if ring == 0 {
		ring = DefaultShmRing
	}
	if !validRingSize(ring) {
		return fmt.Errorf("device %s: shm ring size %d is not a power of two in %d..%d", spec.Name, ring, MinShmRing, MaxShmRing)
	}
	spin := opts.ShmSpin
	if spin == 0 {
		spin = DefaultShmSpin
	}
	boot, err := BootID()
	if err != nil {
		return fmt.Errorf("device %s: %w", spec.Name, err)
	}
	allow := opts.ShmAllowUID
	if allow == nil {
		allow = sameUser
	}
	switch {
	case len(spec.EIDs) > 1:
		return fmt.Errorf("device %s: an shm device has one EID, got %d", spec.Name, len(spec.EIDs))
	case len(spec.EIDs) == 1:
		sd.eid = spec.EIDs[0]
	default:
		if sd.eid, err = ShmEID(); err != nil {
			return fmt.Errorf("device %s: %w", spec.Name, err)
		}
	}
	if err := os.MkdirAll(opts.ShmDir, 0o700); err != nil {
		return fmt.Errorf("device %s: shm directory: %w", spec.Name, err)
	}
	path := ShmSocketPath(opts.ShmDir, sd.eid)
	if len(path) > maxSocketPath {
		return fmt.Errorf("device %s: shm socket path %s is %d bytes, longer than a unix socket takes (%d): use a shorter URMA_SHM_DIR", spec.Name, path, len(path), maxSocketPath)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("device %s: listen on %s: %w", spec.Name, path, err)
	}
	// Who may connect is decided by SO_PEERCRED, not by the file mode:
	// pods of another user may be allowed (Options.ShmAllowUID).
	if err := os.Chmod(path, 0o666); err != nil {
		_ = ln.Close()
		return fmt.Errorf("device %s: open %s to peers: %w", spec.Name, path, err)
	}
	sd.ln = ln
	sd.shm = &shmNet{dir: opts.ShmDir, path: path, ringSize: ring, spin: spin, bootID: boot, allowUID: allow, peerTO: opts.PeerTimeout}
	return nil
}

// peerCreds reads the credentials of the process at the other end of a
// unix socket, as the kernel recorded them at connect or listen time.
func peerCreds(nc net.Conn) (*unix.Ucred, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("connection %T has no descriptor", nc)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) { cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	if gerr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", gerr)
	}
	return cred, nil
}

// checkCreds applies the device's credential rule to the peer of nc.
func (n *shmNet) checkCreds(nc net.Conn) error {
	cred, err := peerCreds(nc)
	if err != nil {
		return err
	}
	if !n.allowUID(cred.Uid) {
		return fmt.Errorf("peer process %d runs as uid %d, which Options.ShmAllowUID refuses", cred.Pid, cred.Uid)
	}
	return nil
}

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

// handshakeInShm answers a dialer's HELLO on the shm socket; the rules for
// duplicate connections are the socket fabric's (handshakeIn).
func (sd *sockDevice) handshakeInShm(nc net.Conn) {
	defer sd.endHandshake(nc)
	uc := nc.(*net.UnixConn)
	_ = uc.SetDeadline(time.Now().Add(sd.dialTO))
	var buf [shmMaxMsgLen + 1]byte
	n, fds, err := readShmMsg(uc, buf[:], shmHelloFds)
	var h shmHelloMsg
	if err == nil {
		h, err = decodeShmHello(buf[:n])
	}
	if err == nil && h.typ != shmMsgHello {
		err = errors.New("first message is not a HELLO")
	}
	if err != nil {
		closeAll(fds)
		sd.log().Info("refusing shm connection: bad HELLO", "reason", err.Error())
		_ = nc.Close()
		return
	}
	ack := shmHelloMsg{typ: shmMsgHelloAck, session: sd.session, src: sd.eid, dst: h.src,
		maxMsg: sd.dev.caps.MaxMsgSize, bootID: sd.shm.bootID, ringSize: uint32(sd.shm.ringSize), pid: uint32(os.Getpid())}
	refuse := func(status uint8, why string) {
		closeAll(fds)
		ack.status = status
		var b [shmMaxMsgLen]byte
		_, _ = uc.Write(encodeShmHello(b[:], &ack))
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
	case len(fds) != shmHelloFds:
		refuse(helloRefused, fmt.Sprintf("HELLO carries %d descriptors, want %d", len(fds), shmHelloFds))
		return
	}
	if err := sd.shm.checkCreds(nc); err != nil {
		refuse(helloRefused, err.Error())
		return
	}
	p, err := sd.peer(h.src)
	if err != nil {
		refuse(helloResources, err.Error())
		return
	}
	// Before the ring: a refused peer costs this side no shared memory.
	reserved, err := sd.admit(p)
	if err != nil {
		refuse(helloConnLimit, err.Error())
		return
	}
	defer func() {
		if reserved {
			sd.unreserve()
		}
	}()
	ends, err := newShmEnds(sd.shm.ringSize)
	if err != nil {
		refuse(helloResources, err.Error())
		return
	}
	sio, err := sd.shm.join(ends, int(h.ringSize), fds)
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
		sio.close()
		refuse(helloDuplicate, "a connection dialed the other way wins")
		return
	}
	var b [shmMaxMsgLen]byte
	_, _, err = uc.WriteMsgUnix(encodeShmHello(b[:], &ack), unix.UnixRights(sio.passFds()...), nil)
	sio.closePassed()
	if err == nil {
		err = sio.attach(nc)
	}
	if err != nil {
		p.mu.Unlock()
		sio.close()
		sd.log().Info("shm handshake failed", "from", h.src.String(), "reason", err.Error())
		_ = nc.Close()
		return
	}
	sio.pollers = &sd.pollers
	c := newConn(sd, p, sio, hello{session: h.session, src: h.src, maxMsg: h.maxMsg}, false, sd.shm.path, fmt.Sprintf("pid %d", h.pid))
	old := sd.adoptLocked(p, c, reserved)
	reserved = false
	p.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection from the peer"))
	}
}

// dialOnceShm connects to the peer's shm socket and handshakes once.
func (p *peer) dialOnceShm(ctx context.Context) error {
	sd := p.sd
	if !IsShmEID(p.eid) {
		return fmt.Errorf("EID %s is not an shm device's", p.eid)
	}
	path := ShmSocketPath(sd.shm.dir, p.eid)
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return fmt.Errorf("dial %s (no such device on this host, or another shm directory): %w", path, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	uc := nc.(*net.UnixConn)
	fail := func(err error) error {
		_ = nc.Close()
		return err
	}
	if err := sd.shm.checkCreds(nc); err != nil {
		return fail(err)
	}
	ends, err := newShmEnds(sd.shm.ringSize)
	if err != nil {
		return fail(err)
	}
	h := shmHelloMsg{typ: shmMsgHello, session: sd.session, src: sd.eid, dst: p.eid,
		maxMsg: sd.dev.caps.MaxMsgSize, bootID: sd.shm.bootID, ringSize: uint32(sd.shm.ringSize), pid: uint32(os.Getpid())}
	var b [shmMaxMsgLen + 1]byte
	_, _, err = uc.WriteMsgUnix(encodeShmHello(b[:], &h), unix.UnixRights(ends.fds()...), nil)
	ends.closePassed()
	if err != nil {
		ends.release()
		return fail(fmt.Errorf("send HELLO to %s: %w", path, err))
	}
	n, fds, err := readShmMsg(uc, b[:], shmHelloFds)
	var a shmHelloMsg
	if err == nil {
		a, err = decodeShmHello(b[:n])
	}
	if err == nil && a.typ != shmMsgHelloAck {
		err = errors.New("answer is not a HELLO_ACK")
	}
	if err != nil {
		closeAll(fds)
		ends.release()
		return fail(fmt.Errorf("handshake with %s: %w", path, err))
	}
	var refused error
	switch {
	case a.status == helloDuplicate:
		refused = errDuplicate
	case a.status == helloWrongEID || a.src != p.eid:
		refused = fmt.Errorf("%s is device %s, not %s", path, a.src, p.eid)
	case a.status == helloWrongHost || a.bootID != sd.shm.bootID:
		refused = fmt.Errorf("%s belongs to a process on another host (boot id differs)", path)
	case a.status == helloRefused:
		refused = fmt.Errorf("%s refused this process (credentials or descriptors)", path)
	case a.status == helloConnLimit:
		refused = fmt.Errorf("%s refused the connection: device %s holds as many connections as it may, %w", path, p.eid, ErrConnLimit)
	case a.status != helloOK:
		refused = fmt.Errorf("%s could not set up its ring", path)
	}
	if refused != nil {
		closeAll(fds)
		ends.release()
		return fail(refused)
	}
	sio, err := sd.shm.join(ends, int(a.ringSize), fds)
	if err != nil {
		return fail(err)
	}
	if err := sio.attach(nc); err != nil {
		sio.close()
		return fail(err)
	}
	sio.pollers = &sd.pollers
	c := newConn(sd, p, sio, hello{session: a.session, src: a.src, maxMsg: a.maxMsg}, true, sd.shm.path, fmt.Sprintf("pid %d", a.pid))
	p.mu.Lock()
	old := sd.adoptLocked(p, c, false)
	p.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection"))
	}
	return nil
}
