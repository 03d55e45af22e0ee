// Command urma-device-plugin advertises URMA devices to kubelet as jetty
// budgets (urma.openeuler.org/jetty). Subcommands: serve (the default) runs
// the plugin; discover prints what it sees as JSON and exits. See
// docs/device-plugin.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/openeuler/urma-k8s/internal/deviceplugin"
	"github.com/openeuler/urma-k8s/internal/stopsignal"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr, deviceplugin.Run))
}

const usage = `usage: urma-device-plugin [serve] [flags]   run the device plugin (default)
       urma-device-plugin discover [flags]  print the devices the plugin sees as JSON
       urma-device-plugin <command> -h      list a command's flags`

// serveFunc is deviceplugin.Run; tests give run another service.
type serveFunc func(context.Context, logr.Logger, deviceplugin.Config, deviceplugin.Deps) error

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, serve serveFunc) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	cfg := deviceplugin.Default()
	cfg.NodeName = getenv("NODE_NAME")
	fs := flag.NewFlagSet("urma-device-plugin "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	// -h before any command reaches serve's flag set (serve is the
	// default): show the commands too, not only this one's flags.
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nflags of %s:\n", usage, fs.Name())
		fs.PrintDefaults()
	}
	var verbosity int // serve only: discover prints its report and logs nothing
	switch cmd {
	case "serve":
		fs.IntVar(&verbosity, "v", 0, "log verbosity (0 info, 1 more, 2 debug)")
		cfg.AddServeFlags(fs)
	case "discover":
		cfg.AddDiscoveryFlags(fs)
	case "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "unknown command %q\n%s\n", cmd, usage)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments %q\n%s\n", fs.Args(), usage)
		return 2
	}

	if cmd == "discover" {
		if err := deviceplugin.Discover(stdout, cfg); err != nil {
			fmt.Fprintln(stderr, "discover:", err)
			return 1
		}
		return 0
	}

	log := funcr.NewJSON(func(obj string) { fmt.Fprintln(stderr, obj) },
		funcr.Options{Verbosity: verbosity, LogTimestamp: true, LogCaller: funcr.Error})
	ctx, stop := stopsignal.Context(ctx, log, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, log, cfg, deviceplugin.Deps{}); err != nil {
		log.Error(err, "urma-device-plugin failed")
		return 1
	}
	return 0
}
