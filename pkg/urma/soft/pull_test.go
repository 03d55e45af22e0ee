package soft

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A SEND_REF comes from the peer: each reference must lie inside the
// segment it names, ends and wrap-around included, or the receiver would
// copy from memory it never mapped.
func TestResolveBoundsReferences(t *testing.T) {
	seg := make([]byte, 4096)
	for i := range seg {
		seg[i] = byte(i * 7)
	}
	cases := []struct {
		name string
		refs []payloadRef
		want []byte // the payload, when it resolves
		err  string
	}{
		{"whole segment", []payloadRef{{handle: 1, length: 4096}}, seg, ""},
		{"last byte", []payloadRef{{handle: 1, length: 1, offset: 4095}}, seg[4095:], ""},
		{"empty at the end", []payloadRef{{handle: 1, offset: 4096}}, nil, ""},
		{"two parts, an empty one skipped", []payloadRef{{handle: 1, length: 3, offset: 10}, {handle: 1}, {handle: 1, length: 2}}, append(append([]byte{}, seg[10:13]...), seg[:2]...), ""},
		{"one byte past the end", []payloadRef{{handle: 1, length: 2, offset: 4095}}, nil, "reaches past its segment"},
		{"offset past the end", []payloadRef{{handle: 1, offset: 4097}}, nil, "reaches past its segment"},
		{"offset that wraps", []payloadRef{{handle: 1, length: 16, offset: ^uint64(0) - 8}}, nil, "reaches past its segment"},
		{"unknown handle", []payloadRef{{handle: 4, length: 1}}, nil, errUnknownHandle.Error()},
		{"retired handle", []payloadRef{{handle: 2, length: 1}}, nil, errRetiredHandle.Error()},
		{"a mapped and a retired handle", []payloadRef{{handle: 1, length: 1}, {handle: 3, length: 1}}, nil, errRetiredHandle.Error()},
		{"a retired and an unknown handle", []payloadRef{{handle: 2, length: 1}, {handle: 9, length: 1}}, nil, errUnknownHandle.Error()},
	}
	// Handles 1 to 3 were announced; 2 and 3 are no longer mapped.
	p := pullState{mapped: map[uint32][]byte{1: seg}, announced: 4}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out refPayload
			err := p.resolve(c.refs, &out)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("resolve = %v, want an error with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			got := make([]byte, len(c.want))
			if err := out.read(got); err != nil {
				t.Fatalf("read: %v", err)
			}
			if !bytes.Equal(got, c.want) {
				t.Fatalf("payload %x, want %x", got, c.want)
			}
			if err := out.read(make([]byte, 1)); err == nil {
				t.Fatal("payload longer than its references")
			}
		})
	}
}

// FuzzSendRef feeds arbitrary SEND_REF bodies through what the reader
// does with them (checkFrame, decodeSendRef, resolve against one mapped
// segment): errors, never a panic; whatever decodes re-encodes to the same
// bytes, and a resolved payload is exactly as long as the header says.
func FuzzSendRef(f *testing.F) {
	var b [maxFrameHdr]byte
	h := sendHeader{opcode: urma.OpSend, dst: 1, token: 7, tag: 1}
	f.Add(bytes.Clone(encodeSendRef(b[:], &h, []payloadRef{{handle: 1, length: 10, offset: 4}})[4:]))
	f.Add(bytes.Clone(encodeSendRef(b[:], &h, []payloadRef{{handle: 1, length: 1, offset: 4095}, {handle: 2, length: 5}})[4:]))
	f.Add(bytes.Clone(encodeSendRef(b[:], &h, []payloadRef{{handle: 1, length: 16, offset: ^uint64(0) - 8}})[4:]))
	seg := make([]byte, 4096)
	p := pullState{mapped: map[uint32][]byte{1: seg}, announced: 3} // handle 2: retired
	const maxMsg = 1 << 20
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) == 0 || checkFrame(frameSendRef, uint32(len(body)), maxMsg) != nil {
			return
		}
		body = bytes.Clone(body)
		body[0] = frameSendRef // the reader dispatched on it
		var h sendHeader
		var refs [MaxSGE]payloadRef
		n, err := decodeSendRef(body, maxMsg, &h, &refs)
		if err != nil {
			return
		}
		var out [maxFrameHdr]byte
		if got := encodeSendRef(out[:], &h, refs[:n])[4:]; !bytes.Equal(got, body) {
			t.Fatalf("SEND_REF %x re-encodes as %x", body, got)
		}
		var pl refPayload
		if err := p.resolve(refs[:n], &pl); err != nil {
			if !errors.Is(err, errUnknownHandle) && !errors.Is(err, errRetiredHandle) && !strings.Contains(err.Error(), "reaches past") {
				t.Fatalf("resolve: unexpected error %v", err)
			}
			return
		}
		if err := pl.read(make([]byte, h.length)); err != nil {
			t.Fatalf("a payload of %d bytes does not read whole: %v", h.length, err)
		}
		if err := pl.read(make([]byte, 1)); err == nil {
			t.Fatalf("payload longer than the %d bytes its header says", h.length)
		}
	})
}
