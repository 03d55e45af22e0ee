package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
)

// TestFallbackMatrix covers who talks to whom, and what each side ends up
// with: mode, reason, and bytes that still flow.
func TestFallbackMatrix(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		name         string
		server       func(*Config)
		client       func(*Config)
		wantMode     Mode
		clientReason Reason
		serverReason Reason
	}{
		{name: "urma to urma, v2", wantMode: ModeURMA},
		{name: "urma to urma, v3", wantMode: ModeURMA, client: func(c *Config) { c.Flags.ClientHandshakeVersion = 3 }},
		{name: "urma to urma, polling server", wantMode: ModeURMA, server: func(c *Config) { c.Flags.UsePolling, c.Flags.PollerYield = true, true }},
		{name: "urma to urma, no token, brpc compatible", wantMode: ModeURMA, server: func(c *Config) { c.NoToken = true }, client: func(c *Config) { c.NoToken = true }},
		{
			name: "urma client, tcp-only server", wantMode: ModeTCP,
			server:       func(c *Config) { c.DisableURMA = true },
			clientReason: ReasonPeerDeclined, serverReason: ReasonDisabled,
		},
		{
			name: "urma client v3, tcp-only server", wantMode: ModeTCP,
			server:       func(c *Config) { c.DisableURMA = true },
			client:       func(c *Config) { c.Flags.ClientHandshakeVersion = 3 },
			clientReason: ReasonPeerDeclined, serverReason: ReasonDisabled,
		},
		{
			name: "tcp-only client, urma server", wantMode: ModeTCP,
			client:       func(c *Config) { c.DisableURMA = true },
			clientReason: ReasonDisabled, serverReason: ReasonPeerNotURMA,
		},
		{
			name: "client device missing", wantMode: ModeTCP,
			client:       func(c *Config) { c.Device = "udma9" },
			clientReason: ReasonDeviceMissing, serverReason: ReasonPeerNotURMA,
		},
		{
			name: "server device missing", wantMode: ModeTCP,
			server:       func(c *Config) { c.Device = "udma9" },
			clientReason: ReasonPeerDeclined, serverReason: ReasonDeviceMissing,
		},
		{
			name: "client provider not built in", wantMode: ModeTCP,
			client:       func(c *Config) { c.Provider = nil; c.LookupEnv = envOf(map[string]string{EnvProvider: "liburma"}) },
			clientReason: ReasonProviderUnavailable, serverReason: ReasonPeerNotURMA,
		},
		{
			name: "server pool too small for a connection", wantMode: ModeTCP,
			server:       func(c *Config) { c.Flags.BufferCount = 16; c.Flags.RQSize = 32 },
			clientReason: ReasonPeerDeclined, serverReason: ReasonResources,
		},
		{
			name: "client and server on different fabrics", wantMode: ModeTCP,
			client:       func(c *Config) { c.Provider = isolatedProvider(t) },
			clientReason: ReasonPeerDeclined, serverReason: ReasonImportFailed,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			fs, fc := smallFlags(), smallFlags()
			scfg, ccfg := cfgWith(pa, fs), cfgWith(pb, fc)
			if tc.server != nil {
				tc.server(&scfg)
			}
			if tc.client != nil {
				tc.client(&ccfg)
			}
			p := connect(t, scfg, ccfg)
			for _, side := range []struct {
				name   string
				c      Conn
				reason Reason
			}{{"client", p.client, tc.clientReason}, {"server", p.server, tc.serverReason}} {
				if side.c.Mode() != tc.wantMode {
					t.Errorf("%s mode %s, want %s (fallback %q)", side.name, side.c.Mode(), tc.wantMode, side.c.FallbackReason())
				}
				if got := side.c.FallbackReason(); !strings.HasPrefix(got, string(side.reason)) || (side.reason == "") != (got == "") {
					t.Errorf("%s fallback reason %q, want %q", side.name, got, side.reason)
				}
				if m, ok := ModeOf(side.c); !ok || m != tc.wantMode {
					t.Errorf("ModeOf(%s) = %v, %v", side.name, m, ok)
				}
				if d := side.c.Debug(); d.Mode != tc.wantMode || !strings.Contains(d.String(), "mode="+tc.wantMode.String()) {
					t.Errorf("%s debug dump %q", side.name, d)
				}
			}
			exchange(t, p.client, p.server, "bytes flow either way: "+tc.name)
		})
	}
}

// TestPlainTCPClientServedTransparently: a client that knows nothing of
// URMA gets the server's application, and the server's application gets
// every byte the client sent, the four the handshake peeked at included.
func TestPlainTCPClientServedTransparently(t *testing.T) {
	checkNoLeaks(t)
	pa, _ := fabricPair(t)
	ln, err := ListenTransport("tcp", "127.0.0.1:0", cfgWith(pa, smallFlags()))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tests := []struct {
		name   string
		send   string
		reason Reason
	}{
		{"http request", "GET / HTTP/1.0\r\nHost: x\r\n\r\n", ReasonPeerNotURMA},
		{"looks like a magic but is not", "URMb and more", ReasonPeerNotURMA},
		{"two bytes then close", "hi", ReasonPeerNotURMA},
		{"nothing then close", "", ReasonPeerNotURMA},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			if _, err := raw.Write([]byte(tc.send)); err != nil {
				t.Fatal(err)
			}
			if len(tc.send) < handshake.MagicLen {
				_ = raw.(*net.TCPConn).CloseWrite()
			}
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sc := c.(Conn)
			if sc.Mode() != ModeTCP || !strings.HasPrefix(sc.FallbackReason(), string(tc.reason)) {
				t.Fatalf("mode %s reason %q, want tcp %s", sc.Mode(), sc.FallbackReason(), tc.reason)
			}
			got := make([]byte, len(tc.send))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != tc.send {
				t.Fatalf("server read %q, %v; want %q", got, err, tc.send)
			}
			if len(tc.send) >= handshake.MagicLen {
				if _, err := c.Write([]byte("reply")); err != nil {
					t.Fatal(err)
				}
				r := make([]byte, 5)
				if _, err := io.ReadFull(raw, r); err != nil || string(r) != "reply" {
					t.Fatalf("client read %q, %v", r, err)
				}
			} else if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("after the client's close: %d, %v; want EOF", n, err)
			}
		})
	}
}

// TestFirstBytesTimeout: a client that waits for the server to speak first
// is served as plain TCP after urma_first_bytes_timeout (Config or flag),
// not after the whole handshake timeout (issue 9, item 10), or after the
// handshake timeout when that is shorter; the bytes it did send are kept.
func TestFirstBytesTimeout(t *testing.T) {
	checkNoLeaks(t)
	byFlag := smallFlags()
	byFlag.FirstBytesTimeout = 150 * time.Millisecond
	noFirstBytesWait := smallFlags()
	noFirstBytesWait.FirstBytesTimeout = 0
	for _, tc := range []struct {
		name string
		cfg  func(c *Config)
		want string
	}{
		{"Config.FirstBytesTimeout", func(c *Config) { c.FirstBytesTimeout = 100 * time.Millisecond }, "within 100ms (urma_first_bytes_timeout)"},
		{"--urma_first_bytes_timeout", func(c *Config) { c.Flags = &byFlag }, "within 150ms (urma_first_bytes_timeout)"},
		{"a shorter handshake timeout", func(c *Config) { c.HandshakeTimeout = 100 * time.Millisecond }, "within 100ms"},
		{"0 waits the whole handshake timeout", func(c *Config) {
			c.Flags, c.HandshakeTimeout = &noFirstBytesWait, 200*time.Millisecond
		}, "within 200ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, _ := fabricPair(t)
			cfg := cfgWith(pa, smallFlags())
			cfg.HandshakeTimeout = time.Hour // unless the case says otherwise
			tc.cfg(&cfg)
			ln, raw := plainClient(t, cfg, "ab")
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := ln.Accept(); err == nil {
					accepted <- c
				}
			}()
			var c net.Conn
			select {
			case c = <-accepted:
			case <-time.After(30 * time.Second):
				t.Fatal("a client waiting for the server to speak first was not served within 30s")
			}
			defer c.Close()
			if r := c.(Conn).FallbackReason(); !strings.HasPrefix(r, string(ReasonPeerSilent)) || !strings.Contains(r, tc.want) {
				t.Fatalf("reason %q, want %s saying %q", r, ReasonPeerSilent, tc.want)
			}
			// The server speaks first; the client's bytes are kept.
			if _, err := c.Write([]byte("220 ready\r\n")); err != nil {
				t.Fatal(err)
			}
			greeting := make([]byte, len("220 ready\r\n"))
			if _, err := io.ReadFull(raw, greeting); err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Write([]byte("cd")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "abcd" {
				t.Fatalf("server read %q, %v; want abcd", got, err)
			}
		})
	}
}

// TestInvalidHelloFallsBack: a hello that breaks a rule gets the fallback
// hello, and an ACK without the URMA bit makes a TCP connection; with the
// URMA bit the server drops the connection (it fell back: protocol breakdown).
func TestInvalidHelloFallsBack(t *testing.T) {
	checkNoLeaks(t)
	pa, _ := fabricPair(t)
	reg := prometheus.NewRegistry()
	cfg := cfgWith(pa, smallFlags())
	cfg.Registerer = reg
	ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	bad := fakeHello()
	bad.JettyID = 0
	longMsg := handshake.AppendV2(nil, fakeHello())
	binary.BigEndian.PutUint16(longMsg[4:], uint16(len(longMsg)+100))
	longMsg = append(longMsg, bytes.Repeat([]byte{0xaa}, 100)...) // valid, but names no jetty: import fails
	tests := []struct {
		name   string
		hello  []byte
		reason Reason
	}{
		{"v2 jetty id zero", handshake.AppendV2(nil, bad), ReasonInvalidHello},
		{"v3 jetty id zero", handshake.AppendV3(nil, bad), ReasonInvalidHello},
		{"v2 wrong version", func() []byte { b := handshake.AppendV2(nil, fakeHello()); b[7] = 9; return b }(), ReasonInvalidHello},
		{"v3 garbage body", []byte("URM3\x00\x00\x00\x03\xff\xff\xff"), ReasonInvalidHello},
		{"v2 longer msg_len, jetty unknown", longMsg, ReasonImportFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw, reply, err := rawHello(t, ln.Addr().String(), tc.hello)
			if !errors.Is(err, handshake.ErrInvalidHello) || !handshake.IsFallback(reply) {
				t.Fatalf("server reply: %+v, %v; want the fallback hello", reply, err)
			}
			if _, err := raw.Write(append(handshake.AppendAck(nil, false), "after"...)); err != nil {
				t.Fatal(err)
			}
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if r := c.(Conn).FallbackReason(); !strings.HasPrefix(r, string(tc.reason)) {
				t.Fatalf("reason %q, want %s", r, tc.reason)
			}
			got := make([]byte, 5)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "after" {
				t.Fatalf("read %q, %v: the ACK must not reach the application", got, err)
			}
		})
	}

	t.Run("ACK for URMA after a server fallback", func(t *testing.T) {
		raw, _, err := rawHello(t, ln.Addr().String(), handshake.AppendV2(nil, bad))
		if !errors.Is(err, handshake.ErrInvalidHello) {
			t.Fatal(err)
		}
		if _, err := raw.Write(handshake.AppendAck(nil, true)); err != nil {
			t.Fatal(err)
		}
		if n, err := raw.Read(make([]byte, 1)); err == nil {
			t.Fatalf("read %d bytes; the server should have dropped the connection", n)
		}
		eventually.Holds(t, "the handshake error metric", 5*time.Second, func() bool {
			return handshakeCount(t, reg, "error", "server") >= 1
		})
	})
}

// handshakeCount reads the count of the handshake histogram for result.
func handshakeCount(t *testing.T, reg *prometheus.Registry, result, role string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "urma_transport_handshake_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["result"] == result && labels["role"] == role {
				n += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return n
}

// TestClientAlwaysSendsAck pins the client's bytes against a scripted
// server: after a fallback hello, the ACK still comes, with flags 0.
func TestClientAlwaysSendsAck(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		name    string
		version int
		reply   func() []byte
		reason  Reason
	}{
		{"v2 fallback hello", 2, func() []byte { return handshake.AppendV2Fallback(nil) }, ReasonPeerDeclined},
		{"v3 fallback hello", 3, func() []byte { return handshake.AppendV3Fallback(nil) }, ReasonPeerDeclined},
		{"v2 hello naming no jetty", 2, func() []byte { h := fakeHello(); h.SQSize = 16; return handshake.AppendV2(nil, h) }, ReasonImportFailed},
		{"brpc server v2 hello, dialer with token", 2, func() []byte { return handshake.AppendV2(nil, fakeHello()) }, ReasonTokenMismatch},
		{"v2 broken hello", 2, func() []byte { b := handshake.AppendV2(nil, fakeHello()); b[9] = 7; return b }, ReasonInvalidHello},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			type result struct {
				version handshake.Version
				ack     []byte
				err     error
			}
			got := make(chan result, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					got <- result{err: err}
					return
				}
				defer c.Close()
				magic := make([]byte, 4)
				if _, err := io.ReadFull(c, magic); err != nil {
					got <- result{err: err}
					return
				}
				_, v, err := handshake.ReadHello(c, magic)
				if err != nil {
					got <- result{err: err}
					return
				}
				if _, err := c.Write(tc.reply()); err != nil {
					got <- result{err: err}
					return
				}
				ack := make([]byte, 4)
				_, err = io.ReadFull(c, ack)
				got <- result{v, ack, err}
				_, _ = io.Copy(c, c) // then echo, as a TCP server
			}()
			_, pb := fabricPair(t)
			f := smallFlags()
			f.ClientHandshakeVersion = tc.version
			c, err := Dial(context.Background(), "tcp", ln.Addr().String(), cfgWith(pb, f))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := <-got
			if r.err != nil {
				t.Fatalf("scripted server: %v", r.err)
			}
			if int(r.version) != tc.version {
				t.Errorf("client sent a v%d hello, want v%d", r.version, tc.version)
			}
			if !bytes.Equal(r.ack, []byte{0, 0, 0, 0}) {
				t.Errorf("ACK %x, want 00000000", r.ack)
			}
			if got := c.(Conn).FallbackReason(); !strings.HasPrefix(got, string(tc.reason)) {
				t.Errorf("reason %q, want %s", got, tc.reason)
			}
			if _, err := c.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 4)
			if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
				t.Fatalf("echo %q, %v", b, err)
			}
		})
	}
}

// TestForeignServer: a server that speaks first and knows nothing of URMA.
// The client keeps what it said and falls back without an ACK.
func TestForeignServer(t *testing.T) {
	checkNoLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("SSH-2.0-test\r\n"))
		_, _ = io.Copy(io.Discard, c)
	}()
	_, pb := fabricPair(t)
	c, err := Dial(context.Background(), "tcp", ln.Addr().String(), cfgWith(pb, smallFlags()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r := c.(Conn).FallbackReason(); !strings.HasPrefix(r, string(ReasonPeerNotURMA)) {
		t.Fatalf("reason %q", r)
	}
	got := make([]byte, 14)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "SSH-2.0-test\r\n" {
		t.Fatalf("read %q, %v: the server's greeting must be kept", got, err)
	}
}

// TestForeignClientWithoutAck: a client without our extension (brpc) that
// the server declines may go straight to TCP without an ACK; its bytes
// reach the application intact, whether it speaks first or waits.
func TestForeignClientWithoutAck(t *testing.T) {
	checkNoLeaks(t)
	pa, _ := fabricPair(t)
	cfg := cfgWith(pa, smallFlags())
	cfg.DisableURMA = true
	cfg.HandshakeTimeout = 200 * time.Millisecond
	ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		name, first string
	}{{"speaks first", "PRPC request bytes"}, {"waits for the server", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			raw, reply, err := rawHello(t, ln.Addr().String(), handshake.AppendV2(nil, fakeHello()))
			if !errors.Is(err, handshake.ErrInvalidHello) || !handshake.IsFallback(reply) {
				t.Fatalf("reply %+v, %v; want the fallback hello", reply, err)
			}
			if tc.first != "" {
				if _, err := raw.Write([]byte(tc.first)); err != nil {
					t.Fatal(err)
				}
			}
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.(Conn).Mode() != ModeTCP {
				t.Fatal("not TCP")
			}
			if tc.first != "" {
				got := make([]byte, len(tc.first))
				if _, err := io.ReadFull(c, got); err != nil || string(got) != tc.first {
					t.Fatalf("read %q, %v; want %q", got, err, tc.first)
				}
			}
			exchange(t, raw, c, "then both ways")
		})
	}
	// Our own clients (with the extension) still must ACK: bit 0 after a
	// fallback is a breakdown, not data.
	h := fakeHello()
	h.SQSize = 16
	raw, _, err := rawHello(t, ln.Addr().String(), handshake.AppendV2(nil, h))
	if !errors.Is(err, handshake.ErrInvalidHello) {
		t.Fatal(err)
	}
	if _, err := raw.Write([]byte("PRPC")); err != nil {
		t.Fatal(err)
	}
	if n, err := raw.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes; the server should have dropped our own client's bad ACK", n)
	}
}

// A fallen-back connection keeps net.Conn's promises where it waits outside
// the socket: the bytes the handshake kept, and the zero-copy API's heap
// buffers, which a caller holding them all would otherwise wait for
// forever.
func TestTCPModeWaitsEndWithDeadlinesAndClose(t *testing.T) {
	checkNoLeaks(t)
	tcpPair := func(t *testing.T) (Conn, ZeroCopyConn) {
		pa, pb := fabricPair(t)
		scfg, ccfg := cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags())
		scfg.DisableURMA = true
		p := connect(t, scfg, ccfg)
		if p.client.Mode() != ModeTCP {
			t.Fatalf("mode %s, want tcp", p.client.Mode())
		}
		return p.client, p.client.(ZeroCopyConn)
	}
	holdAll := func(t *testing.T, zc ZeroCopyConn) {
		t.Helper()
		for i := 0; i < tcpZeroCopyBuffers; i++ {
			b, err := zc.AllocBuffer()
			if err != nil {
				t.Fatalf("buffer %d: %v", i, err)
			}
			t.Cleanup(b.Release)
		}
	}
	cases := []struct {
		name string
		call func(ZeroCopyConn) error
		// end makes the waiting call return, before or while it waits.
		end     func(Conn)
		waiting bool // end it only once the call waits
		free    bool // leave the buffers free
		want    error
	}{
		{name: "AllocBuffer past the write deadline", call: allocErr,
			end: func(c Conn) { _ = c.SetWriteDeadline(time.Now().Add(-time.Second)) }, want: os.ErrDeadlineExceeded},
		{name: "ReadBuffer past the read deadline", call: readBufferErr,
			end: func(c Conn) { _ = c.SetReadDeadline(time.Now().Add(-time.Second)) }, want: os.ErrDeadlineExceeded},
		{name: "AllocBuffer deadline passes mid-wait", call: allocErr,
			end: func(c Conn) { _ = c.SetDeadline(time.Now()) }, waiting: true, want: os.ErrDeadlineExceeded},
		{name: "AllocBuffer closed while it waits", call: allocErr,
			end: func(c Conn) { _ = c.Close() }, waiting: true, want: net.ErrClosed},
		{name: "ReadBuffer closed while it waits", call: readBufferErr,
			end: func(c Conn) { _ = c.Close() }, waiting: true, want: net.ErrClosed},
		{name: "AllocBuffer after Close", call: allocErr,
			end: func(c Conn) { _ = c.Close() }, free: true, want: net.ErrClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, zc := tcpPair(t)
			if !tc.free {
				holdAll(t, zc)
			}
			if !tc.waiting {
				tc.end(c)
			}
			done := make(chan error, 1)
			go func() { done <- tc.call(zc) }()
			if tc.waiting {
				pool := c.(*tcpConn).heapPool()
				eventually.Holds(t, "the call to wait for a buffer", 5*time.Second, func() bool { return pool.waiters() == 1 })
				tc.end(c)
			}
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Fatalf("got %v, want %v", err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the call still waits")
			}
		})
	}
}

func allocErr(zc ZeroCopyConn) error {
	b, err := zc.AllocBuffer()
	if b != nil {
		b.Release()
	}
	return err
}

func readBufferErr(zc ZeroCopyConn) error {
	b, err := zc.ReadBuffer()
	if b != nil {
		b.Release()
	}
	return err
}

// A plain client's first bytes, kept by the server's handshake, are not
// served once the connection is closed or its read deadline has passed.
func TestTCPModeKeptBytesAfterCloseAndDeadline(t *testing.T) {
	cases := []struct {
		name string
		end  func(net.Conn)
		want error
	}{
		{name: "closed", end: func(c net.Conn) { _ = c.Close() }, want: net.ErrClosed},
		{name: "read deadline passed", end: func(c net.Conn) { _ = c.SetReadDeadline(time.Now().Add(-time.Second)) }, want: os.ErrDeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pa, _ := fabricPair(t)
			ln, _ := plainClient(t, cfgWith(pa, smallFlags()), "GET / HTTP/1.0\r\n\r\n")
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if kept, ok := c.(*tcpConn); !ok || len(kept.prefix) == 0 {
				t.Fatal("the handshake kept no bytes: the case tests nothing")
			}
			tc.end(c)
			n, err := c.Read(make([]byte, 16))
			if n != 0 || !errors.Is(err, tc.want) {
				t.Fatalf("Read: %d bytes, %v; want 0, %v", n, err, tc.want)
			}
		})
	}
}

// TestDeclinedForeignClientShortThenClosed: a client without our
// extension (brpc) that the server declines goes to TCP without an ACK,
// so what it sends next is application data, however short. One that
// sends fewer than four bytes (or none) and then ends its side is served
// as TCP with those bytes and then io.EOF, as a plain client that does
// the same is (readFirstBytes), and gets the server's answer; it used to
// be dropped as a failed ACK read. Our own clients always send the ACK:
// one whose ACK is cut short is still dropped.
func TestDeclinedForeignClientShortThenClosed(t *testing.T) {
	checkNoLeaks(t)
	pa, _ := fabricPair(t)
	cfg := cfgWith(pa, smallFlags())
	cfg.DisableURMA = true
	ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ours := fakeHello()
	ours.SQSize = 16 // our extension
	for _, tc := range []struct {
		name   string
		hello  handshake.Hello
		sent   string
		served bool
	}{
		{"brpc client, nothing", fakeHello(), "", true},
		{"brpc client, 1 byte", fakeHello(), "P", true},
		{"brpc client, 2 bytes", fakeHello(), "PR", true},
		{"brpc client, 3 bytes", fakeHello(), "PRP", true},
		{"our client, 3 bytes of an ACK", ours, "\x00\x00\x00", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, reply, err := rawHello(t, ln.Addr().String(), handshake.AppendV2(nil, tc.hello))
			if !errors.Is(err, handshake.ErrInvalidHello) || !handshake.IsFallback(reply) {
				t.Fatalf("reply %+v, %v; want the fallback hello", reply, err)
			}
			if _, err := raw.Write([]byte(tc.sent)); err != nil {
				t.Fatal(err)
			}
			if err := raw.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			// What the client reads until the server ends: nothing when the
			// server drops it, the server's reply when it is served.
			type answer struct {
				got []byte
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				got, err := io.ReadAll(raw)
				answered <- answer{got, err}
			}()
			if !tc.served {
				if a := <-answered; len(a.got) != 0 {
					t.Fatalf("client read %q; the server should have dropped our own client's cut ACK", a.got)
				}
				return
			}
			acc := acceptAsync(ln)
			var c net.Conn
			select {
			case a := <-acc:
				if a.err != nil {
					t.Fatal(a.err)
				}
				c = a.c
			case a := <-answered:
				t.Fatalf("the server dropped the client (it read %q, %v) instead of serving it as TCP", a.got, a.err)
			}
			defer c.Close()
			if c.(Conn).Mode() != ModeTCP {
				t.Fatalf("mode %s, want tcp", c.(Conn).Mode())
			}
			got, err := io.ReadAll(c)
			if err != nil || string(got) != tc.sent {
				t.Fatalf("server read %q, %v; want %q then io.EOF", got, err, tc.sent)
			}
			if _, err := c.Write([]byte("reply")); err != nil {
				t.Fatal(err)
			}
			_ = c.Close()
			if a := <-answered; a.err != nil || string(a.got) != "reply" {
				t.Fatalf("client read %q, %v; want the server's reply", a.got, a.err)
			}
		})
	}
}
