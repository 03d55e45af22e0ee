package transport

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
)

// FuzzServerHandshake plays any bytes to a server as a client's side of
// the handshake (the connection then ends) and checks that the handshake
// ends, in a connection or an error, and that what the client made the
// server hold while it ran (a jetty, receive buffers, imports of the
// segment and jetty its hello names, an engine reference, a seat of the
// listener's AcceptBacklog) is all given back once the connection
// closes. The seeds are hellos of a real client device, whose segment and
// jetty the server can import, so the fuzzer starts from handshakes that
// reach URMA.
func FuzzServerHandshake(f *testing.F) {
	ps := fabricOf(f, 2)
	fl := smallFlags()
	cfg := cfgWith(ps[0], fl)
	cfg.HandshakeTimeout, cfg.FirstBytesTimeout, cfg.AckTimeout = 2*time.Second, 100*time.Millisecond, 200*time.Millisecond
	ln := listenLoopback(f, cfg)
	e := ln.e
	if fb := e.unavailable(); fb != nil {
		f.Fatal(fb)
	}
	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = tcpLn.Close() })

	// A client device with a jetty and segment the server can import.
	client := newRawQueues(f, ps[1])
	client.ours = true
	h := client.hello()
	h.Token, h.HasToken = 7, true
	ack := handshake.AppendAck(nil, true)
	f.Add(append(handshake.AppendV2(nil, h), ack...))
	f.Add(append(handshake.AppendV3(nil, h), ack...))
	f.Add(append(handshake.AppendV2(nil, h), handshake.AppendAck(nil, false)...))
	f.Add(handshake.AppendV2(nil, h)) // no ACK
	brpc := client.hello()
	brpc.SQSize, brpc.CloseMarker = 0, false
	brpc.RecvBufferCnt = 4095 // a brpc client asks for a deep send queue
	f.Add(append(handshake.AppendV2(nil, brpc), ack...))
	f.Add(append(handshake.AppendV2Fallback(nil), ack...))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte("URM3\x00\x00\x10\x00"))

	f.Fuzz(func(t *testing.T, in []byte) {
		cc, err := net.Dial("tcp", tcpLn.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		sc, err := tcpLn.Accept()
		if err != nil {
			t.Fatal(err)
		}
		// The client says its bytes and ends its side; it reads whatever
		// the server answers until the server is done.
		go func() {
			_, _ = cc.Write(in)
			_ = cc.(*net.TCPConn).CloseWrite()
			_, _ = io.Copy(io.Discard, cc)
		}()
		seat := &seat{seats: make(chan struct{}, 1)}
		conn, err := serverHandshake(context.Background(), e, sc, seat)
		if err == nil {
			if conn.Mode() == ModeURMA && len(in) < handshake.MagicLen+handshake.AckLen {
				t.Fatalf("URMA from %d bytes", len(in))
			}
			_ = conn.Close()
		}
		seat.give()
		_ = cc.Close()
		if _, inUse := e.pool.stats(); inUse != 0 {
			t.Fatalf("%d buffers of the pool still in use after the connection closed (%v)", inUse, err)
		}
		if prepared, live := e.jetties.stats(); live != prepared {
			t.Fatalf("%d jetties live, %d of them prepared, after the connection closed (%v)", live, prepared, err)
		}
		e.mu.Lock()
		refs := e.refs
		e.mu.Unlock()
		if refs != 1 {
			t.Fatalf("the engine holds %d references after the connection closed, want the listener's alone (%v)", refs, err)
		}
	})
}
