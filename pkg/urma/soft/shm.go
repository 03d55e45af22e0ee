package soft

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
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

// shmSide is the shm fabric's part of a device's fabricSide: where it
// listens and finds its peers, the key that proves its EID, and how its
// connections' rings are made.
type shmSide struct {
	dir      string // where peers' sockets are found (Options.ShmDir)
	path     string // this device's socket, in Options.ShmSocketDir
	id       *shmIdentity
	budget   *mapBudget // the provider's bounds on peer segments
	log      logr.Logger
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
	// the middle of a frame, and with framebound.For how long it may take
	// over one (shmring.Stream.Stall).
	peerTO time.Duration
}

// join makes a connection's shmIO from this side's ends, whose ring has
// ring bytes, and the peer's descriptors (see newShmIO).
func (n *shmSide) join(ends *shmring.Ends, ring, peerRing int, peerFds []int) (*shmIO, error) {
	sio, err := newShmIO(ends, ring, peerRing, peerFds, n.spin)
	if err == nil && n.pollingEnd > 0 {
		sio.PollingEnd = n.pollingEnd
	}
	if err == nil && n.pollerBudget != 0 {
		sio.pollerBudget = n.pollerBudget
	}
	if err == nil && n.peerTO > 0 {
		sio.Stall = n.peerTO
	}
	if err == nil {
		sio.pull.budget = n.budget
		log := n.log
		sio.refusedMap = func(handle uint32, err error) {
			log.Info("refusing a peer's segment: it sends from it by copy", "handle", handle, "reason", err.Error())
		}
	}
	return sio, err
}

// maxSocketPath is the longest path a unix socket address holds.
const maxSocketPath = len(unix.RawSockaddrUnix{}.Path) - 1

// ShmEID draws a fresh shm EID, the EID of a key drawn and forgotten: no
// device can prove it. A device's own EID comes from its key (shmid.go).
func ShmEID() (urma.EID, error) {
	id, err := newShmIdentity()
	if err != nil {
		return urma.EID{}, err
	}
	return id.eid, nil
}

// ShmSocketPath is where the shm device with EID e listens in dir.
func ShmSocketPath(dir string, e urma.EID) string {
	return filepath.Join(dir, hex.EncodeToString(e[:])+".sock")
}

// IsShmEID reports whether e has the form of an shm device's EID (see
// ShmEID); only the device whose key it is can prove it.
func IsShmEID(e urma.EID) bool {
	return [6]byte(e[:6]) == eidPrefix && e[6] == eidKindShm
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

// anyUser is the default credential check: the identity proof, not the
// peer's user, decides who a peer is, and pods of different users talk.
func anyUser(uint32) bool { return true }

// listenShm opens the device's unix socket in the shm directory.
func listenShm(sd *fabricSide, spec DeviceSpec, opts Options) error {
	ring := opts.ShmRingSize
	if ring == 0 {
		ring = DefaultShmRing
	}
	if !shmring.ValidSize(ring) {
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
		allow = anyUser
	}
	id, err := shmDeviceIdentity(spec)
	if err != nil {
		return fmt.Errorf("device %s: %w", spec.Name, err)
	}
	sd.eid = id.eid
	sockDir := opts.ShmSocketDir
	if sockDir == "" {
		sockDir = opts.ShmDir
	}
	if err := os.MkdirAll(sockDir, 0o700); err != nil {
		return fmt.Errorf("device %s: shm socket directory: %w", spec.Name, err)
	}
	path := ShmSocketPath(sockDir, sd.eid)
	if len(path) > maxSocketPath {
		return fmt.Errorf("device %s: shm socket path %s is %d bytes, longer than a unix socket takes (%d): use a shorter URMA_SHM_DIR (or URMA_SHM_SOCKET_DIR)", spec.Name, path, len(path), maxSocketPath)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("device %s: listen on %s: %w", spec.Name, path, err)
	}
	// Who may connect is decided by the identity proof (and
	// Options.ShmAllowUID), not by the file mode: pods of other users
	// connect.
	if err := os.Chmod(path, 0o666); err != nil {
		_ = ln.Close()
		return fmt.Errorf("device %s: open %s to peers: %w", spec.Name, path, err)
	}
	sd.ln = ln
	sd.shm = &shmSide{dir: opts.ShmDir, path: path, id: id, budget: sd.prov.maps, log: sd.log(), ringSize: ring, spin: spin, bootID: boot, allowUID: allow, peerTO: opts.PeerTimeout}
	return nil
}

// shmDeviceIdentity is the key of an shm device: DeviceSpec.ShmKey, or a
// fresh one. An EID given without its key cannot be proved to any peer, so
// it is refused; one given with its key must be the key's.
func shmDeviceIdentity(spec DeviceSpec) (*shmIdentity, error) {
	var id *shmIdentity
	var err error
	if spec.ShmKey != nil {
		id, err = shmIdentityOf(spec.ShmKey)
	} else {
		id, err = newShmIdentity()
	}
	if err != nil {
		return nil, err
	}
	switch {
	case len(spec.EIDs) > 1:
		return nil, fmt.Errorf("an shm device has one EID, got %d", len(spec.EIDs))
	case len(spec.EIDs) == 1 && spec.ShmKey == nil:
		return nil, fmt.Errorf("EID %s given without its key: an shm device's EID is the hash of its key, which it proves to its peers; set DeviceSpec.ShmKey (ShmEIDOfKey gives its EID) or leave EIDs empty", spec.EIDs[0])
	case len(spec.EIDs) == 1 && spec.EIDs[0] != id.eid:
		return nil, fmt.Errorf("EID %s is not the EID of DeviceSpec.ShmKey (%s)", spec.EIDs[0], id.eid)
	}
	return id, nil
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
func (n *shmSide) checkCreds(nc net.Conn) error {
	cred, err := peerCreds(nc)
	if err != nil {
		return err
	}
	if !n.allowUID(cred.Uid) {
		return fmt.Errorf("peer process %d runs as uid %d, which Options.ShmAllowUID refuses", cred.Pid, cred.Uid)
	}
	return nil
}

// Bounds of the search for a peer's socket: what a dialer reads of the shm
// directory and how many sockets named after one EID it greets. A socket
// that does not prove the EID costs a connection and a signature check.
const (
	maxShmDirEntries   = 4096
	maxShmSocketsTried = 16
)

// ShmSocketCandidates lists the sockets named after e in dir and in its
// subdirectories (not following symbolic links): where a device with EID e
// may listen, its own socket directory being dir or one of those. At most
// 4096 entries of dir are read and 16 sockets returned; a path longer than
// a unix socket takes is left out.
func ShmSocketCandidates(dir string, e urma.EID) ([]string, error) {
	name := hex.EncodeToString(e[:]) + ".sock"
	var out []string
	add := func(path string) {
		if len(path) > maxSocketPath || len(out) >= maxShmSocketsTried {
			return
		}
		if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			out = append(out, path)
		}
	}
	add(filepath.Join(dir, name))
	f, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read shm directory: %w", err)
	}
	defer f.Close()
	entries, err := f.ReadDir(maxShmDirEntries)
	if err != nil && !errors.Is(err, io.EOF) {
		return out, fmt.Errorf("read shm directory %s: %w", dir, err)
	}
	for _, de := range entries {
		if de.IsDir() {
			add(filepath.Join(dir, de.Name(), name))
		}
	}
	return out, nil
}
