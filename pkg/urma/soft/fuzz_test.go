package soft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// frames concatenates encoded frames into one input.
func frames(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func sendFrame(h sendHeader, payload []byte) []byte {
	h.length = uint32(len(payload))
	var b [4 + sendHdrLen]byte
	return append(append([]byte{}, encodeSendHeader(b[:], &h)...), payload...)
}

// FuzzReadFrames feeds arbitrary bytes to an established connection's
// reader, backed by a real device with a jetty and posted receives. It must
// never panic, never read or write out of bounds, and end every input with
// an error (EOF or a protocol error).
func FuzzReadFrames(f *testing.F) {
	p, err := New(Options{Logger: logr.Discard()}) // not newProvider: its test logger must not be called from fuzz targets
	mustOK(f, err, "new provider")
	f.Cleanup(func() { p.Close() })
	s := newSide(f, p, urma.JettyConfig{}, 1024)
	j := s.jetty.(*jetty)
	tag := uint64(j.instance)<<32 | 5
	var buf [64]byte
	ok := sendHeader{opcode: urma.OpSendWithImm, flags: sendFlagSolicited, src: 3, dst: j.id.ID, token: 7, tag: tag, imm: 42}
	f.Add(sendFrame(ok, []byte("hello")))
	f.Add(frames(sendFrame(ok, bytes.Repeat([]byte{1}, 70000)), sendFrame(ok, nil)))
	f.Add(sendFrame(sendHeader{opcode: urma.OpSend, dst: j.id.ID, token: 8, tag: tag}, []byte("wrong token")))
	f.Add(sendFrame(sendHeader{opcode: urma.OpSend, dst: 999, token: 7, tag: tag, flags: sendFlagResume}, []byte("no jetty")))
	f.Add(frames(encodeAck(buf[:], &ackFrame{status: statusRNR, rnrTimer: 3, src: j.id.ID, dst: 1, tag: tag})))
	f.Add(frames(encodeAckRun(buf[:], &ackRunFrame{src: j.id.ID, dst: 1, tag: tag, count: 3})))
	f.Add(frames(encodeCancel(buf[:], &cancelFrame{src: 3, dst: j.id.ID, tag: tag})))
	f.Add(frames(encodeImportJetty(buf[:], &importJettyReq{mode: urma.RC, req: 1, jetty: j.id.ID, token: 7})))
	f.Add(frames(encodeImportSeg(buf[:], &importSegReq{req: 2, tokenID: 1, len: 1 << 20, token: 7})))
	f.Add(frames(encodeImportResp(buf[:], 3, urma.CodeAccess)))
	f.Add(frames(encodePing(buf[:])))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, frameSend})
	sd := p.devices[0].side
	peerEID, _ := SocketEID(netip.MustParseAddrPort("127.0.0.2:2"))
	fakePeer, err := sd.peer(peerEID)
	mustOK(f, err, "peer")
	rbuf := make([]urma.Completion, 64)
	f.Fuzz(func(t *testing.T, data []byte) {
		for i := uint64(0); ; i++ {
			sges := []urma.SGE{{Segment: s.seg, Offset: i % 8 * 4096, Len: 4096}, {Segment: s.seg, Offset: 65536, Len: 65536}}
			if s.jfr.PostRecv(&urma.RecvWR{UserCtx: i, SGEs: sges}) != nil {
				break
			}
		}
		// What the connection writes goes into a socket pair, drained.
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		mustOK(t, err, "socketpair")
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			var b [4096]byte
			for {
				if n, err := unix.Read(fds[1], b[:]); n <= 0 || err != nil {
					return
				}
			}
		}()
		c := newConn(sd, fakePeer, newSockIO(fds[0], bytes.NewReader(data)), hello{maxMsg: 1 << 20}, false, "fuzz", "fuzz")
		done := c.writerDone
		go c.writeLoop()
		err = c.readFrames()
		if err == nil {
			t.Fatal("reader ended without an error")
		}
		var pe protocolError
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &pe) {
			t.Fatalf("reader ended with %v, want EOF or a protocol error", err)
		}
		c.fail(err)
		<-done
		c.abandonWrites()
		c.io.Close()
		<-drained
		unix.Close(fds[1])
		for _, q := range []urma.JFC{s.rjfc, s.sjfc} {
			// Drain what the fuzzed frames completed; the records themselves do not matter.
			n, _ := q.Poll(rbuf)
			for n > 0 {
				n, _ = q.Poll(rbuf)
			}
		}
	})
}

// FuzzHandshake decodes arbitrary handshake frames: errors, never panics,
// and whatever decodes re-encodes to the same bytes.
func FuzzHandshake(f *testing.F) {
	var b [64]byte
	src, _ := SocketEID(netip.MustParseAddrPort("127.0.0.1:1"))
	f.Add(encodeHello(b[:], &hello{session: 7, src: src, dst: src, maxMsg: 99}))
	f.Add(encodeHelloAck(b[:], &helloAck{status: helloDuplicate, eid: src}))
	f.Add([]byte("SRMA"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var out [64]byte
		if h, err := decodeHello(data); err == nil {
			if got := encodeHello(out[:], &h); !bytes.Equal(got, data) {
				t.Fatalf("HELLO %x re-encodes as %x", data, got)
			}
		}
		if a, err := decodeHelloAck(data); err == nil {
			if got := encodeHelloAck(out[:], &a); !bytes.Equal(got, data) {
				t.Fatalf("HELLO_ACK %x re-encodes as %x", data, got)
			}
		}
	})
}

// FuzzShmMessages decodes arbitrary shm socket messages: errors, never
// panics, and whatever decodes re-encodes to the same bytes.
func FuzzShmMessages(f *testing.F) {
	src, _ := ShmEID()
	b := make([]byte, shmMaxMsgLen)
	f.Add(encodeShmHello(b, &shmHelloMsg{typ: shmMsgHello, src: src, dst: src, maxMsg: 1 << 20, ringSize: MinShmRing, pid: 7}))
	f.Add(encodeShmHello(b, &shmHelloMsg{typ: shmMsgHelloAck, status: helloWrongHost, src: src}))
	f.Add(encodeShmSeg(b, &shmSegMsg{typ: shmMsgSegMap, handle: 3, length: 4096}))
	f.Add(encodeShmSeg(b, &shmSegMsg{typ: shmMsgSegMapped, status: 1, handle: 3}))
	f.Add(encodeShmProof(b, bytes.Repeat([]byte{7}, shmSigLen)))
	f.Add(encodeShmReady(b, helloConnLimit))
	f.Add([]byte("SRMS"))
	f.Fuzz(func(t *testing.T, data []byte) {
		out := make([]byte, shmMaxMsgLen)
		if sig, err := decodeShmProof(data); err == nil {
			if got := encodeShmProof(out, sig[:]); !bytes.Equal(got, data) {
				t.Fatalf("PROOF %x re-encodes as %x", data, got)
			}
		}
		if status, err := decodeShmReady(data); err == nil {
			if got := encodeShmReady(out, status); !bytes.Equal(got, data) {
				t.Fatalf("READY %x re-encodes as %x", data, got)
			}
		}
		if h, err := decodeShmHello(data); err == nil {
			if got := encodeShmHello(out, &h); !bytes.Equal(got, data) {
				t.Fatalf("hello %x re-encodes as %x", data, got)
			}
		}
		if m, err := decodeShmSeg(data); err == nil {
			if got := encodeShmSeg(out, &m); !bytes.Equal(got, data) {
				t.Fatalf("segment message %x re-encodes as %x", data, got)
			}
		}
	})
}

// FuzzUnixDiagAnswer parses arbitrary sock_diag answers: an error or a
// peer inode, never a panic or a read past the answer.
func FuzzUnixDiagAnswer(f *testing.F) {
	ne := binary.NativeEndian
	ok := make([]byte, nlmsgHdrLen+unixDiagMsgLen+8)
	ne.PutUint32(ok[0:], uint32(len(ok)))
	ne.PutUint16(ok[4:], sockDiagByFamily)
	ne.PutUint32(ok[nlmsgHdrLen+4:], 77)
	ne.PutUint16(ok[nlmsgHdrLen+unixDiagMsgLen:], 8)
	ne.PutUint16(ok[nlmsgHdrLen+unixDiagMsgLen+2:], unixDiagPeer)
	ne.PutUint32(ok[nlmsgHdrLen+unixDiagMsgLen+4:], 78)
	f.Add(ok)
	f.Add(ok[:nlmsgHdrLen+unixDiagMsgLen+3])
	f.Fuzz(func(t *testing.T, data []byte) {
		if peer, err := parseUnixDiagPeer(data, 77); err == nil && peer > 1<<32 {
			t.Fatalf("peer inode %d does not fit the attribute", peer)
		}
	})
}
