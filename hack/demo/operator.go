package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	urmav1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/hack/internal/proc"
	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

// The demo's objects in the control plane.
const (
	demoNamespace = "urma-demo"
	demoEndpoint  = "echo"
	// demoJettyBudget is the jetties each pod of the endpoint requests; the
	// perf processes get it as URMA_JETTY_BUDGET, as the device plugin would
	// set it for a pod allocated that many.
	demoJettyBudget = 32
)

// endpointResult is what the operator made of the demo's UrmaEndpoint.
type endpointResult struct {
	status urmav1.UrmaEndpointStatus
	flags  string
}

// runOperator runs the operator against the control plane, describes a
// small cluster to it (Nodes annotated as the device plugin annotates them)
// and an UrmaEndpoint, and waits for the tuned flags.
func (d *demo) runOperator(ctx context.Context) error {
	probe, err := freeLoopbackAddr()
	if err != nil {
		return fmt.Errorf("pick a port for the operator's health probes: %w", err)
	}
	args := []string{
		"--enable-webhooks=false", // envtest has no webhook plumbing here; the demo creates no pods
		"--leader-elect=false",
		"--metrics-bind-address=0",
		"--health-probe-bind-address", probe,
	}
	// The operator finds the API server the way controller-runtime programs
	// do: KUBECONFIG, as for kubectl.
	env := []string{"KUBECONFIG=" + d.kubeconfig}
	fmt.Fprintf(d.out, "    $ %s %s %s\n", strings.Join(env, " "), binOperator, strings.Join(args, " "))
	op, err := d.start("operator", binOperator, args, env)
	if err != nil {
		return err
	}
	if err := waitHTTPOK(ctx, op, "http://"+probe+"/readyz", 60*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "    operator is ready (log: %s)\n", op.LogPath())

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("build the client scheme: %w", err)
	}
	if err := urmav1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("build the client scheme: %w", err)
	}
	c, err := client.New(d.restConfig, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connect to the control plane: %w", err)
	}

	nodes, err := d.demoNodes()
	if err != nil {
		return err
	}
	objs := []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}}
	for _, n := range nodes {
		objs = append(objs, n)
	}
	ep := demoUrmaEndpoint()
	objs = append(objs, ep)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("create %s %s: %w", kindOf(o), o.GetName(), err)
		}
	}
	for _, n := range nodes {
		fmt.Fprintf(d.out, "    created Node %s: %s\n", n.Name, describeFacts(n.Annotations))
	}
	fmt.Fprintf(d.out, "    created UrmaEndpoint %s/%s: %s\n", ep.Namespace, ep.Name, describeSpec(ep.Spec))

	key := types.NamespacedName{Namespace: demoNamespace, Name: demoEndpoint}
	var last urmav1.UrmaEndpoint
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if op.Exited() {
			return false, fmt.Errorf("the operator exited (%s)%s", op.ExitStatus(), op.LogTail())
		}
		if err := c.Get(ctx, key, &last); err != nil {
			return false, nil // transient; the deadline bounds it
		}
		return endpointReady(&last), nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("UrmaEndpoint %s never became Ready: %w\n    last status:\n%s%s", key, err, proc.Indent(formatStatus(last.Status), "      "), op.LogTail())
	}

	var cm corev1.ConfigMap
	cmName := last.Status.ConfigMapName
	if cmName == "" {
		cmName = urmav1.ConfigMapName(demoEndpoint)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: demoNamespace, Name: cmName}, &cm); err != nil {
		return fmt.Errorf("read the rendered ConfigMap %s: %w", cmName, err)
	}
	flagsText, ok := cm.Data[urmav1.ConfigMapKeyFlags]
	if !ok || strings.TrimSpace(flagsText) == "" {
		return fmt.Errorf("ConfigMap %s has no %s", cmName, urmav1.ConfigMapKeyFlags)
	}
	d.endpoint = endpointResult{status: last.Status, flags: flagsText}
	d.flagsFile = filepath.Join(d.tmp, "urma.flags")
	if err := os.WriteFile(d.flagsFile, []byte(flagsText), 0o644); err != nil {
		return fmt.Errorf("save the rendered flags: %w", err)
	}

	fmt.Fprintf(d.out, "\n    UrmaEndpoint %s status:\n%s", key, proc.Indent(formatStatus(last.Status), "      ")+"\n")
	fmt.Fprintf(d.out, "\n    rendered flags (ConfigMap %s, key %s; saved to %s):\n%s\n", cmName, urmav1.ConfigMapKeyFlags, d.flagsFile, proc.Indent(flagsText, "      "))
	return nil
}

// endpointReady reports whether the status describes the current spec and
// says Ready.
func endpointReady(ep *urmav1.UrmaEndpoint) bool {
	if ep.Status.ObservedGeneration != ep.Generation {
		return false
	}
	return meta.IsStatusConditionTrue(ep.Status.Conditions, urmav1.ConditionReady)
}

// demoUrmaEndpoint is a request/response workload of 4 KiB messages.
func demoUrmaEndpoint() *urmav1.UrmaEndpoint {
	maxMsg := resource.MustParse("64Ki")
	mem := resource.MustParse("64Mi")
	return &urmav1.UrmaEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: demoEndpoint},
		Spec: urmav1.UrmaEndpointSpec{
			JettyBudget: demoJettyBudget,
			Profile: urmav1.TrafficProfile{
				MessageSize:           resource.MustParse("4Ki"),
				MaxMessageSize:        &maxMsg,
				ConnectionsPerPod:     4,
				InflightPerConnection: 64,
				Objective:             urmav1.ObjectiveThroughput,
				MemoryBudget:          &mem,
			},
		},
	}
}

// demoNodes are the Nodes of the pretend cluster, labelled and annotated as
// the device plugin labels and annotates them (package nodefacts).
func (d *demo) demoNodes() ([]*corev1.Node, error) {
	facts, err := factsFromDiscovery(d.node.devices)
	if err != nil {
		return nil, err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        "ub-node-1",
		Labels:      facts.Labels(),
		Annotations: facts.Annotations(),
	}}
	return []*corev1.Node{node}, nil
}

// factsFromDiscovery derives the facts the device plugin publishes for the
// discovered devices (as nodelabel.FactsFor does for its inventory): the
// number of advertised devices and the smallest of each limit among them,
// since a pod may land on any.
func factsFromDiscovery(devs []discoveredDevice) (nodefacts.Facts, error) {
	var f nodefacts.Facts
	for _, dv := range devs {
		if !dv.Advertised {
			continue
		}
		c := dv.Caps
		perUnit := budget.Default().JettiesPerUnit
		if dv.Budget.Units > 0 {
			perUnit = dv.Budget.Jetties / dv.Budget.Units
		}
		if f.DeviceCount == 0 {
			f = nodefacts.Facts{
				MaxJFSDepth: c.MaxJFSDepth, MaxJFRDepth: c.MaxJFRDepth, MaxJFCDepth: c.MaxJFCDepth,
				MaxMsgSize: c.MaxMsgSize, JettiesPerDevice: dv.Budget.Jetties, JettiesPerUnit: perUnit,
			}
		} else {
			f.MaxJFSDepth = min(f.MaxJFSDepth, c.MaxJFSDepth)
			f.MaxJFRDepth = min(f.MaxJFRDepth, c.MaxJFRDepth)
			f.MaxJFCDepth = min(f.MaxJFCDepth, c.MaxJFCDepth)
			f.MaxMsgSize = min(f.MaxMsgSize, c.MaxMsgSize)
			f.JettiesPerDevice = min(f.JettiesPerDevice, dv.Budget.Jetties)
		}
		f.DeviceCount++
	}
	if f.DeviceCount == 0 {
		return f, errors.New("the device plugin advertises no device on the fake node")
	}
	if err := f.Validate(); err != nil {
		return f, fmt.Errorf("node facts from the discovered devices: %w", err)
	}
	return f, nil
}

// describeFacts summarises a Node's URMA annotations.
func describeFacts(ann map[string]string) string {
	f, err := nodefacts.Parse(ann)
	if err != nil {
		return err.Error()
	}
	kind := "UB"
	if f.Software {
		kind = "software"
	}
	return fmt.Sprintf("%d %s device(s), max depth jfs/jfr/jfc %d/%d/%d, max message %s, %d jetties per device",
		f.DeviceCount, kind, f.MaxJFSDepth, f.MaxJFRDepth, f.MaxJFCDepth, formatBytes(float64(f.MaxMsgSize)), f.JettiesPerDevice)
}

// describeSpec summarises an UrmaEndpoint's spec.
func describeSpec(s urmav1.UrmaEndpointSpec) string {
	p := s.Profile
	out := fmt.Sprintf("objective %s, messages %s", p.Objective, p.MessageSize.String())
	if p.MaxMessageSize != nil {
		out += " (max " + p.MaxMessageSize.String() + ")"
	}
	out += fmt.Sprintf(", %d conns x %d in flight, jetty budget %d", p.ConnectionsPerPod, p.InflightPerConnection, s.JettyBudget)
	if p.MemoryBudget != nil {
		out += ", memory budget " + p.MemoryBudget.String()
	}
	return out
}

// kindOf names an object's Go type for messages ("Node", "UrmaEndpoint").
func kindOf(o client.Object) string {
	t := fmt.Sprintf("%T", o)
	return t[strings.LastIndex(t, ".")+1:]
}

// freeLoopbackAddr returns a loopback address with a port that was free a
// moment ago; for children that cannot report the port they bound.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", err
	}
	return addr, nil
}

// waitHTTPOK polls url until it answers 200, the child exits, or timeout.
func waitHTTPOK(ctx context.Context, c *proc.Child, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: time.Second}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if c.Exited() {
			return false, fmt.Errorf("%s exited (%s)%s", c.Name(), c.ExitStatus(), c.LogTail())
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if err != nil && !c.Exited() {
		return fmt.Errorf("%s did not answer %s within %s: %w%s", c.Name(), url, timeout, err, c.LogTail())
	}
	return err
}
