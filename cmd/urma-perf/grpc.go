package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// gRPC over the transport: `server --grpc` serves the standard health
// service (grpc.health.v1) on its listeners, and `client --grpc` makes unary
// Check calls on it, one at a time per connection. That is what a gRPC
// workload linking pkg/transport pays per call, beside gRPC over TCP
// (--mode tcp) or a Unix socket (--mode unix), between two processes.

// protocolGRPC is Report.Protocol and the listening event's Protocol for
// gRPC health checks.
const protocolGRPC = "grpc"

// serveGRPC serves the health service on every listener until ctx ends or
// one listener fails, which stops the others.
func serveGRPC(ctx context.Context, lns []net.Listener, out *printer) error {
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	stop := context.AfterFunc(ctx, srv.Stop)
	defer stop()
	errs := make(chan error, len(lns))
	for _, l := range lns {
		go func() { errs <- srv.Serve(&eventListener{Listener: l, out: out}) }()
	}
	var first error
	for range lns {
		// Serve returns nil once Stop was called, and ErrServerStopped when
		// Stop came before it started: only this function calls Stop (ctx
		// ended, or another listener failed), so neither is a failure.
		if err := <-errs; err != nil && !errors.Is(err, grpc.ErrServerStopped) && first == nil {
			first = fmt.Errorf("serve gRPC: %w", err)
			srv.Stop()
		}
	}
	return first
}

// eventListener reports each accepted connection, as the perf server does.
type eventListener struct {
	net.Listener
	out *printer
}

func (l *eventListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		ev := connEvent(c)
		ev.Protocol = protocolGRPC
		l.out.event(ev)
	}
	return c, err
}

// grpcWorker is one gRPC connection's loop and results.
type grpcWorker struct {
	worker
	cc     *grpc.ClientConn
	client healthpb.HealthClient
	mu     sync.Mutex // conn is set by gRPC's dialer goroutine
}

// measureGRPC opens r.concurrency gRPC connections through dial, makes one
// call on each to connect, then times unary health checks on all of them
// for r.duration.
func measureGRPC(ctx context.Context, dial func(context.Context) (net.Conn, error), r measurement) (*Report, error) {
	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	workers := make([]*grpcWorker, r.concurrency)
	defer func() {
		for _, w := range workers {
			if w != nil {
				_ = w.cc.Close()
			}
		}
	}()
	req := &healthpb.HealthCheckRequest{}
	for i := range workers {
		w := &grpcWorker{}
		// Each ClientConn dials once through the transport; the dialer
		// keeps the connection to report its mode and fabric.
		dialer := func(ctx context.Context, _ string) (net.Conn, error) {
			c, err := dial(ctx)
			if err == nil {
				w.mu.Lock()
				w.conn = c
				w.mu.Unlock()
			}
			return c, err
		}
		cc, err := grpc.NewClient("passthrough:///"+r.server, grpc.WithContextDialer(dialer),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		w.cc, w.client = cc, healthpb.NewHealthClient(cc)
		workers[i] = w
		if _, err := w.client.Check(dialCtx, req, grpc.WaitForReady(true)); err != nil {
			return nil, fmt.Errorf("connection %d: first health check: %w", i, err)
		}
	}

	end := time.Now().Add(r.duration)
	elapsed := runTimed(len(workers), func(i int) { workers[i].run(ctx, end, req) })
	plain := make([]*worker, len(workers))
	for i, w := range workers {
		w.mu.Lock()
		cp := w.worker
		w.mu.Unlock()
		plain[i] = &cp
	}
	rep := buildReport(r, 0, elapsed, plain)
	rep.Protocol = protocolGRPC
	return rep, nil
}

// run makes health checks until end (or ctx ends) and times each.
func (w *grpcWorker) run(ctx context.Context, end time.Time, req *healthpb.HealthCheckRequest) {
	for ctx.Err() == nil {
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		resp, err := w.client.Check(ctx, req)
		if err != nil {
			w.fail(ctx, fmt.Errorf("health check: %w", err))
			return
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			w.err = fmt.Errorf("health check answered %s, want SERVING", resp.GetStatus())
			return
		}
		w.hist.record(time.Since(t0))
		w.requests++
	}
}

// errGRPCFlags is a client flag that has no meaning for gRPC calls.
var errGRPCFlags = errors.New("--grpc makes unary health checks one at a time, without payload: --size, --pipeline, --ack, --recv-zerocopy and --send-zerocopy do not apply")
