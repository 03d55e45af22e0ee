package soft

import (
	"encoding/binary"
	"fmt"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Frames of the socket fabric. Every frame is a big-endian u32 body length,
// then the body, whose first byte is the frame type. Reserved bytes are zero.
// Control frames have one exact length; a SEND carries its payload after a
// fixed header and is at most sendHdrLen + the receiving device's
// MaxMsgSize. Anything else is a protocol error that closes the connection.
// docs/software-provider.md has the byte layouts.
const (
	frameHello       = 1  // dialer's first frame
	frameHelloAck    = 2  // acceptor's answer
	frameSend        = 3  // a message for a jetty
	frameAck         = 4  // the answer to a SEND
	frameCancel      = 5  // forget the RNR block a SEND left
	frameImportJetty = 6  // may I import this jetty with this token?
	frameImportSeg   = 7  // may I import this segment with this token?
	frameImportResp  = 8  // the answer to an import
	framePing        = 9  // heartbeat on an idle connection
	frameAckRun      = 10 // the answer SUCCESS to consecutive SENDs of one sender jetty
	frameSendRef     = 11 // shm fabric: a SEND whose payload the receiver copies from the sender's memory
)

// Body lengths (after the 4-byte length prefix).
const (
	helloLen       = 56
	helloAckLen    = 40
	sendHdrLen     = 36
	ackLen         = 20
	cancelLen      = 20
	importJettyLen = 16
	importSegLen   = 36
	importRespLen  = 12
	pingLen        = 4
	ackRunLen      = 24
	sendRefLen     = 16              // one payload reference of a SEND_REF
	maxCtlFrame    = 4 + helloAckLen // the largest frame a txItem carries whole
)

const (
	// protoVersion 2 added ACK_RUN; a peer speaking 1 is refused at HELLO.
	protoVersion = 2
	protoMagic   = "SRMA"
)

// HELLO_ACK statuses.
const (
	helloOK        = 0
	helloDuplicate = 1 // a connection dialed the other way wins; use that one
	helloWrongEID  = 2 // the acceptor is not the device the dialer asked for
	// helloConnLimit: the acceptor holds as many connections as it takes
	// (Options.MaxConns); both fabrics, past the shm fabric's own (shmmsg.go).
	helloConnLimit = 6
)

// SEND flags.
const (
	sendFlagSolicited = 1 << 0
	sendFlagResume    = 1 << 1 // retransmission of the send an RNR block waits for
	sendFlagsKnown    = sendFlagSolicited | sendFlagResume
)

// fixedLen is a frame type's body length (the header part for SEND); 0 for
// an unknown type.
func fixedLen(typ byte) uint32 {
	switch typ {
	case frameHello:
		return helloLen
	case frameHelloAck:
		return helloAckLen
	case frameSend:
		return sendHdrLen
	case frameAck:
		return ackLen
	case frameCancel:
		return cancelLen
	case frameImportJetty:
		return importJettyLen
	case frameImportSeg:
		return importSegLen
	case frameImportResp:
		return importRespLen
	case framePing:
		return pingLen
	case frameAckRun:
		return ackRunLen
	case frameSendRef:
		return sendHdrLen // then the references; see checkFrame
	}
	return 0
}

// checkFrame validates a frame's type and body length before anything is
// read past the type byte; maxMsg is the receiving device's MaxMsgSize.
func checkFrame(typ byte, bodyLen uint32, maxMsg uint64) error {
	fl := fixedLen(typ)
	switch {
	case fl == 0:
		return fmt.Errorf("unknown frame type %d", typ)
	case typ == frameSend && (bodyLen < fl || uint64(bodyLen-fl) > maxMsg):
		return fmt.Errorf("SEND frame of %d bytes: payload outside 0..%d", bodyLen, maxMsg)
	case typ == frameSendRef && (bodyLen < fl+sendRefLen || bodyLen > fl+MaxSGE*sendRefLen || (bodyLen-fl)%sendRefLen != 0):
		return fmt.Errorf("SEND_REF frame of %d bytes: not 1..%d references", bodyLen, MaxSGE)
	case typ != frameSend && typ != frameSendRef && bodyLen != fl:
		return fmt.Errorf("frame type %d of %d bytes, want %d", typ, bodyLen, fl)
	}
	return nil
}

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

var be = binary.BigEndian

// hello is the handshake frame.
type hello struct {
	session uint64
	src     urma.EID
	dst     urma.EID
	maxMsg  uint64
}

func encodeHello(b []byte, h *hello) []byte {
	be.PutUint32(b[0:], helloLen)
	body := b[4 : 4+helloLen]
	clear(body)
	body[0], body[1] = frameHello, protoVersion
	copy(body[4:8], protoMagic)
	be.PutUint64(body[8:], h.session)
	copy(body[16:32], h.src[:])
	copy(body[32:48], h.dst[:])
	be.PutUint64(body[48:], h.maxMsg)
	return b[:4+helloLen]
}

// decodeHello parses a whole HELLO frame, length prefix included.
func decodeHello(b []byte) (hello, error) {
	var h hello
	if len(b) != 4+helloLen || be.Uint32(b) != helloLen {
		return h, fmt.Errorf("HELLO of %d bytes, want %d", len(b), 4+helloLen)
	}
	body := b[4:]
	switch {
	case body[0] != frameHello:
		return h, fmt.Errorf("first frame has type %d, want HELLO", body[0])
	case string(body[4:8]) != protoMagic:
		return h, fmt.Errorf("HELLO magic %q, want %q", body[4:8], protoMagic)
	case body[1] != protoVersion:
		return h, fmt.Errorf("protocol version %d, this side speaks %d", body[1], protoVersion)
	case !zero(body[2:4]):
		return h, fmt.Errorf("HELLO reserved bytes are not zero")
	}
	h.session = be.Uint64(body[8:])
	h.src = urma.EID(body[16:32])
	h.dst = urma.EID(body[32:48])
	h.maxMsg = be.Uint64(body[48:])
	if h.src.IsZero() {
		return h, fmt.Errorf("HELLO from a zero EID")
	}
	return h, nil
}

type helloAck struct {
	status  uint8
	session uint64
	eid     urma.EID
	maxMsg  uint64
}

func encodeHelloAck(b []byte, a *helloAck) []byte {
	be.PutUint32(b[0:], helloAckLen)
	body := b[4 : 4+helloAckLen]
	clear(body)
	body[0], body[1] = frameHelloAck, a.status
	copy(body[4:8], protoMagic)
	be.PutUint64(body[8:], a.session)
	copy(body[16:32], a.eid[:])
	be.PutUint64(body[32:], a.maxMsg)
	return b[:4+helloAckLen]
}

func decodeHelloAck(b []byte) (helloAck, error) {
	var a helloAck
	if len(b) != 4+helloAckLen || be.Uint32(b) != helloAckLen {
		return a, fmt.Errorf("HELLO_ACK of %d bytes, want %d", len(b), 4+helloAckLen)
	}
	body := b[4:]
	switch {
	case body[0] != frameHelloAck:
		return a, fmt.Errorf("answer to HELLO has type %d", body[0])
	case string(body[4:8]) != protoMagic:
		return a, fmt.Errorf("HELLO_ACK magic %q, want %q", body[4:8], protoMagic)
	case body[1] > helloWrongEID && body[1] != helloConnLimit && body[1] != helloRefused:
		return a, fmt.Errorf("HELLO_ACK status %d unknown", body[1])
	case !zero(body[2:4]):
		return a, fmt.Errorf("HELLO_ACK reserved bytes are not zero")
	}
	a.status = body[1]
	a.session = be.Uint64(body[8:])
	a.eid = urma.EID(body[16:32])
	a.maxMsg = be.Uint64(body[32:])
	return a, nil
}

// sendHeader is a SEND frame's fixed part; length is the payload size.
type sendHeader struct {
	flags    uint8
	opcode   urma.Opcode
	src      uint32 // sender's jetty
	srcUASID uint32
	dst      uint32 // target jetty
	token    uint32
	tag      uint64 // sender jetty instance << 32 | sequence; echoed by the ACK
	imm      uint64
	length   uint32
}

func encodeSendHeader(b []byte, h *sendHeader) []byte {
	be.PutUint32(b[0:], sendHdrLen+h.length)
	body := b[4 : 4+sendHdrLen]
	body[0], body[1], body[2], body[3] = frameSend, h.flags, byte(h.opcode), 0
	be.PutUint32(body[4:], h.src)
	be.PutUint32(body[8:], h.srcUASID)
	be.PutUint32(body[12:], h.dst)
	be.PutUint32(body[16:], h.token)
	be.PutUint64(body[20:], h.tag)
	be.PutUint64(body[28:], h.imm)
	return b[:4+sendHdrLen]
}

// decodeSendHeader parses a SEND body's fixed part.
func decodeSendHeader(body []byte, bodyLen uint32, h *sendHeader) error {
	*h = sendHeader{
		flags:    body[1],
		opcode:   urma.Opcode(body[2]),
		src:      be.Uint32(body[4:]),
		srcUASID: be.Uint32(body[8:]),
		dst:      be.Uint32(body[12:]),
		token:    be.Uint32(body[16:]),
		tag:      be.Uint64(body[20:]),
		imm:      be.Uint64(body[28:]),
		length:   bodyLen - sendHdrLen,
	}
	switch {
	case h.flags&^sendFlagsKnown != 0:
		return fmt.Errorf("SEND flags %#x unknown", h.flags)
	case h.opcode != urma.OpSend && h.opcode != urma.OpSendWithImm:
		return fmt.Errorf("SEND opcode %#x unknown", uint8(h.opcode))
	case body[3] != 0:
		return fmt.Errorf("SEND reserved byte is not zero")
	}
	return nil
}

// ackFrame answers a SEND; status is a completion status or statusRNR.
type ackFrame struct {
	status   urma.Status
	rnrTimer uint8
	src      uint32 // the sender's jetty, to which the answer goes
	dst      uint32
	tag      uint64
}

func encodeAck(b []byte, a *ackFrame) []byte {
	be.PutUint32(b[0:], ackLen)
	body := b[4 : 4+ackLen]
	body[0], body[1], body[2], body[3] = frameAck, byte(a.status), a.rnrTimer, 0
	be.PutUint32(body[4:], a.src)
	be.PutUint32(body[8:], a.dst)
	be.PutUint64(body[12:], a.tag)
	return b[:4+ackLen]
}

func decodeAck(body []byte) (ackFrame, error) {
	a := ackFrame{
		status: urma.Status(body[1]), rnrTimer: body[2],
		src: be.Uint32(body[4:]), dst: be.Uint32(body[8:]), tag: be.Uint64(body[12:]),
	}
	switch a.status {
	case urma.StatusSuccess, urma.StatusRemAccessAbort, urma.StatusRemOperation, statusRNR:
	default:
		return a, fmt.Errorf("ACK status %d not allowed", a.status)
	}
	if body[3] != 0 || a.rnrTimer > 31 {
		return a, fmt.Errorf("ACK reserved byte or RNR timer %d out of range", a.rnrTimer)
	}
	return a, nil
}

// maxFrameHdr is the longest part of a frame the reader copies out: a
// SEND_REF with every reference.
const maxFrameHdr = 4 + sendHdrLen + MaxSGE*sendRefLen

// payloadRef names payload bytes in memory the sender shared (shm fabric):
// length bytes at offset of the segment the sender calls handle.
type payloadRef struct {
	handle uint32
	length uint32
	offset uint64
}

// encodeSendRef encodes a SEND_REF: h as a SEND's header (length is the
// references' total), then the references.
func encodeSendRef(b []byte, h *sendHeader, refs []payloadRef) []byte {
	encodeSendHeader(b, h)
	n := sendHdrLen + len(refs)*sendRefLen
	be.PutUint32(b[0:], uint32(n))
	b[4], b[7] = frameSendRef, byte(len(refs))
	p := b[4+sendHdrLen:]
	for i, r := range refs {
		be.PutUint32(p[i*sendRefLen:], r.handle)
		be.PutUint32(p[i*sendRefLen+4:], r.length)
		be.PutUint64(p[i*sendRefLen+8:], r.offset)
	}
	return b[:4+n]
}

// decodeSendRef parses a SEND_REF body (checkFrame passed its length) into
// its header and references; h.length is their total.
func decodeSendRef(body []byte, maxMsg uint64, h *sendHeader, refs *[MaxSGE]payloadRef) (int, error) {
	n := int(body[3])
	if len(body) != sendHdrLen+n*sendRefLen {
		return 0, fmt.Errorf("SEND_REF says %d references in %d bytes", n, len(body))
	}
	hdr := [sendHdrLen]byte(body[:sendHdrLen])
	hdr[0], hdr[3] = frameSend, 0
	if err := decodeSendHeader(hdr[:], sendHdrLen, h); err != nil {
		return 0, err
	}
	var total uint64
	for i := 0; i < n; i++ {
		p := body[sendHdrLen+i*sendRefLen:]
		refs[i] = payloadRef{handle: be.Uint32(p), length: be.Uint32(p[4:]), offset: be.Uint64(p[8:])}
		total += uint64(refs[i].length)
	}
	if total > maxMsg {
		return 0, fmt.Errorf("SEND_REF of %d bytes, more than %d", total, maxMsg)
	}
	h.length = uint32(total)
	return n, nil
}

// maxAckRun bounds an ACK_RUN's count, so a peer cannot make the sender
// walk an unbounded loop; no send queue is deeper.
const maxAckRun = 1 << 20

// ackRunFrame answers SUCCESS to count SENDs of one sender jetty whose
// sequence numbers follow each other, starting at tag's. One frame instead
// of count ACKs: the answers to a stream cost next to nothing.
type ackRunFrame struct {
	src, dst uint32
	tag      uint64
	count    uint32
}

func encodeAckRun(b []byte, a *ackRunFrame) []byte {
	be.PutUint32(b[0:], ackRunLen)
	body := b[4 : 4+ackRunLen]
	clear(body[:4])
	body[0] = frameAckRun
	be.PutUint32(body[4:], a.src)
	be.PutUint32(body[8:], a.dst)
	be.PutUint64(body[12:], a.tag)
	be.PutUint32(body[20:], a.count)
	return b[:4+ackRunLen]
}

func decodeAckRun(body []byte) (ackRunFrame, error) {
	a := ackRunFrame{src: be.Uint32(body[4:]), dst: be.Uint32(body[8:]), tag: be.Uint64(body[12:]), count: be.Uint32(body[20:])}
	switch {
	case !zero(body[1:4]):
		return a, fmt.Errorf("ACK_RUN reserved bytes are not zero")
	case a.count < 2 || a.count > maxAckRun:
		return a, fmt.Errorf("ACK_RUN count %d outside 2..%d", a.count, maxAckRun)
	}
	return a, nil
}

// cancelFrame drops the RNR block the SEND tagged tag left at jetty dst.
type cancelFrame struct {
	src, dst uint32
	tag      uint64
}

func encodeCancel(b []byte, c *cancelFrame) []byte {
	be.PutUint32(b[0:], cancelLen)
	body := b[4 : 4+cancelLen]
	clear(body[:4])
	body[0] = frameCancel
	be.PutUint32(body[4:], c.src)
	be.PutUint32(body[8:], c.dst)
	be.PutUint64(body[12:], c.tag)
	return b[:4+cancelLen]
}

func decodeCancel(body []byte) (cancelFrame, error) {
	if !zero(body[1:4]) {
		return cancelFrame{}, fmt.Errorf("CANCEL reserved bytes are not zero")
	}
	return cancelFrame{src: be.Uint32(body[4:]), dst: be.Uint32(body[8:]), tag: be.Uint64(body[12:])}, nil
}

type importJettyReq struct {
	mode  urma.TransportMode
	req   uint32
	jetty uint32
	token uint32
}

func encodeImportJetty(b []byte, r *importJettyReq) []byte {
	be.PutUint32(b[0:], importJettyLen)
	body := b[4 : 4+importJettyLen]
	body[0], body[1], body[2], body[3] = frameImportJetty, byte(r.mode), 0, 0
	be.PutUint32(body[4:], r.req)
	be.PutUint32(body[8:], r.jetty)
	be.PutUint32(body[12:], r.token)
	return b[:4+importJettyLen]
}

func decodeImportJetty(body []byte) (importJettyReq, error) {
	r := importJettyReq{mode: urma.TransportMode(body[1]), req: be.Uint32(body[4:]), jetty: be.Uint32(body[8:]), token: be.Uint32(body[12:])}
	if !zero(body[2:4]) || (r.mode != urma.RC && r.mode != urma.RM) {
		return r, fmt.Errorf("IMPORT_JETTY mode %d or reserved bytes invalid", r.mode)
	}
	return r, nil
}

type importSegReq struct {
	req     uint32
	uasid   uint32
	tokenID uint32
	va, len uint64
	token   uint32
}

func encodeImportSeg(b []byte, r *importSegReq) []byte {
	be.PutUint32(b[0:], importSegLen)
	body := b[4 : 4+importSegLen]
	clear(body[:4])
	body[0] = frameImportSeg
	be.PutUint32(body[4:], r.req)
	be.PutUint32(body[8:], r.uasid)
	be.PutUint32(body[12:], r.tokenID)
	be.PutUint64(body[16:], r.va)
	be.PutUint64(body[24:], r.len)
	be.PutUint32(body[32:], r.token)
	return b[:4+importSegLen]
}

func decodeImportSeg(body []byte) (importSegReq, error) {
	if !zero(body[1:4]) {
		return importSegReq{}, fmt.Errorf("IMPORT_SEG reserved bytes are not zero")
	}
	return importSegReq{
		req: be.Uint32(body[4:]), uasid: be.Uint32(body[8:]), tokenID: be.Uint32(body[12:]),
		va: be.Uint64(body[16:]), len: be.Uint64(body[24:]), token: be.Uint32(body[32:]),
	}, nil
}

func encodeImportResp(b []byte, req uint32, code urma.Code) []byte {
	be.PutUint32(b[0:], importRespLen)
	body := b[4 : 4+importRespLen]
	clear(body[:4])
	body[0] = frameImportResp
	be.PutUint32(body[4:], req)
	be.PutUint32(body[8:], uint32(code))
	return b[:4+importRespLen]
}

func decodeImportResp(body []byte) (req uint32, code urma.Code, err error) {
	if !zero(body[1:4]) {
		return 0, 0, fmt.Errorf("IMPORT_RESP reserved bytes are not zero")
	}
	code = urma.Code(be.Uint32(body[8:]))
	switch code {
	case urma.CodeSuccess, urma.CodeNoEnt, urma.CodeAccess, urma.CodeInval, urma.CodeConnRefused:
	default:
		return 0, 0, fmt.Errorf("IMPORT_RESP code %d not allowed", code)
	}
	return be.Uint32(body[4:]), code, nil
}

func encodePing(b []byte) []byte {
	be.PutUint32(b[0:], pingLen)
	clear(b[4 : 4+pingLen])
	b[4] = framePing
	return b[:4+pingLen]
}
