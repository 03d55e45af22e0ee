// Command grpc-over-urma is the smallest real workload on pkg/transport: a
// gRPC server (the standard health service) and its client, whose bytes move
// over URMA when both ends can and over TCP otherwise. The gRPC code is the
// same as over plain TCP; only the listener and the dialer change.
//
//	grpc-over-urma server --listen :50051 --metrics :9090
//	grpc-over-urma client --server 10.0.3.7:50051 --calls 100 [--require-urma]
//
// Both sides use the zero transport.Config, so in a pod they pick up what the
// device plugin and the operator set: the flags file (URMA_FLAGS_FILE), the
// device (URMA_DEVICE) and the jetty budget (URMA_JETTY_BUDGET). Without any
// of it they run on the software provider with brpc's default flags.
//
// The server logs the data-plane mode of every connection it accepts and
// serves the transport's Prometheus metrics; the client prints the mode of
// its connection and, with --require-urma, exits with status 3 when the
// connection fell back to TCP. See docs/user-guide.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/openeuler/urma-k8s/pkg/transport"
)

const usage = `usage: grpc-over-urma server [--listen ADDR] [--metrics ADDR] [--v N]
       grpc-over-urma client --server ADDR [--calls N] [--timeout D] [--require-urma] [--v N]`

// errFellBack is returned by the client under --require-urma when its
// connection runs on TCP (exit status 3).
var errFellBack = errors.New("the connection fell back to TCP")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errFellBack):
		fmt.Fprintln(os.Stderr, "grpc-over-urma:", err)
		os.Exit(3)
	default:
		fmt.Fprintln(os.Stderr, "grpc-over-urma:", err)
		os.Exit(1)
	}
}

// run dispatches to the server or the client. ready, when not nil, is told
// the server's gRPC and metrics addresses once both listen (tests use it).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(grpcAddr, metricsAddr string)) error {
	if len(args) == 0 {
		return fmt.Errorf("no command\n%s", usage)
	}
	switch args[0] {
	case "server":
		return runServer(ctx, args[1:], stdout, stderr, ready)
	case "client":
		return runClient(ctx, args[1:], stdout, stderr)
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
}

// newLogger writes the transport's log lines (fallbacks and warnings at
// verbosity 0, details at 1) to w.
func newLogger(w io.Writer, verbosity int) logr.Logger {
	return funcr.New(func(prefix, args string) {
		fmt.Fprintln(w, prefix, args)
	}, funcr.Options{Verbosity: verbosity})
}

func runServer(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(string, string)) error {
	fs := flag.NewFlagSet("grpc-over-urma server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", ":50051", "TCP address of the gRPC server; the software provider listens on the same host (POD_IP for an unspecified one)")
	metricsAddr := fs.String("metrics", ":9090", "address serving Prometheus /metrics; empty disables")
	verbosity := fs.Int("v", 0, "transport log verbosity (0 fallbacks and warnings, 1 more)")
	if err := fs.Parse(args); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	ln, err := transport.ListenTransport("tcp", *listen, transport.Config{
		Logger:     newLogger(stderr, *verbosity).WithName("transport"),
		Registerer: reg,
	})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	defer ln.Close()
	if why := ln.FallbackReason(); why != "" {
		fmt.Fprintf(stdout, "URMA unavailable, every connection will use TCP: %s\n", why)
	}

	var metricsLn net.Listener
	if *metricsAddr != "" {
		metricsLn, err = net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("listen for metrics on %s: %w", *metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.Serve(metricsLn) }()
		defer hs.Close()
	}

	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(modeLogger{Listener: ln, w: stdout}) }()

	fmt.Fprintf(stdout, "serving gRPC on %s\n", ln.Addr())
	if ready != nil {
		m := ""
		if metricsLn != nil {
			m = metricsLn.Addr().String()
		}
		ready(ln.Addr().String(), m)
	}
	select {
	case <-ctx.Done():
		srv.GracefulStop()
		if err := <-served; err != nil { // nil after GracefulStop
			return fmt.Errorf("serve gRPC: %w", err)
		}
		return nil
	case err := <-served:
		return fmt.Errorf("serve gRPC: %w", err)
	}
}

// modeLogger prints the data plane of every connection the server accepts.
type modeLogger struct {
	net.Listener
	w io.Writer
}

func (l modeLogger) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(l.w, "accepted %s: %s\n", c.RemoteAddr(), describe(c))
	return c, nil
}

// describe says which data plane a connection runs on and, for TCP, why.
func describe(c net.Conn) string {
	tc, ok := c.(transport.Conn)
	if !ok {
		return "not a pkg/transport connection"
	}
	if tc.Mode() == transport.ModeURMA {
		return tc.Debug().String() // mode=urma, device, jetties, windows
	}
	return fmt.Sprintf("mode=tcp fallback=%q", tc.FallbackReason())
}

func runClient(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("grpc-over-urma client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", "", "address of a grpc-over-urma server (required)")
	calls := fs.Int("calls", 10, "health checks to make")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	requireURMA := fs.Bool("require-urma", false, "exit with status 3 when the connection runs on TCP")
	verbosity := fs.Int("v", 0, "transport log verbosity (0 fallbacks and warnings, 1 more)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *server == "" {
		return fmt.Errorf("--server is required\n%s", usage)
	}
	if *calls < 1 {
		return fmt.Errorf("--calls must be at least 1, got %d", *calls)
	}

	// One Dialer per process: its connections share the registered buffer
	// pool and the jetty pool, and together stay within URMA_JETTY_BUDGET.
	d, err := transport.NewDialer(transport.Config{Logger: newLogger(stderr, *verbosity).WithName("transport")})
	if err != nil {
		return fmt.Errorf("create URMA dialer: %w", err)
	}
	defer d.Close()

	modes := make(chan net.Conn, 1)
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, addr)
		if err == nil {
			select {
			case modes <- c:
			default: // a redial; the first connection is the one reported
			}
		}
		return c, err
	}
	cc, err := grpc.NewClient("passthrough:///"+*server,
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("create gRPC client for %s: %w", *server, err)
	}
	defer cc.Close()

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	client := healthpb.NewHealthClient(cc)
	start := time.Now()
	for i := 0; i < *calls; i++ {
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return fmt.Errorf("health check %d of %d: %w", i+1, *calls, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("health check %d of %d: server is %s", i+1, *calls, resp.GetStatus())
		}
	}
	elapsed := time.Since(start)

	var c net.Conn
	select {
	case c = <-modes:
	default:
		return errors.New("the calls succeeded but no connection was dialed")
	}
	fmt.Fprintf(stdout, "%d health checks in %s (%.1f us each); connection %s\n",
		*calls, elapsed.Round(time.Microsecond), float64(elapsed.Microseconds())/float64(*calls), describe(c))
	if m, _ := transport.ModeOf(c); *requireURMA && m != transport.ModeURMA {
		return errFellBack
	}
	return nil
}
