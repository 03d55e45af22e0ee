package soft

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Two devices that dial each other at the same moment end up with exactly
// one TCP connection, the same one on both sides, and it carries traffic
// both ways.
func TestOneConnectionPerDevicePair(t *testing.T) {
	for round := 0; round < 25; round++ {
		func() {
			noLeaks(t)
			pa, pb := newProvider(t, socketOpts()), newProvider(t, socketOpts())
			a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
			b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
			var ta, tb urma.RemoteJetty
			var ea, eb error
			var wg sync.WaitGroup
			start := make(chan struct{})
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-start
				ta, ea = a.ctx.ImportJetty(context.Background(), b.jetty.ID(), urma.RC, 7)
			}()
			go func() {
				defer wg.Done()
				<-start
				tb, eb = b.ctx.ImportJetty(context.Background(), a.jetty.ID(), urma.RC, 7)
			}()
			close(start)
			wg.Wait()
			mustOK(t, ea, "import A->B")
			mustOK(t, eb, "import B->A")
			defer ta.Close()
			defer tb.Close()
			ca, cb := pa.conns(), pb.conns()
			if len(ca) != 1 || len(cb) != 1 {
				t.Fatalf("round %d: %d and %d connections, want one each", round, len(ca), len(cb))
			}
			// The one connection runs from one device to the other's listener.
			if ca[0].local != pa.addr() && ca[0].remote != pb.addr() {
				t.Fatalf("round %d: connection %s<->%s is not between %s and %s", round, ca[0].local, ca[0].remote, pa.addr(), pb.addr())
			}
			if ca[0].local != cb[0].remote || ca[0].remote != cb[0].local {
				t.Fatalf("round %d: the sides kept different connections: %s<->%s vs %s<->%s", round,
					ca[0].local, ca[0].remote, cb[0].local, cb[0].remote)
			}
			a.postRecv(1, 0, 64)
			b.postRecv(1, 0, 64)
			mustOK(t, a.send(ta, 1, 0, 64, 0), "send A->B")
			mustOK(t, b.send(tb, 1, 0, 64, 0), "send B->A")
			pollN(t, a.rjfc, 1, 2*time.Second)
			pollN(t, b.rjfc, 1, 2*time.Second)
		}()
	}
}

// fakePeer is a hand-driven socket fabric device: it answers the handshake
// and imports, then does whatever the test scripts.
type fakePeer struct {
	t      testing.TB
	ln     net.Listener
	eid    urma.EID
	maxMsg uint64 // the MaxMsgSize it announces; 0 means 1 MiB
}

func newFakePeer(t testing.TB) *fakePeer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustOK(t, err, "listen")
	return fakePeerOn(t, ln)
}

// fakePeerOn is a fake peer answering on ln, which it closes at the end.
func fakePeerOn(t testing.TB, ln net.Listener) *fakePeer {
	t.Cleanup(func() { ln.Close() })
	eid, err := SocketEID(netip.MustParseAddrPort(ln.Addr().String()))
	mustOK(t, err, "EID")
	return &fakePeer{t: t, ln: ln, eid: eid}
}

// accept takes one connection and answers its HELLO and one IMPORT_JETTY.
func (f *fakePeer) accept() (net.Conn, *bufio.Reader) {
	nc, br, r := f.acceptHello()
	if nc == nil {
		return nil, nil
	}
	var rb [4 + importRespLen]byte
	nc.Write(encodeImportResp(rb[:], r.req, urma.CodeSuccess))
	return nc, br
}

// serve runs fn on the fake peer's first connection (see accept) on a
// goroutine of its own, closes the connection when fn returns and then
// done; fn is not called when the provider never dials.
func (f *fakePeer) serve(done chan<- struct{}, fn func(nc net.Conn, br *bufio.Reader)) {
	go func() {
		defer close(done)
		nc, br := f.accept()
		if nc == nil {
			return
		}
		defer nc.Close()
		fn(nc, br)
	}()
}

// wantInOrder fails the test unless got starts with want's user contexts
// and statuses, in order: a jetty's completions in post order.
func wantInOrder(t testing.TB, got, want []urma.Completion) {
	t.Helper()
	for i, w := range want {
		if i >= len(got) || got[i].UserCtx != w.UserCtx || got[i].Status != w.Status {
			t.Fatalf("completions %+v, want (ctx, status) %+v", got, want)
		}
	}
}

// ackWhenTold reads one SEND and answers it with SUCCESS once told
// receives a value; a closed told leaves it unanswered.
func ackWhenTold(nc net.Conn, br *bufio.Reader, told <-chan struct{}) {
	h, err := readSend(br)
	if err != nil {
		return
	}
	if _, ok := <-told; ok {
		ackSend(nc, h)
	}
}

// ackSend answers the SEND h with SUCCESS.
func ackSend(nc net.Conn, h sendHeader) {
	var b [4 + ackLen]byte
	nc.Write(encodeAck(b[:], &ackFrame{status: urma.StatusSuccess, src: h.src, dst: h.dst, tag: h.tag}))
}

// acceptHello takes one connection, answers its HELLO and reads one
// IMPORT_JETTY, which it leaves unanswered.
func (f *fakePeer) acceptHello() (net.Conn, *bufio.Reader, importJettyReq) {
	nc, br := f.handshake()
	if nc == nil {
		return nil, nil, importJettyReq{}
	}
	var ib [4 + importJettyLen]byte
	if _, err := io.ReadFull(br, ib[:]); err != nil {
		return nil, nil, importJettyReq{}
	}
	r, _ := decodeImportJetty(ib[4:])
	return nc, br, r
}

// handshake takes one connection and answers its HELLO.
func (f *fakePeer) handshake() (net.Conn, *bufio.Reader) {
	nc, err := f.ln.Accept()
	if err != nil {
		return nil, nil
	}
	br := bufio.NewReader(nc)
	var hb [4 + helloLen]byte
	if _, err := io.ReadFull(br, hb[:]); err != nil {
		nc.Close()
		return nil, nil
	}
	var ab [4 + helloAckLen]byte
	maxMsg := f.maxMsg
	if maxMsg == 0 {
		maxMsg = 1 << 20
	}
	nc.Write(encodeHelloAck(ab[:], &helloAck{eid: f.eid, maxMsg: maxMsg}))
	return nc, br
}

// readSend reads one SEND frame, payload included.
func readSend(br *bufio.Reader) (sendHeader, error) {
	var h sendHeader
	var b [4 + sendHdrLen]byte
	if _, err := io.ReadFull(br, b[:]); err != nil {
		return h, err
	}
	if err := decodeSendHeader(b[4:], be.Uint32(b[:4]), &h); err != nil {
		return h, err
	}
	_, err := br.Discard(int(h.length))
	return h, err
}

// A peer that breaks the protocol loses its connection, with the reason
// logged, and the sends outstanding to it complete with ACK_TIMEOUT; a peer
// that goes silent is declared dead with the same result, and the log names
// the configured PeerTimeout (not the default) as the silence it waited out;
// so is a peer that trickles a frame, never silent for PeerTimeout, once the
// frame's bound (framebound.For) passes.
// No wall-clock bound: on a loaded machine the watchdog's ticks come late.
func TestBadPeerFailsOutstandingSends(t *testing.T) {
	trickled := append(encodeSendHeader(make([]byte, 4+sendHdrLen), &sendHeader{opcode: urma.OpSend, dst: 999, length: 4096}),
		make([]byte, 4096)...)
	cases := []struct {
		name    string
		respond func(nc net.Conn, h sendHeader)
		log     string
	}{
		{"bad ACK status", func(nc net.Conn, h sendHeader) {
			var b [4 + ackLen]byte
			encodeAck(b[:], &ackFrame{status: urma.StatusLocAccess, src: h.src, dst: h.dst, tag: h.tag})
			nc.Write(b[:])
		}, "ACK status"},
		{"unknown frame", func(nc net.Conn, h sendHeader) { nc.Write([]byte{0, 0, 0, 4, 200, 0, 0, 0}) }, "unknown frame type"},
		{"oversize SEND", func(nc net.Conn, h sendHeader) { nc.Write([]byte{0xff, 0xff, 0xff, 0xff, frameSend}) }, "payload outside"},
		{"silent", func(nc net.Conn, h sendHeader) {}, fmt.Sprintf("peer silent for %v", socketOpts().PeerTimeout)},
		{"trickling a frame", func(nc net.Conn, h sendHeader) {
			for i := range trickled {
				if _, err := nc.Write(trickled[i : i+1]); err != nil {
					return // the provider hung up
				}
				time.Sleep(socketOpts().PeerTimeout / 10) // the trickle under test, not a synchronisation
			}
		}, "peer stalled mid-frame: waited"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			var sink logtest.Lines
			opts := socketOpts()
			opts.Logger = sink.Logger(nil)
			p := newProvider(t, opts)
			a := newSide(t, p, urma.JettyConfig{RNRRetry: 7}, 64)
			f := newFakePeer(t)
			done := make(chan struct{})
			f.serve(done, func(nc net.Conn, br *bufio.Reader) {
				// Both sends are outstanding before the peer misbehaves.
				h, err := readSend(br)
				if err == nil {
					_, err = readSend(br)
				}
				if err != nil {
					return
				}
				c.respond(nc, h)
				io.Copy(io.Discard, br) // read until the provider hangs up
			})
			target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
			mustOK(t, err, "import from the fake peer")
			defer target.Close()
			mustOK(t, a.send(target, 1, 0, 100, 0), "send")
			mustOK(t, a.send(target, 2, 0, 100, 0), "send")
			cs := pollN(t, a.sjfc, 2, 5*time.Second)
			if cs[0].Status != urma.StatusAckTimeout || cs[1].Status != urma.StatusWRFlushErr {
				t.Errorf("completions %+v, want ACK_TIMEOUT then WR_FLUSH_ERR", cs)
			}
			<-done
			if !sink.Contains(c.log) {
				t.Errorf("no log line says %q: %q", c.log, sink.All())
			}
		})
	}
}

// A slow but healthy socket peer that writes a large frame in pieces, with
// pauses between them, takes longer over it than PeerTimeout: the frame's
// bound grows with what arrives (framebound.For), so the connection stays up
// and the answer the peer writes after the frame comes through.
func TestSocketSlowLargeFrameIsNotFailed(t *testing.T) {
	// A piece earns PeerTimeout/8, twice the pause, and the pauses add up
	// to twice PeerTimeout: a watchdog that times the frame from a tick up
	// to PeerTimeout/4 late, and checks it once a tick, still sees it pass
	// PeerTimeout. The long PeerTimeout leaves nearly all of it between
	// pauses: only a peer or reader descheduled that long looks stalled.
	const piece, pieces = 128 << 10, 32
	opts := socketOpts()
	opts.PeerTimeout = time.Second
	p, sink := loggedProvider(t, opts)
	a := newSide(t, p, urma.JettyConfig{}, 64)
	f := newFakePeer(t)
	done, release := make(chan struct{}), make(chan struct{})
	defer func() { close(release); <-done }()
	took := make(chan time.Duration, 1)
	f.serve(done, func(nc net.Conn, br *bufio.Reader) {
		h, err := readSend(br)
		if err != nil {
			return
		}
		start := time.Now()
		if _, err := nc.Write(encodeSendHeader(make([]byte, 4+sendHdrLen), &sendHeader{opcode: urma.OpSend, dst: 999, length: piece * pieces})); err != nil {
			return
		}
		payload := make([]byte, piece)
		for range pieces {
			time.Sleep(opts.PeerTimeout / 16) // the slow peer under test, not a synchronisation
			if _, err := nc.Write(payload); err != nil {
				return
			}
		}
		took <- time.Since(start)
		ackSend(nc, h)
		<-release // hanging up now could reset the connection before the answer is read
	})
	target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
	mustOK(t, err, "import from the fake peer")
	defer target.Close()
	mustOK(t, a.send(target, 1, 0, 100, 0), "send")
	cs := pollN(t, a.sjfc, 1, 20*time.Second) // a hang, not a measurement
	if cs[0].Status != urma.StatusSuccess {
		t.Fatalf("the send answered after the large frame completed with %v, want SUCCESS; log: %q", cs[0].Status, sink.All())
	}
	if d := <-took; d <= opts.PeerTimeout {
		t.Errorf("the peer took %v over the frame, no longer than PeerTimeout %v: nothing tested", d, opts.PeerTimeout)
	}
}

// Hostile bytes on the listener close that connection, say why in the log,
// and leave the device serving honest peers.
func TestHostileConnections(t *testing.T) {
	var sink logtest.Lines
	opts := socketOpts()
	opts.Logger = sink.Logger(nil)
	pb := newProvider(t, opts)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	bEID := b.ctx.EID()
	fakeEID, _ := SocketEID(netip.MustParseAddrPort("127.0.0.9:9"))
	hello := func(dst urma.EID) []byte {
		var hb [4 + helloLen]byte
		return encodeHello(hb[:], &hello{session: 1, src: fakeEID, dst: dst, maxMsg: 1 << 20})
	}
	good := hello(bEID)
	cases := []struct {
		name  string
		bytes []byte
		log   string
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("z", 40)), "bad HELLO"},
		{"truncated hello", good[:20], "bad HELLO"},
		{"wrong magic", append(append([]byte{}, good[:8]...), append([]byte("XXXX"), good[12:]...)...), "magic"},
		{"wrong version", append(append([]byte{}, good[:5]...), append([]byte{9}, good[6:]...)...), "version"},
		{"another device", hello(fakeEID), "wrong EID"},
		{"huge length", append(append([]byte{}, good...), 0xff, 0xff, 0xff, 0xf0, frameSend), "payload outside"},
		{"unknown type", append(append([]byte{}, good...), 0, 0, 0, 4, 77, 0, 0, 0), "unknown frame type"},
		{"short ACK", append(append([]byte{}, good...), 0, 0, 0, 8, frameAck, 0, 0, 0, 0, 0, 0, 0), "want 20"},
		{"second hello", append(append([]byte{}, good...), good...), "handshake frame"},
		{"bad SEND opcode", append(append([]byte{}, good...), func() []byte {
			var sb [4 + sendHdrLen]byte
			encodeSendHeader(sb[:], &sendHeader{opcode: 0x66, dst: 1})
			return sb[:]
		}()...), "opcode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", pb.addr())
			mustOK(t, err, "dial")
			defer nc.Close()
			nc.Write(c.bytes)
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = io.Copy(io.Discard, nc) // ends when the device hangs up
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("device kept a hostile connection open")
			}
			deadline := time.Now().Add(2 * time.Second)
			for !sink.Contains(c.log) {
				if time.Now().After(deadline) {
					t.Fatalf("no log line says %q: %q", c.log, sink.All())
				}
				time.Sleep(time.Millisecond) // polling deadline: the device logs after hanging up
			}
		})
	}
	// An honest peer still gets through.
	pa := newProvider(t, socketOpts())
	a := newSide(t, pa, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	b.postRecv(1, 0, 64)
	mustOK(t, a.send(target, 1, 0, 64, 0), "send")
	if c := pollN(t, a.sjfc, 1, 2*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("honest send after hostile peers: %+v", c)
	}
}

// A device whose EID encodes no address is reached through the Resolver.
func TestResolver(t *testing.T) {
	custom, _ := urma.ParseEID("fd00::b0b")
	pb := newProvider(t, Options{Devices: []DeviceSpec{{EIDs: []urma.EID{custom}}}, Logger: logr.Discard()})
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	if b.ctx.EID() != custom {
		t.Fatalf("device EID %s, want %s", b.ctx.EID(), custom)
	}
	plain := newProvider(t, socketOpts())
	pa := newSide(t, plain, urma.JettyConfig{}, 64)
	_, err := pa.ctx.ImportJetty(t.Context(), b.jetty.ID(), urma.RC, 7)
	if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "no resolver") {
		t.Fatalf("import without a resolver: %v", err)
	}
	asked := make(chan urma.EID, 4)
	opts := socketOpts()
	opts.Resolver = func(ctx context.Context, e urma.EID) (string, error) {
		asked <- e
		if e == custom {
			return pb.addr(), nil
		}
		return "", nil
	}
	pr := newProvider(t, opts)
	a := newSide(t, pr, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	if e := <-asked; e != custom {
		t.Errorf("resolver asked for %s", e)
	}
	b.postRecv(1, 0, 64)
	mustOK(t, a.send(target, 1, 0, 64, 0), "send")
	pollN(t, b.rjfc, 1, 2*time.Second)
	// A failing resolver fails the import with its reason.
	opts.Resolver = func(context.Context, urma.EID) (string, error) { return "", errors.New("no such pod") }
	bad := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
	_, err = bad.ctx.ImportJetty(t.Context(), b.jetty.ID(), urma.RC, 7)
	if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "no such pod") {
		t.Fatalf("import with a failing resolver: %v", err)
	}
}

// A peer that does not answer the handshake in time is unreachable, and the
// import says so within the dial timeout.
func TestDialTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustOK(t, err, "listen")
	defer ln.Close()
	go func() { // accept and say nothing
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	eid, _ := SocketEID(netip.MustParseAddrPort(ln.Addr().String()))
	opts := socketOpts()
	opts.DialTimeout = 200 * time.Millisecond
	a := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
	start := time.Now()
	_, err = a.ctx.ImportJetty(context.Background(), urma.JettyID{EID: eid, ID: 1}, urma.RC, 0)
	if !errors.Is(err, urma.ErrUnreachable) {
		t.Fatalf("import from a mute peer: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("import took %v with a %v dial timeout", el, opts.DialTimeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := a.ctx.ImportJetty(ctx, urma.JettyID{EID: eid, ID: 1}, urma.RC, 0); !errors.Is(err, urma.ErrTimeout) && !errors.Is(err, urma.ErrUnreachable) {
		t.Fatalf("import with a short context: %v", err)
	}
}

// Closing a provider does not wait for a dialer that never says HELLO, nor
// for a dial to a peer that never answers.
func TestCloseDoesNotWaitForHandshakes(t *testing.T) {
	noLeaks(t)
	opts := socketOpts()
	opts.DialTimeout = 30 * time.Second
	p, err := New(opts)
	mustOK(t, err, "new")
	silent, err := net.Dial("tcp", p.addr())
	mustOK(t, err, "dial")
	defer silent.Close()
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	mustOK(t, err, "listen")
	defer mute.Close()
	muteEID, _ := SocketEID(netip.MustParseAddrPort(mute.Addr().String()))
	s := newSide(t, p, urma.JettyConfig{}, 64)
	imported := make(chan error, 1)
	go func() {
		_, err := s.ctx.ImportJetty(context.Background(), urma.JettyID{EID: muteEID, ID: 1}, urma.RC, 0)
		imported <- err
	}()
	c, err := mute.Accept() // the dial arrived; never answer it
	mustOK(t, err, "accept")
	defer c.Close()
	start := time.Now()
	mustOK(t, p.Close(), "close")
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Close took %v", el)
	}
	if err := <-imported; !errors.Is(err, urma.ErrClosed) && !errors.Is(err, urma.ErrUnreachable) {
		t.Errorf("import during Close: %v", err)
	}
}

// peerDown fails only the sends outstanding to the peer whose connection
// broke, wherever they sit in the queue: not a send ahead of them to
// another peer (which is flushed as the jetty enters ERROR), nor a send to
// the broken peer that completed already while an older send waits.
func TestPeerDownFailsOnlyItsOutstandingSends(t *testing.T) {
	cases := []struct {
		name string
		// yAnswers: the peer Y answers its send before its connection breaks.
		yAnswers bool
		want     []urma.Completion // UserCtx and Status of each, in order
	}{
		{"send behind a send to another peer", false, []urma.Completion{
			{UserCtx: 2, Status: urma.StatusAckTimeout}, {UserCtx: 1, Status: urma.StatusWRFlushErr}}},
		{"completed send to the broken peer", true, []urma.Completion{
			{UserCtx: 2, Status: urma.StatusSuccess}, {UserCtx: 1, Status: urma.StatusSuccess}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			opts := socketOpts()
			opts.PeerTimeout = time.Minute // X stays up, however slow the machine
			p := newProvider(t, opts)
			a := newSide(t, p, urma.JettyConfig{Mode: urma.RM}, 64)
			// X reads the first send and answers it only when told; Y reads the
			// second, answers it or not, and drops its connection when told.
			x, y := newFakePeer(t), newFakePeer(t)
			answerX, dropY := make(chan struct{}), make(chan struct{})
			xDone, yDone := make(chan struct{}), make(chan struct{})
			defer func() { <-xDone; <-yDone }()
			defer close(answerX)
			x.serve(xDone, func(nc net.Conn, br *bufio.Reader) { ackWhenTold(nc, br, answerX) })
			y.serve(yDone, func(nc net.Conn, br *bufio.Reader) {
				h, err := readSend(br)
				if err != nil || !c.yAnswers {
					return
				}
				ackSend(nc, h)
				<-dropY
			})
			tx, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: x.eid, ID: 5}, urma.RM, 9)
			mustOK(t, err, "import from X")
			defer tx.Close()
			ty, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: y.eid, ID: 5}, urma.RM, 9)
			mustOK(t, err, "import from Y")
			defer ty.Close()
			var yConn *conn
			for _, cn := range p.conns() {
				if cn.peerEID == y.eid {
					yConn = cn
				}
			}
			mustOK(t, a.send(tx, 1, 0, 64, 0), "send to X")
			mustOK(t, a.send(ty, 2, 0, 64, 0), "send to Y")
			var got []urma.Completion
			if c.yAnswers {
				got = append(got, pollN(t, a.sjfc, 1, 10*time.Second)...)
				close(dropY)
				// Y's connection is gone, and peerDown has run, once its
				// reader released the stream.
				eventually.Holds(t, "Y's connection to be released", 0, func() bool {
					yConn.readMu.Lock()
					defer yConn.readMu.Unlock()
					return yConn.released
				})
				answerX <- struct{}{}
			} else {
				defer close(dropY)
			}
			got = append(got, pollN(t, a.sjfc, len(c.want)-len(got), 10*time.Second)...)
			wantInOrder(t, got, c.want)
		})
	}
}

// A send posted while its connection dies, after the connection is dead
// but before peerDown has failed the peer's sends, must not overtake the
// older send outstanding on that connection: the older one is the send the
// peer failed (ACK_TIMEOUT) and the new one is flushed behind it, in post
// order, as when peerDown gets there first. Under load an RNR retry's pump
// met this window between two sends (TestConformanceSocket/PeerKilled, a
// few runs in 600); the hook holds it open.
func TestSendMeetingDyingConnectionKeepsPostOrder(t *testing.T) {
	noLeaks(t)
	peerDone := make(chan struct{})
	t.Cleanup(func() { <-peerDone }) // registered first: runs once the provider has hung up
	opts := socketOpts()
	opts.PeerTimeout = time.Minute // only the test breaks the connection
	p := newProvider(t, opts)
	a := newSide(t, p, urma.JettyConfig{RNRRetry: 7}, 64)
	f := newFakePeer(t)
	f.serve(peerDone, func(_ net.Conn, br *bufio.Reader) {
		io.Copy(io.Discard, br) // answers nothing, so the first send stays outstanding
	})
	target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
	mustOK(t, err, "import from the fake peer")
	defer target.Close()
	mustOK(t, a.send(target, 7, 0, 64, 0), "send 7")
	conns := p.conns()
	if len(conns) != 1 {
		t.Fatalf("%d connections, want 1", len(conns))
	}
	// The hook runs in the test's own call to fail below; nothing else
	// breaks the connection, so no other goroutine reads it.
	posted := false
	var postErr error
	p.devices[0].side.connDying = func(c *conn) {
		if c == conns[0] && !posted {
			posted = true
			postErr = a.send(target, 8, 64, 64, 0)
		}
	}
	conns[0].fail(errors.New("broken by the test"))
	if !posted {
		t.Fatal("the connection died without running the hook")
	}
	mustOK(t, postErr, "send 8 while the connection dies")
	got := pollN(t, a.sjfc, 2, 10*time.Second)
	want := []urma.Completion{{UserCtx: 7, Status: urma.StatusAckTimeout}, {UserCtx: 8, Status: urma.StatusWRFlushErr}}
	wantInOrder(t, got, want)
}

// An import waits for the peer's answer only as long as its context: once
// the caller cancels, it returns ErrTimeout, though the connection is
// healthy and the peer may still answer. A peer that closes instead makes
// it ErrUnreachable. Either way the cause stays reachable for errors.Is.
func TestImportHonoursItsContext(t *testing.T) {
	tests := []struct {
		name       string
		peerLeaves bool // the peer closes the connection instead of answering
		want       []error
	}{
		{name: "cancelled", want: []error{urma.ErrTimeout, context.Canceled}},
		{name: "peer closed", peerLeaves: true, want: []error{urma.ErrUnreachable, io.EOF}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			opts := socketOpts()
			opts.PeerTimeout = time.Minute // the connection outlives the test
			a := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
			f := newFakePeer(t)
			asked, stop := make(chan struct{}), make(chan struct{})
			peerDone := make(chan struct{})
			go func() {
				defer close(peerDone)
				nc, _, _ := f.acceptHello()
				if nc == nil {
					return
				}
				defer nc.Close()
				close(asked) // and never answer
				if tc.peerLeaves {
					return
				}
				<-stop
			}()
			defer func() { close(stop); <-peerDone }()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if !tc.peerLeaves {
				go func() {
					<-asked
					cancel()
				}()
			}
			_, err := a.ctx.ImportJetty(ctx, urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("import: %v, want errors.Is %v", err, w)
				}
			}
		})
	}
}

// A receive that a message is being written into still counts against the
// JFR's depth, and closing the JFR waits until the message is done with it:
// the sender stops half-way, and either sends the rest once Close waits, or
// never does, so that only its connection dying of silence (which puts the
// receive back) ends the wait.
func TestJFRReceiveBeingFilled(t *testing.T) {
	rest := make(chan struct{}, 1) // the fake sender sends the rest of its message
	cases := []struct {
		name  string
		check func(t *testing.T, b *side, conn *conn)
	}{
		{"counts against the depth", func(t *testing.T, b *side, _ *conn) {
			if err := b.jfr.PostRecv(&urma.RecvWR{SGEs: []urma.SGE{{Segment: b.seg, Len: 64}}}); !errors.Is(err, urma.ErrAgain) {
				t.Fatalf("post past the depth while a receive is being filled: %v, want ErrAgain", err)
			}
		}},
		{"Close waits for it to arrive", func(t *testing.T, b *side, _ *conn) {
			mustOK(t, b.jetty.Close(), "close the jetty")
			r := b.jfr.(*jfr)
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				if err := b.jfr.Close(); err != nil {
					t.Errorf("close the JFR: %v", err)
				}
			}()
			eventually.Holds(t, "Close to start", 0, func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				return r.closed
			})
			rest <- struct{}{} // the message completes now
			select {
			case <-closed:
			case <-time.After(30 * time.Second):
				t.Fatal("JFR Close never returned, though the message arrived whole")
			}
		}},
		{"Close waits for it", func(t *testing.T, b *side, conn *conn) {
			mustOK(t, b.jetty.Close(), "close the jetty")
			closeOutlastsConnection(t, "the JFR", b.jfr, conn, "a message was still being written into a receive")
			mustOK(t, b.seg.Close(), "unregister the receive's segment after Close")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			p := newProvider(t, socketOpts())
			b := newSide(t, p, urma.JettyConfig{}, 64)
			const depth = 64 // newSide's JFR
			for i := range depth {
				b.postRecv(uint64(i), 0, 4096)
			}
			f := newFakePeer(t)
			stop, peerDone := make(chan struct{}), make(chan struct{})
			f.serve(peerDone, func(nc net.Conn, _ *bufio.Reader) {
				frame := sendFrame(sendHeader{opcode: urma.OpSend, dst: b.jetty.ID().ID, token: 7}, make([]byte, 4096))
				nc.Write(frame[:len(frame)-100]) // the rest comes only when told
				select {
				case <-rest:
					nc.Write(frame[len(frame)-100:])
					<-stop
				case <-stop:
				}
			})
			defer func() { close(stop); <-peerDone }()
			target, err := b.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
			mustOK(t, err, "import from the fake peer")
			defer target.Close()
			r := b.jfr.(*jfr)
			eventually.Holds(t, "the message to take a receive", 0, func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				return r.inProgress == 1
			})
			c.check(t, b, p.conns()[0])
		})
	}
}

// A receive whose message broke off (its sender's connection died in the
// middle of the payload) goes back to the head of the queue, in its place:
// the next message, from another sender, lands in it, and the one after
// in the receive posted after it.
func TestJFRReceivePutBackInPlace(t *testing.T) {
	noLeaks(t)
	p := newProvider(t, socketOpts())
	b := newSide(t, p, urma.JettyConfig{}, 64)
	b.postRecv(1, 0, 4096)
	b.postRecv(2, 4096, 4096)
	f := newFakePeer(t)
	peerDone := make(chan struct{})
	f.serve(peerDone, func(nc net.Conn, _ *bufio.Reader) {
		frame := sendFrame(sendHeader{opcode: urma.OpSend, dst: b.jetty.ID().ID, token: 7}, make([]byte, 4096))
		nc.Write(frame[:len(frame)-100]) // and dies in the middle of the payload
	})
	target, err := b.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
	mustOK(t, err, "import from the fake peer")
	defer target.Close()
	<-peerDone
	r := b.jfr.(*jfr)
	eventually.Holds(t, "the broken message's receive to be put back", 0, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.inProgress == 0 && r.n == 2 && r.ring[r.head].userCtx == 1
	})
	a := newSide(t, newProvider(t, socketOpts()), urma.JettyConfig{RNRRetry: 7}, 64)
	toB := a.importJetty(b)
	for i := range 2 {
		mem := a.mem.Bytes()[i*4096 : (i+1)*4096]
		for k := range mem {
			mem[k] = byte(i + 1)
		}
		mustOK(t, a.send(toB, uint64(i), i*4096, 4096, 0), "send")
	}
	pollN(t, a.sjfc, 2, 10*time.Second)
	cs := pollN(t, b.rjfc, 2, 10*time.Second)
	for i, c := range cs {
		if c.Status != urma.StatusSuccess || c.UserCtx != uint64(i+1) || c.CompletionLen != 4096 {
			t.Fatalf("receive %d: %+v, want SUCCESS in receive %d", i, c, i+1)
		}
		got := b.mem.Bytes()[i*4096 : (i+1)*4096]
		if !bytes.Equal(got, bytes.Repeat([]byte{byte(i + 1)}, 4096)) {
			t.Fatalf("receive %d holds the wrong bytes", i+1)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n != 0 || r.inProgress != 0 {
		t.Fatalf("%d receives still posted, %d in progress, want none", r.n, r.inProgress)
	}
}

// An answer that arrived before its connection died is the request's
// result, not the death: a peer that answers an import and then hangs up
// has answered. (With both ready, a bare select picks either; a hundred
// tries leave that a 2^-100 chance of passing.)
func TestAnswerBeforeDeathWins(t *testing.T) {
	tests := []struct {
		name                  string
		answer, dead, givenUp bool
		wantAnswered          bool
		wantBroke             bool
	}{
		{name: "answered, then died", answer: true, dead: true, wantAnswered: true},
		{name: "answered", answer: true, wantAnswered: true},
		{name: "died unanswered", dead: true, wantBroke: true},
		{name: "given up", givenUp: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for range 100 {
				ch, done := make(chan urma.Code, 1), make(chan struct{})
				if tc.answer {
					ch <- urma.CodeExist
				}
				if tc.dead {
					close(done)
				}
				ctx, cancel := context.WithCancel(t.Context())
				if tc.givenUp {
					cancel()
				}
				code, answered, broke := awaitAnswer(ctx, ch, done)
				cancel()
				if answered != tc.wantAnswered || broke != tc.wantBroke || (answered && code != urma.CodeExist) {
					t.Fatalf("awaitAnswer = %v, answered %v, broke %v; want answered %v, broke %v", code, answered, broke, tc.wantAnswered, tc.wantBroke)
				}
			}
		})
	}
}

// A device keeps no entry for peers that came and went: a long-lived
// server that clients in many processes (each its own EID) connected to
// over time holds only what is still in use. Every connection here is
// from another EID, and each is gone before the next.
func TestPeerEntriesDoNotOutliveTheirConnections(t *testing.T) {
	noLeaks(t)
	p := newProvider(t, socketOpts())
	sd := p.devices[0].side
	entries := func() int {
		sd.mu.Lock()
		defer sd.mu.Unlock()
		return len(sd.peers)
	}
	const cycles = 64
	for i := range cycles {
		src, err := SocketEID(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.9"), uint16(1000+i)))
		mustOK(t, err, "eid")
		nc, _ := fakeDial(t, p.addr(), src, sd.eid)
		eventually.Holds(t, "the device to adopt the connection", 0, func() bool { return len(p.conns()) == 1 })
		mustOK(t, nc.Close(), "hang up")
		eventually.Holds(t, "the device to drop the connection", 0, func() bool { return len(p.conns()) == 0 })
	}
	// Entries go with the garbage collector's freeing of them.
	eventually.Holds(t, "the device to drop the entries of the peers gone", 0, func() bool {
		runtime.GC()
		return entries() == 0
	})
}
