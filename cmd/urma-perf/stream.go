package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
	"github.com/openeuler/urma-k8s/pkg/transport"
)

// StreamReport is one line of the stream's output.
type StreamReport = perfjson.StreamReport

// Bounds of stream's waits after a failed dial or connection: it tries
// again at once after the first, then waits twice as long each time.
const (
	streamRetryFirst = 100 * time.Millisecond
	streamRetryMax   = 2 * time.Second
	streamDialBound  = 10 * time.Second
)

// runStream keeps concurrency connections busy with echoed requests until
// ctx ends (or --duration passes), dialling again after every failure (and
// every --redial without one), and prints the counts every --interval: a
// workload's view of a disruption, for make e2e's chaos steps.
func runStream(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("urma-perf stream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", "", "address of a urma-perf server started with --echo (required)")
	size := fs.Int("size", 4096, "request size in bytes")
	concurrency := fs.Int("concurrency", 2, "connections")
	interval := fs.Duration("interval", time.Second, "print the counts this often")
	redial := fs.Duration("redial", 0, "close each connection after it has been open this long and dial again, so that connections keep being made; 0: keep them")
	duration := fs.Duration("duration", 0, "stop after this long; 0: run until SIGINT or SIGTERM")
	mode := fs.String("mode", "auto", "auto: whatever each connection negotiates; urma: a connection that falls back counts as an error and is dialled again; tcp: TCP only")
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
	case *concurrency < 1 || *concurrency > 1024:
		return usageError{fmt.Errorf("--concurrency %d outside 1..1024", *concurrency)}
	case *interval < time.Millisecond || *interval > time.Hour:
		return usageError{fmt.Errorf("--interval %s outside 1ms..1h", *interval)}
	case *redial < 0:
		return usageError{fmt.Errorf("--redial %s must not be negative", *redial)}
	case *duration < 0:
		return usageError{fmt.Errorf("--duration %s must not be negative", *duration)}
	case *mode != "auto" && *mode != "urma" && *mode != "tcp":
		return usageError{fmt.Errorf("--mode %q: want auto, urma or tcp", *mode)}
	}
	cfg, err := c.config(fs, stderr)
	if err != nil {
		return usageError{err}
	}
	cfg.DisableURMA = *mode == "tcp"
	d, err := transport.NewDialer(cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	s := &stream{
		server: *server, size: *size, redial: *redial, requireURMA: *mode == "urma",
		dial: d.DialContext, log: c.logger(stderr), start: time.Now(),
		concurrency: *concurrency,
	}
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Go(func() { s.keepConnected(ctx) })
	}
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return printStream(stdout, s.report(true), c.json)
		case <-t.C:
			if err := printStream(stdout, s.report(false), c.json); err != nil {
				return err
			}
		}
	}
}

// stream is the shared state of a stream's connections.
type stream struct {
	server      string
	size        int
	redial      time.Duration
	requireURMA bool
	dial        func(ctx context.Context, addr string) (net.Conn, error)
	log         logr.Logger
	start       time.Time
	concurrency int

	mu           sync.Mutex
	counts       StreamReport // the cumulative fields
	lastRequests uint64       // Requests at the line before
}

// keepConnected dials, sends requests until the connection fails or is due
// for a redial, and dials again, until ctx ends.
func (s *stream) keepConnected(ctx context.Context) {
	retry := streamRetryFirst
	why := firstDial
	for ctx.Err() == nil {
		conn, err := s.connect(ctx, why)
		if err == nil {
			retry = streamRetryFirst
			err = s.exchange(ctx, conn)
			s.closed(conn)
			if err == nil { // due for a redial, or ctx ended
				why = redial
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		s.failed(err)
		why = reconnect
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		retry = min(2*retry, streamRetryMax)
	}
}

// dialReason says why a connection of the stream is dialled.
type dialReason int

const (
	firstDial dialReason = iota
	redial               // the connection before was due (--redial)
	reconnect            // the connection or dial before failed
)

// connect dials the server and exchanges the perf headers; the server must
// echo. It counts the dial by why it was made and how it ended.
func (s *stream) connect(ctx context.Context, why dialReason) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, streamDialBound)
	defer cancel()
	conn, err := s.dial(dctx, s.server)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", s.server, err)
	}
	respSize, err := exchangeHeaders(dctx, conn, s.size, 0)
	if err == nil && respSize != s.size {
		err = fmt.Errorf("the server answers %d bytes to a %d-byte request: start it with --echo", respSize, s.size)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	mode, fallback, fabric := "unix", "", ""
	if tc, ok := conn.(transport.Conn); ok {
		mode, fallback = tc.Mode().String(), tc.FallbackReason()
		dbg := tc.Debug()
		fabric = dbg.Fabric
		if fabric == "" {
			fabric = dbg.Provider
		}
	}
	s.mu.Lock()
	s.counts.Dials++
	s.counts.Open++
	switch why {
	case reconnect:
		s.counts.Reconnects++
	case redial:
		s.counts.Redials++
	}
	if mode == transport.ModeURMA.String() {
		s.counts.URMADials++
		s.counts.Fabric = fabric
	} else {
		s.counts.TCPDials++
		s.counts.LastFallbackReason = fallback
	}
	s.mu.Unlock()
	if s.requireURMA && mode != transport.ModeURMA.String() {
		s.closed(conn)
		return nil, fmt.Errorf("connection fell back to %s: %s", mode, fallback)
	}
	return conn, nil
}

// exchange sends echoed requests on conn until it fails (the error), its
// redial is due or ctx ends (nil).
func (s *stream) exchange(ctx context.Context, conn net.Conn) error {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	defer stop()
	var due <-chan time.Time
	if s.redial > 0 {
		t := time.NewTimer(s.redial)
		defer t.Stop()
		due = t.C
	}
	snd := sliceSender{conn: conn, req: newRequest(s.size)}
	resp := make([]byte, s.size)
	for seq := uint64(1); ; seq++ {
		select {
		case <-due:
			return nil
		default:
		}
		if err := snd.send(seq); err != nil {
			return stopped(ctx, fmt.Errorf("write: %w", err))
		}
		if _, err := io.ReadFull(conn, resp); err != nil {
			return stopped(ctx, fmt.Errorf("read: %w", err))
		}
		if !snd.echoes(resp, seq) {
			return errors.New("the echo differs from the request")
		}
		s.mu.Lock()
		s.counts.Requests++
		s.mu.Unlock()
	}
}

// stopped is nil when ctx ended (the error is the aborted read or write),
// else err.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (s *stream) closed(conn net.Conn) {
	_ = conn.Close()
	s.mu.Lock()
	s.counts.Open--
	s.mu.Unlock()
}

func (s *stream) failed(err error) {
	s.log.Error(err, "stream connection failed; dialling again")
	s.mu.Lock()
	s.counts.Errors++
	s.counts.LastError = err.Error()
	s.mu.Unlock()
}

// report is the counts now, for one line.
func (s *stream) report(final bool) StreamReport {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.counts
	r.Time = now.UTC().Format(time.RFC3339Nano)
	r.ElapsedSeconds = now.Sub(s.start).Seconds()
	r.IntervalRequests = r.Requests - s.lastRequests
	r.Concurrency = s.concurrency
	r.Final = final
	s.lastRequests = r.Requests
	return r
}

func printStream(w io.Writer, r StreamReport, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, string(b))
		return err
	}
	_, err := fmt.Fprintf(w, "%7.1fs requests=%d (+%d) open=%d/%d dials=%d urma=%d tcp=%d redials=%d reconnects=%d errors=%d",
		r.ElapsedSeconds, r.Requests, r.IntervalRequests, r.Open, r.Concurrency, r.Dials, r.URMADials, r.TCPDials, r.Redials, r.Reconnects, r.Errors)
	if err == nil && r.LastError != "" {
		_, err = fmt.Fprintf(w, " last_error=%q", r.LastError)
	}
	if err == nil {
		_, err = fmt.Fprintln(w)
	}
	return err
}
