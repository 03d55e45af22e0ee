//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/openeuler/urma-k8s/hack/internal/proc"
	"github.com/openeuler/urma-k8s/internal/node/discover"
)

// Names of the cluster this run creates.
const (
	nodeName     = "urma-e2e-node"
	testNS       = "urma-e2e"
	releaseName  = "urma"
	releaseNS    = "urma-system"
	endpointName = "perf"
	imageTag     = "e2e"
	imageRepo    = "e2e.local/urma-k8s/"
	// The pod network (bridge + host-local) and the Service range. Both live
	// on this machine only: the bridge's subnet is connected, and a route
	// marks the Service range unreachable, so that an address kube-proxy did
	// not translate never leaves through the default route.
	podCIDR     = "10.244.0.0/24"
	serviceCIDR = "10.96.0.0/16"
	bridgeName  = "urmae2e0"
)

// run is one e2e run: what it started and created, so teardown can undo it
// whatever step failed.
type run struct {
	o       options
	out     io.Writer
	current string // title of the step running, for error messages

	paths paths

	mu       sync.Mutex
	children map[string]*proc.Child // by component name
	order    []string               // start order, for stopping in reverse

	nodeIP          string
	serverIP        string               // the urma-perf server pod's IP (step 3)
	draServerIP     string               // step 8's urma-perf server pod's IP
	flags           string               // the endpoint's rendered flags (step 2)
	assigned        int                  // jetty device IDs kubelet assigned to the two pods (step 3)
	expectedUnits   int64                // urma.openeuler.org/jetty the plugin advertises on the fake node
	discovered      []discover.Device    // what urma-device-plugin discover reports on the fake node
	draDevices      map[string]draDevice // the DRA driver's devices for the node, by name (step 7)
	draBudget       int64                // jetties the endpoint's claim template asks for (step 7)
	ports           ports
	adminKubeconfig string
	rest            *rest.Config
	cs              kubernetes.Interface

	timings  []timing
	notes    []string      // facts for the summary (fabric, throughput, ...)
	recovery time.Duration // set by a chaos step (recovered), for its timing
}

// timing is one step's title, duration, recovery time (chaos steps) and
// outcome, for the summary.
type timing struct {
	title    string
	took     time.Duration
	recovery time.Duration
	err      error
}

// paths are where each component keeps its state under -work.
type paths struct {
	work, logs                           string
	pki, etcd, kubelet, containerd, cni  string
	containerdSock, cniConf, cniIPAM     string
	cdi                                  string // CDI specs: the DRA driver writes, containerd reads
	podLogs, node, sysfs, images, config string
}

func newPaths(work, logs string) paths {
	p := paths{work: work, logs: logs}
	p.pki = filepath.Join(work, "pki")
	p.etcd = filepath.Join(work, "etcd")
	p.kubelet = filepath.Join(work, "kubelet")
	p.containerd = filepath.Join(work, "containerd")
	p.containerdSock = filepath.Join(p.containerd, "containerd.sock")
	p.cni = filepath.Join(work, "cni")
	p.cniConf = filepath.Join(p.cni, "net.d")
	p.cniIPAM = filepath.Join(p.cni, "ipam")
	p.cdi = filepath.Join(work, "cdi")
	p.node = filepath.Join(work, "node")
	p.sysfs = filepath.Join(p.node, "sys")
	p.images = filepath.Join(work, "images")
	p.config = filepath.Join(work, "config")
	// Pod logs are written by kubelet and containerd straight into the
	// kept log folder.
	p.podLogs = filepath.Join(logs, "pods")
	return p
}

func newRun(o options, out io.Writer) (*run, error) {
	if err := os.MkdirAll(o.logs, 0o755); err != nil {
		return nil, fmt.Errorf("create the log folder: %w", err)
	}
	return &run{o: o, out: out, current: "setup", paths: newPaths(o.work, o.logs), children: map[string]*proc.Child{}}, nil
}

type step struct {
	title string
	fn    func(context.Context) error
}

func (r *run) run(ctx context.Context) error {
	steps := []step{
		{"preflight: root, binaries, cgroups, leftovers of an earlier run", r.preflight},
		{"certificates, kubeconfigs and configuration files", r.configure},
		{"etcd and kube-apiserver", r.startControlPlane},
		{"containerd (runc, bridge CNI) and the project's images", r.startRuntime},
		{"kube-controller-manager, kube-scheduler, kube-proxy, kubelet: node Ready", r.startNode},
		{"fake UB node: sysfs tree and /dev/uburma character devices", r.fakeUBNode},
		{"1. helm install: device plugin and operator Ready, webhook serving", r.checkInstall},
		{"2. UrmaEndpoint: status reports rendered flags", r.checkEndpoint},
		{"3. two labelled pods: flags, jetties, device node, environment, shm dir made again", r.checkPods},
		{"4. urma-perf between the two pods: URMA vs TCP", r.checkPerf},
		{"5. kubelet restart: plugin re-registers; oversized request stays Pending", r.checkKubeletRestart},
	}
	chaosDevicePlugin, chaosDRA := r.chaosSteps()
	if r.o.chaos {
		steps = append(steps, chaosDevicePlugin...)
	}
	steps = append(steps,
		step{"6. helm uninstall removes what it owns, keeps the CRD", r.checkUninstall},
		step{"7. helm install driver=dra: ResourceSlices match discover, DeviceClass, claim template", r.checkDRAInstall},
		step{"8. two labelled pods with claims: allocated, prepared, CDI environment, shm made again; urma-perf over shm", r.checkDRAPods},
	)
	if r.o.chaos {
		steps = append(steps, chaosDRA...)
	}
	steps = append(steps,
		step{"9. a C program given a software device: liburma injected, URMA over shm to urma-perf vs TCP", r.checkCProgram},
	)
	fmt.Fprintf(r.out, "urma-k8s e2e: a real one-node Kubernetes on this machine\n")
	fmt.Fprintf(r.out, "state in %s, logs in %s\n", r.o.work, r.o.logs)
	for i, s := range steps {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		r.current = s.title
		fmt.Fprintf(r.out, "\n==> [%d/%d] %s\n", i+1, len(steps), s.title)
		start := time.Now()
		r.recovery = 0
		err := s.fn(ctx)
		took := time.Since(start)
		r.timings = append(r.timings, timing{title: s.title, took: took, recovery: r.recovery, err: err})
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return err
		}
		fmt.Fprintf(r.out, "    ok (%s)\n", took.Round(100*time.Millisecond))
	}
	return nil
}

// say prints a detail line of the current step.
func (r *run) say(format string, args ...any) {
	fmt.Fprintf(r.out, "    "+format+"\n", args...)
}

// note records a fact for the summary and prints it.
func (r *run) note(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	r.notes = append(r.notes, s)
	r.say("%s", s)
}

// printSummary prints each step's time and outcome and the recorded facts.
func (r *run) printSummary(total time.Duration) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tTIME\tRECOVERY\tRESULT")
	for _, t := range r.timings {
		res := "ok"
		if t.err != nil {
			res = "FAILED"
		}
		recovery := "-"
		if t.recovery > 0 {
			recovery = t.recovery.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.title, t.took.Round(100*time.Millisecond), recovery, res)
	}
	tw.Flush()
	fmt.Fprintf(r.out, "\n==> summary (%s in all)\n%s", total.Round(time.Second), proc.Indent(b.String(), "    ")+"\n")
	for _, n := range r.notes {
		fmt.Fprintf(r.out, "    - %s\n", n)
	}
	fmt.Fprintf(r.out, "    logs of every component: %s\n", r.o.logs)
}

// start runs a component as a child that teardown stops. Under -keep it
// is detached (proc.StartDetached), so that the cluster outlives this
// process; either way its pid is recorded under -work, where -cleanup (a
// later process) finds it.
func (r *run) start(name, path string, args ...string) (*proc.Child, error) {
	startChild := proc.Start
	if r.o.keep {
		startChild = proc.StartDetached
	}
	c, err := startChild(r.o.logs, name, path, args, nil)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.children[name]; !ok {
		r.order = append(r.order, name)
	}
	r.children[name] = c
	if err := recordPid(r.pidsFile(), name, c.Pid()); err != nil {
		// Teardown still finds it by its command line.
		r.say("warning: %v", err)
	}
	return c, nil
}

// appendLog appends text to a log file of the run; a failure to log is not
// worth failing the run for.
func appendLog(path, text string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(text)
}

// bin is the path of a tool in -bin-dir.
func (r *run) bin(rel string) string { return filepath.Join(r.o.binDir, rel) }
