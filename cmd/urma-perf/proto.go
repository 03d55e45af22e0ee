package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
)

// The perf protocol, after the transport's own handshake. The client opens
// each connection with a 16-byte header; the server answers with 8 bytes
// saying how long each response will be:
//
//	client: "UPRF" u32 version=1 u32 request size u32 flags
//	server: "UPRF" u32 response size (the request size with --echo, else 8)
//
// Flag bit 0 (ack) asks for 8-byte answers even from an echo server: a
// throughput run moves its bytes one way. Bit 1 (zero-copy receive) asks
// the server to take requests with the transport's zero-copy API
// (ReadBuffer), in place, where its connection has it. Other bits must be
// zero.
//
// then request, response, request, response... A connection that does not
// start with "UPRF" is a plain TCP client: it gets a byte echo (or, from a
// non-echo server, silence).
const (
	perfMagic   = "UPRF"
	perfVersion = 1
	ackSize     = 8
	// flagAck asks for 8-byte answers whatever the server's --echo.
	flagAck uint32 = 1
	// flagRecvZeroCopy asks the server to take requests in place.
	flagRecvZeroCopy uint32 = 2
	// maxSize bounds a request so a bad header cannot make the server
	// allocate without limit.
	maxSize = perfjson.MaxSize
)

func appendClientHeader(dst []byte, size int, flags uint32) []byte {
	dst = append(dst, perfMagic...)
	dst = binary.BigEndian.AppendUint32(dst, perfVersion)
	dst = binary.BigEndian.AppendUint32(dst, uint32(size))
	return binary.BigEndian.AppendUint32(dst, flags)
}

// readClientHeaderRest reads the 12 bytes after the magic.
func readClientHeaderRest(r io.Reader) (size int, flags uint32, err error) {
	var b [12]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, 0, fmt.Errorf("read perf header: %w", err)
	}
	if v := binary.BigEndian.Uint32(b[0:]); v != perfVersion {
		return 0, 0, fmt.Errorf("perf header version %d, want %d", v, perfVersion)
	}
	size = int(binary.BigEndian.Uint32(b[4:]))
	if size < 1 || size > maxSize {
		return 0, 0, fmt.Errorf("perf request size %d outside 1..%d", size, maxSize)
	}
	flags = binary.BigEndian.Uint32(b[8:])
	if flags&^(flagAck|flagRecvZeroCopy) != 0 {
		return 0, 0, fmt.Errorf("perf header flags %#x unknown", flags)
	}
	return size, flags, nil
}

func appendServerHeader(dst []byte, respSize int) []byte {
	dst = append(dst, perfMagic...)
	return binary.BigEndian.AppendUint32(dst, uint32(respSize))
}

func readServerHeader(r io.Reader) (respSize int, err error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, fmt.Errorf("read the server's perf header: %w", err)
	}
	if string(b[:4]) != perfMagic {
		return 0, errors.New("the server is not a urma-perf server (no perf header)")
	}
	respSize = int(binary.BigEndian.Uint32(b[4:]))
	if respSize < 1 || respSize > maxSize {
		return 0, fmt.Errorf("server response size %d outside 1..%d", respSize, maxSize)
	}
	return respSize, nil
}
