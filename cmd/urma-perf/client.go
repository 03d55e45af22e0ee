package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
	"github.com/openeuler/urma-k8s/pkg/transport"
)

// The --json output types live in perfjson so that programs reading them
// (the demo) decode exactly what urma-perf writes.
type (
	ConnReport = perfjson.ConnReport
	Latency    = perfjson.Latency
	Report     = perfjson.Report
)

func runClient(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("urma-perf client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", "", "address of a urma-perf server (required)")
	size := fs.Int("size", 4096, "request size in bytes")
	concurrency := fs.Int("concurrency", 1, "connections")
	pipeline := fs.Int("pipeline", 1, "requests outstanding per connection: 1 times each round trip, more measures throughput")
	ack := fs.Bool("ack", false, "ask for 8-byte answers even from an echo server: bytes go one way")
	recvZeroCopy := fs.Bool("recv-zerocopy", false, "ask the server to take requests in place, with the transport's zero-copy API (ReadBuffer), where its connection has it")
	sendZeroCopy := fs.Bool("send-zerocopy", false, "build each request in place, in the transport's own buffers (zero-copy API: AllocBuffer, WriteBuffer), instead of writing it from the client's slice; the client writes only an 8-byte sequence number into each")
	duration := fs.Duration("duration", 5*time.Second, "how long to send requests")
	mode := fs.String("mode", "auto", "auto: whatever each connection negotiates; urma: fail (exit 3) if any connection falls back; tcp: TCP only; unix: plain Unix domain socket to the server's --unix path (--server is that path)")
	useGRPC := fs.Bool("grpc", false, "make gRPC unary health checks, one at a time per connection, on a server started with --grpc, instead of urma-perf requests")
	var c common
	c.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case *server == "":
		return usageError{errors.New("--server is required")}
	case *size < 1 || *size > maxSize:
		return usageError{fmt.Errorf("--size %d outside 1..%d", *size, maxSize)}
	case *concurrency < 1 || *concurrency > 4096:
		return usageError{fmt.Errorf("--concurrency %d outside 1..4096", *concurrency)}
	case *pipeline < 1 || *pipeline > 4096:
		return usageError{fmt.Errorf("--pipeline %d outside 1..4096", *pipeline)}
	case *duration <= 0:
		return usageError{fmt.Errorf("--duration %s must be positive", *duration)}
	case *mode != "auto" && *mode != "urma" && *mode != "tcp" && *mode != "unix":
		return usageError{fmt.Errorf("--mode %q: want auto, urma, tcp or unix", *mode)}
	case *useGRPC && (isSet(fs, "size") || *pipeline != 1 || *ack || *recvZeroCopy || *sendZeroCopy):
		return usageError{errGRPCFlags}
	case *sendZeroCopy && *mode == "unix":
		return usageError{errors.New("--send-zerocopy builds requests in the transport's buffers: it needs a transport connection, not --mode unix")}
	}
	cfg, err := c.config(fs, stderr)
	if err != nil {
		return usageError{err}
	}
	cfg.DisableURMA = *mode == "tcp"
	stopProfile, err := c.startProfile()
	if err != nil {
		return usageError{err}
	}
	defer stopProfile()
	var dial func(ctx context.Context) (net.Conn, error)
	if *mode == "unix" {
		var nd net.Dialer
		dial = func(ctx context.Context) (net.Conn, error) { return nd.DialContext(ctx, "unix", *server) }
	} else {
		d, err := transport.NewDialer(cfg)
		if err != nil {
			return err
		}
		defer d.Close()
		dial = func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, *server) }
	}

	var flags uint32
	if *recvZeroCopy {
		flags |= flagRecvZeroCopy
	}
	if *ack {
		flags |= flagAck
	}
	m := measurement{server: *server, size: *size, concurrency: *concurrency, pipeline: *pipeline, flags: flags,
		sendInPlace: *sendZeroCopy, duration: *duration}
	var rep *Report
	if *useGRPC {
		m.size = 0
		rep, err = measureGRPC(ctx, dial, m)
	} else {
		rep, err = measure(ctx, dial, m)
	}
	if err != nil {
		return err
	}
	if c.json {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
	} else {
		printReport(stdout, rep)
	}
	if *mode == "urma" && rep.TCPConns > 0 {
		return fmt.Errorf("%w: %d of %d connections fell back to TCP", errNotURMA, rep.TCPConns, len(rep.Conns))
	}
	for _, cr := range rep.Conns {
		if cr.Error != "" {
			return fmt.Errorf("a connection failed: %s", cr.Error)
		}
	}
	return nil
}

// isSet reports whether the command line gave flag name.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// measurement is what to measure.
type measurement struct {
	server      string
	size        int
	concurrency int
	pipeline    int
	flags       uint32
	sendInPlace bool // requests are built in the transport's buffers (--send-zerocopy)
	duration    time.Duration
}

// worker is one connection's loop and results.
type worker struct {
	conn     net.Conn
	hist     histogram
	requests uint64
	err      error
}

func measure(ctx context.Context, dial func(context.Context) (net.Conn, error), r measurement) (*Report, error) {
	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	workers := make([]*worker, r.concurrency)
	respSize := 0
	for i := range workers {
		conn, err := dial(dialCtx)
		if err != nil {
			closeAll(workers)
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		workers[i] = &worker{conn: conn}
		rs, err := exchangeHeaders(dialCtx, conn, r.size, r.flags)
		if err != nil {
			closeAll(workers)
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		respSize = rs
	}
	defer closeAll(workers)
	// A signal ends the measurement even while a connection waits for a
	// server that stopped answering.
	stop := context.AfterFunc(ctx, func() {
		for _, w := range workers {
			_ = w.conn.SetDeadline(aLongTimeAgo)
		}
	})
	defer stop()

	end := time.Now().Add(r.duration)
	elapsed := runTimed(len(workers), func(i int) {
		w := workers[i]
		snd, err := newRequestSender(w.conn, r.size, r.sendInPlace)
		switch {
		case err != nil:
			w.err = err
		case r.pipeline == 1:
			w.run(ctx, end, snd, r.size, respSize)
		default:
			w.runPipelined(ctx, end, snd, respSize, r.pipeline)
		}
	})
	return buildReport(r, respSize, elapsed, workers), nil
}

// aLongTimeAgo is a deadline in the past: it aborts blocked reads and
// writes.
var aLongTimeAgo = time.Unix(1, 0)

// exchangeHeaders sends the client's perf header on conn and reads the
// server's answer, the response size. ctx's end (the dial timeout, a
// signal) aborts the exchange, so a server that never answers cannot hold
// the client.
func exchangeHeaders(ctx context.Context, conn net.Conn, size int, flags uint32) (int, error) {
	aborted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(aborted)
		_ = conn.SetDeadline(aLongTimeAgo)
	})
	respSize, err := func() (int, error) {
		if _, err := conn.Write(appendClientHeader(nil, size, flags)); err != nil {
			return 0, fmt.Errorf("send perf header: %w", err)
		}
		return readServerHeader(conn)
	}()
	if !stop() {
		<-aborted
		if err == nil {
			err = errors.New("perf header exchange")
		}
		return 0, fmt.Errorf("%w: %w", err, context.Cause(ctx))
	}
	return respSize, err
}

// runTimed runs loop(0..n-1) at once, one goroutine each, and returns how
// many seconds they took together.
func runTimed(n int, loop func(i int)) float64 {
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(i)
		}()
	}
	wg.Wait()
	return time.Since(start).Seconds()
}

// buildReport sums up the workers of a measurement that ran elapsed
// seconds.
func buildReport(r measurement, respSize int, elapsed float64, workers []*worker) *Report {
	rep := &Report{Server: r.server, Size: r.size, ResponseSize: respSize, Concurrency: r.concurrency,
		Pipeline: r.pipeline, Ack: r.flags&flagAck != 0, SendZeroCopy: r.sendInPlace, DurationSeconds: elapsed}
	var all histogram
	for _, w := range workers {
		all.merge(&w.hist)
		rep.Requests += w.requests
		cr := ConnReport{Mode: "unix", Requests: w.requests}
		if w.conn != nil {
			cr.Local = w.conn.LocalAddr().String()
		}
		if tc, ok := w.conn.(transport.Conn); ok {
			dbg := tc.Debug()
			cr.Mode, cr.Provider, cr.Device, cr.Fabric = tc.Mode().String(), dbg.Provider, dbg.Device, dbg.Fabric
			cr.FallbackReason, cr.HandshakeVersion = tc.FallbackReason(), dbg.HandshakeVersion
		}
		if w.err != nil {
			cr.Error = w.err.Error()
		}
		switch cr.Mode {
		case transport.ModeURMA.String():
			rep.URMAConns++
		case "unix":
			rep.UnixConns++
		default:
			rep.TCPConns++
		}
		rep.Conns = append(rep.Conns, cr)
	}
	rep.QPS = float64(rep.Requests) / elapsed
	rep.SentBytesPerSec = float64(rep.Requests) * float64(r.size) / elapsed
	rep.ReceivedBytesPerSec = float64(rep.Requests) * float64(respSize) / elapsed
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	rep.LatencyMicros = Latency{
		Avg: us(all.mean()), Min: us(all.minV), P50: us(all.quantile(0.5)),
		P99: us(all.quantile(0.99)), P999: us(all.quantile(0.999)), Max: us(all.maxV),
	}
	return rep
}

// requestSender sends one connection's requests.
type requestSender interface {
	// send sends request number seq (counting from 1).
	send(seq uint64) error
	// echoes reports whether echo is what an echo server returns for
	// request seq.
	echoes(echo []byte, seq uint64) bool
}

// newRequestSender sends requests of size bytes on conn: from one slice,
// or with inPlace built in the transport's own buffers.
func newRequestSender(conn net.Conn, size int, inPlace bool) (requestSender, error) {
	if !inPlace {
		return sliceSender{conn: conn, req: newRequest(size)}, nil
	}
	zc, ok := conn.(transport.ZeroCopyConn)
	if !ok {
		return nil, fmt.Errorf("--send-zerocopy: a %T has no zero-copy API", conn)
	}
	return inPlaceSender{conn: zc, size: size}, nil
}

// sliceSender writes every request from the same slice, as the TCP
// baseline does: the slice stays in the cache.
type sliceSender struct {
	conn net.Conn
	req  []byte
}

func (s sliceSender) send(uint64) error {
	_, err := s.conn.Write(s.req)
	return err
}

func (s sliceSender) echoes(echo []byte, _ uint64) bool { return bytes.Equal(echo, s.req) }

// inPlaceSender builds each request in buffers of the transport's pool
// (AllocBuffer) and sends them as they are (WriteBuffer): the bytes go to
// the provider with no copy out of a slice of the client's. An
// application that produces its messages in place writes them there and
// nowhere else; this client writes only the request's sequence number
// into its first bytes and sends the rest as the buffer holds it, as the
// TCP baseline sends the same bytes every time. A request longer than a
// buffer takes several.
type inPlaceSender struct {
	conn transport.ZeroCopyConn
	size int
}

func (s inPlaceSender) send(seq uint64) error {
	stamp := seqStamp(seq)
	for left := s.size; left > 0; {
		b, err := s.conn.AllocBuffer()
		if err != nil {
			return err
		}
		n := min(left, len(b.Data()), s.conn.MaxMessage())
		if left == s.size {
			copy(b.Data()[:n], stamp[:])
		}
		if err := s.conn.WriteBuffer(b, n); err != nil {
			return err
		}
		left -= n
	}
	return nil
}

// echoes checks the length and the sequence number: the rest of a
// request built in place is whatever its buffers held.
func (s inPlaceSender) echoes(echo []byte, seq uint64) bool {
	stamp := seqStamp(seq)
	n := min(len(echo), len(stamp))
	return len(echo) == s.size && bytes.Equal(echo[:n], stamp[:n])
}

// seqStamp is what starts request seq built in place: its number, least
// significant byte first, so that even a 1-byte request differs from the
// one before it.
func seqStamp(seq uint64) [8]byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seq)
	return b
}

// newRequest is a request of size bytes, a recognisable pattern.
func newRequest(size int) []byte {
	req := make([]byte, size)
	for i := range req {
		req[i] = byte(i)
	}
	return req
}

// fail records err as the connection's failure, unless ctx ended: a
// signal aborts reads and writes in progress (measure), which ends the
// measurement and is no failure of the connection.
func (w *worker) fail(ctx context.Context, err error) {
	if ctx.Err() == nil {
		w.err = err
	}
}

// run sends requests until end (or ctx ends) and times each round trip.
func (w *worker) run(ctx context.Context, end time.Time, snd requestSender, size, respSize int) {
	resp := make([]byte, respSize)
	for ctx.Err() == nil {
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		seq := w.requests + 1
		if err := snd.send(seq); err != nil {
			w.fail(ctx, fmt.Errorf("write: %w", err))
			return
		}
		if _, err := io.ReadFull(w.conn, resp); err != nil {
			w.fail(ctx, fmt.Errorf("read: %w", err))
			return
		}
		rtt := time.Since(t0)
		if respSize == size && !snd.echoes(resp, seq) {
			w.err = errors.New("the echo differs from the request")
			return
		}
		w.hist.record(rtt)
		w.requests++
	}
}

// runPipelined keeps depth requests outstanding until end: a writer sends
// while fewer are unanswered, this goroutine reads the answers (in order)
// and times each from its send.
func (w *worker) runPipelined(ctx context.Context, end time.Time, snd requestSender, respSize, depth int) {
	// slots holds one token per request sent and not yet answered: the
	// writer takes one before it sends, the reader gives it back once the
	// answer is in. sent carries each request's send time to the reader;
	// the slots keep it from filling. A channel of send times alone would
	// let one more request out (the one the reader waits for is no longer
	// in it) and time a request from when it began to wait for room.
	slots := make(chan struct{}, depth)
	sent := make(chan time.Time, depth)
	quit := make(chan struct{}) // the reader gave up
	werr := make(chan error, 1)
	go func() {
		defer close(sent)
		for seq := uint64(1); ; seq++ {
			select {
			case slots <- struct{}{}: // waits while depth requests are unanswered
			case <-quit:
				return
			case <-ctx.Done():
				return
			}
			t0 := time.Now()
			if !t0.Before(end) {
				return
			}
			sent <- t0
			if err := snd.send(seq); err != nil {
				werr <- fmt.Errorf("write: %w", err)
				return
			}
		}
	}()
	resp := make([]byte, respSize)
	for t0 := range sent {
		if _, err := io.ReadFull(w.conn, resp); err != nil {
			select {
			case err = <-werr:
			default:
				err = fmt.Errorf("read: %w", err)
			}
			w.fail(ctx, err)
			close(quit)
			_ = w.conn.Close() // unblock the writer's Write
			for range sent {
			}
			return
		}
		w.hist.record(time.Since(t0))
		w.requests++
		<-slots
	}
	select {
	case err := <-werr:
		w.fail(ctx, err)
	default:
	}
}

func closeAll(ws []*worker) {
	for _, w := range ws {
		if w != nil {
			_ = w.conn.Close()
		}
	}
}

func printReport(w io.Writer, r *Report) {
	if r.Protocol == protocolGRPC {
		fmt.Fprintf(w, "urma-perf client: server=%s gRPC health checks concurrency=%d duration=%.2fs\n", r.Server, r.Concurrency, r.DurationSeconds)
	} else {
		send := "from a slice"
		if r.SendZeroCopy {
			send = "in place"
		}
		fmt.Fprintf(w, "urma-perf client: server=%s size=%d response=%d concurrency=%d pipeline=%d send=%q duration=%.2fs\n",
			r.Server, r.Size, r.ResponseSize, r.Concurrency, r.Pipeline, send, r.DurationSeconds)
	}
	for i, c := range r.Conns {
		fmt.Fprintf(w, "  conn %d %s mode=%s", i, c.Local, c.Mode)
		if c.Provider != "" {
			fmt.Fprintf(w, " provider=%s device=%s", c.Provider, c.Device)
		}
		if c.Fabric != "" {
			fmt.Fprintf(w, " fabric=%s", c.Fabric)
		}
		if c.HandshakeVersion != 0 {
			fmt.Fprintf(w, " hello=v%d", c.HandshakeVersion)
		}
		if c.FallbackReason != "" {
			fmt.Fprintf(w, " fallback=%q", c.FallbackReason)
		}
		fmt.Fprintf(w, " requests=%d", c.Requests)
		if c.Error != "" {
			fmt.Fprintf(w, " error=%q", c.Error)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "connections: %d urma, %d tcp", r.URMAConns, r.TCPConns)
	if r.UnixConns > 0 {
		fmt.Fprintf(w, ", %d unix", r.UnixConns)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "requests: %d  qps: %.1f\n", r.Requests, r.QPS)
	fmt.Fprintf(w, "throughput: sent %.2f MB/s, received %.2f MB/s\n", r.SentBytesPerSec/1e6, r.ReceivedBytesPerSec/1e6)
	l := r.LatencyMicros
	fmt.Fprintf(w, "latency (us): avg %.1f min %.1f p50 %.1f p99 %.1f p999 %.1f max %.1f\n", l.Avg, l.Min, l.P50, l.P99, l.P999, l.Max)
}
