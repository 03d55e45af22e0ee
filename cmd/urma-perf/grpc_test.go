package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestGRPC: `server --grpc` serves gRPC's health service and `client
// --grpc` times unary checks on it, over the transport (shm) or TCP, and
// both say how each connection runs.
func TestGRPC(t *testing.T) {
	isolate(t)
	tests := []struct {
		name       string
		serverArgs []string
		clientArgs []string
		wantCode   int
		wantURMA   int
		wantTCP    int
	}{
		{name: "over urma", clientArgs: []string{"--concurrency", "2"}, wantURMA: 2},
		{name: "client forced to tcp", clientArgs: []string{"--mode", "tcp"}, wantTCP: 1},
		{name: "urma required, server tcp-only", serverArgs: []string{"--mode", "tcp"}, clientArgs: []string{"--mode", "urma"}, wantCode: 3, wantTCP: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr, events := startServer(t, append([]string{"--grpc"}, tc.serverArgs...)...)
			r, code, stderr := runClientJSON(t, append([]string{"--grpc", "--server", addr, "--duration", "300ms"}, tc.clientArgs...)...)
			if code != tc.wantCode {
				t.Fatalf("client exit %d, want %d; stderr: %s", code, tc.wantCode, stderr)
			}
			if r.Protocol != protocolGRPC || r.Size != 0 {
				t.Errorf("report protocol %q size %d, want grpc and no payload", r.Protocol, r.Size)
			}
			if r.URMAConns != tc.wantURMA || r.TCPConns != tc.wantTCP {
				t.Fatalf("conns urma=%d tcp=%d, want %d/%d: %+v", r.URMAConns, r.TCPConns, tc.wantURMA, tc.wantTCP, r.Conns)
			}
			if r.Requests == 0 || r.QPS <= 0 || r.LatencyMicros.P50 <= 0 || r.LatencyMicros.Max < r.LatencyMicros.P50 {
				t.Errorf("implausible results: %+v", r)
			}
			for _, c := range r.Conns {
				if c.Error != "" || c.Requests == 0 || c.Local == "" {
					t.Errorf("connection %+v: want requests, an address and no error", c)
				}
				if wantFabric := map[bool]string{true: "shm"}[c.Mode == "urma"]; c.Fabric != wantFabric {
					t.Errorf("connection %+v: fabric %q, want %q", c, c.Fabric, wantFabric)
				}
			}
			for seen := 0; seen < tc.wantURMA+tc.wantTCP; {
				select {
				case e := <-events:
					if e.Event != "conn" {
						continue
					}
					seen++
					if e.Protocol != protocolGRPC || (e.Mode == "urma") != (tc.wantURMA > 0) {
						t.Errorf("server conn %+v", e)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("server reported %d connections", seen)
				}
			}
		})
	}
}

// TestGRPCUsage: flags that shape urma-perf's own requests do not apply to
// health checks; a gRPC client says so instead of ignoring them.
func TestGRPCUsage(t *testing.T) {
	isolate(t)
	for _, args := range [][]string{
		{"--size", "100"},
		{"--pipeline", "2"},
		{"--ack"},
		{"--recv-zerocopy"},
		{"--send-zerocopy"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var errb strings.Builder
			code := run(context.Background(), append([]string{"client", "--grpc", "--server", "127.0.0.1:1"}, args...), io.Discard, &errb)
			if code != 2 || !strings.Contains(errb.String(), "--grpc makes unary health checks") {
				t.Fatalf("exit %d, stderr %q; want 2 and the reason", code, errb.String())
			}
		})
	}
}

// A stop (SIGTERM) that comes before a listener's Serve started made Serve
// return grpc.ErrServerStopped, and `server --grpc` exited 1 on a normal
// stop. Stopping at once after the start hits that window often; every
// run must be clean.
func TestServeGRPCStoppedBeforeServingIsClean(t *testing.T) {
	for i := range 200 {
		lns := make([]net.Listener, 2)
		for j := range lns {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			lns[j] = l
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := serveGRPC(ctx, lns, &printer{w: io.Discard}); err != nil {
			t.Fatalf("run %d: serveGRPC after a stop = %v, want nil", i, err)
		}
		for _, l := range lns {
			_ = l.Close()
		}
	}
}
