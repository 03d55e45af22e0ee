//go:build linux

// Command urma-e2e brings up a real one-node Kubernetes cluster on this
// machine (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// kube-proxy, kubelet, containerd with runc, a bridge CNI), installs the
// chart with images packed by the project itself, and checks the product
// end to end on a fake UB node: the device plugin registering with the real
// kubelet, the operator and its webhook, two pods talking over URMA, a
// kubelet restart and helm uninstall; then the chart again with the DRA
// driver, and two pods whose claims it prepares through CDI talking over
// URMA. It tears everything down at the end,
// on failure and on Ctrl-C, and keeps every component's log in one folder.
//
// It runs as root on Linux. hack/e2e.sh (`make e2e`) installs runc from
// Debian, builds the Kubernetes binaries, the CNI plugins, containerd 2.x and
// the project's static binaries into bin/ and runs it. See docs/e2e.md.
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

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/openeuler/urma-k8s/hack/internal/repo"
)

// options are the command-line settings.
type options struct {
	root     string // repository root: bin/, charts/
	binDir   string // bin/: helm, k8s/, cni/, e2e/
	work     string // state of the cluster, removed at teardown
	logs     string // every component's log, kept
	nodeIP   string
	timeout  time.Duration
	keep     bool // leave the cluster running after the checks
	cleanup  bool // only tear down what a previous run left in -work
	chaos    bool // run the chaos steps
	perfTime time.Duration
}

func parseOptions(args []string, stderr io.Writer, now time.Time) (options, error) {
	fs := flag.NewFlagSet("urma-e2e", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.root, "root", "", "repository root (default: the directory holding go.mod, from the working directory up)")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory of helm, k8s/, cni/ and e2e/ (default <root>/bin)")
	fs.StringVar(&o.work, "work", "/tmp/urma-e2e", "the cluster's state (certificates, etcd, containerd, kubelet); removed at teardown")
	fs.StringVar(&o.logs, "logs", "", "folder for every component's log, kept after the run (default /tmp/urma-e2e-logs/<time>)")
	fs.StringVar(&o.nodeIP, "node-ip", "", "the node's IPv4 address that pods reach the API server on (default: the first global IPv4 address of an up interface)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up when the whole run takes longer")
	fs.DurationVar(&o.perfTime, "perf-duration", 3*time.Second, "load duration of each urma-perf client run")
	fs.BoolVar(&o.keep, "keep", false, "leave the cluster running after the checks (tear it down later with -cleanup)")
	fs.BoolVar(&o.cleanup, "cleanup", false, "only tear down what a previous run left in -work, then exit")
	fs.BoolVar(&o.chaos, "chaos", true, "run the chaos steps: the device plugin's, the DRA driver's and the operator's pods deleted, the DRA checkpoint corrupted, containerd restarted, under running workloads (-chaos=false skips them)")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.timeout <= 0 || o.perfTime <= 0 {
		return options{}, errors.New("-timeout and -perf-duration must be positive")
	}
	if !filepath.IsAbs(o.work) || filepath.Clean(o.work) == "/" {
		return options{}, fmt.Errorf("-work %q must be an absolute path below /", o.work)
	}
	o.work = filepath.Clean(o.work)
	if o.root == "" {
		var err error
		if o.root, err = repo.RootFromWorkingDir(); err != nil {
			return options{}, err
		}
	}
	if o.binDir == "" {
		o.binDir = filepath.Join(o.root, "bin")
	}
	if o.logs == "" {
		o.logs = filepath.Join("/tmp/urma-e2e-logs", now.Format("20060102-150405"))
	}
	return o, nil
}

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

func execute(args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr, time.Now())
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "urma-e2e: %v\n", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "urma-e2e: must run as root (it starts kubelet and containerd, creates device nodes, mounts and cgroups)")
		return 2
	}
	// The controller-runtime client logs through this; the run prints its own.
	ctrllog.SetLogger(logr.Discard())
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	r, err := newRun(o, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "urma-e2e: %v\n", err)
		return 1
	}
	if o.cleanup {
		if err := r.teardown(); err != nil {
			fmt.Fprintf(stderr, "urma-e2e: cleanup: %v\n", err)
			return 1
		}
		return 0
	}
	ctx, cancel := context.WithTimeoutCause(sigCtx, o.timeout, fmt.Errorf("the run took longer than -timeout %s", o.timeout))
	defer cancel()
	start := time.Now()
	runErr := r.run(ctx)
	interrupted := sigCtx.Err() != nil
	if interrupted {
		fmt.Fprintln(stdout, "\n==> interrupted: tearing down")
	}
	var teardownErr error
	if o.keep && runErr == nil {
		fmt.Fprintf(stdout, "\n==> -keep: the cluster keeps running after this command (its components' pids are in %s)\n"+
			"    %s --kubeconfig %s get pods -A\n"+
			"    tear it down with: hack/e2e.sh -cleanup -work %s   (or make e2e E2E_FLAGS=-cleanup for the default -work)\n",
			r.pidsFile(), r.bin("k8s/kubectl"), r.adminKubeconfig, o.work)
	} else {
		// Teardown needs no context: ctx may be over, and every stop it does is bounded.
		teardownErr = r.teardown()
	}
	r.printSummary(time.Since(start))
	switch {
	case runErr != nil && interrupted:
		fmt.Fprintf(stderr, "urma-e2e: interrupted during %s; logs in %s\n", r.current, o.logs)
		return 130
	case runErr != nil:
		fmt.Fprintf(stderr, "\nurma-e2e: FAILED at %q:\n  %v\n  logs of every component: %s\n", r.current, runErr, o.logs)
		return 1
	case teardownErr != nil:
		fmt.Fprintf(stderr, "urma-e2e: teardown: %v\n  logs: %s\n", teardownErr, o.logs)
		return 1
	}
	return 0
}
