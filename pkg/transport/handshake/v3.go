package handshake

import (
	"encoding/binary"

	"google.golang.org/protobuf/encoding/protowire"
)

// UrmaHello field numbers (urma_handshake.proto). 1..11 are brpc's.
const (
	fieldBufferSize    protowire.Number = 1
	fieldRecvBufferCnt protowire.Number = 2
	fieldJettyID       protowire.Number = 3
	fieldEID           protowire.Number = 4
	fieldUASID         protowire.Number = 5
	fieldTPType        protowire.Number = 6
	fieldSegEID        protowire.Number = 7
	fieldSegUASID      protowire.Number = 8
	fieldSegVA         protowire.Number = 9
	fieldSegLen        protowire.Number = 10
	fieldSegTokenID    protowire.Number = 11
	// fieldToken, fieldSQSize and fieldCloseMarker are ours; brpc keeps
	// them as unknown fields.
	fieldToken       protowire.Number = 100
	fieldSQSize      protowire.Number = 101
	fieldCloseMarker protowire.Number = 102
	fieldBootID      protowire.Number = 103
	fieldSocketEID   protowire.Number = 104
)

// requiredFields are brpc's proto2 required fields, in field-number order.
var requiredFields = [...]struct {
	num  protowire.Number
	name string
}{
	{fieldBufferSize, "buffer_size"}, {fieldRecvBufferCnt, "recv_buffer_cnt"},
	{fieldJettyID, "jetty_id"}, {fieldEID, "eid"}, {fieldUASID, "uasid"},
	{fieldTPType, "tp_type"}, {fieldSegEID, "seg_eid"}, {fieldSegUASID, "seg_uasid"},
	{fieldSegVA, "seg_va"}, {fieldSegLen, "seg_len"}, {fieldSegTokenID, "seg_token_id"},
}

// MarshalV3Body encodes h as a UrmaHello protobuf message, every required
// field present, in field-number order as protoc-generated code writes it.
func MarshalV3Body(dst []byte, h Hello) []byte {
	u32 := func(b []byte, n protowire.Number, v uint32) []byte {
		b = protowire.AppendTag(b, n, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(v))
	}
	u64 := func(b []byte, n protowire.Number, v uint64) []byte {
		b = protowire.AppendTag(b, n, protowire.VarintType)
		return protowire.AppendVarint(b, v)
	}
	raw := func(b []byte, n protowire.Number, v []byte) []byte {
		b = protowire.AppendTag(b, n, protowire.BytesType)
		return protowire.AppendBytes(b, v)
	}
	dst = u32(dst, fieldBufferSize, h.BufferSize)
	dst = u32(dst, fieldRecvBufferCnt, h.RecvBufferCnt)
	dst = u32(dst, fieldJettyID, h.JettyID)
	dst = raw(dst, fieldEID, h.EID[:])
	dst = u32(dst, fieldUASID, h.UASID)
	dst = u32(dst, fieldTPType, uint32(h.TPType))
	dst = raw(dst, fieldSegEID, h.SegEID[:])
	dst = u32(dst, fieldSegUASID, h.SegUASID)
	dst = u64(dst, fieldSegVA, h.SegVA)
	dst = u64(dst, fieldSegLen, h.SegLen)
	dst = u32(dst, fieldSegTokenID, h.SegTokenID)
	if h.HasToken {
		dst = u32(dst, fieldToken, h.Token)
	}
	if h.SQSize != 0 {
		dst = u32(dst, fieldSQSize, h.SQSize)
	}
	if h.CloseMarker {
		dst = u32(dst, fieldCloseMarker, 1)
	}
	if h.HasBootID() {
		dst = raw(dst, fieldBootID, h.BootID[:])
	}
	if h.HasSocketEID() {
		dst = raw(dst, fieldSocketEID, h.SocketEID[:])
	}
	return dst
}

// AppendV3 appends h as a v3 packet: magic, big-endian body length, body.
func AppendV3(dst []byte, h Hello) []byte {
	dst = append(dst, MagicV3...)
	lenAt := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = MarshalV3Body(dst, h)
	binary.BigEndian.PutUint32(dst[lenAt:], uint32(len(dst)-lenAt-4))
	return dst
}

// AppendV3Fallback appends the v3 hello a server sends when it will not use
// URMA: every field zero (EIDs 16 zero bytes), which parses but fails
// validation (jetty_id 0), as brpc's v3 client expects.
func AppendV3Fallback(dst []byte) []byte {
	return AppendV3(dst, Hello{})
}

// UnmarshalV3Body decodes a UrmaHello body without validating it. It fails,
// as brpc's ParseFromArray does, on malformed protobuf, a missing required
// field, or an EID that is not 16 bytes. A known field with an unexpected
// wire type is skipped like an unknown one (protobuf's rule), which then
// usually leaves a required field missing. The error is ErrInvalidHello.
func UnmarshalV3Body(body []byte) (Hello, error) {
	var h Hello
	var seen uint32 // bit n set: field n seen, for n <= 11
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 {
			return Hello{}, invalid("v3 body: bad field tag: %v", protowire.ParseError(n))
		}
		body = body[n:]
		switch {
		case typ == protowire.VarintType && isVarintField(num):
			v, m := protowire.ConsumeVarint(body)
			if m < 0 {
				return Hello{}, invalid("v3 body: field %d: %v", num, protowire.ParseError(m))
			}
			body = body[m:]
			setVarint(&h, num, v)
		case typ == protowire.BytesType && (num == fieldEID || num == fieldSegEID || num == fieldSocketEID):
			v, m := protowire.ConsumeBytes(body)
			if m < 0 {
				return Hello{}, invalid("v3 body: field %d: %v", num, protowire.ParseError(m))
			}
			body = body[m:]
			if len(v) != len(h.EID) {
				return Hello{}, invalid("v3 body: field %d holds %d bytes, an EID is 16", num, len(v))
			}
			switch num {
			case fieldEID:
				copy(h.EID[:], v)
			case fieldSegEID:
				copy(h.SegEID[:], v)
			default:
				copy(h.SocketEID[:], v)
			}
		case typ == protowire.BytesType && num == fieldBootID:
			v, m := protowire.ConsumeBytes(body)
			if m < 0 {
				return Hello{}, invalid("v3 body: field %d: %v", num, protowire.ParseError(m))
			}
			body = body[m:]
			if len(v) != BootIDLen {
				return Hello{}, invalid("v3 body: boot_id holds %d bytes, want %d", len(v), BootIDLen)
			}
			copy(h.BootID[:], v)
		default:
			m := protowire.ConsumeFieldValue(num, typ, body)
			if m < 0 {
				return Hello{}, invalid("v3 body: field %d: %v", num, protowire.ParseError(m))
			}
			body = body[m:]
			continue
		}
		if num <= fieldSegTokenID {
			seen |= 1 << uint(num)
		}
	}
	for _, f := range requiredFields {
		if seen&(1<<uint(f.num)) == 0 {
			return Hello{}, invalid("v3 body: required field %s (%d) is missing", f.name, f.num)
		}
	}
	return h, nil
}

func isVarintField(num protowire.Number) bool {
	switch num {
	case fieldBufferSize, fieldRecvBufferCnt, fieldJettyID, fieldUASID, fieldTPType,
		fieldSegUASID, fieldSegVA, fieldSegLen, fieldSegTokenID, fieldToken, fieldSQSize, fieldCloseMarker:
		return true
	}
	return false
}

// setVarint stores a varint field; uint32 fields keep the low 32 bits, as
// protobuf does.
func setVarint(h *Hello, num protowire.Number, v uint64) {
	switch num {
	case fieldBufferSize:
		h.BufferSize = uint32(v)
	case fieldRecvBufferCnt:
		h.RecvBufferCnt = uint32(v)
	case fieldJettyID:
		h.JettyID = uint32(v)
	case fieldUASID:
		h.UASID = uint32(v)
	case fieldTPType:
		// tp_type is a uint32 on the wire; anything above 255 must still
		// fail the tp_type rule, so clamp instead of truncating.
		if v > 0xff {
			v = 0xff
		}
		h.TPType = uint8(v)
	case fieldSegUASID:
		h.SegUASID = uint32(v)
	case fieldSegVA:
		h.SegVA = v
	case fieldSegLen:
		h.SegLen = v
	case fieldSegTokenID:
		h.SegTokenID = uint32(v)
	case fieldToken:
		h.Token = uint32(v)
		h.HasToken = true
	case fieldSQSize:
		h.SQSize = uint32(v)
	case fieldCloseMarker:
		h.CloseMarker = v != 0
	}
}

// ParseV3 parses a complete v3 packet, magic and length included, and
// validates the hello.
func ParseV3(packet []byte) (Hello, error) {
	if len(packet) < MagicLen+4 {
		return Hello{}, invalid("v3 packet is %d bytes, want at least %d", len(packet), MagicLen+4)
	}
	if string(packet[:MagicLen]) != MagicV3 {
		return Hello{}, invalid("v3 magic is %q, want %q", packet[:MagicLen], MagicV3)
	}
	n := binary.BigEndian.Uint32(packet[MagicLen:])
	if err := checkV3Len(n); err != nil {
		return Hello{}, err
	}
	body := packet[MagicLen+4:]
	if uint32(len(body)) != n {
		return Hello{}, invalid("v3 length %d does not match the %d body bytes given", n, len(body))
	}
	h, err := UnmarshalV3Body(body)
	if err != nil {
		return Hello{}, err
	}
	if err := h.Validate(); err != nil {
		return Hello{}, err
	}
	return h, nil
}

func checkV3Len(n uint32) error {
	if n == 0 || n > V3MaxBodyLen {
		return invalid("v3 body length %d is outside 1..%d", n, V3MaxBodyLen)
	}
	return nil
}
