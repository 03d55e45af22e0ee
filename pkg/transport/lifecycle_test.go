package transport

import (
	"io"
	"sync"
	"testing"
)

// TestReleaseRacesClose: a received buffer released while its connection
// closes goes back to the pool whichever comes first; its slot is never
// lost (issue 9, item 2). The first case releases it at the worst moment,
// just after the JFR is destroyed; the second lets the two race freely,
// many times.
func TestReleaseRacesClose(t *testing.T) {
	checkNoLeaks(t)
	iterations := 300
	if testing.Short() {
		iterations = 30
	}
	for _, tc := range []struct {
		name         string
		iterations   int
		atJFRDestroy bool
	}{
		{"release as the JFR is destroyed", 1, true},
		{"release racing close", iterations, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			fp := newFaultProvider(pa)
			f := smallFlags()
			f.PreparedJettyCnt = 0 // nothing but the connection holds pool buffers
			ln, err := ListenTransport("tcp", "127.0.0.1:0", cfgWith(fp, f))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			d, err := NewDialer(cfgWith(pb, f))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			msg := make([]byte, f.ZerocopyMinSize) // handed over in its receive buffer
			for i := 0; i < tc.iterations; i++ {
				p := dialAccept(t, ln, d)
				if p.server.Mode() != ModeURMA {
					t.Fatal(p.server.FallbackReason())
				}
				if _, err := p.client.Write(msg); err != nil {
					t.Fatal(err)
				}
				b, err := p.server.(ZeroCopyConn).ReadBuffer()
				if err != nil {
					t.Fatal(err)
				}
				if b.recv == nil {
					t.Fatal("the message was copied, not handed over in its receive buffer")
				}
				if tc.atJFRDestroy {
					fp.f.set(func(c *faultConfig) { c.onJFRClose = b.Release })
					_ = p.server.Close()
					fp.f.set(func(c *faultConfig) { c.onJFRClose = nil })
				} else {
					var wg sync.WaitGroup
					wg.Add(2)
					go func() { defer wg.Done(); b.Release() }()
					go func() { defer wg.Done(); _ = p.server.Close() }()
					wg.Wait()
				}
				_ = p.client.Close()
				if _, inUse := ln.e.pool.stats(); inUse != 0 {
					t.Fatalf("iteration %d: %d server buffers still out after the connection closed and its buffer was released", i, inUse)
				}
			}
		})
	}
}

// TestWriteBufferRacesRelease: a buffer passed to WriteBuffer while another
// goroutine releases it is taken back exactly once: either the write sends
// it or the release returns it, and the pool never holds it twice (issue 9,
// item 6).
func TestWriteBufferRacesRelease(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	go func() { _, _ = io.Copy(io.Discard, p.server) }()
	zc := p.client.(ZeroCopyConn)
	iterations := 2000
	if testing.Short() {
		iterations = 200
	}
	for i := 0; i < iterations; i++ {
		b, err := zc.AllocBuffer()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); b.Release() }()
		_ = zc.WriteBuffer(b, 1) // fails when the release won
		<-done
	}
	pool := p.client.(*urmaConn).pool
	if err := pool.check(); err != nil {
		t.Fatal(err)
	}
}
