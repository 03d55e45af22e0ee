package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
	"github.com/openeuler/urma-k8s/pkg/transport"
)

type serverEvent = perfjson.ServerEvent

// printer writes events, one per line, from any goroutine.
type printer struct {
	mu   sync.Mutex
	w    io.Writer
	json bool
}

func (p *printer) event(e serverEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		b, _ := json.Marshal(e)
		fmt.Fprintln(p.w, string(b))
		return
	}
	switch e.Event {
	case "listening":
		fmt.Fprintf(p.w, "listening on %s echo=%v urma=%v", e.Addr, e.Echo, e.FallbackReason == "")
		if e.Unix != "" {
			fmt.Fprintf(p.w, " unix=%s", e.Unix)
		}
		if e.FallbackReason != "" {
			fmt.Fprintf(p.w, " (every connection falls back: %s)", e.FallbackReason)
		}
		fmt.Fprintln(p.w)
	case "conn":
		fmt.Fprintf(p.w, "conn from %s mode=%s", e.Remote, e.Mode)
		if e.Fabric != "" {
			fmt.Fprintf(p.w, " fabric=%s", e.Fabric)
		}
		if e.Provider != "" {
			fmt.Fprintf(p.w, " provider=%s device=%s", e.Provider, e.Device)
		}
		if e.FallbackReason != "" {
			fmt.Fprintf(p.w, " fallback=%q", e.FallbackReason)
		}
		fmt.Fprintln(p.w)
	case "closed":
		fmt.Fprintf(p.w, "conn from %s closed protocol=%s in=%d out=%d", e.Remote, e.Protocol, e.BytesIn, e.BytesOut)
		if e.MessagesIn > 0 {
			fmt.Fprintf(p.w, " messages_in=%d direct_reads=%d", e.MessagesIn, e.DirectReads)
		}
		if e.Error != "" {
			fmt.Fprintf(p.w, " error=%q", e.Error)
		}
		fmt.Fprintln(p.w)
	}
}

func runServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("urma-perf server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "TCP address to listen on (the software provider listens on the same host)")
	unixPath := fs.String("unix", "", "also serve plain (non-URMA) clients on this Unix domain socket, the baseline of --mode unix")
	echo := fs.Bool("echo", false, "return every request; without it each request gets an 8-byte answer")
	mode := fs.String("mode", "auto", "auto: URMA when the client can; tcp: TCP only (URMA clients fall back)")
	useGRPC := fs.Bool("grpc", false, "serve gRPC's health service (grpc.health.v1) instead of urma-perf's protocol, for client --grpc")
	var c common
	c.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *mode != "auto" && *mode != "tcp" {
		return usageError{fmt.Errorf("--mode %q: want auto or tcp", *mode)}
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
	ln, err := transport.ListenTransport("tcp", *listen, cfg)
	if err != nil {
		return err
	}
	lns := []net.Listener{ln}
	if *unixPath != "" {
		uln, err := net.Listen("unix", *unixPath)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("listen on %s: %w", *unixPath, err)
		}
		lns = append(lns, uln)
	}
	out := &printer{w: stdout, json: c.json}
	listening := serverEvent{Event: "listening", Addr: ln.Addr().String(), Unix: *unixPath, Echo: *echo, FallbackReason: ln.FallbackReason()}
	if *useGRPC {
		listening.Protocol = protocolGRPC
		out.event(listening)
		return serveGRPC(ctx, lns, out)
	}
	out.event(listening)

	return serveListeners(ctx, lns, func(conn net.Conn) { serveConn(conn, *echo, out) })
}

// serveListeners accepts on every listener and serves each connection with
// serve, until ctx ends or one listener fails (which stops the others).
// When ctx ends it closes the listeners and every connection; it returns
// once every serve returned.
func serveListeners(ctx context.Context, lns []net.Listener, serve func(net.Conn)) error {
	var wg sync.WaitGroup
	conns := map[net.Conn]struct{}{}
	var mu sync.Mutex
	closing := false // under mu: ctx ended, conns were closed
	stop := context.AfterFunc(ctx, func() {
		for _, l := range lns {
			_ = l.Close()
		}
		mu.Lock()
		closing = true
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	errs := make(chan error, len(lns))
	for _, l := range lns {
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					if ctx.Err() != nil {
						err = nil
					}
					errs <- err
					return
				}
				mu.Lock()
				late := closing
				if !late {
					conns[conn] = struct{}{}
				}
				mu.Unlock()
				if late {
					// Accepted as the listener closed (pkg/transport's
					// hands over a finished handshake before its close),
					// after the others were closed: nobody else closes it.
					_ = conn.Close()
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					serve(conn)
					mu.Lock()
					delete(conns, conn)
					mu.Unlock()
				}()
			}
		}()
	}
	var acceptErr error
	for range lns {
		if e := <-errs; e != nil && acceptErr == nil {
			acceptErr = e // one listener broke: stop the others too
			for _, l := range lns {
				_ = l.Close()
			}
		}
	}
	wg.Wait()
	return acceptErr
}

// countingConn counts bytes each way.
type countingConn struct {
	net.Conn
	in, out atomic.Uint64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(uint64(n))
	return n, err
}

func serveConn(conn net.Conn, echo bool, out *printer) {
	defer conn.Close()
	out.event(connEvent(conn))
	c := &countingConn{Conn: conn}
	protocol, inPlace, err := serve(c, echo)
	closed := serverEvent{Event: "closed", Remote: conn.RemoteAddr().String(), Protocol: protocol, RecvZeroCopy: inPlace, BytesIn: c.in.Load(), BytesOut: c.out.Load()}
	if tc, ok := conn.(transport.Conn); ok {
		dbg := tc.Debug()
		closed.MessagesIn, closed.DirectReads = dbg.MessagesReceived, dbg.DirectReads
	}
	if err != nil {
		closed.Error = err.Error()
	}
	out.event(closed)
}

// connEvent is the "conn" event of a new connection: how it runs.
func connEvent(conn net.Conn) serverEvent {
	ev := serverEvent{Event: "conn", Remote: conn.RemoteAddr().String(), Mode: "unix"}
	if tc, ok := conn.(transport.Conn); ok {
		dbg := tc.Debug()
		ev.Mode, ev.Provider, ev.Device, ev.Fabric, ev.FallbackReason = tc.Mode().String(), dbg.Provider, dbg.Device, dbg.Fabric, tc.FallbackReason()
	}
	return ev
}

// serve answers one connection until it ends; a clean end is no error.
func serve(c net.Conn, echo bool) (protocol string, inPlace bool, err error) {
	magic, err := readMagic(c)
	if err != nil || string(magic) != perfMagic {
		// A plain client: echo its bytes, or swallow them.
		if echo {
			if _, werr := c.Write(magic); werr != nil {
				return "plain", false, werr
			}
			if err == nil {
				_, err = io.Copy(c, c)
			}
		} else if err == nil {
			_, err = io.Copy(io.Discard, c)
		}
		return "plain", false, cleanEnd(err)
	}
	size, flags, err := readClientHeaderRest(c)
	if err != nil {
		return "perf", false, err
	}
	resp := ackSize
	if echo && flags&flagAck == 0 {
		resp = size
	}
	if _, err := c.Write(appendServerHeader(nil, resp)); err != nil {
		return "perf", false, err
	}
	buf := make([]byte, max(size, ackSize))
	if zc, ok := zeroCopy(c); ok && flags&flagRecvZeroCopy != 0 {
		return "perf", true, serveInPlace(c, zc, size, buf[:resp])
	}
	for {
		if _, err := io.ReadFull(c, buf[:size]); err != nil {
			return "perf", false, cleanEnd(err)
		}
		if _, err := c.Write(buf[:resp]); err != nil {
			return "perf", false, err
		}
	}
}

// zeroCopy is the zero-copy API of the transport connection c wraps, if
// it has one (a plain Unix socket has not).
func zeroCopy(c net.Conn) (transport.ZeroCopyConn, bool) {
	if cc, ok := c.(*countingConn); ok {
		c = cc.Conn
	}
	zc, ok := c.(transport.ZeroCopyConn)
	return zc, ok
}

// serveInPlace answers requests taken with ReadBuffer: each received
// buffer is looked at where it landed and released, so the transport's
// own copy into the receive buffer is the only one on this side. Like the
// copying loop in serve, each answer is the first len(resp) bytes of its
// request (all of it for an echo, 8 bytes for an ack). A buffer may hold
// the end of one request and the start of the next (TCP mode reads a
// stream). c counts the bytes.
func serveInPlace(c net.Conn, zc transport.ZeroCopyConn, size int, resp []byte) error {
	cc, _ := c.(*countingConn)
	got := 0
	for {
		b, err := zc.ReadBuffer()
		if err != nil {
			return cleanEnd(err)
		}
		data := b.Bytes()
		if cc != nil {
			cc.in.Add(uint64(len(data)))
		}
		for len(data) > 0 {
			k := min(len(data), size-got)
			if got < len(resp) {
				copy(resp[got:], data[:k])
			}
			got += k
			data = data[k:]
			if got < size {
				continue
			}
			got = 0
			if _, err := c.Write(resp); err != nil {
				b.Release()
				return err
			}
		}
		b.Release()
	}
}

// plainIdle is how long the server waits for more of the perf magic once a
// client sent a part of it: a plain client may send a few bytes and wait for
// their echo.
const plainIdle = 100 * time.Millisecond

// readMagic reads the perf magic, or less: what a plain client sent before
// it went quiet (for plainIdle), or before it showed it is not a perf
// client. An error comes with the bytes read before it.
func readMagic(c net.Conn) ([]byte, error) {
	buf := make([]byte, len(perfMagic))
	n := 0
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	for n < len(buf) {
		if n > 0 {
			if !strings.HasPrefix(perfMagic, string(buf[:n])) {
				return buf[:n], nil // not a perf client: no need to wait
			}
			_ = c.SetReadDeadline(time.Now().Add(plainIdle))
		}
		k, err := c.Read(buf[n:])
		n += k
		if err != nil {
			if n > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				return buf[:n], nil // a plain client waiting for its echo
			}
			return buf[:n], err
		}
	}
	return buf, nil
}

// cleanEnd maps the peer's orderly close, and ours at shutdown, to no error.
func cleanEnd(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
