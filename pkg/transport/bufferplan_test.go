package transport

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// defaultsOn is the zero Config's flags (brpc's defaults, none given) on
// the software fabric named, meeting in dir for shm.
func defaultsOn(t *testing.T, fabric, dir string) Config {
	t.Helper()
	f := flags.Defaults()
	f.PreparedJettyCnt = 1 // given, but no buffer flag: the transport still sizes them
	return Config{Flags: &f, SoftFabric: fabric, LookupEnv: envOf(map[string]string{EnvShmDir: dir}), Logger: logr.Discard()}
}

// sendCounts writes msg on from and reads it on to, and reports how many
// SENDs it took and how many messages arrived.
func sendCounts(t *testing.T, from, to Conn, msg []byte) (sent, received uint64) {
	t.Helper()
	s0, r0 := from.Debug().MessagesSent, to.Debug().MessagesReceived
	got := make([]byte, len(msg))
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(to, got)
		done <- err
	}()
	if _, err := from.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("%d bytes arrived changed", len(msg))
	}
	return from.Debug().MessagesSent - s0, to.Debug().MessagesReceived - r0
}

// TestOwnBuffersOneSendPerMessage: with no buffer flag given, on the
// software provider, a connection between two of our peers receives into
// 16 buffers of 1 MiB of its own and sends from buffers as large: a Write
// of up to 1 MiB is one SEND and one message at the peer, larger ones a
// SEND per MiB, on either fabric.
func TestOwnBuffersOneSendPerMessage(t *testing.T) {
	for _, fabric := range []string{FabricShm, FabricSocket} {
		t.Run(fabric, func(t *testing.T) {
			dir := t.TempDir()
			p := connect(t, defaultsOn(t, fabric, dir), defaultsOn(t, fabric, dir))
			requireURMA(t, "default flags on "+fabric, p.client, p.server)
			for _, c := range []Conn{p.client, p.server} {
				d := c.Debug()
				if d.BufferSize != autoMaxBuffer || d.Receives != autoRecvCount || d.RemoteBufferSize != autoMaxBuffer || d.MaxMessage != autoMaxBuffer {
					t.Fatalf("%s: receives %d of %d bytes, the peer's %d, messages up to %d; want %d of %d, %d, %d",
						d.Role, d.Receives, d.BufferSize, d.RemoteBufferSize, d.MaxMessage, autoRecvCount, autoMaxBuffer, autoMaxBuffer, autoMaxBuffer)
				}
				if d.WindowCapacity != autoRecvCount-creditWRs || d.OwnSendBuffers != d.WindowCapacity {
					t.Fatalf("%s: a window of %d with %d send buffers of its own, want %d of each", d.Role, d.WindowCapacity, d.OwnSendBuffers, autoRecvCount-creditWRs)
				}
			}
			for _, tc := range []struct {
				size  int
				sends uint64
			}{{4 << 10, 1}, {64 << 10, 1}, {1 << 20, 1}, {5<<20 + 1, 6}} {
				msg := bytes.Repeat([]byte{byte(tc.size)}, tc.size)
				msg[len(msg)-1] = 0xee
				for _, dir := range []struct {
					name     string
					from, to Conn
				}{{"client to server", p.client, p.server}, {"server to client", p.server, p.client}} {
					sent, received := sendCounts(t, dir.from, dir.to, msg)
					if sent != tc.sends || received != tc.sends {
						t.Errorf("%s, %d bytes: %d SENDs, %d messages received; want %d", dir.name, tc.size, sent, received, tc.sends)
					}
				}
			}
		})
	}
}

// shortDir is a temporary directory whose path is short enough for the
// shm fabric's unix socket whatever the test's name.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "urma")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// writeFlagsFile writes text as a flags file and returns an environment
// naming it (URMA_FLAGS_FILE) and the shm directory.
func writeFlagsFile(t *testing.T, dir, text string) func(string) (string, bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "urma.flags")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return envOf(map[string]string{EnvFlagsFile: path, EnvShmDir: dir})
}

// TestGivenBufferFlagsWin: a buffer flag that is given (a flags file names
// it, as the operator's always does; a command line or a program sets it)
// is used as given, whatever its value; the transport sizes the buffers
// only when none is. The other side adapts to either: it sends no message
// larger than the receives announced to it.
func TestGivenBufferFlagsWin(t *testing.T) {
	set := func(name, value string) func(t *testing.T, dir string) Config {
		return func(t *testing.T, dir string) Config {
			c := defaultsOn(t, FabricShm, dir)
			if err := c.Flags.Set(name, value); err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	file := func(text string) func(t *testing.T, dir string) Config {
		return func(t *testing.T, dir string) Config {
			return Config{SoftFabric: FabricShm, LookupEnv: writeFlagsFile(t, dir, text), Logger: logr.Discard()}
		}
	}
	defaults := func(t *testing.T, dir string) Config { return defaultsOn(t, FabricShm, dir) }
	for _, tc := range []struct {
		name           string
		client, server func(t *testing.T, dir string) Config
		size, count    int    // the client's receives
		peerSize       int    // the server's
		sends, back    uint64 // SENDs of a 64 KiB Write, client to server and back
	}{
		{name: "a flags file naming the default size", client: file("--urma_buffer_size=8192\n"), server: file("--urma_buffer_size=8192\n"), size: 8 << 10, count: 128, peerSize: 8 << 10, sends: 8, back: 8},
		{name: "the operator's rendered file", client: file(flags.Defaults().Render()), server: file(flags.Defaults().Render()), size: 8 << 10, count: 128, peerSize: 8 << 10, sends: 8, back: 8},
		{name: "a program's own buffer size", client: func(t *testing.T, dir string) Config {
			c := defaultsOn(t, FabricShm, dir)
			c.Flags.BufferSize = 16 << 10
			return c
		}, server: defaults, size: 16 << 10, count: 128, peerSize: autoMaxBuffer, sends: 4, back: 4},
		{name: "urma_buffer_count given", client: set("urma_buffer_count", "4096"), server: set("urma_buffer_count", "4096"), size: 8 << 10, count: 128, peerSize: 8 << 10, sends: 8, back: 8},
		{name: "only urma_rq_size given", client: set("urma_rq_size", "64"), server: set("urma_rq_size", "64"), size: autoRecvBytes / 64, count: 64, peerSize: autoRecvBytes / 64, sends: 1, back: 1},
		{name: "sized by the transport, to a server with the flags' sizes", client: defaults, server: file("--urma_buffer_size=8192\n"), size: autoMaxBuffer, count: autoRecvCount, peerSize: 8 << 10, sends: 8, back: 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortDir(t) // the subtest's name would make the socket path too long
			p := connect(t, tc.server(t, dir), tc.client(t, dir))
			requireURMA(t, tc.name, p.client, p.server)
			d := p.client.Debug()
			if d.BufferSize != tc.size || d.Receives != tc.count || d.RemoteBufferSize != tc.peerSize {
				t.Fatalf("client receives %d of %d bytes, the server's are %d bytes; want %d of %d, %d", d.Receives, d.BufferSize, d.RemoteBufferSize, tc.count, tc.size, tc.peerSize)
			}
			if s := p.server.Debug(); s.RemoteBufferSize != tc.size || s.BufferSize != tc.peerSize {
				t.Fatalf("the server sees the client's receives as %d bytes and its own as %d, want %d and %d", s.RemoteBufferSize, s.BufferSize, tc.size, tc.peerSize)
			}
			msg := bytes.Repeat([]byte("64k."), 16<<10)
			if sent, _ := sendCounts(t, p.client, p.server, msg); sent != tc.sends {
				t.Errorf("a 64 KiB Write, client to server: %d SENDs, want %d", sent, tc.sends)
			}
			if sent, _ := sendCounts(t, p.server, p.client, msg); sent != tc.back {
				t.Errorf("a 64 KiB Write, server to client: %d SENDs, want %d", sent, tc.back)
			}
		})
	}
}

// TestBrpcClientGetsThePoolsReceives: a server that sizes its buffers
// itself serves a brpc client (no extension in its hello) from the pool,
// as the flags size it: the receives brpc's own are, and the only ones
// its hello announces.
func TestBrpcClientGetsThePoolsReceives(t *testing.T) {
	pa, pb := fabricPair(t)
	f := flags.Defaults()
	f.PreparedJettyCnt = 1
	ln := listenLoopback(t, cfgWith(pa, f))
	b := newBrpcPeer(t, pb, 128, 16)
	negotiated, err := b.dial(ln.Addr().String())
	if err != nil || !negotiated {
		t.Fatalf("brpc client handshake: %v, %v", negotiated, err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b.peer.BufferSize != uint32(f.BufferSize) || b.peer.RecvBufferCnt != uint32(f.RQSize-1) {
		t.Fatalf("our hello to brpc announces %d receives of %d bytes, want urma_rq_size %d of urma_buffer_size %d", b.peer.RecvBufferCnt+1, b.peer.BufferSize, f.RQSize, f.BufferSize)
	}
	if d := c.(Conn).Debug(); d.MaxMessage != brpcBlock || d.OwnSendBuffers != 0 {
		t.Fatalf("to brpc: messages up to %d bytes, %d send buffers of its own; want %d (its receives), none", d.MaxMessage, d.OwnSendBuffers, brpcBlock)
	}
	streamBoth(t, b, c, 64<<10)
}

// TestReadBufferCopiesLargeMessagesInPieces: with urma_recv_zerocopy off,
// ReadBuffer copies each message out of its receive; a message larger
// than a pool buffer (the connection's own receives are) comes out a pool
// buffer at a time, every byte of it.
func TestReadBufferCopiesLargeMessagesInPieces(t *testing.T) {
	dir := t.TempDir()
	cfg := func() Config {
		c := defaultsOn(t, FabricShm, dir)
		c.Flags.RecvZerocopy = false
		return c
	}
	p := connect(t, cfg(), cfg())
	requireURMA(t, "zero-copy off", p.client, p.server)
	msg := make([]byte, 3*p.server.Debug().MaxMessage/4+7)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	go func() { _, _ = p.client.Write(msg) }()
	zc := p.server.(ZeroCopyConn)
	var got []byte
	for len(got) < len(msg) {
		b, err := zc.ReadBuffer()
		if err != nil {
			t.Fatal(err)
		}
		if b.Len() > flags.Defaults().BufferSize {
			t.Fatalf("ReadBuffer handed out %d bytes, more than a pool buffer holds", b.Len())
		}
		got = append(got, b.Bytes()...)
		b.Release()
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("%d bytes arrived, changed or in the wrong order", len(got))
	}
}

// TestOwnReceivesReleasedWithTheConnection: a connection's own receive
// buffers are unmapped when it closes, but not while the application
// still holds one (ReadBuffer), which stays readable until released.
func TestOwnReceivesReleasedWithTheConnection(t *testing.T) {
	dir := t.TempDir()
	p := connect(t, defaultsOn(t, FabricShm, dir), defaultsOn(t, FabricShm, dir))
	requireURMA(t, "default flags", p.client, p.server)
	uc := p.server.(*urmaConn)
	if uc.rxPool == uc.pool {
		t.Fatal("the connection receives into the engine pool")
	}
	mem := uc.rxPool.mem
	msg := bytes.Repeat([]byte("held"), 1024)
	if _, err := p.client.Write(msg); err != nil {
		t.Fatal(err)
	}
	held, err := p.server.(ZeroCopyConn).ReadBuffer()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.server.Close(); err != nil {
		t.Fatal(err)
	}
	if mem.Bytes() == nil || !bytes.Equal(held.Bytes(), msg) {
		t.Fatal("the receive buffer the application holds was unmapped, or changed, at close")
	}
	held.Release()
	if mem.Bytes() != nil {
		t.Fatal("the connection's receive buffers stay mapped after its close and the last release")
	}
}

// TestEveryConnectionOnURMAWithinTheBudget: with the default flags every
// connection gets URMA while the jetty budget has room (neither the pool
// nor anything else runs out first), and the next one falls back with the
// budget as its reason.
func TestEveryConnectionOnURMAWithinTheBudget(t *testing.T) {
	const budget = 20
	dir := t.TempDir()
	cfg := func() Config {
		c := defaultsOn(t, FabricShm, dir)
		c.JettyBudget = budget
		return c
	}
	ln, d := listenAndDialer(t, cfg(), cfg())
	var ps []pair
	for i := 0; i < budget; i++ {
		ps = append(ps, dialAccept(t, ln, d))
		requireURMA(t, fmt.Sprintf("connection %d of a budget of %d", i+1, budget), ps[i].client, ps[i].server)
	}
	over := dialAccept(t, ln, d)
	if over.client.Mode() != ModeTCP || !strings.HasPrefix(over.client.FallbackReason(), string(ReasonBudgetExhausted)) {
		t.Fatalf("connection %d: %s (%q), want TCP with %s", budget+1, over.client.Mode(), over.client.FallbackReason(), ReasonBudgetExhausted)
	}
	for _, p := range ps {
		exchange(t, p.client, p.server, "still on URMA")
	}
}
