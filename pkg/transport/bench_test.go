package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/openeuler/urma-k8s/internal/benchbase"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// Benchmark names, for `make bench` and its ratio printer (grouped by size):
//
//	BenchmarkTransport/mode=M/size=S          one-way stream, Write/Read
//	BenchmarkTransportZeroCopy/mode=M/size=S  one-way stream, WriteBuffer/ReadBuffer
//
// M is one of
//
//	memcpy          copy between two mmap'd regions: the ceiling
//	tcp             loopback TCP socket, the fallback path
//	raw             the software provider driven directly (in-process fabric,
//	                event completions): a window of SENDs, the receiver
//	                reposting, as pkg/urma/soft's BenchmarkRaw does
//	urma            this transport on the in-process fabric, event mode
//	urma-polling    this transport, polling mode (one poller, no yield)
//	urma-shm        this transport on the shm fabric (the zero Config: both
//	                ends on this host), event mode
//	urma-socket     this transport on the socket fabric (urma_soft_fabric=socket)
//
// S is 64B, 4KiB, 64KiB or 1MiB. Each write is one message of size S; the
// transport's buffers are sized to hold one (urma_buffer_size = max(8KiB,
// S)), as a deployment moving S-sized messages would configure them.

var benchSizes = benchbase.Sizes()

// benchFlags sizes the transport for messages of n bytes.
func benchFlags(n int, polling bool) flags.Flags {
	f := flags.Defaults()
	f.BufferSize = max(8<<10, n)
	f.SQSize, f.RQSize = 64, 64
	if n >= 1<<20 {
		f.SQSize, f.RQSize = 16, 16
	}
	f.BufferCount = 2 * (f.SQSize + f.RQSize)
	f.UsePolling = polling
	f.PreparedJettyCnt = 1
	return f
}

func BenchmarkTransport(b *testing.B) {
	for _, mode := range []string{"memcpy", "tcp", "raw", "urma", "urma-polling", "urma-shm", "urma-socket"} {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("mode=%s/size=%s", mode, s.Name), func(b *testing.B) {
				switch mode {
				case "memcpy":
					benchbase.Memcpy(b, s.N)
				case "tcp":
					benchTCP(b, s.N)
				case "raw":
					benchRaw(b, s.N)
				default:
					c, srv := benchConns(b, mode, s.N)
					benchStream(b, c, srv, s.N)
				}
			})
		}
	}
}

func BenchmarkTransportZeroCopy(b *testing.B) {
	for _, mode := range []string{"urma", "urma-shm", "urma-socket"} {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("mode=%s/size=%s", mode, s.Name), func(b *testing.B) {
				c, srv := benchConns(b, mode, s.N)
				benchZeroCopy(b, c.(ZeroCopyConn), srv.(ZeroCopyConn), s.N)
			})
		}
	}
}

func benchTCP(b *testing.B, n int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	srv := <-accepted
	benchStream(b, c, srv, n)
}

// benchConns connects a client and a server for mode.
func benchConns(b *testing.B, mode string, n int) (net.Conn, net.Conn) {
	f := benchFlags(n, mode == "urma-polling")
	var scfg, ccfg Config
	switch mode {
	case "urma-shm":
		scfg = Config{Flags: &f, LookupEnv: noEnv}
		ccfg = scfg
	case "urma-socket":
		scfg = Config{Flags: &f, LookupEnv: noEnv, SoftFabric: FabricSocket}
		ccfg = scfg
	default:
		pa, pb := fabricPair(b)
		scfg, ccfg = cfgWith(pa, f), cfgWith(pb, f)
	}
	p := connect(b, scfg, ccfg)
	if p.client.Mode() != ModeURMA {
		b.Fatalf("benchmark connection fell back: %s", p.client.FallbackReason())
	}
	return p.client, p.server
}

// benchStream writes b.N messages of n bytes from c; a goroutine reads
// them at srv.
func benchStream(b *testing.B, c, srv net.Conn, n int) {
	defer c.Close()
	defer srv.Close()
	total := int64(b.N) * int64(n)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, n)
		var got int64
		for got < total {
			k, err := srv.Read(buf[:min(int64(n), total-got)])
			got += int64(k)
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	msg := make([]byte, n)
	b.ReportAllocs()
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// benchZeroCopy sends b.N messages with AllocBuffer/WriteBuffer; a
// goroutine takes them with ReadBuffer/Release.
func benchZeroCopy(b *testing.B, c, srv ZeroCopyConn, n int) {
	defer c.Close()
	defer srv.Close()
	total := int64(b.N) * int64(n)
	done := make(chan error, 1)
	go func() {
		var got int64
		for got < total {
			buf, err := srv.ReadBuffer()
			if err != nil {
				done <- err
				return
			}
			got += int64(buf.Len())
			buf.Release()
		}
		done <- nil
	}()
	b.ReportAllocs()
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		buf, err := c.AllocBuffer()
		if err != nil {
			b.Fatal(err)
		}
		if err := c.WriteBuffer(buf, n); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// rawEP is one side of the raw-provider baseline.
type rawEP struct {
	ctx    urma.Context
	jfce   urma.JFCE
	jfc    urma.JFC
	jfr    urma.JFR
	jetty  urma.Jetty
	mem    *urma.Memory
	seg    urma.Segment
	target urma.RemoteJetty
	cs     []urma.Completion
	fired  []urma.JFC
	swr    urma.SendWR
	sge    [1]urma.SGE
	rwr    urma.RecvWR
	rsge   [1]urma.SGE
}

func newRawEP(b *testing.B, p urma.Provider, window, n int) *rawEP {
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	e := &rawEP{cs: make([]urma.Completion, 32), fired: make([]urma.JFC, 1)}
	var err error
	e.ctx, err = p.Open("", 0)
	must(err)
	e.jfce, err = e.ctx.CreateJFCE()
	must(err)
	e.jfc, err = e.ctx.CreateJFC(urma.JFCConfig{Depth: uint32(4 * window), JFCE: e.jfce})
	must(err)
	e.jfr, err = e.ctx.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: uint32(window), JFC: e.jfc})
	must(err)
	e.jetty, err = e.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: uint32(window), SendJFC: e.jfc, JFR: e.jfr, RNRRetry: 7})
	must(err)
	e.mem, err = urma.AllocMemory(2 * window * n)
	must(err)
	e.seg, err = e.ctx.RegisterSegment(e.mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	must(err)
	must(e.jfc.Rearm(false))
	b.Cleanup(func() {
		for _, c := range []io.Closer{e.target, e.jetty, e.jfr, e.jfc, e.jfce, e.seg} {
			if c != nil {
				_ = c.Close()
			}
		}
		_ = e.mem.Free()
		_ = e.ctx.Close()
	})
	return e
}

// next returns completions: polled, else after an event (wait, ack, rearm,
// poll again).
func (e *rawEP) next() ([]urma.Completion, error) {
	k, err := e.jfc.Poll(e.cs)
	if k > 0 || err != nil {
		return e.cs[:k], err
	}
	fired, err := e.jfce.Wait(e.fired, 100*time.Millisecond)
	if err != nil || fired == 0 {
		return nil, err
	}
	e.jfc.Ack(uint32(fired))
	if err := e.jfc.Rearm(false); err != nil {
		return nil, err
	}
	k, err = e.jfc.Poll(e.cs)
	return e.cs[:k], err
}

// benchRaw is the raw-provider baseline: a window of SENDs outstanding, a
// receiver reposting each buffer and returning it as a credit.
func benchRaw(b *testing.B, n int) {
	window := 64
	if n >= 1<<20 {
		window = 16
	}
	f := soft.NewFabric()
	mk := func() urma.Provider {
		p, err := soft.New(soft.Options{Fabric: f, Logger: logr.Discard()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = p.Close() })
		return p
	}
	a, r := newRawEP(b, mk(), window, n), newRawEP(b, mk(), window, n)
	var err error
	if a.target, err = a.ctx.ImportJetty(context.Background(), r.jetty.ID(), urma.RM, 0); err != nil {
		b.Fatal(err)
	}
	post := func(e *rawEP, slot int) error {
		e.rsge[0] = urma.SGE{Segment: e.seg, Offset: uint64(slot * n), Len: uint32(n)}
		e.rwr = urma.RecvWR{UserCtx: uint64(slot), SGEs: e.rsge[:]}
		return e.jfr.PostRecv(&e.rwr)
	}
	for i := 0; i < window; i++ {
		if err := post(r, i); err != nil {
			b.Fatal(err)
		}
	}
	var credits atomic.Int64
	credits.Store(int64(window))
	stop := make(chan struct{})
	recvErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			cs, err := r.next()
			if err != nil {
				recvErr <- err
				return
			}
			for _, c := range cs {
				if c.Status != urma.StatusSuccess {
					recvErr <- fmt.Errorf("receive: %s", c.Status)
					return
				}
				if err := post(r, int(c.UserCtx)); err != nil {
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
			}
		}
	}()
	b.ReportAllocs()
	b.SetBytes(int64(n))
	b.ResetTimer()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < window && int64(posted) < credits.Load() {
			a.sge[0] = urma.SGE{Segment: a.seg, Offset: uint64((window + posted%window) * n), Len: uint32(n)}
			a.swr = urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: a.target, UserCtx: uint64(posted), SGEs: a.sge[:]}
			if err := a.jetty.PostSend(&a.swr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		if posted == done {
			// Nothing outstanding: waiting on the completion queue would
			// sleep until its timeout; it is credits we lack.
			runtime.Gosched()
			continue
		}
		cs, err := a.next()
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range cs {
			if c.Status != urma.StatusSuccess {
				b.Fatalf("send: %s", c.Status)
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

// BenchmarkGRPCUnary/mode=M/size=health: sequential unary calls (the gRPC
// health check) from one client, over plain TCP (tcp) or over the
// transport between two engines of this process on the shm fabric (the
// zero Config: urma-shm; urma-shm-nospin with urma_event_spin=0, since
// both ends' spinning readers share this process's processors with the
// goroutines that answer them). ns/op is one call's round trip; `make
// bench` prints urma-shm beside tcp as a ratio.
func BenchmarkGRPCUnary(b *testing.B) {
	for _, mode := range []string{"tcp", "urma-shm", "urma-shm-nospin"} {
		b.Run("mode="+mode+"/size=health", func(b *testing.B) {
			f := benchFlags(4096, false)
			if mode == "urma-shm-nospin" {
				f.EventSpin = 0
			}
			cfg := Config{Flags: &f, LookupEnv: noEnv, DisableURMA: mode == "tcp"}
			ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
			if err != nil {
				b.Fatal(err)
			}
			srv := grpc.NewServer()
			healthpb.RegisterHealthServer(srv, health.NewServer())
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			defer func() {
				srv.Stop()
				<-served
			}()
			d, err := NewDialer(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			modes := make(chan Mode, 1)
			dial := func(ctx context.Context, addr string) (net.Conn, error) {
				c, err := d.DialContext(ctx, addr)
				if err == nil {
					m, _ := ModeOf(c)
					select {
					case modes <- m:
					default:
					}
				}
				return c, err
			}
			cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithContextDialer(dial), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Close()
			client := healthpb.NewHealthClient(cc)
			ctx := b.Context()
			req := &healthpb.HealthCheckRequest{}
			if _, err := client.Check(ctx, req); err != nil { // connect before timing
				b.Fatal(err)
			}
			if m := <-modes; (m == ModeURMA) != (mode != "tcp") {
				b.Fatalf("mode %s: the connection runs %s", mode, m)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := client.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkConnect/mode=M: one connection's life, dial and accept through
// the handshake to both ends closed, over plain loopback TCP (tcp: the
// baseline, without the transport) or the transport on the shm fabric
// between two engines of this process, with each connection's own send
// buffers (urma-shm, the default) or without them (urma-shm-poolsend:
// urma_shm_send_buffers=false). ns/op is the cost of a short-lived
// connection; `make bench` prints the modes beside tcp.
func BenchmarkConnect(b *testing.B) {
	for _, mode := range []string{"tcp", "urma-shm", "urma-shm-poolsend"} {
		b.Run("mode="+mode+"/size=conn", func(b *testing.B) {
			var ln net.Listener
			dial := func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }
			if mode == "tcp" {
				var err error
				if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = ln.Close() })
			} else {
				f := benchFlags(8<<10, false)
				f.ShmSendBuffers = mode != "urma-shm-poolsend"
				cfg := Config{Flags: &f, LookupEnv: noEnv}
				tln, d := listenAndDialer(b, cfg, cfg)
				ln = tln
				dial = func() (net.Conn, error) { return d.DialContext(b.Context(), ln.Addr().String()) }
			}
			connectOnce := func() {
				acc := acceptAsync(ln)
				c, err := dial()
				if err != nil {
					b.Fatal(err)
				}
				a := <-acc
				if a.err != nil {
					b.Fatal(a.err)
				}
				if m, ok := ModeOf(c); mode != "tcp" && (!ok || m != ModeURMA) {
					b.Fatalf("mode %s: the connection runs %s", mode, m)
				}
				if err := errors.Join(c.Close(), a.c.Close()); err != nil {
					b.Fatal(err)
				}
			}
			connectOnce() // the engines' first connection maps their rings
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				connectOnce()
			}
		})
	}
}
