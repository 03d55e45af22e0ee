// Command urma-dra-driver is the Dynamic Resource Allocation driver for URMA
// devices: it publishes each node's devices as ResourceSlices with their
// jetty budgets as consumable capacity, and prepares claims for kubelet by
// writing CDI specs. See docs/dra.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/openeuler/urma-k8s/internal/dra"
	"github.com/openeuler/urma-k8s/internal/stopsignal"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stderr, dra.Run))
}

// serveFunc is dra.Run; tests give run another service.
type serveFunc func(context.Context, logr.Logger, dra.Config, dra.Deps) error

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, serve serveFunc) int {
	cfg := dra.Default()
	cfg.NodeName = getenv("NODE_NAME")
	fs := flag.NewFlagSet("urma-dra-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	verbosity := fs.Int("v", 0, "log verbosity (0 info, 1 more, 2 debug; 6 logs kubelet's gRPC calls)")
	cfg.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments %q\n", fs.Args())
		return 2
	}
	log := funcr.NewJSON(func(obj string) { fmt.Fprintln(stderr, obj) },
		funcr.Options{Verbosity: *verbosity, LogTimestamp: true, LogCaller: funcr.Error})
	ctx, stop := stopsignal.Context(ctx, log, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, log, cfg, dra.Deps{}); err != nil {
		log.Error(err, "urma-dra-driver failed")
		return 1
	}
	return 0
}
