package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer the server goroutine and the test can share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// smallFlagsFile writes a flags file with a pool small enough for a test,
// read through URMA_FLAGS_FILE exactly as in a pod the operator tuned.
func smallFlagsFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "urma.flags")
	if err := os.WriteFile(p, []byte("--urma_buffer_count=512\n--urma_sq_size=32\n--urma_rq_size=32\n--urma_prepared_jetty_cnt=2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServerAndClient runs both commands in one process over loopback and
// checks what a user checks: the mode each side reports, the fallback
// reason, --require-urma's error, and the transport's metrics.
func TestServerAndClient(t *testing.T) {
	for _, tc := range []struct {
		name        string
		provider    string // URMA_PROVIDER for both sides
		requireURMA bool
		wantErr     error
		wantClient  []string
		wantServer  []string
		wantMetric  string
	}{{
		name:       "urma",
		wantClient: []string{"3 health checks", "connection mode=urma"},
		wantServer: []string{"mode=urma"},
		wantMetric: `urma_transport_conns_total{mode="urma",role="server"} 1`,
	}, {
		name:        "urma required and available",
		requireURMA: true,
		wantClient:  []string{"connection mode=urma"},
		wantServer:  []string{"mode=urma"},
		wantMetric:  `urma_transport_conns_total{mode="urma",role="server"} 1`,
	}, {
		name:       "no provider - TCP fallback with its reason",
		provider:   "liburma",
		wantClient: []string{"connection mode=tcp", `fallback="provider_unavailable`},
		wantServer: []string{"URMA unavailable, every connection will use TCP: provider_unavailable", "mode=tcp"},
		wantMetric: `urma_transport_conns_total{mode="tcp",role="server"} 1`,
	}, {
		name:        "urma required but unavailable",
		provider:    "liburma",
		requireURMA: true,
		wantErr:     errFellBack,
		wantClient:  []string{"connection mode=tcp", `fallback="provider_unavailable`},
		wantServer:  []string{"mode=tcp"},
		// A client without URMA sends no hello at all, so the server sees
		// gRPC's first bytes: its reason is the peer's, not its own.
		wantMetric: `urma_transport_fallbacks_total{reason="peer_not_urma",role="server"} 1`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			baseline := runtime.NumGoroutine()
			t.Setenv("URMA_FLAGS_FILE", smallFlagsFile(t))
			t.Setenv("URMA_JETTY_BUDGET", "")
			t.Setenv("URMA_DEVICE", "")
			t.Setenv("URMA_PROVIDER", tc.provider)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var srvOut, srvErr syncBuffer
			type addrs struct{ grpc, metrics string }
			ready := make(chan addrs, 1)
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"server", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"}, &srvOut, &srvErr,
					func(g, m string) { ready <- addrs{g, m} })
			}()
			var a addrs
			select {
			case a = <-ready:
			case err := <-done:
				t.Fatalf("server exited early: %v\n%s", err, srvErr.String())
			case <-time.After(30 * time.Second):
				t.Fatal("server did not start")
			}

			args := []string{"client", "--server", a.grpc, "--calls", "3"}
			if tc.requireURMA {
				args = append(args, "--require-urma")
			}
			var cliOut, cliErr bytes.Buffer
			err := run(context.Background(), args, &cliOut, &cliErr, nil)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("client error %v, want %v\nstdout: %s\nstderr: %s", err, tc.wantErr, cliOut.String(), cliErr.String())
			}
			for _, w := range tc.wantClient {
				if !strings.Contains(cliOut.String(), w) {
					t.Errorf("client output lacks %q:\n%s", w, cliOut.String())
				}
			}

			metrics := get(t, "http://"+a.metrics+"/metrics")
			if !strings.Contains(metrics, tc.wantMetric) {
				t.Errorf("metrics lack %q:\n%s", tc.wantMetric, metrics)
			}

			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("server: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("server did not stop")
			}
			for _, w := range tc.wantServer {
				if !strings.Contains(srvOut.String(), w) {
					t.Errorf("server output lacks %q:\n%s", w, srvOut.String())
				}
			}
			waitGoroutines(t, baseline)
		})
	}
}

func TestBadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"serve"}, `unknown command "serve"`},
		{[]string{"client"}, "--server is required"},
		{[]string{"client", "--server", "127.0.0.1:1", "--calls", "0"}, "--calls must be at least 1"},
		{[]string{"server", "--bogus"}, "flag provided but not defined: -bogus"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := run(context.Background(), tc.args, io.Discard, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return string(b)
}

// waitGoroutines fails the test when goroutines started by it are still
// running after a deadline: the server, its listener and the transport
// must all stop when the context ends.
func waitGoroutines(t *testing.T, baseline int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= baseline {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines still running, %d before the test:\n%s", n, baseline, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
