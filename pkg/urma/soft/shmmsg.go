package soft

import (
	"fmt"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// Messages on an shm connection's unix socket (SOCK_SEQPACKET, one message
// per packet). Frames go through the rings; the socket carries what needs
// the kernel: the handshake with its descriptors (SCM_RIGHTS), the sharing
// of registered memory for one-copy SENDs, and liveness: its EOF is the
// peer's death. Integers are big-endian, reserved bytes zero. Every
// message starts with the magic "SRMS", the version, the type and a status.
// docs/software-provider.md has the layouts.
const (
	shmMsgMagic = "SRMS"
	// shmMsgVersion 2 added the identity proof (shmid.go); a peer
	// speaking 1 is refused at HELLO.
	shmMsgVersion = 2

	shmMsgHello     = 1 // dialer's first message: its EID, key and nonce; no descriptors
	shmMsgHelloAck  = 2 // acceptor's answer: its EID, key, nonce and signature of the transcript
	shmMsgSegMap    = 3 // a read-only descriptor of a registered segment, under a handle
	shmMsgSegMapped = 4 // the receiver mapped the handle (status OK) or refused it
	shmMsgSegUnmap  = 5 // the segment is gone: forget the handle
	shmMsgProof     = 6 // dialer's signature of the transcript; descriptors: region, data eventfd, space eventfd
	shmMsgReady     = 7 // acceptor's last word; the same descriptors when the status is OK

	shmMsgHdrLen = 8
	shmNonceLen  = 32
	shmSigLen    = 64
	shmHelloLen  = shmMsgHdrLen + 72 + shmNonceLen + 32 + shmSigLen
	shmProofLen  = shmMsgHdrLen + shmSigLen
	shmReadyLen  = shmMsgHdrLen
	shmSegMsgLen = shmMsgHdrLen + 16
	shmMaxMsgLen = shmHelloLen
	shmHelloFds  = 3
	shmSegMapFds = 1
	shmMaxFds    = shmHelloFds
	bootIDLen    = 16
)

// HELLO_ACK and READY statuses beyond the socket fabric's (helloOK,
// helloDuplicate, helloWrongEID, helloConnLimit).
const (
	helloWrongHost = 3 // another boot id: not the same host, or not the same boot
	helloRefused   = 4 // the dialer's credentials are not allowed, or it did not prove its EID
	helloResources = 5 // the acceptor could not create its ring
)

// shmHelloMsg is a HELLO or HELLO_ACK.
type shmHelloMsg struct {
	typ      uint8
	status   uint8
	session  uint64
	src, dst urma.EID // the sender's and the receiver's device
	maxMsg   uint64
	bootID   [bootIDLen]byte
	ringSize uint32 // the ring the sender writes into (HELLO_ACK: at most the HELLO's)
	pid      uint32 // the sender's process id, for logs
	nonce    [shmNonceLen]byte
	pub      [32]byte        // the sender's ed25519 public key, whose hash is src
	sig      [shmSigLen]byte // HELLO_ACK: the acceptor's signature of the transcript; HELLO: zero
}

func encodeShmHello(b []byte, h *shmHelloMsg) []byte {
	b = b[:shmHelloLen]
	clear(b)
	copy(b, shmMsgMagic)
	b[4], b[5], b[6] = shmMsgVersion, h.typ, h.status
	p := b[shmMsgHdrLen:]
	be.PutUint64(p[0:], h.session)
	copy(p[8:24], h.src[:])
	copy(p[24:40], h.dst[:])
	be.PutUint64(p[40:], h.maxMsg)
	copy(p[48:64], h.bootID[:])
	be.PutUint32(p[64:], h.ringSize)
	be.PutUint32(p[68:], h.pid)
	copy(p[72:104], h.nonce[:])
	copy(p[104:136], h.pub[:])
	copy(p[136:200], h.sig[:])
	return b
}

// unsigned is an encoded HELLO_ACK with its signature field zero, as the
// transcript holds it.
func unsignedShmHello(b []byte) []byte {
	u := append([]byte(nil), b...)
	clear(u[shmMsgHdrLen+136 : shmMsgHdrLen+200])
	return u
}

// decodeShmMsgHeader checks a message's fixed start and returns its type
// and status.
func decodeShmMsgHeader(b []byte) (typ, status uint8, err error) {
	switch {
	case len(b) < shmMsgHdrLen:
		return 0, 0, fmt.Errorf("shm message of %d bytes, shorter than its header", len(b))
	case string(b[:4]) != shmMsgMagic:
		return 0, 0, fmt.Errorf("shm message magic %q, want %q", b[:4], shmMsgMagic)
	case b[4] != shmMsgVersion:
		return 0, 0, fmt.Errorf("shm protocol version %d, this side speaks %d", b[4], shmMsgVersion)
	case b[7] != 0:
		return 0, 0, fmt.Errorf("shm message reserved byte is not zero")
	}
	return b[5], b[6], nil
}

func decodeShmHello(b []byte) (shmHelloMsg, error) {
	var h shmHelloMsg
	typ, status, err := decodeShmMsgHeader(b)
	if err != nil {
		return h, err
	}
	switch {
	case typ != shmMsgHello && typ != shmMsgHelloAck:
		return h, fmt.Errorf("shm message type %d, want a hello", typ)
	case len(b) != shmHelloLen:
		return h, fmt.Errorf("shm hello of %d bytes, want %d", len(b), shmHelloLen)
	case typ == shmMsgHello && status != 0, status > helloConnLimit:
		return h, fmt.Errorf("shm hello status %d not allowed", status)
	}
	p := b[shmMsgHdrLen:]
	h = shmHelloMsg{
		typ: typ, status: status, session: be.Uint64(p[0:]),
		src: urma.EID(p[8:24]), dst: urma.EID(p[24:40]), maxMsg: be.Uint64(p[40:]),
		ringSize: be.Uint32(p[64:]), pid: be.Uint32(p[68:]),
	}
	copy(h.bootID[:], p[48:64])
	copy(h.nonce[:], p[72:104])
	copy(h.pub[:], p[104:136])
	copy(h.sig[:], p[136:200])
	switch {
	case h.src.IsZero():
		return h, fmt.Errorf("shm hello from a zero EID")
	case typ == shmMsgHello && !zero(h.sig[:]):
		return h, fmt.Errorf("shm HELLO carries a signature")
	case status == helloOK && !shmring.ValidSize(int(h.ringSize)):
		return h, fmt.Errorf("shm hello ring size %d is not a power of two in %d..%d", h.ringSize, MinShmRing, MaxShmRing)
	}
	return h, nil
}

// encodeShmProof encodes a PROOF: the dialer's signature of the transcript.
func encodeShmProof(b []byte, sig []byte) []byte {
	b = b[:shmProofLen]
	clear(b)
	copy(b, shmMsgMagic)
	b[4], b[5] = shmMsgVersion, shmMsgProof
	copy(b[shmMsgHdrLen:], sig)
	return b
}

func decodeShmProof(b []byte) (sig [shmSigLen]byte, err error) {
	typ, status, err := decodeShmMsgHeader(b)
	switch {
	case err != nil:
		return sig, err
	case typ != shmMsgProof:
		return sig, fmt.Errorf("shm message type %d, want a PROOF", typ)
	case len(b) != shmProofLen:
		return sig, fmt.Errorf("shm PROOF of %d bytes, want %d", len(b), shmProofLen)
	case status != 0:
		return sig, fmt.Errorf("shm PROOF status %d not allowed", status)
	}
	copy(sig[:], b[shmMsgHdrLen:])
	return sig, nil
}

// encodeShmReady encodes a READY with its status.
func encodeShmReady(b []byte, status uint8) []byte {
	b = b[:shmReadyLen]
	clear(b)
	copy(b, shmMsgMagic)
	b[4], b[5], b[6] = shmMsgVersion, shmMsgReady, status
	return b
}

func decodeShmReady(b []byte) (status uint8, err error) {
	typ, status, err := decodeShmMsgHeader(b)
	switch {
	case err != nil:
		return 0, err
	case typ != shmMsgReady:
		return 0, fmt.Errorf("shm message type %d, want a READY", typ)
	case len(b) != shmReadyLen:
		return 0, fmt.Errorf("shm READY of %d bytes, want %d", len(b), shmReadyLen)
	case status > helloConnLimit:
		return 0, fmt.Errorf("shm READY status %d not allowed", status)
	}
	return status, nil
}

// shmSegMsg is a SEG_MAP, SEG_MAPPED or SEG_UNMAP.
type shmSegMsg struct {
	typ    uint8
	status uint8  // SEG_MAPPED: 0 mapped, 1 refused
	handle uint32 // the sender's name for the segment, never reused
	length uint64 // SEG_MAP: the segment's size
}

func encodeShmSeg(b []byte, m *shmSegMsg) []byte {
	b = b[:shmSegMsgLen]
	clear(b)
	copy(b, shmMsgMagic)
	b[4], b[5], b[6] = shmMsgVersion, m.typ, m.status
	p := b[shmMsgHdrLen:]
	be.PutUint32(p[0:], m.handle)
	be.PutUint64(p[8:], m.length)
	return b
}

func decodeShmSeg(b []byte) (shmSegMsg, error) {
	var m shmSegMsg
	typ, status, err := decodeShmMsgHeader(b)
	if err != nil {
		return m, err
	}
	p := b[shmMsgHdrLen:]
	switch {
	case typ < shmMsgSegMap || typ > shmMsgSegUnmap:
		return m, fmt.Errorf("shm message type %d unknown or out of place", typ)
	case len(b) != shmSegMsgLen:
		return m, fmt.Errorf("shm segment message of %d bytes, want %d", len(b), shmSegMsgLen)
	case status > 1 || (status != 0 && typ != shmMsgSegMapped):
		return m, fmt.Errorf("shm segment message status %d not allowed", status)
	case !zero(p[4:8]):
		return m, fmt.Errorf("shm segment message reserved bytes are not zero")
	}
	m = shmSegMsg{typ: typ, status: status, handle: be.Uint32(p[0:]), length: be.Uint64(p[8:])}
	if m.typ != shmMsgSegMap && m.length != 0 {
		return m, fmt.Errorf("shm segment message type %d with a length", typ)
	}
	return m, nil
}
