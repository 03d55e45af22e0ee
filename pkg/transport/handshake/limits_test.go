package handshake

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// v2WithMsgLen is sampleHello as a v2 packet whose msg_len is n: the bytes
// after the fixed 86 are a foreign extension, which must be drained.
func v2WithMsgLen(t *testing.T, n int) []byte {
	t.Helper()
	p := mustHex(t, goldenV2)
	binary.BigEndian.PutUint16(p[MagicLen:], uint16(n))
	return append(p, bytes.Repeat([]byte{0xee}, n-V2PacketLen)...)
}

// v3WithBodyLen is sampleHello as a v3 packet whose body is n bytes: an
// unknown bytes field (number 15) pads it, which a parser must skip.
func v3WithBodyLen(t *testing.T, n int) []byte {
	t.Helper()
	body := MarshalV3Body(nil, sampleHello())
	pad := n - len(body) - protowire.SizeTag(15)
	payload := pad - protowire.SizeVarint(uint64(pad))
	body = protowire.AppendTag(body, 15, protowire.BytesType)
	body = protowire.AppendBytes(body, bytes.Repeat([]byte{0xee}, payload))
	if len(body) != n {
		t.Fatalf("padded body is %d bytes, want %d", len(body), n)
	}
	p := append([]byte(MagicV3), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(p[MagicLen:], uint32(n))
	return append(p, body...)
}

// The largest hello each version allows (brpc's limits: msg_len and the v3
// body length at most 4096) is accepted, parsed whole and, when read from a
// stream, drained up to the ACK that follows; one byte more is refused.
func TestHelloLengthLimits(t *testing.T) {
	const ack = "\x00\x00\x00\x01"
	tests := []struct {
		name    string
		packet  []byte
		parse   func([]byte) (Hello, error)
		wantErr string // "" = accepted
	}{
		{"v2 msg_len 4096", v2WithMsgLen(t, V2MaxMsgLen), ParseV2, ""},
		{"v2 msg_len 4097", v2WithMsgLen(t, V2MaxMsgLen+1), ParseV2, "v2 msg_len 4097 is outside 86..4096"},
		{"v3 body 4096", v3WithBodyLen(t, V3MaxBodyLen), ParseV3, ""},
		{"v3 body 4097", v3WithBodyLen(t, V3MaxBodyLen+1), ParseV3, "v3 body length 4097 is outside 1..4096"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check := func(what string, h Hello, err error) {
				t.Helper()
				if tc.wantErr != "" {
					if !errors.Is(err, ErrInvalidHello) || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("%s = %v, want ErrInvalidHello mentioning %q", what, err, tc.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if h != sampleHello() {
					t.Fatalf("%s = %+v, want %+v", what, h, sampleHello())
				}
			}
			h, err := tc.parse(tc.packet)
			check("parse", h, err)

			r := bytes.NewReader(append(bytes.Clone(tc.packet[MagicLen:]), ack...))
			h, _, err = ReadHello(r, tc.packet[:MagicLen])
			check("ReadHello", h, err)
			if tc.wantErr == "" {
				if a, _, err := ReadAck(r); err != nil || !a.UseURMA() || a.Reserved() {
					t.Fatalf("stream not aligned on the ACK after the hello: ACK %#x, err %v", uint32(a), err)
				}
			}
		})
	}
}

// A v2 hello with both versions 0 is a fallback hello whatever else it
// carries (nothing in it is meant); one with only hello_ver 0 is a broken
// hello, returned as decoded.
func TestV2ZeroVersions(t *testing.T) {
	withVersions := func(helloVer, implVer uint16) []byte {
		p := AppendV2(nil, sampleHello())
		binary.BigEndian.PutUint16(p[6:], helloVer)
		binary.BigEndian.PutUint16(p[8:], implVer)
		return p
	}
	tests := []struct {
		name         string
		packet       []byte
		wantFallback bool
	}{
		{"both zero", withVersions(0, 0), true},
		{"hello_ver zero", withVersions(0, V2ImplVersion), false},
		{"impl_ver zero", withVersions(V2HelloVersion, 0), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, _, err := ReadHello(bytes.NewReader(tc.packet[MagicLen:]), tc.packet[:MagicLen])
			if !errors.Is(err, ErrInvalidHello) {
				t.Fatalf("ReadHello = %v, want invalid", err)
			}
			if got := IsFallback(h); got != tc.wantFallback {
				t.Fatalf("IsFallback = %v, want %v (hello %+v)", got, tc.wantFallback, h)
			}
			if !tc.wantFallback && h != sampleHello() {
				t.Fatalf("broken hello returned as %+v, want it as decoded %+v", h, sampleHello())
			}
		})
	}
}
