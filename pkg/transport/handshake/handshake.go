// Package handshake is the wire codec of the transport's TCP control plane:
// the v2 binary hello ("URMA", 86 bytes), the v3 protobuf hello ("URM3" +
// length + UrmaHello), and the 4-byte ACK. It is byte-compatible with brpc's
// UrmaTransport (src/brpc/urma/urma_handshake.{h,cpp}) and adds one thing brpc
// lacks: the token that guards the sender's jetty and segment, carried in a
// v2 extension block or in v3 field 100.
//
// The package does no networking beyond the io.Reader it is handed, so every
// parser can be fuzzed. docs/wire-format.md describes the bytes.
package handshake

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Magics: the first four bytes a client sends. Anything else is a plain TCP
// client.
const (
	MagicV2  = "URMA"
	MagicV3  = "URM3"
	MagicLen = 4
)

// v2 layout (brpc's v2_wire). msg_len counts the whole packet, magic included.
const (
	V2BodyLen      = 82
	V2PacketLen    = MagicLen + V2BodyLen // 86
	V2MaxMsgLen    = 4096
	V2HelloVersion = 2
	V2ImplVersion  = 1

	// V2ExtTag opens our extension block after the 86 fixed bytes. brpc drains
	// whatever follows the fixed part, so the block is invisible to it.
	V2ExtTag = "K8ST"
	// V2ExtLen is the extension block: tag, token value, sq_size and flags,
	// each a big-endian uint32. Flag bit 0 says the token is present, bit 1
	// that the sender ends connections with a close marker.
	V2ExtLen = 16
	// v2ExtHasToken is the extension flag for "token present".
	v2ExtHasToken = 0x1
	// v2ExtCloseMarker is the extension flag for "sends a close marker".
	v2ExtCloseMarker = 0x2
	// V2HostTag opens the optional host block after the extension block:
	// the tag and the sender's 16-byte boot id. Peers that know only the
	// extension block ignore it, as brpc ignores both.
	V2HostTag = "K8SH"
	// V2HostLen is the host block's length.
	V2HostLen = MagicLen + BootIDLen
	// V2SocketTag opens the optional socket block after the host block:
	// the tag and the 16-byte EID at which the sender's device is also
	// reached over the software provider's socket fabric, from any host.
	// Peers that know only the blocks before it ignore it.
	V2SocketTag = "K8SE"
	// V2SocketLen is the socket block's length.
	V2SocketLen = MagicLen + 16
)

// BootIDLen is the length of a boot id (/proc/sys/kernel/random/boot_id).
const BootIDLen = 16

// V3MaxBodyLen is the largest protobuf body a v3 hello may announce.
const V3MaxBodyLen = 4096

// ACK: four big-endian bytes of flags; bit 0 says "use URMA".
const (
	AckLen            = 4
	AckUseURMA uint32 = 0x1
)

// Validity limits (brpc's ValidHello).
const (
	MinBufferSize    = 1024
	MinRecvBufferCnt = 3
	MaxRecvBufferCnt = 65535
)

// Transport path types (urma_tp_type_t); a valid hello has TPType <= TPUTP.
const (
	TPRTP uint8 = 0
	TPCTP uint8 = 1
	TPUTP uint8 = 2
)

// Version is a hello's wire format.
type Version int

// Hello versions.
const (
	V2 Version = 2
	V3 Version = 3
)

// ErrInvalidHello marks a hello that parsed as far as the wire allowed but
// breaks a rule: the peer is not a usable URMA peer, so the connection falls
// back to TCP. Errors that are not ErrInvalidHello are I/O errors.
var ErrInvalidHello = errors.New("invalid URMA hello")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidHello, fmt.Sprintf(format, args...))
}

// Hello is the version-independent content of a hello (brpc's ParsedHello)
// plus our token.
type Hello struct {
	BufferSize    uint32   // receive buffer size per work request
	RecvBufferCnt uint32   // receive queue depth - 1
	JettyID       uint32   // the sender's jetty id
	EID           urma.EID // the sender's EID
	UASID         uint32
	TPType        uint8
	SegEID        urma.EID // the sender's registered pool segment
	SegUASID      uint32
	SegVA         uint64
	SegLen        uint64
	SegTokenID    uint32
	// Token guards the sender's jetty and segment; HasToken is false when the
	// sender registered them without one (brpc peers).
	Token    uint32
	HasToken bool
	// SQSize is the sender's send queue depth, so the receiver can size its
	// credit batches below the sender's window; 0 when not sent (brpc).
	SQSize uint32
	// CloseMarker says the sender ends a connection gracefully with a close
	// marker on the data plane before it closes TCP, so that its peer can
	// tell a graceful close from a peer that vanished. brpc does not.
	CloseMarker bool
	// BootID is the sender's boot id, all zero when not sent: two peers with
	// the same one run on the same host, where the software provider can use
	// shared memory. Only our own peers send it.
	BootID [BootIDLen]byte
	// SocketEID is the EID at which the sender's device is also reached
	// over the software provider's socket fabric, zero when not sent: a
	// peer on another host that also runs both fabrics imports the
	// sender's jetty and segment there instead of falling back to TCP.
	// Only our own peers send it, and only with a boot id.
	SocketEID urma.EID
}

// HasBootID reports whether the sender said which host (and boot) it runs on.
func (h *Hello) HasBootID() bool { return h.BootID != [BootIDLen]byte{} }

// HasSocketEID reports whether the sender offers a socket-fabric EID. It
// goes on the wire only after a boot id, and counts only with one.
func (h *Hello) HasSocketEID() bool { return h.HasBootID() && !h.SocketEID.IsZero() }

// hasExt reports whether h carries anything only our extension holds.
func (h *Hello) hasExt() bool { return h.HasToken || h.SQSize != 0 || h.CloseMarker || h.HasBootID() }

// HasExtension reports whether the sender is one of ours: its hello carries
// our extension (we always send the SQ depth). A hello without it is from
// brpc, which presents no token, ends with a plain FIN, and returns credits
// by its own threshold rule.
func (h *Hello) HasExtension() bool { return h.hasExt() }

// Validate applies brpc's ValidHello rules; it names the first rule broken.
func (h *Hello) Validate() error {
	switch {
	case h.BufferSize < MinBufferSize:
		return invalid("buffer_size %d is below %d", h.BufferSize, MinBufferSize)
	case h.RecvBufferCnt < MinRecvBufferCnt || h.RecvBufferCnt > MaxRecvBufferCnt:
		return invalid("recv_buffer_cnt %d is outside %d..%d", h.RecvBufferCnt, MinRecvBufferCnt, MaxRecvBufferCnt)
	case h.JettyID == 0:
		return invalid("jetty_id is 0")
	case h.TPType > TPUTP:
		return invalid("tp_type %d is above UTP (%d)", h.TPType, TPUTP)
	case h.SegLen == 0:
		return invalid("seg_len is 0")
	case h.SegVA == 0:
		return invalid("seg_va is 0")
	}
	return nil
}

// AppendV2 appends h as a v2 packet. With a token or an SQ size the packet
// grows by our extension block and msg_len says so.
func AppendV2(dst []byte, h Hello) []byte {
	msgLen := V2PacketLen
	if h.hasExt() {
		msgLen += V2ExtLen
	}
	if h.HasBootID() {
		msgLen += V2HostLen
	}
	if h.HasSocketEID() {
		msgLen += V2SocketLen
	}
	dst = append(dst, MagicV2...)
	dst = binary.BigEndian.AppendUint16(dst, uint16(msgLen))
	dst = binary.BigEndian.AppendUint16(dst, V2HelloVersion)
	dst = binary.BigEndian.AppendUint16(dst, V2ImplVersion)
	dst = appendV2Fields(dst, &h)
	if h.hasExt() {
		var flags uint32
		if h.HasToken {
			flags |= v2ExtHasToken
		}
		if h.CloseMarker {
			flags |= v2ExtCloseMarker
		}
		dst = append(dst, V2ExtTag...)
		dst = binary.BigEndian.AppendUint32(dst, h.Token)
		dst = binary.BigEndian.AppendUint32(dst, h.SQSize)
		dst = binary.BigEndian.AppendUint32(dst, flags)
	}
	if h.HasBootID() {
		dst = append(dst, V2HostTag...)
		dst = append(dst, h.BootID[:]...)
	}
	if h.HasSocketEID() {
		dst = append(dst, V2SocketTag...)
		dst = append(dst, h.SocketEID[:]...)
	}
	return dst
}

// AppendV2Fallback appends the v2 hello a server sends when it will not use
// URMA: versions, jetty id and buffer size zero, as brpc's server does, so
// the client's checks fail and it falls back. It is exactly 86 bytes: a brpc
// client does not drain the extra bytes of a hello it rejects.
func AppendV2Fallback(dst []byte) []byte {
	dst = append(dst, MagicV2...)
	dst = binary.BigEndian.AppendUint16(dst, V2PacketLen)
	return append(dst, make([]byte, V2BodyLen-2)...)
}

func appendV2Fields(dst []byte, h *Hello) []byte {
	dst = binary.BigEndian.AppendUint32(dst, h.BufferSize)
	dst = binary.BigEndian.AppendUint32(dst, h.RecvBufferCnt)
	dst = binary.BigEndian.AppendUint32(dst, h.JettyID)
	dst = append(dst, h.EID[:]...)
	dst = binary.BigEndian.AppendUint32(dst, h.UASID)
	dst = append(dst, h.TPType, 0, 0, 0)
	dst = append(dst, h.SegEID[:]...)
	dst = binary.BigEndian.AppendUint32(dst, h.SegUASID)
	dst = binary.BigEndian.AppendUint64(dst, h.SegVA)
	dst = binary.BigEndian.AppendUint64(dst, h.SegLen)
	return binary.BigEndian.AppendUint32(dst, h.SegTokenID)
}

// v2Header is what the fixed body says about the packet itself.
type v2Header struct {
	msgLen, helloVer, implVer uint16
}

// decodeV2Body decodes the 82 bytes after the magic.
func decodeV2Body(body []byte) (v2Header, Hello) {
	be := binary.BigEndian
	var hdr v2Header
	var h Hello
	hdr.msgLen = be.Uint16(body[0:])
	hdr.helloVer = be.Uint16(body[2:])
	hdr.implVer = be.Uint16(body[4:])
	h.BufferSize = be.Uint32(body[6:])
	h.RecvBufferCnt = be.Uint32(body[10:])
	h.JettyID = be.Uint32(body[14:])
	copy(h.EID[:], body[18:34])
	h.UASID = be.Uint32(body[34:])
	h.TPType = body[38]
	// body[39:42] is padding.
	copy(h.SegEID[:], body[42:58])
	h.SegUASID = be.Uint32(body[58:])
	h.SegVA = be.Uint64(body[62:])
	h.SegLen = be.Uint64(body[70:])
	h.SegTokenID = be.Uint32(body[78:])
	return hdr, h
}

// checkV2Header applies brpc's length and version checks.
func checkV2Header(hdr v2Header) error {
	switch {
	case hdr.msgLen < V2PacketLen || hdr.msgLen > V2MaxMsgLen:
		return invalid("v2 msg_len %d is outside %d..%d", hdr.msgLen, V2PacketLen, V2MaxMsgLen)
	case hdr.helloVer != V2HelloVersion:
		return invalid("v2 hello_ver is %d, want %d", hdr.helloVer, V2HelloVersion)
	case hdr.implVer != V2ImplVersion:
		return invalid("v2 impl_ver is %d, want %d", hdr.implVer, V2ImplVersion)
	}
	return nil
}

// decodeV2Ext reads our extension from the bytes after the fixed 86;
// anything else there is some other implementation's extension and is
// ignored.
func decodeV2Ext(h *Hello, ext []byte) {
	if len(ext) < V2ExtLen || string(ext[:MagicLen]) != V2ExtTag {
		return
	}
	be := binary.BigEndian
	flags := be.Uint32(ext[12:])
	h.SQSize = be.Uint32(ext[8:])
	if flags&v2ExtHasToken != 0 {
		h.Token, h.HasToken = be.Uint32(ext[4:]), true
	}
	h.CloseMarker = flags&v2ExtCloseMarker != 0
	host := ext[V2ExtLen:]
	if len(host) < V2HostLen || string(host[:MagicLen]) != V2HostTag {
		return
	}
	copy(h.BootID[:], host[MagicLen:V2HostLen])
	if sock := host[V2HostLen:]; len(sock) >= V2SocketLen && string(sock[:MagicLen]) == V2SocketTag {
		copy(h.SocketEID[:], sock[MagicLen:V2SocketLen])
	}
}

// ParseV2 parses a complete v2 packet, magic included, whose length is
// exactly its msg_len. It validates the hello.
func ParseV2(packet []byte) (Hello, error) {
	if len(packet) < V2PacketLen {
		return Hello{}, invalid("v2 packet is %d bytes, want at least %d", len(packet), V2PacketLen)
	}
	if string(packet[:MagicLen]) != MagicV2 {
		return Hello{}, invalid("v2 magic is %q, want %q", packet[:MagicLen], MagicV2)
	}
	hdr, h := decodeV2Body(packet[MagicLen:V2PacketLen])
	if err := checkV2Header(hdr); err != nil {
		return Hello{}, err
	}
	if int(hdr.msgLen) != len(packet) {
		return Hello{}, invalid("v2 msg_len %d does not match the %d bytes given", hdr.msgLen, len(packet))
	}
	decodeV2Ext(&h, packet[V2PacketLen:])
	if err := h.Validate(); err != nil {
		return Hello{}, err
	}
	return h, nil
}
