package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// isolate keeps the environment the tests run in out of the transport.
func isolate(t *testing.T) {
	for _, k := range []string{"URMA_FLAGS_FILE", "URMA_DEVICE", "URMA_DEVICES", "URMA_EID", "URMA_JETTY_BUDGET", "URMA_PROVIDER", "URMA_LIBRARY", "URMA_SOFT_FABRIC", "URMA_SHM_DIR"} {
		t.Setenv(k, "")
	}
}

// small keeps the registered pools small.
var small = []string{"--urma_buffer_count=512", "--urma_sq_size=32", "--urma_rq_size=32"}

// startServer runs `urma-perf server` in process and returns its address
// and its output so far; the server stops at cleanup.
func startServer(t *testing.T, args ...string) (addr string, events chan serverEvent) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, append(append([]string{"server", "--listen", "127.0.0.1:0", "--json"}, small...), args...), pw, &stderr)
		_ = pw.Close()
	}()
	events = make(chan serverEvent, 100)
	sc := bufio.NewScanner(pr)
	go func() {
		defer close(events)
		for sc.Scan() {
			var e serverEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Errorf("server printed %q: %v", sc.Text(), err)
				continue
			}
			events <- e
		}
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("server exited %d: %s", code, stderr.String())
		}
		for range events {
		}
	})
	select {
	case e := <-events:
		if e.Event != "listening" {
			t.Fatalf("first server event %+v", e)
		}
		return e.Addr, events
	case <-time.After(30 * time.Second):
		t.Fatalf("server did not start: %s", stderr.String())
	}
	return "", nil
}

func runClientJSON(t *testing.T, args ...string) (Report, int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append(append([]string{"client", "--json"}, small...), args...), &out, &errb)
	var r Report
	if code == 0 || code == 3 {
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("client output %q: %v", out.String(), err)
		}
	}
	return r, code, errb.String()
}

func TestClientServer(t *testing.T) {
	isolate(t)
	tests := []struct {
		name       string
		serverArgs []string
		clientArgs []string
		wantCode   int
		wantURMA   int
		wantTCP    int
		wantResp   int
	}{
		{name: "echo over urma", serverArgs: []string{"--echo"}, clientArgs: []string{"--size", "3000", "--concurrency", "3"}, wantURMA: 3, wantResp: 3000},
		{name: "acks over urma", clientArgs: []string{"--size", "100", "--concurrency", "2"}, wantURMA: 2, wantResp: ackSize},
		{name: "client forced to tcp", serverArgs: []string{"--echo"}, clientArgs: []string{"--mode", "tcp", "--concurrency", "2"}, wantTCP: 2, wantResp: 4096},
		{name: "tcp-only server", serverArgs: []string{"--echo", "--mode", "tcp"}, clientArgs: []string{"--concurrency", "2"}, wantTCP: 2, wantResp: 4096},
		{name: "urma required, server tcp-only", serverArgs: []string{"--mode", "tcp"}, clientArgs: []string{"--mode", "urma"}, wantCode: 3, wantTCP: 1, wantResp: ackSize},
		{name: "v3 hello and polling", serverArgs: []string{"--echo", "--urma_use_polling", "--urma_poller_yield"}, clientArgs: []string{"--urma_client_handshake_version=3"}, wantURMA: 1, wantResp: 4096},
		{name: "pipelined, acks asked of an echo server", serverArgs: []string{"--echo"}, clientArgs: []string{"--size", "2000", "--pipeline", "8", "--ack"}, wantURMA: 1, wantResp: ackSize},
		{name: "zero-copy receive, echo over urma", serverArgs: []string{"--echo"}, clientArgs: []string{"--size", "3000", "--recv-zerocopy"}, wantURMA: 1, wantResp: 3000},
		{name: "zero-copy receive, pipelined acks over urma", serverArgs: []string{"--echo"}, clientArgs: []string{"--size", "20000", "--pipeline", "8", "--ack", "--recv-zerocopy"}, wantURMA: 1, wantResp: ackSize},
		{name: "zero-copy receive, 8-byte requests, acks of a non-echo server", clientArgs: []string{"--size", "8", "--recv-zerocopy"}, wantURMA: 1, wantResp: ackSize},
		{name: "zero-copy receive, pipelined acks over tcp", serverArgs: []string{"--echo"}, clientArgs: []string{"--mode", "tcp", "--size", "3000", "--pipeline", "8", "--ack", "--recv-zerocopy"}, wantTCP: 1, wantResp: ackSize},
		{name: "socket fabric", serverArgs: []string{"--echo", "--urma_soft_fabric=socket"}, clientArgs: []string{"--urma_soft_fabric=socket"}, wantURMA: 1, wantResp: 4096},
		// Echoes of requests built in place are checked for their
		// sequence numbers: a client that sent from its slice fails.
		{name: "zero-copy send, echo over urma", serverArgs: []string{"--echo"}, clientArgs: []string{"--size", "3000", "--send-zerocopy"}, wantURMA: 1, wantResp: 3000},
		{name: "zero-copy send of requests longer than a buffer, echo over urma", serverArgs: []string{"--echo"}, clientArgs: []string{"--size", "16384", "--send-zerocopy", "--concurrency", "2"}, wantURMA: 2, wantResp: 16384},
		{name: "zero-copy send of 1-byte requests, echo over urma", serverArgs: []string{"--echo"}, clientArgs: []string{"--size", "1", "--send-zerocopy"}, wantURMA: 1, wantResp: 1},
		{name: "zero-copy send, echo over tcp", serverArgs: []string{"--echo"}, clientArgs: []string{"--mode", "tcp", "--size", "20000", "--send-zerocopy"}, wantTCP: 1, wantResp: 20000},
		{name: "zero-copy send, zero-copy receive, pipelined acks on the socket fabric", serverArgs: []string{"--echo", "--urma_soft_fabric=socket"}, clientArgs: []string{"--urma_soft_fabric=socket", "--size", "20000", "--pipeline", "8", "--ack", "--send-zerocopy", "--recv-zerocopy"}, wantURMA: 1, wantResp: ackSize},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr, events := startServer(t, tc.serverArgs...)
			r, code, stderr := runClientJSON(t, append([]string{"--server", addr, "--duration", "300ms"}, tc.clientArgs...)...)
			if code != tc.wantCode {
				t.Fatalf("client exit %d, want %d; stderr: %s", code, tc.wantCode, stderr)
			}
			if r.URMAConns != tc.wantURMA || r.TCPConns != tc.wantTCP {
				t.Fatalf("conns urma=%d tcp=%d, want %d/%d: %+v", r.URMAConns, r.TCPConns, tc.wantURMA, tc.wantTCP, r.Conns)
			}
			if r.ResponseSize != tc.wantResp {
				t.Errorf("response size %d, want %d", r.ResponseSize, tc.wantResp)
			}
			if want := strings.Contains(strings.Join(tc.clientArgs, " "), "--pipeline 8"); want != (r.Pipeline == 8) || want != r.Ack {
				t.Errorf("pipeline %d ack %v in the report", r.Pipeline, r.Ack)
			}
			if want := slices.Contains(tc.clientArgs, "--send-zerocopy"); r.SendZeroCopy != want {
				t.Errorf("report says requests built in place: %v, want %v", r.SendZeroCopy, want)
			}
			if r.Requests == 0 || r.QPS <= 0 || r.LatencyMicros.P50 <= 0 || r.LatencyMicros.P999 < r.LatencyMicros.P50 || r.LatencyMicros.Max < r.LatencyMicros.P999 {
				t.Errorf("implausible results: %+v", r)
			}
			for _, c := range r.Conns {
				if c.Mode == "tcp" && c.FallbackReason == "" {
					t.Errorf("a tcp connection without a reason: %+v", c)
				}
				// What carries URMA, as a UB node's operator checks it.
				if (c.Mode == "urma") != (strings.HasPrefix(c.Provider, "soft-") && c.Device == "soft0") {
					t.Errorf("connection %+v: want the software provider on soft0 exactly when on URMA", c)
				}
				// One host: shared memory, unless the socket fabric is forced.
				wantFabric := map[bool]string{true: "shm"}[c.Mode == "urma"]
				if strings.Contains(tc.name, "socket fabric") {
					wantFabric = "socket"
				}
				if c.Fabric != wantFabric {
					t.Errorf("connection %+v: fabric %q, want %q", c, c.Fabric, wantFabric)
				}
			}
			// The server reports each connection's mode too.
			seen := 0
			for seen < tc.wantURMA+tc.wantTCP {
				select {
				case e := <-events:
					if e.Event == "conn" {
						seen++
						if (e.Mode == "urma") != (tc.wantURMA > 0) || (e.Mode == "urma") != strings.HasPrefix(e.Provider, "soft-") {
							t.Errorf("server conn %+v", e)
						}
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("server reported %d connections", seen)
				}
			}
			if tc.wantCode != 0 {
				return
			}
			// Every request reached the server whole: the 16-byte perf
			// header and size bytes per request, per connection.
			var in, direct, messages uint64
			for closed := 0; closed < tc.wantURMA+tc.wantTCP; {
				select {
				case e := <-events:
					if e.Event == "closed" {
						closed++
						in += e.BytesIn
						direct += e.DirectReads
						messages += e.MessagesIn
						if (e.MessagesIn > 0) != (tc.wantURMA > 0) || e.DirectReads > e.MessagesIn {
							t.Errorf("server counted %d messages, %d read directly, on a connection of a run with %d URMA connections", e.MessagesIn, e.DirectReads, tc.wantURMA)
						}
						if want := strings.Contains(tc.name, "zero-copy receive"); e.RecvZeroCopy != want {
							t.Errorf("server took requests in place: %v, want %v", e.RecvZeroCopy, want)
						}
						if e.Error != "" {
							t.Errorf("server connection ended with %q", e.Error)
						}
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("server reported %d closed connections", closed)
				}
			}
			if want := uint64(16*(tc.wantURMA+tc.wantTCP)) + r.Requests*uint64(r.Size); in != want {
				t.Errorf("server read %d bytes, want %d (%d requests of %d)", in, want, r.Requests, r.Size)
			}
			// Built in place, a request is one message per buffer (the
			// default urma_buffer_size), each filled: the perf header, then
			// ceil(size/buffer) each.
			if perBuf := uint64(flags.Defaults().BufferSize); r.SendZeroCopy && tc.wantURMA > 0 {
				if want := uint64(tc.wantURMA) + r.Requests*((uint64(r.Size)+perBuf-1)/perBuf); messages != want {
					t.Errorf("server took %d messages, want %d: %d requests of %d bytes built in buffers of %d", messages, want, r.Requests, r.Size, perBuf)
				}
			}
			// A server Read waits for each request with room for it: over
			// URMA, from urma_zerocopy_min_size (512) on, the request lands
			// in its slice (urma_read_direct); never with ReadBuffer.
			if want := tc.wantURMA > 0 && !strings.Contains(tc.name, "zero-copy receive") && r.Size >= 512; (direct > 0) != want {
				t.Errorf("server read %d requests directly; want some: %v", direct, want)
			}
		})
	}
}

// TestUnixBaseline: the server also serves plain clients on a Unix domain
// socket, the baseline urma-perf compares with (--mode unix).
func TestUnixBaseline(t *testing.T) {
	isolate(t)
	path := filepath.Join(t.TempDir(), "perf.sock")
	_, events := startServer(t, "--echo", "--unix", path)
	for _, args := range [][]string{{"--size", "4096"}, {"--size", "512", "--pipeline", "4", "--ack"}} {
		r, code, stderr := runClientJSON(t, append([]string{"--server", path, "--mode", "unix", "--duration", "200ms"}, args...)...)
		if code != 0 {
			t.Fatalf("client exit %d: %s", code, stderr)
		}
		if len(r.Conns) != 1 || r.Conns[0].Mode != "unix" || r.Conns[0].Fabric != "" || r.Requests == 0 || r.URMAConns != 0 || r.TCPConns != 0 || r.UnixConns != 1 {
			t.Fatalf("unix run %+v", r)
		}
		select {
		case e := <-events:
			if e.Event != "conn" || e.Mode != "unix" {
				t.Fatalf("server event %+v, want a unix conn", e)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("server reported no connection")
		}
		<-events // closed
	}
}

// A perf header with flags this side does not know is refused.
func TestPerfHeaderFlags(t *testing.T) {
	for _, tc := range []struct {
		flags uint32
		ok    bool
	}{{0, true}, {flagAck, true}, {flagRecvZeroCopy, true}, {flagAck | flagRecvZeroCopy, true}, {4, false}, {flagAck | 1<<31, false}} {
		b := appendClientHeader(nil, 100, tc.flags)
		size, flags, err := readClientHeaderRest(bytes.NewReader(b[len(perfMagic):]))
		if (err == nil) != tc.ok || (tc.ok && (size != 100 || flags != tc.flags)) {
			t.Errorf("flags %#x: %d %#x %v", tc.flags, size, flags, err)
		}
	}
}

// TestEchoServerAnswersPlainTCP: a plain TCP client gets its bytes back,
// including one that sends fewer bytes than the perf magic, even a part of
// it, and waits for the echo.
func TestEchoServerAnswersPlainTCP(t *testing.T) {
	isolate(t)
	addr, _ := startServer(t, "--echo")
	for _, msg := range []string{"hello from a plain TCP client\n", "hi", "UP"} {
		t.Run(msg, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
				t.Fatalf("echo %q, %v", got, err)
			}
		})
	}
}

func TestTextOutput(t *testing.T) {
	isolate(t)
	addr, _ := startServer(t, "--echo")
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"client", "--server", addr, "--duration", "200ms", "--concurrency", "2"}, small...), &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	// Without liburma, auto picks the software provider, and says so.
	for _, want := range []string{"conn 0 ", "conn 1 ", "mode=urma provider=soft-", " device=soft0", "qps:", "throughput:", "p50", "p99", "p999", "connections: 2 urma, 0 tcp"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCommandLineErrors(t *testing.T) {
	isolate(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "flags")
	if err := os.WriteFile(bad, []byte("--urma_sq_size=8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		code    int
		wantErr string
	}{
		{"no command", nil, nil, 2, "usage"},
		{"unknown command", []string{"bench"}, nil, 2, `unknown command "bench"`},
		{"client without server", []string{"client"}, nil, 2, "--server is required"},
		{"bad size", []string{"client", "--server", "x:1", "--size", "0"}, nil, 2, "--size 0 outside"},
		{"bad mode", []string{"client", "--server", "x:1", "--mode", "rdma"}, nil, 2, `--mode "rdma"`},
		{"bad pipeline", []string{"client", "--server", "x:1", "--pipeline", "0"}, nil, 2, "--pipeline 0 outside"},
		{"in-place requests on a plain unix socket", []string{"client", "--server", "/tmp/x.sock", "--mode", "unix", "--send-zerocopy"}, nil, 2, "--send-zerocopy builds requests in the transport's buffers"},
		{"unix socket missing", []string{"client", "--server", "/nonexistent/perf.sock", "--mode", "unix", "--duration", "10ms"}, nil, 1, "connection 0"},
		{"bad urma flag", []string{"server", "--urma_sq_size=5"}, nil, 2, "urma_sq_size: 5 is out of range (want 16..4096)"},
		{"unknown flag", []string{"server", "--urma_nope=1"}, nil, 2, "flag provided but not defined"},
		{"bad provider", []string{"server", "--urma_provider=hw"}, nil, 2, `urma_provider: "hw" is not allowed (want one of auto, liburma, soft)`},
		{"bad flags file", []string{"server"}, map[string]string{"URMA_FLAGS_FILE": bad}, 2, "line 1: flag urma_sq_size: 8 is out of range"},
		{"server unreachable", []string{"client", "--server", "127.0.0.1:1", "--duration", "10ms"}, nil, 1, "connection 0"},
		{"help", []string{"help"}, nil, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(errb.String()+out.String(), tc.wantErr) {
				t.Fatalf("exit %d (want %d), output %q (want %q)", code, tc.code, errb.String()+out.String(), tc.wantErr)
			}
		})
	}
}

// TestTwoProcesses builds urma-perf and runs server and client as two
// processes over the software provider, as `make demo` does: on one host,
// through shared memory.
func TestTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	isolate(t)
	bin := filepath.Join(t.TempDir(), "urma-perf")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	srv := exec.Command(bin, append([]string{"server", "--listen", "127.0.0.1:0", "--echo", "--json"}, small...)...)
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatalf("server printed nothing: %s", srvErr.String())
	}
	var ev serverEvent
	if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Event != "listening" {
		t.Fatalf("server said %q: %v", sc.Text(), err)
	}
	cli := exec.Command(bin, append([]string{"client", "--server", ev.Addr, "--size", "8192", "--concurrency", "2", "--duration", "500ms", "--mode", "urma", "--json"}, small...)...)
	cli.Stderr = os.Stderr
	res, err := cli.Output()
	if err != nil {
		t.Fatalf("client: %v\n%s", err, res)
	}
	var r Report
	if err := json.Unmarshal(res, &r); err != nil {
		t.Fatal(err)
	}
	if r.URMAConns != 2 || r.Requests == 0 || r.Conns[0].Fabric != "shm" || r.Conns[1].Fabric != "shm" {
		t.Fatalf("two processes on one host: %+v", r)
	}
	// SIGTERM stops the server cleanly.
	if err := srv.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("server exit: %v: %s", err, srvErr.String())
	}
}

// FuzzPerfHeader: whatever 12 bytes follow a client's magic, the server
// either refuses them with an error or takes a size within 1..maxSize and
// only the flags it knows; a header the client writes always parses back
// to what it wrote.
func FuzzPerfHeader(f *testing.F) {
	for _, seed := range [][]byte{
		appendClientHeader(nil, 4096, 0)[len(perfMagic):],
		appendClientHeader(nil, 1, flagAck|flagRecvZeroCopy)[len(perfMagic):],
		appendClientHeader(nil, maxSize+1, 4)[len(perfMagic):],
		{},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		size, flags, err := readClientHeaderRest(bytes.NewReader(b))
		if err != nil {
			return
		}
		if size < 1 || size > maxSize || flags&^(flagAck|flagRecvZeroCopy) != 0 {
			t.Fatalf("accepted size %d flags %#x from %x", size, flags, b)
		}
		again := appendClientHeader(nil, size, flags)[len(perfMagic):]
		size2, flags2, err := readClientHeaderRest(bytes.NewReader(again))
		if err != nil || size2 != size || flags2 != flags {
			t.Fatalf("header %d/%#x wrote %x, read back %d/%#x, %v", size, flags, again, size2, flags2, err)
		}
	})
}

// TestCPUProfile: --cpuprofile leaves Go's CPU profile of the run in the
// file it names (gzip-compressed protobuf, as pprof writes it), and a
// profile that cannot be written is a usage error before anything runs.
func TestCPUProfile(t *testing.T) {
	isolate(t)
	addr, _ := startServer(t, "--echo")
	prof := filepath.Join(t.TempDir(), "client.prof")
	if _, code, stderr := runClientJSON(t, "--server", addr, "--duration", "200ms", "--cpuprofile", prof); code != 0 {
		t.Fatalf("client exit %d: %s", code, stderr)
	}
	b, err := os.ReadFile(prof)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("%s holds %d bytes that are not a gzip-compressed profile", prof, len(b))
	}
	bad := filepath.Join(t.TempDir(), "missing", "client.prof")
	if _, code, stderr := runClientJSON(t, "--server", addr, "--duration", "200ms", "--cpuprofile", bad); code != 2 || !strings.Contains(stderr, "--cpuprofile") {
		t.Fatalf("client with an unwritable profile exited %d, want 2 naming --cpuprofile; stderr: %s", code, stderr)
	}
}
