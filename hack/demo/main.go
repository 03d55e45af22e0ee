// Command urma-demo runs the urma-k8s stack end to end on one machine, with
// no UB hardware and no cluster: a fake UB node seen by the device plugin, a
// local control plane (envtest's kube-apiserver and etcd) with the operator
// tuning an UrmaEndpoint, and urma-perf's client and server exchanging data
// over the software URMA provider with the operator's flags, measured against
// TCP in the same run.
//
// It expects its binaries in bin/ and the envtest binaries in bin/k8s;
// hack/demo.sh (`make demo`) builds them first. See docs/demo.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/openeuler/urma-k8s/hack/internal/repo"
)

// options are the demo's command-line settings.
type options struct {
	root        string // repository root: bin/, config/crd/bases
	binDir      string
	assetsDir   string
	crdDir      string
	duration    time.Duration // load per urma-perf client run
	size        int           // message size
	concurrency int
	timeout     time.Duration // whole demo
	keep        bool          // keep the temporary directory
	verbose     bool          // attach the control plane's output
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("urma-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.root, "root", "", "repository root (default: the directory holding go.mod, found from the working directory up)")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory of urma-operator, urma-device-plugin and urma-perf (default <root>/bin)")
	fs.StringVar(&o.assetsDir, "assets", "", "directory of the envtest binaries kube-apiserver and etcd (default <root>/bin/k8s)")
	fs.StringVar(&o.crdDir, "crds", "", "directory of the CRD manifests (default <root>/config/crd/bases)")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "load duration of each urma-perf client run")
	fs.IntVar(&o.size, "size", 4096, "urma-perf message size in bytes")
	fs.IntVar(&o.concurrency, "concurrency", 4, "urma-perf client connections")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "give up when the whole demo takes longer")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directory (kubeconfig, logs, flags file, fake node) for inspection")
	fs.BoolVar(&o.verbose, "v", false, "show the control plane's own output")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.duration <= 0 || o.size <= 0 || o.concurrency <= 0 || o.timeout <= 0 {
		return options{}, errors.New("-duration, -size, -concurrency and -timeout must be positive")
	}
	if o.root == "" {
		var err error
		if o.root, err = repo.RootFromWorkingDir(); err != nil {
			return options{}, err
		}
	}
	def := func(p *string, rel string) {
		if *p == "" {
			*p = filepath.Join(o.root, rel)
		}
	}
	def(&o.binDir, "bin")
	def(&o.assetsDir, filepath.Join("bin", "k8s"))
	def(&o.crdDir, filepath.Join("config", "crd", "bases"))
	return o, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "urma-demo: %v\n", err)
		return 2
	}
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeoutCause(sigCtx, o.timeout, fmt.Errorf("the demo took longer than -timeout %s", o.timeout))
	defer cancel()

	d, err := newDemo(o, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "urma-demo: %v\n", err)
		return 1
	}
	start := time.Now()
	runErr := d.run(ctx)
	interrupted := sigCtx.Err() != nil
	if interrupted {
		fmt.Fprintln(stdout, "\n==> interrupted: cleaning up")
	}
	// Cleanup needs no context: ctx may be over, and every stop it does is bounded.
	cleanupErr := d.cleanup()
	switch {
	case runErr != nil && interrupted:
		fmt.Fprintf(stderr, "urma-demo: interrupted during %s\n", d.current)
		return 130
	case runErr != nil:
		fmt.Fprintf(stderr, "\nurma-demo: FAILED at step %q:\n  %v\n", d.current, runErr)
		if d.tmp != "" && o.keep {
			fmt.Fprintf(stderr, "  logs kept in %s\n", filepath.Join(d.tmp, "logs"))
		} else {
			fmt.Fprintln(stderr, "  (run with -keep to keep the logs and the temporary files)")
		}
		return 1
	case cleanupErr != nil:
		fmt.Fprintf(stderr, "urma-demo: cleanup: %v\n", cleanupErr)
		return 1
	}
	fmt.Fprintf(stdout, "\n==> demo finished in %s\n", time.Since(start).Round(100*time.Millisecond))
	return 0
}
