package handshake

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// sampleHello has a distinct value in every field so that a field written at
// the wrong offset shows up in the golden bytes.
func sampleHello() Hello {
	h := Hello{
		BufferSize:    8192,
		RecvBufferCnt: 127,
		JettyID:       0x01020304,
		UASID:         0x0a0b0c0d,
		TPType:        TPCTP,
		SegUASID:      0x11223344,
		SegVA:         0x00007f0000001000,
		SegLen:        0x0000000004000000,
		SegTokenID:    0xdeadbeef,
	}
	for i := range h.EID {
		h.EID[i] = byte(i)
		h.SegEID[i] = byte(0x10 + i)
	}
	return h
}

// goldenV2 is sampleHello as brpc's v2_wire::HelloMessage::Serialize lays it
// out, written out field by field from the offsets in urma_handshake.cpp.
const goldenV2 = "55524d41" + // "URMA"
	"0056" + // msg_len 86
	"0002" + // hello_ver
	"0001" + // impl_ver
	"00002000" + // buffer_size 8192
	"0000007f" + // recv_buffer_cnt 127
	"01020304" + // jetty_id
	"000102030405060708090a0b0c0d0e0f" + // eid
	"0a0b0c0d" + // uasid
	"01" + "000000" + // tp_type CTP, pad
	"101112131415161718191a1b1c1d1e1f" + // seg_eid
	"11223344" + // seg_uasid
	"00007f0000001000" + // seg_va
	"0000000004000000" + // seg_len
	"deadbeef" // seg_token_id

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestV2GoldenBytes(t *testing.T) {
	withToken := sampleHello()
	withToken.Token, withToken.HasToken = 0xcafef00d, true
	withToken.SQSize = 256
	// With our extension, msg_len grows to 102 and the block follows:
	// tag "K8ST", token, sq_size, flags (bit 0: token present).
	goldenWithToken := "55524d41" + "0066" + goldenV2[12:] + "4b385354" + "cafef00d" + "00000100" + "00000001"
	sqOnly := sampleHello()
	sqOnly.SQSize = 16
	goldenSQOnly := "55524d41" + "0066" + goldenV2[12:] + "4b385354" + "00000000" + "00000010" + "00000000"
	// Flag bit 1: the sender ends connections with a close marker.
	marker := sampleHello()
	marker.SQSize, marker.CloseMarker = 16, true
	goldenMarker := "55524d41" + "0066" + goldenV2[12:] + "4b385354" + "00000000" + "00000010" + "00000002"
	// The host block follows the extension block: tag "K8SH", boot id.
	host := marker
	host.BootID = [BootIDLen]byte{0xb0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xbf}
	goldenHost := "55524d41" + "007a" + goldenV2[12:] + "4b385354" + "00000000" + "00000010" + "00000002" +
		"4b385348" + "b00102030405060708090a0b0c0d0ebf"
	// The socket block follows the host block: tag "K8SE", the EID at which
	// the sender's device is also reached over the socket fabric.
	socket := host
	socket.SocketEID = urma.EID{0xfd, 0x75, 0x72, 0x6d, 0x61, 0x73, 1, 0, 0, 0, 0x1b, 0x58, 10, 244, 1, 7}
	goldenSocket := "55524d41" + "008e" + goldenV2[12:] + "4b385354" + "00000000" + "00000010" + "00000002" +
		"4b385348" + "b00102030405060708090a0b0c0d0ebf" + "4b385345" + "fd75726d617301000000" + "1b580af40107"

	tests := []struct {
		name   string
		hello  Hello
		golden string
		length int
	}{
		{"brpc layout", sampleHello(), goldenV2, V2PacketLen},
		{"with token extension", withToken, goldenWithToken, V2PacketLen + V2ExtLen},
		{"extension without token", sqOnly, goldenSQOnly, V2PacketLen + V2ExtLen},
		{"close marker", marker, goldenMarker, V2PacketLen + V2ExtLen},
		{"boot id", host, goldenHost, V2PacketLen + V2ExtLen + V2HostLen},
		{"socket EID", socket, goldenSocket, V2PacketLen + V2ExtLen + V2HostLen + V2SocketLen},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AppendV2(nil, tc.hello)
			want := mustHex(t, tc.golden)
			if !bytes.Equal(got, want) {
				t.Fatalf("AppendV2:\n got %x\nwant %x", got, want)
			}
			if len(got) != tc.length {
				t.Fatalf("packet is %d bytes, want %d", len(got), tc.length)
			}
			parsed, err := ParseV2(want)
			if err != nil {
				t.Fatalf("ParseV2(golden): %v", err)
			}
			if parsed != tc.hello {
				t.Fatalf("ParseV2(golden) = %+v, want %+v", parsed, tc.hello)
			}
		})
	}
}

// A block after the extension that is not the host block (another
// implementation's) leaves the boot id unset.
func TestV2ForeignBlockAfterExtension(t *testing.T) {
	h := sampleHello()
	h.SQSize = 16
	p := AppendV2(nil, h)
	p = append(p, "XXXX0123456789abcdef"...)
	binary.BigEndian.PutUint16(p[4:], uint16(len(p)))
	got, err := ParseV2(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.HasBootID() || got != h {
		t.Fatalf("parsed %+v, want %+v", got, h)
	}
}

// A socket EID goes on the wire only after a boot id, and a block after
// the host block that is not the socket block leaves it unset.
func TestV2SocketEIDNeedsTheHostBlock(t *testing.T) {
	h := sampleHello()
	h.SQSize = 16
	h.SocketEID[0] = 0xfd
	if got, want := len(AppendV2(nil, h)), V2PacketLen+V2ExtLen; got != want {
		t.Fatalf("a socket EID without a boot id: %d bytes, want %d (no host or socket block)", got, want)
	}
	if got := len(AppendV3(nil, h)); got != len(AppendV3(nil, sampleHelloSQ(16))) {
		t.Fatalf("v3: a socket EID without a boot id went on the wire (%d bytes)", got)
	}
	h.BootID[0] = 1
	p := AppendV2(nil, h)
	p = append(p[:len(p)-V2SocketLen], "XXXX0123456789abcdef"...)
	got, err := ParseV2(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.HasSocketEID() || !got.HasBootID() {
		t.Fatalf("a foreign block after the host block: parsed %+v", got)
	}
}

func sampleHelloSQ(sq uint32) Hello {
	h := sampleHello()
	h.SQSize = sq
	return h
}

func TestV2FallbackHelloIsRejectedByVersion(t *testing.T) {
	b := AppendV2Fallback(nil)
	if len(b) != V2PacketLen {
		t.Fatalf("fallback hello is %d bytes, want %d", len(b), V2PacketLen)
	}
	if got := binary.BigEndian.Uint16(b[4:]); got != V2PacketLen {
		t.Fatalf("fallback msg_len = %d, want %d", got, V2PacketLen)
	}
	_, err := ParseV2(b)
	if !errors.Is(err, ErrInvalidHello) || !strings.Contains(err.Error(), "hello_ver is 0") {
		t.Fatalf("ParseV2(fallback) error = %v, want invalid hello_ver", err)
	}
}

func TestV3FallbackHelloParsesButIsInvalid(t *testing.T) {
	b := AppendV3Fallback(nil)
	h, err := UnmarshalV3Body(b[8:])
	if err != nil {
		t.Fatalf("fallback body must parse like brpc's (all required fields present): %v", err)
	}
	if err := h.Validate(); !errors.Is(err, ErrInvalidHello) {
		t.Fatalf("fallback hello validates: %v", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Hello)
		wantErr string // "" = valid
	}{
		{"valid", func(*Hello) {}, ""},
		{"buffer size at minimum", func(h *Hello) { h.BufferSize = 1024 }, ""},
		{"buffer size below minimum", func(h *Hello) { h.BufferSize = 1023 }, "buffer_size 1023"},
		{"recv count at minimum", func(h *Hello) { h.RecvBufferCnt = 3 }, ""},
		{"recv count below minimum", func(h *Hello) { h.RecvBufferCnt = 2 }, "recv_buffer_cnt 2"},
		{"recv count at maximum", func(h *Hello) { h.RecvBufferCnt = 65535 }, ""},
		{"recv count above maximum", func(h *Hello) { h.RecvBufferCnt = 65536 }, "recv_buffer_cnt 65536"},
		{"jetty id zero", func(h *Hello) { h.JettyID = 0 }, "jetty_id is 0"},
		{"tp type UTP", func(h *Hello) { h.TPType = TPUTP }, ""},
		{"tp type above UTP", func(h *Hello) { h.TPType = 3 }, "tp_type 3"},
		{"seg len zero", func(h *Hello) { h.SegLen = 0 }, "seg_len is 0"},
		{"seg va zero", func(h *Hello) { h.SegVA = 0 }, "seg_va is 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := sampleHello()
			tc.mutate(&h)
			err := h.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidHello) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want ErrInvalidHello mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseV2Rejects(t *testing.T) {
	good := mustHex(t, goldenV2)
	patch := func(off int, b ...byte) []byte {
		p := bytes.Clone(good)
		copy(p[off:], b)
		return p
	}
	tests := []struct {
		name    string
		packet  []byte
		wantErr string
	}{
		{"short", good[:50], "want at least 86"},
		{"wrong magic", patch(0, 'X'), "magic"},
		{"msg_len too small", patch(4, 0, 85), "msg_len 85"},
		{"msg_len too large", patch(4, 0x10, 0x01), "msg_len 4097"},
		{"msg_len longer than packet", patch(4, 0, 90), "does not match"},
		{"hello_ver 3", patch(6, 0, 3), "hello_ver is 3"},
		{"impl_ver 0", patch(8, 0, 0), "impl_ver is 0"},
		{"jetty zero", patch(18, 0, 0, 0, 0), "jetty_id is 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseV2(tc.packet)
			if !errors.Is(err, ErrInvalidHello) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseV2 = %v, want ErrInvalidHello mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestV3RoundTrip(t *testing.T) {
	withToken := sampleHello()
	withToken.Token, withToken.HasToken = 7, true
	withSQ := withToken
	withSQ.SQSize = 4096
	withMarker := withSQ
	withMarker.CloseMarker = true
	withBoot := withMarker
	withBoot.BootID[3] = 9
	withSocket := withBoot
	withSocket.SocketEID[15] = 4
	for _, h := range []Hello{sampleHello(), withToken, withSQ, withMarker, withBoot, withSocket} {
		p := AppendV3(nil, h)
		if string(p[:4]) != MagicV3 {
			t.Fatalf("magic %q", p[:4])
		}
		if n := binary.BigEndian.Uint32(p[4:]); int(n) != len(p)-8 {
			t.Fatalf("length field %d, body %d bytes", n, len(p)-8)
		}
		got, err := ParseV3(p)
		if err != nil {
			t.Fatalf("ParseV3: %v", err)
		}
		if got != h {
			t.Fatalf("round trip: got %+v, want %+v", got, h)
		}
	}
}

func TestParseV3Rejects(t *testing.T) {
	good := AppendV3(nil, sampleHello())
	withLen := func(n uint32, body []byte) []byte {
		p := append([]byte(MagicV3), 0, 0, 0, 0)
		binary.BigEndian.PutUint32(p[4:], n)
		return append(p, body...)
	}
	body := good[8:]
	// Drop the seg_token_id field (the last one: tag 0x58 then a varint).
	withoutTokenID := body[:bytes.LastIndexByte(body, 0x58)]
	// eid of 15 bytes: tag 0x22, length 15.
	shortEID := append(bytes.Clone(body), 0x22, 15)
	shortEID = append(shortEID, make([]byte, 15)...)
	// boot_id (field 103, tag 0xba 0x06) of 15 bytes.
	shortBoot := append(bytes.Clone(body), 0xba, 0x06, 15)
	shortBoot = append(shortBoot, make([]byte, 15)...)
	tests := []struct {
		name    string
		packet  []byte
		wantErr string
	}{
		{"short", good[:6], "at least 8"},
		{"zero length", withLen(0, nil), "body length 0"},
		{"too long", withLen(4097, nil), "body length 4097"},
		{"length mismatch", withLen(uint32(len(body)+1), body), "does not match"},
		{"truncated varint", withLen(2, []byte{0x08, 0x80}), "field 1"},
		{"missing required", withLen(uint32(len(withoutTokenID)), withoutTokenID), "seg_token_id"},
		{"eid not 16 bytes", withLen(uint32(len(shortEID)), shortEID), "holds 15 bytes"},
		{"boot id not 16 bytes", withLen(uint32(len(shortBoot)), shortBoot), "boot_id holds 15 bytes"},
		{"invalid values", AppendV3(nil, Hello{}), "buffer_size 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseV3(tc.packet)
			if !errors.Is(err, ErrInvalidHello) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseV3 = %v, want ErrInvalidHello mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestV3UnknownFieldsAndWrongWireTypesAreSkipped(t *testing.T) {
	body := MarshalV3Body(nil, sampleHello())
	// An unknown fixed32 field 15, and field 1 (buffer_size) as a bytes field:
	// protobuf treats both as unknown, so the hello still parses.
	extra := []byte{15<<3 | 5, 1, 2, 3, 4, 1<<3 | 2, 2, 'h', 'i'}
	h, err := UnmarshalV3Body(append(bytes.Clone(body), extra...))
	if err != nil {
		t.Fatalf("UnmarshalV3Body: %v", err)
	}
	if h != sampleHello() {
		t.Fatalf("got %+v", h)
	}
}

func TestReadHello(t *testing.T) {
	tok := sampleHello()
	tok.Token, tok.HasToken = 99, true
	// A v2 hello with a foreign 20-byte extension (msg_len 106): drained.
	foreign := mustHex(t, goldenV2)
	binary.BigEndian.PutUint16(foreign[4:], V2PacketLen+20)
	foreign = append(foreign, bytes.Repeat([]byte{0xee}, 20)...)
	// An invalid v2 hello (jetty 0) with a 10-byte tail: still drained so the
	// ACK after it is read correctly.
	badTail := AppendV2(nil, Hello{BufferSize: 8192})
	binary.BigEndian.PutUint16(badTail[4:], V2PacketLen+10)
	badTail = append(badTail, make([]byte, 10)...)

	const trailer = "\x00\x00\x00\x01" // the ACK that follows
	tests := []struct {
		name        string
		stream      []byte
		want        Hello
		wantVersion Version
		wantErr     error // nil, ErrInvalidHello, or io.ErrUnexpectedEOF
		aligned     bool  // the trailer is next in the stream afterwards
	}{
		{"v2", AppendV2(nil, sampleHello()), sampleHello(), V2, nil, true},
		{"v2 with token", AppendV2(nil, tok), tok, V2, nil, true},
		{"v2 foreign extension drained", foreign, sampleHello(), V2, nil, true},
		{"v2 invalid but drained", badTail, Hello{}, V2, ErrInvalidHello, true},
		{"v2 fallback", AppendV2Fallback(nil), Hello{}, V2, ErrInvalidHello, true},
		{"v2 truncated", AppendV2(nil, sampleHello())[:40], Hello{}, V2, io.ErrUnexpectedEOF, false},
		{"v3", AppendV3(nil, sampleHello()), sampleHello(), V3, nil, true},
		{"v3 with token", AppendV3(nil, tok), tok, V3, nil, true},
		{"v3 fallback", AppendV3Fallback(nil), Hello{}, V3, ErrInvalidHello, true},
		{"v3 truncated", AppendV3(nil, sampleHello())[:20], Hello{}, V3, io.ErrUnexpectedEOF, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := bytes.NewReader(append(bytes.Clone(tc.stream[MagicLen:]), trailer...))
			if errors.Is(tc.wantErr, io.ErrUnexpectedEOF) {
				r = bytes.NewReader(tc.stream[MagicLen:])
			}
			got, v, err := ReadHello(r, tc.stream[:MagicLen])
			if v != tc.wantVersion {
				t.Fatalf("version %d, want %d", v, tc.wantVersion)
			}
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("ReadHello: %v", err)
				}
				if got != tc.want {
					t.Fatalf("got %+v, want %+v", got, tc.want)
				}
			} else if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ReadHello error = %v, want %v", err, tc.wantErr)
			}
			if tc.aligned {
				ack, _, err := ReadAck(r)
				if err != nil || !ack.UseURMA() {
					t.Fatalf("stream not aligned on the ACK after the hello: ack=%v err=%v", ack, err)
				}
			}
		})
	}
}

func TestIsFallback(t *testing.T) {
	tests := []struct {
		name   string
		stream []byte
		want   bool
	}{
		{"v2 fallback", AppendV2Fallback(nil), true},
		{"v3 fallback", AppendV3Fallback(nil), true},
		{"v2 broken", AppendV2(nil, Hello{JettyID: 5, BufferSize: 100}), false},
		{"v3 broken", AppendV3(nil, Hello{JettyID: 5, BufferSize: 100}), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, _, err := ReadHello(bytes.NewReader(tc.stream[MagicLen:]), tc.stream[:MagicLen])
			if !errors.Is(err, ErrInvalidHello) {
				t.Fatalf("ReadHello = %v, want invalid", err)
			}
			if got := IsFallback(h); got != tc.want {
				t.Fatalf("IsFallback(%+v) = %v, want %v", h, got, tc.want)
			}
		})
	}
}

func TestReadHelloUnknownMagic(t *testing.T) {
	if _, ok := IsMagic([]byte("GET ")); ok {
		t.Fatal("GET is not a magic")
	}
	if v, ok := IsMagic([]byte(MagicV3)); !ok || v != V3 {
		t.Fatalf("IsMagic(URM3) = %v %v", v, ok)
	}
	_, _, err := ReadHello(bytes.NewReader(nil), []byte("GET "))
	if !errors.Is(err, ErrInvalidHello) {
		t.Fatalf("ReadHello(GET) = %v", err)
	}
}

func TestAck(t *testing.T) {
	tests := []struct {
		name     string
		bytes    []byte
		useURMA  bool
		reserved bool
	}{
		{"use URMA", AppendAck(nil, true), true, false},
		{"fallback", AppendAck(nil, false), false, false},
		{"reserved bits", []byte{0x80, 0, 0, 0x02}, false, true},
		{"bit 0 with reserved bits", []byte{0, 0, 0x10, 0x03}, true, true},
		{"brpc PRPC, bit 0 happens to be set", []byte("PRPC"), true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, raw, err := ReadAck(bytes.NewReader(tc.bytes))
			if err != nil || got.UseURMA() != tc.useURMA || got.Reserved() != tc.reserved || !bytes.Equal(raw, tc.bytes) {
				t.Fatalf("ReadAck(%x) = %#x (URMA %v, reserved %v), %x, %v; want URMA %v, reserved %v",
					tc.bytes, uint32(got), got.UseURMA(), got.Reserved(), raw, err, tc.useURMA, tc.reserved)
			}
		})
	}
	if !bytes.Equal(AppendAck(nil, true), []byte{0, 0, 0, 1}) || !bytes.Equal(AppendAck(nil, false), []byte{0, 0, 0, 0}) {
		t.Fatal("ACK bytes are not big-endian flags")
	}
	_, raw, err := ReadAck(bytes.NewReader([]byte{0, 7}))
	if !errors.Is(err, io.ErrUnexpectedEOF) || !bytes.Equal(raw, []byte{0, 7}) {
		t.Fatalf("short ACK: %x, %v; want the 2 bytes read and io.ErrUnexpectedEOF", raw, err)
	}
}
