package soft

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/benchbase"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Benchmark names, for `make bench` and its ratio printer (grouped by size):
//
//	BenchmarkMemcpy/size=S                             copy between two mmap'd regions
//	BenchmarkTCPLoopback/size=S                        one-way stream over loopback TCP
//	BenchmarkTCPLoopbackRTT/size=S                     ping-pong over loopback TCP
//	BenchmarkRaw/fabric=F/completion=C/size=S          one-way send/recv throughput
//	BenchmarkRawRTT/fabric=F/completion=C/size=S       round trip (ping-pong) latency
//
// F is inproc, shm or socket (the shm fabric between two providers of this
// process: the same rings and wake-ups as between two), C is poll or event,
// S is 64B, 4KiB, 64KiB or 1MiB.

var benchSizes = benchbase.Sizes()

var benchFabrics = []string{"inproc", "shm", "socket"}

func BenchmarkMemcpy(b *testing.B) {
	for _, s := range benchSizes {
		b.Run("size="+s.Name, func(b *testing.B) { benchbase.Memcpy(b, s.N) })
	}
}

func BenchmarkTCPLoopback(b *testing.B) {
	for _, s := range benchSizes {
		b.Run("size="+s.Name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			done := make(chan int64)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- -1
					return
				}
				n, _ := io.Copy(io.Discard, c)
				c.Close()
				done <- n
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, s.N)
			b.ReportAllocs()
			b.SetBytes(int64(s.N))
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			c.Close()
			if n := <-done; n != int64(b.N)*int64(s.N) {
				b.Fatalf("receiver got %d bytes, want %d", n, int64(b.N)*int64(s.N))
			}
		})
	}
}

func BenchmarkTCPLoopbackRTT(b *testing.B) {
	for _, s := range benchSizes {
		b.Run("size="+s.Name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			go func() { // echo
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				buf := make([]byte, s.N)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, s.N)
			b.ReportAllocs()
			b.SetBytes(int64(s.N))
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchEP is one side of a benchmark: the objects, and a window of slots.
type benchEP struct {
	ctx     urma.Context
	jfce    urma.JFCE
	sendJFC urma.JFC
	recvJFC urma.JFC
	jfr     urma.JFR
	jetty   urma.Jetty
	mem     *urma.Memory
	seg     urma.Segment
	target  urma.RemoteJetty
	event   bool
	events  []urma.JFC
	cs      []urma.Completion // what next returns
	scs     []urma.Completion // send completions drained on the side
	// Work requests are built once and reused, as the API allows: passing
	// a fresh one through the interface would allocate it every time.
	sendWR  urma.SendWR
	sendSGE [1]urma.SGE
	recvWR  urma.RecvWR
	recvSGE [1]urma.SGE
}

func benchPair(b *testing.B, fabric string, event bool, window, size int) (*benchEP, *benchEP) {
	b.Helper()
	var pa, pb *Provider
	switch fabric {
	case "inproc":
		f := NewFabric()
		pa, pb = newProvider(b, Options{Fabric: f, Logger: quiet()}), newProvider(b, Options{Fabric: f, Logger: quiet()})
	case "shm":
		opts := shmOpts(b)
		opts.Logger = quiet()
		pa, pb = newProvider(b, opts), newProvider(b, opts)
	default:
		pa, pb = newProvider(b, Options{Logger: quiet()}), newProvider(b, Options{Logger: quiet()})
	}
	mk := func(p *Provider) *benchEP {
		e := &benchEP{event: event, events: make([]urma.JFC, 2), cs: make([]urma.Completion, 32), scs: make([]urma.Completion, 32)}
		var err error
		must := func(err error) {
			if err != nil {
				b.Fatal(err)
			}
		}
		e.ctx, err = p.Open("", 0)
		must(err)
		var jfce urma.JFCE
		if event {
			e.jfce, err = e.ctx.CreateJFCE()
			must(err)
			jfce = e.jfce
		}
		e.sendJFC, err = e.ctx.CreateJFC(urma.JFCConfig{Depth: uint32(4 * window), JFCE: jfce})
		must(err)
		e.recvJFC, err = e.ctx.CreateJFC(urma.JFCConfig{Depth: uint32(4 * window), JFCE: jfce})
		must(err)
		e.jfr, err = e.ctx.CreateJFR(urma.JFRConfig{Mode: urma.RC, Depth: uint32(window), JFC: e.recvJFC})
		must(err)
		e.jetty, err = e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: uint32(window), SendJFC: e.sendJFC, JFR: e.jfr, RNRRetry: 7})
		must(err)
		e.mem, err = urma.AllocMemory(2 * window * size)
		must(err)
		// Fault every page in now: first-touch faults are setup, not data path.
		for i := 0; i < len(e.mem.Bytes()); i += 4096 {
			e.mem.Bytes()[i] = 1
		}
		e.seg, err = e.ctx.RegisterSegment(e.mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
		must(err)
		if event {
			must(e.sendJFC.Rearm(false))
			must(e.recvJFC.Rearm(false))
		}
		b.Cleanup(func() {
			for _, c := range []io.Closer{e.target, e.jetty, e.jfr, e.recvJFC, e.sendJFC} {
				if c != nil {
					_ = c.Close()
				}
			}
			if e.jfce != nil {
				_ = e.jfce.Close()
			}
			_ = e.seg.Close()
			_ = e.mem.Free()
			_ = e.ctx.Close()
		})
		return e
	}
	a, c := mk(pa), mk(pb)
	var err error
	if a.target, err = a.ctx.ImportJetty(b.Context(), c.jetty.ID(), urma.RC, 0); err != nil {
		b.Fatal(err)
	}
	if c.target, err = c.ctx.ImportJetty(b.Context(), a.jetty.ID(), urma.RC, 0); err != nil {
		b.Fatal(err)
	}
	return a, c
}

// next returns completions from q: polled, or in event mode after waiting on
// the JFCE (wait, ack, rearm, poll again). Zero means nothing arrived yet.
func (e *benchEP) next(q urma.JFC) ([]urma.Completion, error) {
	n, err := q.Poll(e.cs)
	if n > 0 || err != nil || !e.event {
		return e.cs[:n], err
	}
	k, err := e.jfce.Wait(e.events, 100*time.Millisecond)
	if err != nil {
		return nil, err
	}
	for _, fired := range e.events[:k] {
		fired.Ack(1)
		if err := fired.Rearm(false); err != nil {
			return nil, err
		}
	}
	n, err = q.Poll(e.cs)
	return e.cs[:n], err
}

func (e *benchEP) postRecv(slot, size int) error {
	e.recvSGE[0] = urma.SGE{Segment: e.seg, Offset: uint64(slot * size), Len: uint32(size)}
	e.recvWR = urma.RecvWR{UserCtx: uint64(slot), SGEs: e.recvSGE[:]}
	return e.jfr.PostRecv(&e.recvWR)
}

func (e *benchEP) postSend(slot, size, window int) error {
	e.sendSGE[0] = urma.SGE{Segment: e.seg, Offset: uint64((window + slot) * size), Len: uint32(size)}
	e.sendWR = urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: e.target, UserCtx: uint64(slot), SGEs: e.sendSGE[:]}
	return e.jetty.PostSend(&e.sendWR)
}

// BenchmarkRaw measures one-way throughput: the benchmark goroutine keeps a
// window of sends outstanding; a receiver goroutine reposts each buffer it
// gets. Every send is signaled. The sender never sends more than the
// receiver has buffers for (credits, as a transport's flow control would
// return them), so no send meets "receiver not ready".
func BenchmarkRaw(b *testing.B) {
	for _, fabric := range benchFabrics {
		for _, mode := range []string{"poll", "event"} {
			for _, s := range benchSizes {
				b.Run(fmt.Sprintf("fabric=%s/completion=%s/size=%s", fabric, mode, s.Name), func(b *testing.B) {
					window := 64
					if s.N >= 1<<20 {
						window = 16
					}
					benchThroughput(b, fabric, mode == "event", window, s.N)
				})
			}
		}
	}
}

func benchThroughput(b *testing.B, fabric string, event bool, window, size int) {
	a, r := benchPair(b, fabric, event, window, size)
	for i := 0; i < window; i++ {
		if err := r.postRecv(i, size); err != nil {
			b.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var credits atomic.Int64 // receives posted so far
	credits.Store(int64(window))
	stop := make(chan struct{})
	recvErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			cs, err := r.next(r.recvJFC)
			if err != nil {
				recvErr <- err
				return
			}
			for _, c := range cs {
				if c.Status != urma.StatusSuccess {
					recvErr <- fmt.Errorf("receive completed with %s", c.Status)
					return
				}
				if err := r.postRecv(int(c.UserCtx), size); err != nil {
					recvErr <- err
					return
				}
				credits.Add(1)
			}
			if len(cs) == 0 {
				select {
				case <-stop:
					return
				default:
				}
				runtime.Gosched()
			}
		}
	}()
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < window && int64(posted) < credits.Load() {
			if err := a.postSend(posted%window, size, window); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		if posted == done {
			// Nothing outstanding: waiting for credits, which no
			// completion event announces.
			runtime.Gosched()
			continue
		}
		cs, err := a.next(a.sendJFC)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range cs {
			if c.Status != urma.StatusSuccess {
				b.Fatalf("send completed with %s", c.Status)
			}
			done++
		}
		if len(cs) == 0 {
			runtime.Gosched()
		}
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	select {
	case err := <-recvErr:
		b.Fatal(err)
	default:
	}
}

// BenchmarkRawRTT measures round-trip latency: A sends, B answers with a
// message of the same size, A receives it; one round trip per op.
func BenchmarkRawRTT(b *testing.B) {
	for _, fabric := range benchFabrics {
		for _, mode := range []string{"poll", "event"} {
			for _, s := range benchSizes {
				b.Run(fmt.Sprintf("fabric=%s/completion=%s/size=%s", fabric, mode, s.Name), func(b *testing.B) {
					benchRTT(b, fabric, mode == "event", s.N)
				})
			}
		}
	}
}

func benchRTT(b *testing.B, fabric string, event bool, size int) {
	const window = 4
	a, r := benchPair(b, fabric, event, window, size)
	for i := 0; i < window; i++ {
		if err := r.postRecv(i, size); err != nil {
			b.Fatal(err)
		}
		if err := a.postRecv(i, size); err != nil {
			b.Fatal(err)
		}
	}
	stop := make(chan struct{})
	echoErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // echo: every receive is answered with a send of the same size
		defer wg.Done()
		n := 0
		for {
			cs, err := r.next(r.recvJFC)
			for _, c := range cs {
				if err == nil {
					err = r.postRecv(int(c.UserCtx), size)
				}
				if err == nil {
					err = r.postSend(n%window, size, window)
					n++
				}
			}
			if err == nil {
				_, err = r.sendJFC.Poll(r.scs)
			}
			if err != nil {
				echoErr <- err
				return
			}
			if len(cs) == 0 {
				select {
				case <-stop:
					return
				default:
				}
				runtime.Gosched()
			}
		}
	}()
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := a.postSend(i%window, size, window); err != nil {
			b.Fatal(err)
		}
		for got := false; !got; {
			cs, err := a.next(a.recvJFC)
			if err != nil {
				b.Fatal(err)
			}
			for _, c := range cs {
				if c.Status != urma.StatusSuccess {
					b.Fatalf("receive completed with %s", c.Status)
				}
				got = true
				if err := a.postRecv(int(c.UserCtx), size); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := a.sendJFC.Poll(a.scs); err != nil {
				b.Fatal(err)
			}
			if !got {
				runtime.Gosched()
			}
		}
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	select {
	case err := <-echoErr:
		b.Fatal(err)
	default:
	}
}
