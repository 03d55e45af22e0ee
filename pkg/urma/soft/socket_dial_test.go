package soft

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A dialer told DUPLICATE waits for the peer's own connection, redialing
// with a backoff that doubles from a millisecond up to 100 ms, until the
// dial timeout: against a peer that always says DUPLICATE it dials a
// handful of times, not in a tight loop, and the import then fails: the
// peer is unreachable.
func TestDuplicateRedialBacksOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustOK(t, err, "listen")
	defer ln.Close()
	eid, err := SocketEID(netip.MustParseAddrPort(ln.Addr().String()))
	mustOK(t, err, "EID")
	var dials atomic.Int64
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			var hb [4 + helloLen]byte
			if _, err := io.ReadFull(nc, hb[:]); err == nil {
				var ab [4 + helloAckLen]byte
				_, _ = nc.Write(encodeHelloAck(ab[:], &helloAck{status: helloDuplicate, eid: eid, maxMsg: 1 << 20}))
			}
			_ = nc.Close()
		}
	}()
	opts := socketOpts()
	opts.DialTimeout = time.Second
	a := newSide(t, newProvider(t, opts), urma.JettyConfig{}, 64)
	_, err = a.ctx.ImportJetty(context.Background(), urma.JettyID{EID: eid, ID: 1}, urma.RC, 0)
	if !errors.Is(err, urma.ErrUnreachable) || !strings.Contains(err.Error(), "connect to") {
		t.Fatalf("import from a peer that always says DUPLICATE: %v", err)
	}
	_ = ln.Close()
	<-served
	// 1+2+4+...+64 ms, then 100 ms at a time: at most 17 dials fit in the
	// second; a slow machine makes fewer.
	if n := dials.Load(); n < 2 || n > 17 {
		t.Errorf("%d dials in a %v dial timeout against DUPLICATE answers, want a few (2..17)", n, opts.DialTimeout)
	}
}
