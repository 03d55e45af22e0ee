package transport

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// TestProtocolErrors: a peer that breaks the data-plane rules gets its
// connection closed with an error that says which rule, and the metric
// counts it.
func TestProtocolErrors(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		name    string
		breakIt func(r *rawPeer)
		wantErr string
		proto   bool
	}{
		{"credit above the window", func(r *rawPeer) { r.send(0, 1000) }, "peer returned 1000 credits", true},
		{"credit overflowing the window", func(r *rawPeer) { r.send(0, 1) }, "peer returned 1 credits with the remote receive window at 13 of 13", true},
		{"zero-length message without credit", func(r *rawPeer) { r.send(0, 0) }, "zero-length message without a credit", true},
		// An immediate of 0 is no credit either, whatever the opcode.
		{"zero-length SEND_WITH_IMM of 0 credits", func(r *rawPeer) { r.sendOp(urma.OpSendWithImm, 0, 0) }, "zero-length message without a credit", true},
		{"message larger than a receive buffer", func(r *rawPeer) { r.send(rawBuf, 0) }, "status LOC_LEN", false},
		{"data on the TCP connection", func(r *rawPeer) { _, _ = r.tcp.Write([]byte("x")) }, "sent data on the TCP connection", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			reg := prometheus.NewRegistry()
			scfg := cfgWith(pa, smallFlags()) // 1 KiB buffers, 16-deep queues
			scfg.Registerer = reg
			r, c := serveRawPeer(t, scfg, pb)
			// The raw peer's first message is fine.
			if st := r.send(10, 0); st != urma.StatusSuccess {
				t.Fatalf("first send: %s", st)
			}
			if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
				t.Fatal(err)
			}
			tc.breakIt(r)
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err := c.Read(make([]byte, 1))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || errors.Is(err, ErrProtocol) != tc.proto {
				t.Fatalf("read: %v; want an error containing %q (protocol error: %v)", err, tc.wantErr, tc.proto)
			}
			if _, err := c.Write([]byte("x")); err == nil {
				t.Fatal("write on a failed connection succeeded")
			}
			// The peer sees its TCP connection end.
			_ = r.tcp.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := r.tcp.Read(make([]byte, 1)); err == nil {
				t.Fatal("the peer's TCP connection is still open")
			}
			if tc.proto {
				eventually.Holds(t, "the protocol error metric", 5*time.Second, func() bool {
					mfs, _ := reg.Gather()
					for _, mf := range mfs {
						if mf.GetName() == "urma_transport_protocol_errors_total" {
							return mf.GetMetric()[0].GetCounter().GetValue() == 1
						}
					}
					return false
				})
			}
		})
	}
}

// TestBrpcStylePeerCredits: a peer without our extension (a brpc peer) gets
// its credits in batches below the smallest legal window, and a steady
// stream flows both ways.
func TestBrpcStylePeerCredits(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	f := smallFlags()
	f.RQSize = 64
	r, uc := serveRawPeer(t, cfgWith(pa, f), pb)
	if r.server.HasToken {
		t.Error("a NoToken server advertised a token")
	}
	if r.server.RecvBufferCnt != 63 {
		t.Errorf("server advertised recv_buffer_cnt %d, want rq_size-1 = 63", r.server.RecvBufferCnt)
	}
	if want := (16 - creditWRs) / 2; uc.threshold != want {
		t.Fatalf("credit threshold for a peer of unknown SQ depth = %d, want %d", uc.threshold, want)
	}
	// Thirteen messages (the raw peer's whole window) reach the reader, and
	// reading them returns credits before the peer's window runs out.
	for i := 0; i < 13; i++ {
		if st := r.send(100, 0); st != urma.StatusSuccess {
			t.Fatalf("send %d: %s", i, st)
		}
		if _, err := io.ReadFull(uc, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
	}
	// Credits go back once more than the threshold (6) are pending: the
	// first batch is 7, not 6.
	if r.credits < 7 || r.batches[0] != 7 {
		t.Fatalf("the peer got %d credits back for 13 messages in batches %v, want a first batch of 7", r.credits, r.batches)
	}
}

// TestTokenProtectsJettyAndSegments: a server's jetty takes messages only
// with its connection's token. As on UB hardware, importing never checks a
// token; the target checks it on every message, so a send through an
// import with a wrong token completes with REM_ACCESS_ABORT and the server
// sees nothing. (Segments are checked the same way, on access; the
// transport does no one-sided access.)
func TestTokenProtectsJettyAndSegments(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	ln, err := ListenTransport("tcp", "127.0.0.1:0", cfgWith(pa, smallFlags()))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := newOurRawPeer(t, pb, ln.Addr().String()) // imports with the right token
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := r.server
	if !h.HasToken || h.Token == 0 {
		t.Fatalf("server hello carries no token: %+v", h)
	}
	jetty := urma.JettyID{EID: h.EID, UASID: h.UASID, ID: h.JettyID}
	good, goodJetty := r.target, r.jetty
	for _, tok := range []urma.Token{0, urma.Token(h.Token + 1)} {
		rj, err := r.ctx.ImportJetty(context.Background(), jetty, urma.RM, tok)
		if err != nil {
			t.Fatalf("import jetty with token %#x: %v (imports do not check tokens)", tok, err)
		}
		// A failed send puts a jetty in ERROR: one jetty per attempt.
		j, err := r.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 16, SendJFC: r.jfc, JFR: r.jfr, RNRRetry: 7})
		if err != nil {
			t.Fatal(err)
		}
		r.target, r.jetty = rj, j
		if st := r.send(8, 0); st != urma.StatusRemAccessAbort {
			t.Errorf("send with token %#x completed as %s, want REM_ACCESS_ABORT", tok, st)
		}
		r.target, r.jetty = good, goodJetty
		_ = j.Close()
		_ = rj.Close()
	}
	// The rejected messages did not reach the server: the next bytes it
	// reads are those sent with the right token.
	copy(r.mem.Bytes()[20*rawBuf:], "right token")
	if st := r.send(11, 0); st != urma.StatusSuccess {
		t.Fatalf("send with the right token: %s", st)
	}
	got := make([]byte, 11)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "right token" {
		t.Fatalf("server read %q, %v; want the right-token message only", got, err)
	}
}

// TestCreditToAClosedPeer: a peer that sent its last messages and closed
// is still read to the end. Close closes the TCP connection before it
// destroys the jetty, but the reader may notice the EOF only after it
// returned credits to the vanished jetty; that failed send must not turn
// the buffered bytes and the io.EOF into an error. Here the peer's jetty
// goes first, so the failing credit is certain.
func TestCreditToAClosedPeer(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	r, uc := serveRawPeer(t, cfgWith(pa, smallFlags()), pb)
	const msgs, size = 13, 100 // the whole window
	for i := 0; i < msgs; i++ {
		if st := r.send(size, 0); st != urma.StatusSuccess {
			t.Fatalf("send %d: %s", i, st)
		}
	}
	// The peer's jetty vanishes; its TCP connection is still open.
	for _, x := range []io.Closer{r.target, r.rseg, r.jetty} {
		_ = x.Close()
	}
	r.target, r.rseg, r.jetty = nil, nil, nil
	got := make([]byte, msgs*size)
	if _, err := io.ReadFull(uc, got); err != nil {
		t.Fatalf("read the buffered messages: %v", err)
	}
	eventually.Holds(t, "the credit to the vanished jetty to fail", 5*time.Second, func() bool {
		return strings.HasPrefix(uc.Debug().State, "SEND_FAILED")
	})
	if _, err := uc.Write([]byte("x")); err == nil || !strings.Contains(err.Error(), "REM_ACCESS_ABORT") {
		t.Fatalf("write after the failed send: %v", err)
	}
	// The failed credit message gave its reserved work request back
	// (issue 9, item 6): nothing is outstanding, so Close does not wait.
	if free := uc.Debug().CreditWRsFree; free != creditWRs {
		t.Errorf("%d of %d credit work requests free after the failed credit send", free, creditWRs)
	}
	_ = r.tcp.Close() // now the peer's end arrives
	if n, err := uc.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read after the peer's EOF: %d, %v; want io.EOF", n, err)
	}
	// The clean end cancelled the escalation: the send failure can no
	// longer turn it into a failure after sendFailGrace.
	uc.mu.Lock()
	escalating := uc.escalate != nil
	uc.mu.Unlock()
	if escalating {
		t.Error("the send-failure timer still runs after the peer's clean end")
	}
}

// TestCreditsUpToTheWindow: a peer may return a whole window's credits in
// one message once every send of the window is out; that is no protocol
// error, and writing goes on.
func TestCreditsUpToTheWindow(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	r, uc := serveRawPeer(t, cfgWith(pa, smallFlags()), pb)
	window := uc.Debug().WindowCapacity // min(16, the raw peer's 16) - 3
	for i := 0; i < window; i++ {
		if _, err := uc.Write([]byte("m")); err != nil {
			t.Fatal(err)
		}
	}
	eventually.Holds(t, "the window to be spent", 5*time.Second, func() bool { return uc.Debug().RemoteRQWindow == 0 })
	if st := r.send(0, uint64(window)); st != urma.StatusSuccess {
		t.Fatalf("credit send: %s", st)
	}
	eventually.Holds(t, "the credits to arrive", 5*time.Second, func() bool {
		d := uc.Debug()
		return d.RemoteRQWindow == window || d.State != "ESTABLISHED"
	})
	if d := uc.Debug(); d.State != "ESTABLISHED" {
		t.Fatalf("state %s after a whole window of credits, want ESTABLISHED", d.State)
	}
	if _, err := uc.Write([]byte("more")); err != nil {
		t.Fatalf("write after the credits came back: %v", err)
	}
}
