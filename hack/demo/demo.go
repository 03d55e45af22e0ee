package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/openeuler/urma-k8s/hack/internal/proc"
)

// Binary names in bin/, as hack/demo.sh builds them.
const (
	binOperator     = "urma-operator"
	binDevicePlugin = "urma-device-plugin"
	binPerf         = "urma-perf"
)

// demo holds what the steps create, so cleanup can undo it whatever step
// failed.
type demo struct {
	o   options
	out io.Writer

	tmp     string // everything the demo writes lives here
	logDir  string
	current string // title of the step running, for error messages

	children []*proc.Child
	env      *envtest.Environment

	kubeconfig string
	restConfig *rest.Config
	node       fakeNode       // step 1
	endpoint   endpointResult // step 3
	flagsFile  string         // the operator's rendered flags, for urma-perf
}

func newDemo(o options, out io.Writer) (*demo, error) {
	tmp, err := os.MkdirTemp("", "urma-demo-")
	if err != nil {
		return nil, fmt.Errorf("create the temporary directory: %w", err)
	}
	d := &demo{o: o, out: out, tmp: tmp, logDir: filepath.Join(tmp, "logs"), current: "setup"}
	if err := os.Mkdir(d.logDir, 0o755); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("create the log directory: %w", err)
	}
	return d, nil
}

type step struct {
	title string
	run   func(context.Context) error
}

func (d *demo) run(ctx context.Context) error {
	steps := []step{
		{"fake UB node: what the device plugin discovers", d.discoverFakeNode},
		{"local control plane: kube-apiserver and etcd (envtest)", d.startControlPlane},
		{"operator: tune an UrmaEndpoint into urma_* flags", d.runOperator},
		{"urma-perf over the software URMA provider, then over TCP", d.runPerf},
	}
	fmt.Fprintf(d.out, "urma-k8s demo: the whole stack on this machine, no UB hardware, no cluster\n")
	fmt.Fprintf(d.out, "temporary files in %s\n", d.tmp)
	for i, s := range steps {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		d.current = s.title
		fmt.Fprintf(d.out, "\n==> [%d/%d] %s\n", i+1, len(steps), s.title)
		start := time.Now()
		if err := s.run(ctx); err != nil {
			return err
		}
		fmt.Fprintf(d.out, "    (%s)\n", time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

// start runs one of the demo's binaries as a child that cleanup stops.
func (d *demo) start(name, bin string, args, env []string) (*proc.Child, error) {
	c, err := proc.Start(d.logDir, name, filepath.Join(d.o.binDir, bin), args, env)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w (hack/demo.sh builds it; if it said it skipped it, its package is not in this checkout)", err)
	}
	if err != nil {
		return nil, err
	}
	d.children = append(d.children, c)
	return c, nil
}

// cleanup stops every child (the last started first), the control plane,
// and removes the temporary directory unless -keep. It reports what it could
// not undo.
func (d *demo) cleanup() error {
	var errs []error
	for i := len(d.children) - 1; i >= 0; i-- {
		d.children[i].Stop()
	}
	if d.env != nil {
		if err := d.env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop the control plane: %w", err))
		}
	}
	if d.o.keep {
		fmt.Fprintf(d.out, "kept %s (kubeconfig, logs/, node/, urma.flags)\n", d.tmp)
	} else if err := os.RemoveAll(d.tmp); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", d.tmp, err))
	}
	return errors.Join(errs...)
}
