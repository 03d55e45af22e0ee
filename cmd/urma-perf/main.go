// Command urma-perf measures pkg/transport, the counterpart of brpc's
// example/urma_performance:
//
//	urma-perf server --listen ADDR [--echo] [--mode auto|tcp] [--grpc] [--json]
//	urma-perf client --server ADDR --size N --concurrency N --duration D [--mode auto|urma|tcp] [--grpc] [--json]
//	urma-perf stream --server ADDR [--concurrency N] [--interval D] [--redial D] [--duration D] [--mode auto|urma|tcp] [--json]
//
// The client runs request/response loops on concurrency connections and
// prints QPS, throughput, latency percentiles and the mode of each
// connection. The echo server returns every request; without --echo it
// answers each with 8 bytes. Plain TCP clients (nc, telnet) get a plain
// byte echo. Both sides read the flags file (URMA_FLAGS_FILE) and the device
// plugin's environment like any workload, and take any urma_* flag on the
// command line (--urma_sq_size=256). With --grpc on both sides the server
// serves gRPC's health service instead and the client times unary health
// checks: gRPC over the transport. The stream command runs until it is
// stopped, dials again whenever a connection fails, and prints its counts
// (requests, dials by mode, reconnects, errors) every interval: a
// workload's view of a disruption (make e2e's chaos steps). See
// docs/transport.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/openeuler/urma-k8s/internal/stopsignal"
	"github.com/openeuler/urma-k8s/pkg/transport"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

func main() {
	os.Exit(runWithSignals(os.Args[1:], os.Stdout, os.Stderr, run))
}

// runWithSignals runs cmd with a context that ends at the first SIGINT or
// SIGTERM. A second one ends the process at once: a server waiting for its
// connections to close, or a client for a peer that no longer answers, is
// then cut short by a second Ctrl-C, not only by SIGKILL.
func runWithSignals(args []string, stdout, stderr io.Writer, cmd func(context.Context, []string, io.Writer, io.Writer) int) int {
	ctx, stop := stopsignal.Context(context.Background(), (&common{}).logger(stderr), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return cmd(ctx, args, stdout, stderr)
}

const usage = `usage: urma-perf server --listen ADDR [--echo] [--mode auto|tcp] [--grpc] [--json] [--urma_*=V ...]
       urma-perf client --server ADDR [--size N] [--concurrency N] [--duration D] [--mode auto|urma|tcp] [--grpc] [--json] [--urma_*=V ...]
       urma-perf stream --server ADDR [--size N] [--concurrency N] [--interval D] [--redial D] [--duration D] [--mode auto|urma|tcp] [--json] [--urma_*=V ...]
       urma-perf <command> -h   list a command's flags`

// common are the flags both commands take.
type common struct {
	json       bool
	verbosity  int
	cpuProfile string               // --cpuprofile: where Go's CPU profile of the run goes
	urma       map[string]*urmaFlag // urma_* overrides given on the command line
}

// urmaFlag is one urma_* flag on the command line; booleans may be given
// bare (--urma_use_polling), as gflags allows.
type urmaFlag struct {
	spec  flags.Spec
	value string
}

func (f *urmaFlag) String() string { return f.value }

func (f *urmaFlag) Set(v string) error {
	f.value = v
	return nil
}

func (f *urmaFlag) IsBoolFlag() bool { return f.spec.Kind == flags.Bool }

func (c *common) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.json, "json", false, "print results as JSON")
	fs.IntVar(&c.verbosity, "v", 0, "log verbosity of the transport on stderr (0 warnings and fallbacks, 1 more)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write Go's CPU profile of the whole run to this file (go tool pprof reads it)")
	c.urma = map[string]*urmaFlag{}
	for _, s := range append(flags.Specs(), flags.TransportSpecs()...) {
		f := &urmaFlag{spec: s}
		c.urma[s.Name] = f
		fs.Var(f, s.Name, fmt.Sprintf("%s (default %q; %s); overrides the flags file", s.Help, s.Default, s.Range()))
	}
}

// config builds the transport configuration: the flags file and
// environment (as transport.LoadFlags reads them), then the command line.
func (c *common) config(fs *flag.FlagSet, stderr io.Writer) (transport.Config, error) {
	f, err := transport.LoadFlags()
	if err != nil {
		return transport.Config{}, err
	}
	var setErr error
	fs.Visit(func(fl *flag.Flag) {
		if v, ok := c.urma[fl.Name]; ok && setErr == nil {
			if err := f.Set(fl.Name, v.value); err != nil {
				setErr = fmt.Errorf("--%s: %w", fl.Name, err)
			}
		}
	})
	if setErr != nil {
		return transport.Config{}, setErr
	}
	if err := f.Validate(); err != nil {
		return transport.Config{}, err
	}
	return transport.Config{Flags: &f, Logger: c.logger(stderr)}, nil
}

// startProfile starts the CPU profile --cpuprofile asks for; the caller
// runs stop when the command ends, which writes it out.
func (c *common) startProfile() (stop func(), err error) {
	if c.cpuProfile == "" {
		return func() {}, nil
	}
	f, err := os.Create(c.cpuProfile)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

func (c *common) logger(stderr io.Writer) logr.Logger {
	return funcr.New(func(prefix, args string) {
		if prefix != "" {
			fmt.Fprintln(stderr, prefix+": "+args)
		} else {
			fmt.Fprintln(stderr, args)
		}
	}, funcr.Options{Verbosity: c.verbosity})
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stdout, usage)
			return 0
		}
		fmt.Fprintln(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	var err error
	switch cmd {
	case "server":
		err = runServer(ctx, args, stdout, stderr)
	case "client":
		err = runClient(ctx, args, stdout, stderr)
	case "stream":
		err = runStream(ctx, args, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "unknown command %q\n%s\n", cmd, usage)
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "urma-perf %s: %v\n", cmd, err)
		return 2
	case errors.Is(err, errNotURMA):
		fmt.Fprintf(stderr, "urma-perf %s: %v\n", cmd, err)
		return 3
	}
	fmt.Fprintf(stderr, "urma-perf %s: %v\n", cmd, err)
	return 1
}

// usageError is a bad command line (exit 2).
type usageError struct{ error }

// errNotURMA: --mode urma, and a connection fell back (exit 3).
var errNotURMA = errors.New("a connection does not run on URMA")

// parse parses args into fs, mapping flag errors to usageError.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	return nil
}
