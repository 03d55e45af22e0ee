package soft

import (
	"fmt"
	"net"
	"strconv"

	"golang.org/x/sys/unix"
)

// A device's connection slots. Identities cost nothing to make up (a
// fresh key on shm, a port of one's own address on the socket fabric), so
// a process that reaches a device's socket can prove as many as it likes
// and dial in under each. Three rules keep such a process from taking the
// slots a legitimate peer needs:
//
//   - A device holds at most Options.MaxConns connections. When it is
//     full, a peer dialing in takes the slot of the oldest connection
//     that was dialed in and that this side never used (peer.used); only
//     when every connection is in use is the dialer refused. A made-up
//     identity is never used, so an attacker displaces only its own
//     links, while a legitimate peer's link is used soon after it is made
//     (the device imports over it, or the peer's first send passes a
//     token check) and stays.
//   - On shm, one process that dials in holds at most
//     Options.MaxConnsPerProcess connections and handshakes each, where
//     the kernel names that process (dialerProcess): the bound on what a
//     process that can pass token checks (and so make its links used) can
//     pin.
//   - At most MaxConns handshakes are under way at once.
//
// This side's own dials are never refused nor evicted, and a peer that
// replaces its connection keeps its slot.

// procKey names the process that connected an accepted unix socket; the
// zero key names none (TCP, or a kernel that cannot tell).
type procKey struct {
	pidfs uint64 // the process's pidfs inode: unique on the host, in any pid namespace
	pid   int32  // else its pid in this process's pid namespace
}

func (k procKey) known() bool { return k != procKey{} }

func (k procKey) String() string {
	switch {
	case k.pidfs != 0:
		return "pidfs inode " + strconv.FormatUint(k.pidfs, 10)
	case k.pid != 0:
		return "pid " + strconv.Itoa(int(k.pid))
	}
	return "unknown"
}

// dialerProcess names the process that connected nc, an accepted unix
// socket: by its pidfs inode (SO_PEERPIDFD, Linux 6.9 and later), which
// names a process in any pid namespace, else by its pid when this
// process's pid namespace sees it. SO_PEERCRED reports pid 0 for a process
// of a pid namespace this one does not contain (another pod), so without
// pidfs such a dialer is not bounded per process (the zero key).
func dialerProcess(nc net.Conn) procKey {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return procKey{}
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return procKey{}
	}
	var k procKey
	_ = raw.Control(func(fd uintptr) { k = peerProcess(int(fd)) })
	return k
}

func peerProcess(fd int) procKey {
	if pidfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
		var fs unix.Statfs_t
		var st unix.Stat_t
		ok := unix.Fstatfs(pidfd, &fs) == nil && fs.Type == unix.PID_FS_MAGIC && unix.Fstat(pidfd, &st) == nil
		_ = unix.Close(pidfd)
		if ok && st.Ino != 0 {
			return procKey{pidfs: st.Ino}
		}
	}
	if cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil && cred.Pid > 0 {
		return procKey{pid: cred.Pid}
	}
	return procKey{}
}

// procCount is what one dialing process holds at a device.
type procCount struct{ handshakes, links int }

// procLocked is the count of process k, made on first use; sd.mu is held.
func (sd *fabricSide) procLocked(k procKey) *procCount {
	n := sd.byProc[k]
	if n == nil {
		n = new(procCount)
		sd.byProc[k] = n
	}
	return n
}

// forgetProcLocked drops the count of a process that holds nothing.
func (sd *fabricSide) forgetProcLocked(k procKey) {
	if n := sd.byProc[k]; n != nil && n.handshakes == 0 && n.links == 0 {
		delete(sd.byProc, k)
	}
}

// holdLinkLocked and releaseLinkLocked count a connection dialed in by
// process k; sd.mu is held. The zero key is not counted.
func (sd *fabricSide) holdLinkLocked(k procKey) {
	if k.known() {
		sd.procLocked(k).links++
	}
}

func (sd *fabricSide) releaseLinkLocked(k procKey) {
	if k.known() {
		sd.procLocked(k).links--
		sd.forgetProcLocked(k)
	}
}

// beginHandshake records an accepted connection that Close must break, so
// that a silent dialer cannot hold Close up, and names the process that
// dialed it (shm). It refuses, closing the connection, when the device
// closes or already has MaxConns handshakes under way, or MaxConnsPerProcess
// from that process: each holds a goroutine and a descriptor for up to
// DialTimeout.
func (sd *fabricSide) beginHandshake(nc net.Conn) (procKey, bool) {
	var proc procKey
	if sd.shm != nil {
		proc = dialerProcess(nc)
	}
	sd.mu.Lock()
	closed, n := sd.closed, len(sd.handshaking)
	var why error
	switch {
	case closed:
	case n >= sd.maxConns:
		why = fmt.Errorf("%d handshakes under way, %w", n, ErrConnLimit)
	case proc.known() && sd.procLocked(proc).handshakes >= sd.maxPerProc:
		why = fmt.Errorf("%d handshakes under way from process %s, the most Options.MaxConnsPerProcess allows", sd.byProc[proc].handshakes, proc)
	default:
		sd.handshaking[nc] = proc
		sd.holdHandshakeLocked(proc)
	}
	sd.mu.Unlock()
	switch {
	case closed:
	case why != nil:
		sd.limitRefusals.Add(1)
		sd.log().Info("refusing connection", "remote", nc.RemoteAddr().String(), "process", proc.String(), "reason", why.Error())
	default:
		return proc, true
	}
	_ = nc.Close()
	return proc, false
}

func (sd *fabricSide) holdHandshakeLocked(k procKey) {
	if k.known() {
		sd.procLocked(k).handshakes++
	}
}

func (sd *fabricSide) endHandshake(nc net.Conn) {
	sd.mu.Lock()
	if k, ok := sd.handshaking[nc]; ok {
		delete(sd.handshaking, nc)
		if k.known() {
			sd.byProc[k].handshakes--
			sd.forgetProcLocked(k)
		}
	}
	sd.mu.Unlock()
}

// admit makes room for a connection that peer p, whose dialer is process
// proc, dialed in, or refuses it with an error naming the bound. p takes
// no new room when it replaces its connection or crosses this side's
// dial to it (which would take the room anyway); otherwise admit reserves
// one of the device's MaxConns, evicting the oldest connection dialed in
// and never used when the device is full, and reports so: the caller
// hands the reservation to adoptLocked or gives it back (unreserve).
func (sd *fabricSide) admit(p *peer, proc procKey) (reserved bool, err error) {
	p.mu.Lock()
	if p.conn != nil || p.dialing {
		p.mu.Unlock()
		return false, nil
	}
	sd.mu.Lock()
	victim, n, err := sd.reserveLocked(proc)
	sd.mu.Unlock()
	p.mu.Unlock()
	if err != nil {
		sd.limitRefusals.Add(1)
		return false, err
	}
	if victim != nil {
		sd.evictions.Add(1)
		sd.log().Info("evicting a connection this device never used, to make room for a peer dialing in",
			"evicted", victim.peerEID.String(), "for", p.eid.String(), "connections", n, "limit", "Options.MaxConns")
		victim.fail(fmt.Errorf("evicted for a peer dialing in: %d connections, %w, and this one was never used", n, ErrConnLimit))
	}
	return true, nil
}

// reserveLocked takes a slot for a connection dialed in by process proc:
// victim, when not nil, is the connection whose slot it took, already
// dropped from the device, which the caller fails; n is the connections
// the device held. sd.mu is held.
func (sd *fabricSide) reserveLocked(proc procKey) (victim *conn, n int, err error) {
	if proc.known() {
		if held := sd.procLocked(proc).links; held >= sd.maxPerProc {
			sd.forgetProcLocked(proc)
			return nil, 0, fmt.Errorf("process %s holds %d connections at this device, the most Options.MaxConnsPerProcess allows", proc, held)
		}
	}
	n = len(sd.conns) + sd.reserved
	if n >= sd.maxConns {
		victim = sd.evictableLocked()
		if victim == nil {
			sd.forgetProcLocked(proc)
			return nil, n, fmt.Errorf("%d connections open or being accepted, each in use, %w", n, ErrConnLimit)
		}
		sd.dropConnLocked(victim)
	}
	sd.reserved++
	sd.holdLinkLocked(proc)
	return victim, n, nil
}

// evictableLocked is the oldest connection a peer dialed in that this side
// never used (peer.used), or nil; sd.mu is held.
func (sd *fabricSide) evictableLocked() *conn {
	var oldest *conn
	for c := range sd.conns {
		if c.dialedByMe || c.p.used.Load() {
			continue
		}
		if oldest == nil || c.seq < oldest.seq {
			oldest = c
		}
	}
	return oldest
}

// unreserve gives back a slot admit reserved for process proc.
func (sd *fabricSide) unreserve(proc procKey) {
	sd.mu.Lock()
	sd.reserved--
	sd.releaseLinkLocked(proc)
	sd.mu.Unlock()
}

// dropConnLocked removes c from the device's connections, once; sd.mu is
// held.
func (sd *fabricSide) dropConnLocked(c *conn) {
	if _, ok := sd.conns[c]; !ok {
		return
	}
	delete(sd.conns, c)
	sd.releaseLinkLocked(c.proc)
	sd.publishShmConnsLocked()
}
