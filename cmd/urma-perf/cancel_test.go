package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// stuckServer is a loopback TCP server that takes a perf client's header
// and then goes quiet: before its own header (answer false), or after it
// and the client's first request (answer true). It says on reached when a
// connection got there, and closes every connection at cleanup, so that a
// client that did not stop on its own still ends.
func stuckServer(t *testing.T, answer bool, size int) (addr string, reached <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{}, 16)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				hdr := make([]byte, 16)
				if _, err := io.ReadFull(c, hdr); err != nil {
					return
				}
				if answer {
					if _, err := c.Write(binary.BigEndian.AppendUint32([]byte(perfMagic), ackSize)); err != nil {
						return
					}
					if _, err := io.ReadFull(c, make([]byte, size)); err != nil {
						return
					}
				}
				ch <- struct{}{}
				_, _ = io.Copy(io.Discard, c) // never answer
			}()
		}
	}()
	return ln.Addr().String(), ch
}

// TestClientStopsWhenCancelled: a signal (ctx) ends the client even while a
// connection waits for a server that stopped answering: before the perf
// header it is an error, during the measurement the end of it, with the
// report of what was measured and no connection blamed.
func TestClientStopsWhenCancelled(t *testing.T) {
	isolate(t)
	tests := []struct {
		name     string
		answer   bool // the server sends its header and takes a request
		args     []string
		wantCode int
	}{
		{name: "silent before the perf header", wantCode: 1},
		{name: "stalled mid-run", answer: true, wantCode: 0},
		{name: "stalled mid-run, pipelined", answer: true, args: []string{"--pipeline", "4"}, wantCode: 0},
		{name: "stalled mid-run, two connections", answer: true, args: []string{"--concurrency", "2"}, wantCode: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const size = 64
			addr, reached := stuckServer(t, tc.answer, size)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out, errb bytes.Buffer
			done := make(chan int, 1)
			args := append([]string{"client", "--server", addr, "--mode", "tcp", "--size", "64", "--duration", "1h", "--json"}, tc.args...)
			go func() { done <- run(ctx, args, &out, &errb) }()
			select {
			case <-reached:
			case code := <-done:
				t.Fatalf("client exited %d before the server went quiet: %s", code, errb.String())
			}
			cancel()
			var code int
			select {
			case code = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the client still runs 20s after its context ended")
			}
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.wantCode, errb.String())
			}
			if !tc.answer {
				if !strings.Contains(errb.String(), "context canceled") {
					t.Errorf("stderr %q does not say the client was cancelled", errb.String())
				}
				return
			}
			var r Report
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatalf("report %q: %v", out.String(), err)
			}
			for _, c := range r.Conns {
				if c.Error != "" {
					t.Errorf("an interrupted connection reports an error: %+v", c)
				}
			}
		})
	}
}

// blockingHealth answers no health check: each call ends the measurement
// (the signal) and returns what gRPC returns for a cancelled call.
type blockingHealth struct {
	healthpb.HealthClient
	cancel context.CancelFunc
}

func (h blockingHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest, _ ...grpc.CallOption) (*healthpb.HealthCheckResponse, error) {
	h.cancel()
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// TestGRPCWorkerCancelled: a health check cut short by the signal ends the
// measurement; it is not a failed connection.
func TestGRPCWorkerCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &grpcWorker{client: blockingHealth{cancel: cancel}}
	w.run(ctx, time.Now().Add(time.Hour), &healthpb.HealthCheckRequest{})
	if w.err != nil || w.requests != 0 {
		t.Fatalf("cancelled worker: err %v, %d requests; want no error and none", w.err, w.requests)
	}
}
