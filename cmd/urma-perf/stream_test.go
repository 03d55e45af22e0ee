package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// echoServer runs `urma-perf server --echo` in process at addr ("" picks a
// port) and returns its address and a stop that waits for it to end.
func echoServer(t *testing.T, addr string, args ...string) (string, func()) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, append(append([]string{"server", "--echo", "--listen", addr, "--json"}, small...), args...), pw, &stderr)
		_ = pw.Close()
	}()
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var e serverEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.Event == "listening" {
				listening <- e.Addr
			}
		}
		close(listening)
	}()
	got, ok := <-listening
	if !ok {
		cancel()
		t.Fatalf("server at %s did not start (exit %d): %s", addr, <-done, stderr.String())
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("server exited %d: %s", code, stderr.String())
		}
		for range listening {
		}
	}
	t.Cleanup(stop)
	return got, stop
}

// runningStream is `urma-perf stream` running in process.
type runningStream struct {
	lines  chan StreamReport
	stop   context.CancelFunc
	done   chan struct{} // closed when run has returned code
	code   int
	stderr *lockedBuffer
}

func startStream(t *testing.T, args ...string) *runningStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	s := &runningStream{lines: make(chan StreamReport, 1000), stop: cancel, done: make(chan struct{}), stderr: &lockedBuffer{}}
	go func() {
		s.code = run(ctx, append(append([]string{"stream", "--json", "--interval", "10ms"}, small...), args...), pw, s.stderr)
		_ = pw.Close()
		close(s.done)
	}()
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var r StreamReport
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Errorf("stream printed %q: %v", sc.Text(), err)
				continue
			}
			s.lines <- r
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
		for range s.lines {
		}
	})
	return s
}

// until reads lines until one satisfies cond, and returns it.
func (s *runningStream) until(t *testing.T, what string, cond func(StreamReport) bool) StreamReport {
	t.Helper()
	timeout := time.After(time.Minute)
	var last StreamReport
	for {
		select {
		case r, ok := <-s.lines:
			if !ok {
				t.Fatalf("stream ended before %s; last line %+v", what, last)
			}
			if cond(r) {
				return r
			}
			last = r
		case <-timeout:
			t.Fatalf("no line with %s within a minute; last %+v", what, last)
		}
	}
}

// end stops the stream and returns its final line and exit status.
func (s *runningStream) end(t *testing.T) (StreamReport, int) {
	t.Helper()
	s.stop()
	var last StreamReport
	for r := range s.lines {
		last = r
	}
	<-s.done
	return last, s.code
}

// lockedBuffer is a buffer written by the stream's goroutines and read by
// the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The stream keeps its connections busy on URMA, dials each again when it
// is due, and prints cumulative counts, ending with a final line.
func TestStreamRedials(t *testing.T) {
	isolate(t)
	addr, _ := echoServer(t, "")
	s := startStream(t, "--server", addr, "--concurrency", "2", "--redial", "30ms", "--size", "1000")
	r := s.until(t, "two redials", func(r StreamReport) bool { return r.Redials >= 2 && r.Requests > 0 })
	if r.Errors != 0 || r.Reconnects != 0 || r.TCPDials != 0 || r.URMADials != r.Dials || r.Dials < 4 || r.Concurrency != 2 || r.Fabric == "" {
		t.Fatalf("line %+v: want every dial on URMA (with its fabric), no error, no reconnect", r)
	}
	final, code := s.end(t)
	if code != 0 || !final.Final || final.Requests < r.Requests {
		t.Fatalf("final line %+v, exit %d: want final, exit 0, requests not fewer than %d", final, code, r.Requests)
	}
}

// When the server goes, every connection fails and is counted; the stream
// keeps dialling, and once a server is back at the address it reconnects
// and requests flow again.
func TestStreamReconnectsWhenTheServerComesBack(t *testing.T) {
	isolate(t)
	addr, stop := echoServer(t, "")
	s := startStream(t, "--server", addr, "--concurrency", "2")
	before := s.until(t, "requests answered", func(r StreamReport) bool { return r.Requests > 0 && r.Open == 2 })
	stop()
	down := s.until(t, "the connections' failures", func(r StreamReport) bool { return r.Errors >= 2 && r.Open == 0 })
	if down.LastError == "" {
		t.Fatalf("line %+v: errors without the last one", down)
	}
	echoServer(t, addr)
	back := s.until(t, "both connections back", func(r StreamReport) bool {
		return r.Reconnects >= 2 && r.Open == 2 && r.Requests > down.Requests
	})
	if back.Dials < before.Dials+2 || back.Redials != 0 {
		t.Fatalf("after the server came back: %+v (before %+v): want two more dials, both reconnects", back, before)
	}
	if !strings.Contains(s.stderr.String(), "stream connection failed; dialling again") {
		t.Errorf("stderr does not log the failures: %s", s.stderr.String())
	}
}

// With --mode urma, a connection that falls back is an error, dialled
// again.
func TestStreamRequireURMA(t *testing.T) {
	isolate(t)
	addr, _ := echoServer(t, "", "--mode", "tcp")
	s := startStream(t, "--server", addr, "--concurrency", "1", "--mode", "urma")
	r := s.until(t, "two refused fallbacks", func(r StreamReport) bool { return r.Errors >= 2 })
	if r.Requests != 0 || r.URMADials != 0 || r.TCPDials < 2 || !strings.Contains(r.LastError, "fell back") || r.LastFallbackReason == "" {
		t.Fatalf("line %+v: want fallbacks counted as errors, no request", r)
	}
}

func TestStreamCommandLineErrors(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"stream"}, "--server is required"},
		{[]string{"stream", "--server", "x:1", "--concurrency", "0"}, "--concurrency 0 outside 1..1024"},
		{[]string{"stream", "--server", "x:1", "--interval", "0s"}, "--interval 0s outside 1ms..1h"},
		{[]string{"stream", "--server", "x:1", "--redial", "-1s"}, "--redial -1s must not be negative"},
		{[]string{"stream", "--server", "x:1", "--duration", "-1s"}, "--duration -1s must not be negative"},
		{[]string{"stream", "--server", "x:1", "--mode", "unix"}, `--mode "unix": want auto, urma or tcp`},
		{[]string{"stream", "--server", "x:1", "--size", "0"}, "--size 0 outside"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.wantErr) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errb.String(), tc.wantErr)
		}
	}
}

// --duration ends the stream by itself, with a final line.
func TestStreamDuration(t *testing.T) {
	isolate(t)
	addr, _ := echoServer(t, "")
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"stream", "--server", addr, "--duration", "200ms", "--interval", "50ms"}, small...), &out, &errb)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if code != 0 || len(lines) < 2 || !strings.Contains(lines[len(lines)-1], "requests=") {
		t.Fatalf("exit %d, output %q, stderr %q: want text lines ending with the final counts", code, out.String(), errb.String())
	}
}
