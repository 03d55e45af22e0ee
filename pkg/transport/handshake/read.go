package handshake

import (
	"encoding/binary"
	"fmt"
	"io"
)

// IsMagic reports whether the first four bytes of a connection open a hello,
// and which version.
func IsMagic(magic []byte) (Version, bool) {
	switch string(magic) {
	case MagicV2:
		return V2, true
	case MagicV3:
		return V3, true
	}
	return 0, false
}

// ReadHello reads the rest of a hello whose magic has already been read
// from r and validates it.
//
// An error wrapping ErrInvalidHello means the peer spoke the handshake but
// its hello is unusable: fall back to TCP. The hello is then returned as far
// as it was decoded (zero if nothing was), so a caller can tell a peer's
// deliberate fallback hello (IsFallback) from a broken one. ReadHello keeps
// the stream aligned for the ACK that follows whenever the hello says how
// long it is: a v2 hello
// with msg_len in range is read in full (extra bytes drained) even when a
// rule fails. Any other error is an I/O error and the connection is broken.
func ReadHello(r io.Reader, magic []byte) (Hello, Version, error) {
	switch string(magic) {
	case MagicV2:
		h, err := readV2(r)
		return h, V2, err
	case MagicV3:
		h, err := readV3(r)
		return h, V3, err
	}
	return Hello{}, 0, invalid("magic %q is neither %q nor %q", magic, MagicV2, MagicV3)
}

func readV2(r io.Reader) (Hello, error) {
	var body [V2BodyLen]byte
	if _, err := io.ReadFull(r, body[:]); err != nil {
		return Hello{}, fmt.Errorf("read v2 hello body: %w", err)
	}
	hdr, h := decodeV2Body(body[:])
	if hdr.msgLen < V2PacketLen || hdr.msgLen > V2MaxMsgLen {
		// The length itself is wrong: nothing to drain by.
		return h, checkV2Header(hdr)
	}
	if extra := int(hdr.msgLen) - V2PacketLen; extra > 0 {
		var ext [V2MaxMsgLen - V2PacketLen]byte
		if _, err := io.ReadFull(r, ext[:extra]); err != nil {
			return Hello{}, fmt.Errorf("drain %d extra bytes of v2 hello: %w", extra, err)
		}
		decodeV2Ext(&h, ext[:extra])
	}
	if err := checkV2Header(hdr); err != nil {
		if hdr.helloVer == 0 && hdr.implVer == 0 {
			return Hello{}, err // a fallback hello: nothing in it is meant
		}
		return h, err
	}
	if err := h.Validate(); err != nil {
		return h, err
	}
	return h, nil
}

// IsFallback reports whether an invalid hello returned by ReadHello is the
// deliberate "I will not use URMA" hello a server sends (AppendV2Fallback,
// AppendV3Fallback): no jetty and no buffer size.
func IsFallback(h Hello) bool { return h.JettyID == 0 && h.BufferSize == 0 }

func readV3(r io.Reader) (Hello, error) {
	var lenBuf [4]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return Hello{}, fmt.Errorf("read v3 hello length: %w", err)
	}
	n := binary.BigEndian.Uint32(lenBuf[:])
	if err := checkV3Len(n); err != nil {
		return Hello{}, err
	}
	var body [V3MaxBodyLen]byte
	if _, err := io.ReadFull(r, body[:n]); err != nil {
		return Hello{}, fmt.Errorf("read v3 hello body of %d bytes: %w", n, err)
	}
	h, err := UnmarshalV3Body(body[:n])
	if err != nil {
		return Hello{}, err
	}
	if err := h.Validate(); err != nil {
		return h, err
	}
	return h, nil
}

// AppendAck appends the 4-byte ACK a client sends after the server's hello.
func AppendAck(dst []byte, useURMA bool) []byte {
	var flags uint32
	if useURMA {
		flags = AckUseURMA
	}
	return binary.BigEndian.AppendUint32(dst, flags)
}

// Ack is a client's ACK: four big-endian bytes of flags.
type Ack uint32

// UseURMA reports bit 0: the client imported our segment and jetty and
// asks for URMA.
func (a Ack) UseURMA() bool { return uint32(a)&AckUseURMA != 0 }

// Reserved reports whether a bit other than bit 0 is set. No client of ours
// or of brpc sets one, so four such bytes from a client whose hello lacked
// our extension are its first application bytes, not an ACK (see the
// server's leniency in docs/wire-format.md).
func (a Ack) Reserved() bool { return uint32(a)&^AckUseURMA != 0 }

// ReadAck reads an ACK. It also returns the bytes it read, fewer than four
// on error, for a caller that serves them to the application instead.
func ReadAck(r io.Reader) (Ack, []byte, error) {
	var b [AckLen]byte
	n, err := io.ReadFull(r, b[:])
	if err != nil {
		return 0, b[:n], fmt.Errorf("read handshake ACK: %w", err)
	}
	return Ack(binary.BigEndian.Uint32(b[:])), b[:], nil
}
