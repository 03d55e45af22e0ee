package soft

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Who is at the other end of an shm socket. Every pod that has a jetty can
// reach the shm directory, list it and create sockets of its own there, so
// neither a socket's name nor an EID in a HELLO says who answers or who
// dials. An shm EID is self-certifying, as an IPv6 CGA (RFC 3972) is: its
// last nine bytes are a hash of the device's ed25519 public key, and the
// device proves it holds the key by signing the handshake's transcript.
// The transcript binds both nonces, both EIDs, both keys, the boot id, what
// the link will carry (ring sizes, message size) and the connection
// itself: the inode of the acceptor's end of the unix socket, which the
// acceptor reads with fstat and the dialer with sock_diag (the kernel's
// record of the socket it is connected to). A process between the two,
// relaying each one's messages and descriptors to the other, talks to each
// over a socket of its own: the two transcripts differ, and neither
// signature verifies. docs/software-provider.md#identity has the argument.

// shmKeyDomain separates the hash that makes an EID from any other use of
// the key.
const shmKeyDomain = "urma-k8s shm EID v1\x00"

// shmEIDHashLen is how many bytes of the key's hash an shm EID holds (bytes
// 7-15): finding a key for a given EID takes about 2^72 key generations.
const shmEIDHashLen = 9

// shmIdentity is an shm device's key and the EID it proves.
type shmIdentity struct {
	key ed25519.PrivateKey
	pub ed25519.PublicKey
	eid urma.EID
}

// newShmIdentity draws a fresh key.
func newShmIdentity() (*shmIdentity, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("draw shm device key: %w", err)
	}
	return &shmIdentity{key: key, pub: pub, eid: shmEIDOf(pub)}, nil
}

// shmIdentityOf is the identity of a given key.
func shmIdentityOf(key ed25519.PrivateKey) (*shmIdentity, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("shm key of %d bytes, want an ed25519 private key (%d)", len(key), ed25519.PrivateKeySize)
	}
	pub := key.Public().(ed25519.PublicKey)
	return &shmIdentity{key: key, pub: pub, eid: shmEIDOf(pub)}, nil
}

// shmEIDOf is the EID a public key proves.
func shmEIDOf(pub ed25519.PublicKey) urma.EID {
	var e urma.EID
	copy(e[:6], eidPrefix[:])
	e[6] = eidKindShm
	h := sha256.New()
	h.Write([]byte(shmKeyDomain))
	h.Write(pub)
	copy(e[16-shmEIDHashLen:], h.Sum(nil))
	return e
}

// ShmEIDOfKey is the EID of the shm device whose key is key (see
// DeviceSpec.ShmKey).
func ShmEIDOfKey(key ed25519.PrivateKey) (urma.EID, error) {
	id, err := shmIdentityOf(key)
	if err != nil {
		return urma.EID{}, err
	}
	return id.eid, nil
}

// Roles in a transcript's signature: each side signs the same transcript
// under its own label, so that one side's signature is never the other's.
const (
	shmSignAcceptor = "urma-k8s shm link v2 acceptor\x00"
	shmSignDialer   = "urma-k8s shm link v2 dialer\x00"
)

// shmTranscript is what both sides sign: the HELLO and the HELLO_ACK as
// they crossed the socket (the ACK's signature field zero) and the inode of
// the acceptor's end of the socket.
func shmTranscript(role string, hello, ack []byte, acceptorSock uint64) []byte {
	t := make([]byte, 0, len(role)+len(hello)+len(ack)+8)
	t = append(t, role...)
	t = append(t, hello...)
	t = append(t, ack...)
	return binary.BigEndian.AppendUint64(t, acceptorSock)
}

// errNotProved says that a peer did not prove the EID it claims.
var errNotProved = errors.New("does not prove the EID it claims")

// checkShmProof checks that pub proves eid and signed transcript t under
// role.
func checkShmProof(eid urma.EID, pub, sig []byte, role string, hello, ack []byte, acceptorSock uint64) error {
	switch {
	case len(pub) != ed25519.PublicKeySize:
		return fmt.Errorf("%w: key of %d bytes", errNotProved, len(pub))
	case shmEIDOf(pub) != eid:
		return fmt.Errorf("%w: its key's hash is not EID %s", errNotProved, eid)
	case !ed25519.Verify(pub, shmTranscript(role, hello, ack, acceptorSock), sig):
		return fmt.Errorf("%w: the signature of the handshake does not verify (another key, or a process relays between us)", errNotProved)
	}
	return nil
}

// sockInode is the inode of the socket fd is.
func sockInode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("fstat socket: %w", err)
	}
	return st.Ino, nil
}

// Netlink sock_diag for AF_UNIX (linux/unix_diag.h).
const (
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
	udiagShowPeer    = 0x4
	unixDiagPeer     = 2
	nlmsgHdrLen      = 16
	unixDiagReqLen   = 24
	unixDiagMsgLen   = 16
)

// unixPeerInode asks the kernel for the inode of the socket at the other
// end of the unix socket fd, whose own inode is ino: the kernel's record,
// which no process can forge. The dialer's socket lives in its own network
// namespace, where sock_diag finds it; the acceptor's end of a connection
// lives in the dialer's, so only the dialer asks (see shmTranscript).
func unixPeerInode(ino uint64) (uint64, error) {
	s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("open sock_diag socket: %w", err)
	}
	defer unix.Close(s)
	req := make([]byte, nlmsgHdrLen+unixDiagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], sockDiagByFamily)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1)
	r := req[nlmsgHdrLen:]
	r[0] = unix.AF_UNIX
	ne.PutUint32(r[4:], ^uint32(0)) // every state
	ne.PutUint32(r[8:], uint32(ino))
	ne.PutUint32(r[12:], udiagShowPeer)
	ne.PutUint32(r[16:], ^uint32(0)) // no cookie
	ne.PutUint32(r[20:], ^uint32(0))
	if err := unix.Sendto(s, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag request: %w", err)
	}
	buf := make([]byte, 1024)
	n, _, err := unix.Recvfrom(s, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag answer: %w", err)
	}
	return parseUnixDiagPeer(buf[:n], ino)
}

// parseUnixDiagPeer finds the peer's inode in a sock_diag answer about the
// socket ino.
func parseUnixDiagPeer(b []byte, ino uint64) (uint64, error) {
	ne := binary.NativeEndian
	if len(b) < nlmsgHdrLen {
		return 0, fmt.Errorf("sock_diag answer of %d bytes", len(b))
	}
	l, typ := ne.Uint32(b[0:]), ne.Uint16(b[4:])
	if l < nlmsgHdrLen || int(l) > len(b) {
		return 0, fmt.Errorf("sock_diag answer says %d bytes, has %d", l, len(b))
	}
	b = b[:l]
	if typ == unix.NLMSG_ERROR {
		if len(b) < nlmsgHdrLen+4 {
			return 0, errors.New("short sock_diag error")
		}
		errno := unix.Errno(-int32(ne.Uint32(b[nlmsgHdrLen:])))
		return 0, fmt.Errorf("sock_diag (needs the kernel's unix_diag, CONFIG_UNIX_DIAG): %w", errno)
	}
	if typ != sockDiagByFamily || len(b) < nlmsgHdrLen+unixDiagMsgLen {
		return 0, fmt.Errorf("sock_diag answer of type %d, %d bytes", typ, len(b))
	}
	msg := b[nlmsgHdrLen:]
	if got := ne.Uint32(msg[4:]); uint64(got) != uint64(uint32(ino)) {
		return 0, fmt.Errorf("sock_diag answered about socket %d, not %d", got, uint32(ino))
	}
	for attrs := msg[unixDiagMsgLen:]; len(attrs) >= 4; {
		al, at := int(ne.Uint16(attrs[0:])), ne.Uint16(attrs[2:])
		if al < 4 || al > len(attrs) {
			break
		}
		if at == unixDiagPeer && al >= 8 {
			return uint64(ne.Uint32(attrs[4:])), nil
		}
		attrs = attrs[min((al+3)&^3, len(attrs)):]
	}
	return 0, errors.New("sock_diag does not name the socket's peer: not connected")
}
