package transport

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
)

// TestUnequalQueueDepths: two ends of ours with different send and receive
// queue depths each size both windows and both credit thresholds from the
// other's hello, and a stream of several windows flows both ways at once
// without a stall (issue 15, item 2). Each side's send window is
// min(its sq, the peer's rq) - 3; it returns credits once more than half of
// the peer's send window is pending: (min(its rq, the peer's sq) - 3) / 2.
func TestUnequalQueueDepths(t *testing.T) {
	checkNoLeaks(t)
	type depths struct{ sq, rq int }
	for _, tc := range []struct {
		client, server depths
	}{
		{depths{16, 64}, depths{64, 16}},
		{depths{64, 16}, depths{16, 64}},
		{depths{32, 128}, depths{16, 48}},
		{depths{128, 32}, depths{48, 16}},
		{depths{16, 16}, depths{128, 128}},
	} {
		name := fmt.Sprintf("client sq%d rq%d, server sq%d rq%d", tc.client.sq, tc.client.rq, tc.server.sq, tc.server.rq)
		t.Run(name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			flagsOf := func(d depths) Config {
				f := smallFlags()
				f.SQSize, f.RQSize = d.sq, d.rq
				f.BufferCount = 512
				return cfgWith(nil, f)
			}
			scfg, ccfg := flagsOf(tc.server), flagsOf(tc.client)
			scfg.Provider, ccfg.Provider = pa, pb
			p := connect(t, scfg, ccfg)
			if p.client.Mode() != ModeURMA {
				t.Fatal(p.client.FallbackReason())
			}
			for _, side := range []struct {
				name      string
				c         Conn
				own, peer depths
			}{{"client", p.client, tc.client, tc.server}, {"server", p.server, tc.server, tc.client}} {
				d := side.c.Debug()
				if want := min(side.own.sq, side.peer.rq) - creditWRs; d.WindowCapacity != want {
					t.Errorf("%s: WindowCapacity %d, want min(sq %d, peer rq %d) - 3 = %d", side.name, d.WindowCapacity, side.own.sq, side.peer.rq, want)
				}
				if want := (min(side.own.rq, side.peer.sq) - creditWRs) / 2; d.CreditThreshold != want {
					t.Errorf("%s: CreditThreshold %d, want (min(rq %d, peer sq %d) - 3) / 2 = %d", side.name, d.CreditThreshold, side.own.rq, side.peer.sq, want)
				}
			}
			// Four of the larger window each way, at once, in full-size
			// messages.
			bufSize := smallFlags().BufferSize
			total := 4 * max(p.client.Debug().WindowCapacity, p.server.Debug().WindowCapacity) * bufSize
			type result struct {
				sum [32]byte
				err error
			}
			run := func(f func() ([32]byte, error)) chan result {
				ch := make(chan result, 1)
				go func() {
					s, err := f()
					ch <- result{s, err}
				}()
				return ch
			}
			up := run(func() ([32]byte, error) { return stream(p.client, 1, total, bufSize) })
			down := run(func() ([32]byte, error) { return stream(p.server, 2, total, bufSize) })
			gotUp := run(func() ([32]byte, error) { return drain(p.server, 3, total, bufSize) })
			gotDown := run(func() ([32]byte, error) { return drain(p.client, 4, total, bufSize) })
			timeout := time.After(30 * time.Second)
			var sums [4]result
			for i, ch := range []chan result{up, down, gotUp, gotDown} {
				select {
				case sums[i] = <-ch:
					if sums[i].err != nil {
						t.Fatal(sums[i].err)
					}
				case <-timeout:
					t.Fatalf("the streams stalled: client %s; server %s", p.client.Debug(), p.server.Debug())
				}
			}
			if sums[0].sum != sums[2].sum || sums[1].sum != sums[3].sum {
				t.Fatal("the bytes differ")
			}
		})
	}
}

// TestWriterWaitsForTheSendQueue: with the send queue window spent but
// receives still posted at the peer, a writer waits (within its deadline)
// and counts a send-queue stall, not a remote-receive-queue one; it goes
// on once a send slot is free.
func TestWriterWaitsForTheSendQueue(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	reg := prometheus.NewRegistry()
	ccfg := cfgWith(pb, smallFlags())
	ccfg.Registerer = reg
	p := connect(t, cfgWith(pa, smallFlags()), ccfg)
	uc := p.client.(*urmaConn)
	// Every send posted, none completed yet: only the send queue is full.
	uc.mu.Lock()
	free := uc.sqWindow
	uc.sqWindow = 0
	uc.mu.Unlock()
	_ = p.client.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := p.client.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write with the send queue full: %d, %v; want a timeout", n, err)
	}
	stalls := func(window string) float64 {
		return counterValue(t, reg, "urma_transport_window_stalls_total", map[string]string{"window": window})
	}
	if sq, rq := stalls(metrics.WindowSQ), stalls(metrics.WindowRemoteRQ); sq != 1 || rq != 0 {
		t.Errorf("stalls: send queue %v, remote receive queue %v; want 1 and 0", sq, rq)
	}
	_ = p.client.SetWriteDeadline(time.Time{})
	uc.mu.Lock()
	uc.sqWindow = free
	uc.mu.Unlock()
	notify(uc.writable)
	exchange(t, p.client, p.server, "the send queue has room again")
}
