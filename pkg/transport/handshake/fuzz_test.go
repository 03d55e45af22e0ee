package handshake

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// The fuzz targets check that no input panics, that every rejection is an
// ErrInvalidHello (never a bare error), and that whatever parses re-encodes
// to a packet that parses to the same hello.

func FuzzParseV2(f *testing.F) {
	h := sampleHello()
	f.Add(AppendV2(nil, h))
	h.Token, h.HasToken = 5, true
	f.Add(AppendV2(nil, h))
	h.SQSize, h.CloseMarker = 64, true
	f.Add(AppendV2(nil, h))
	f.Add(AppendV2Fallback(nil))
	f.Add([]byte("URMA"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, packet []byte) {
		h, err := ParseV2(packet)
		if err != nil {
			if !errors.Is(err, ErrInvalidHello) {
				t.Fatalf("rejection is not ErrInvalidHello: %v", err)
			}
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("ParseV2 accepted an invalid hello: %v", err)
		}
		again, err := ParseV2(AppendV2(nil, h))
		if err != nil || again != h {
			t.Fatalf("re-encode round trip: %+v, %v; want %+v", again, err, h)
		}
	})
}

func FuzzParseV3(f *testing.F) {
	h := sampleHello()
	f.Add(AppendV3(nil, h))
	h.Token, h.HasToken = 5, true
	f.Add(AppendV3(nil, h))
	h.SQSize, h.CloseMarker = 64, true
	f.Add(AppendV3(nil, h))
	f.Add(AppendV3Fallback(nil))
	f.Add([]byte("URM3\x00\x00\x00\x02\x08\x80"))
	f.Add([]byte("URM3\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, packet []byte) {
		h, err := ParseV3(packet)
		if err != nil {
			if !errors.Is(err, ErrInvalidHello) {
				t.Fatalf("rejection is not ErrInvalidHello: %v", err)
			}
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("ParseV3 accepted an invalid hello: %v", err)
		}
		again, err := ParseV3(AppendV3(nil, h))
		if err != nil || again != h {
			t.Fatalf("re-encode round trip: %+v, %v; want %+v", again, err, h)
		}
	})
}

// FuzzReadHello drives the streaming reader the server uses: the first four
// bytes are the magic, the rest is the stream.
func FuzzReadHello(f *testing.F) {
	f.Add(AppendV2(nil, sampleHello()))
	f.Add(AppendV3(nil, sampleHello()))
	f.Add(AppendV2Fallback(nil))
	f.Add([]byte("URMA\x10\x00"))
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		if len(stream) < MagicLen {
			return
		}
		r := bytes.NewReader(stream[MagicLen:])
		h, _, err := ReadHello(r, stream[:MagicLen])
		if err == nil {
			if verr := h.Validate(); verr != nil {
				t.Fatalf("ReadHello accepted an invalid hello: %v", verr)
			}
		}
		read := len(stream) - MagicLen - r.Len()
		if want, ok := helloLen(stream); ok {
			// The hello says how long it is, and the stream holds it all:
			// exactly that is read, valid or not, so the ACK after it is
			// read in step.
			if read != want {
				t.Fatalf("read %d bytes of a hello that says it has %d (%v)", read, want, err)
			}
		} else if read > 4+V3MaxBodyLen {
			t.Fatalf("read %d bytes, more than any hello holds", read)
		}
	})
}

// helloLen is how many bytes after the magic the hello at the start of
// stream says it has, when it says so within the bounds and the stream
// holds them all.
func helloLen(stream []byte) (int, bool) {
	rest := stream[MagicLen:]
	switch string(stream[:MagicLen]) {
	case MagicV2:
		if len(rest) < 2 {
			return 0, false
		}
		n := int(binary.BigEndian.Uint16(rest)) - MagicLen
		return n, n >= V2BodyLen && n <= V2MaxMsgLen-MagicLen && len(rest) >= n
	case MagicV3:
		if len(rest) < 4 {
			return 0, false
		}
		n := binary.BigEndian.Uint32(rest)
		return 4 + int(n), n >= 1 && n <= V3MaxBodyLen && len(rest) >= 4+int(n)
	}
	return 0, false
}
