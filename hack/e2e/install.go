//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	urmav1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/hack/internal/proc"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

// helm runs bin/helm against the cluster; its output goes to helm.log too.
func (r *run) helm(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"--kubeconfig", r.adminKubeconfig}, args...)
	cmd := exec.CommandContext(ctx, r.bin("helm"), full...)
	out, err := cmd.CombinedOutput()
	appendLog(filepath.Join(r.o.logs, "helm.log"), "$ helm "+strings.Join(full, " ")+"\n"+string(out))
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", args[0], err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// kubectl runs bin/k8s/kubectl against the cluster and returns its
// stdout and stderr apart.
func (r *run) kubectl(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	full := append([]string{"--kubeconfig", r.adminKubeconfig}, args...)
	cmd := exec.CommandContext(ctx, r.bin("k8s/kubectl"), full...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		return o.String(), e.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(e.String()))
	}
	return o.String(), e.String(), nil
}

// ctrlClient is a controller-runtime client that knows the project's API.
func (r *run) ctrlClient() (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("build the client scheme: %w", err)
	}
	if err := urmav1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("build the client scheme: %w", err)
	}
	c, err := client.New(r.rest, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("client for the API server: %w", err)
	}
	return c, nil
}

// chartImageSets are the chart values that point the operator at the
// imported image; every install of the run uses them.
func chartImageSets() []string {
	return []string{
		"operator.image.repository=" + imageRepo + "urma-operator",
		"operator.image.tag=" + imageTag,
		"operator.image.pullPolicy=Never",
	}
}

// helmInstall installs the chart with sets and waits until every DaemonSet
// and Deployment of the release's namespace is Ready.
func (r *run) helmInstall(ctx context.Context, sets []string) error {
	chart := filepath.Join(r.o.root, "charts", "urma-k8s")
	args := []string{"install", releaseName, chart, "--namespace", releaseNS, "--create-namespace"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	r.say("$ helm install %s charts/urma-k8s -n %s --create-namespace \\\n        --set %s", releaseName, releaseNS, strings.Join(sets, " \\\n        --set "))
	if _, err := r.helm(ctx, args...); err != nil {
		return err
	}
	start := time.Now()
	err := r.poll(ctx, 5*time.Minute, "the release's DaemonSet and Deployment to be Ready", func(ctx context.Context) (bool, error) {
		dss, err := r.cs.AppsV1().DaemonSets(releaseNS).List(ctx, metav1.ListOptions{})
		if err != nil || len(dss.Items) == 0 {
			return false, nil
		}
		deps, err := r.cs.AppsV1().Deployments(releaseNS).List(ctx, metav1.ListOptions{})
		if err != nil || len(deps.Items) == 0 {
			return false, nil
		}
		for _, ds := range dss.Items {
			if ds.Status.DesiredNumberScheduled == 0 || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
				return false, nil
			}
		}
		for _, d := range deps.Items {
			if d.Status.ReadyReplicas == 0 || d.Status.ReadyReplicas != d.Status.Replicas {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w\n%s", err, r.podsReport(ctx, releaseNS))
	}
	r.say("DaemonSet and Deployment Ready after %s:\n%s", time.Since(start).Round(100*time.Millisecond), proc.Indent(r.podsReport(ctx, releaseNS), "      "))
	return nil
}

func (r *run) checkInstall(ctx context.Context) error {
	sets := append([]string{
		"devicePlugin.image.repository=" + imageRepo + "urma-device-plugin",
		"devicePlugin.image.tag=" + imageTag,
		"devicePlugin.image.pullPolicy=Never",
	}, chartImageSets()...)
	// The fake UB node's sysfs tree; /dev stays the host's, where its
	// device nodes are. (kubeletSocketDir keeps its default: kubelet
	// serves device plugins in /var/lib/kubelet/device-plugins whatever
	// its --root-dir.)
	sets = append(sets, "devicePlugin.hostSysfs="+r.paths.sysfs)
	if err := r.helmInstall(ctx, sets); err != nil {
		return err
	}

	// The webhook serves when the API server gets its answer: a dry-run pod
	// naming an UrmaEndpoint that does not exist is let through with the
	// webhook's own warning. (failurePolicy Fail: an unreachable webhook
	// would refuse it.)
	var warning string
	err := r.poll(ctx, 2*time.Minute, "the pod webhook to answer", func(ctx context.Context) (bool, error) {
		w, err := r.dryRunLabelledPod(ctx, "no-such-endpoint")
		if err != nil {
			return false, nil
		}
		warning = w
		return strings.Contains(w, "does not exist"), nil
	})
	if err != nil {
		_, last := r.dryRunLabelledPod(ctx, "no-such-endpoint")
		return fmt.Errorf("%w (last answer: %w)", err, last)
	}
	r.say("webhook answered a dry-run pod: warning %q", warning)

	// The device plugin registered with the real kubelet.
	var got resource.Quantity
	err = r.poll(ctx, 2*time.Minute, "node "+nodeName+" to show "+nodefacts.ResourceName, func(ctx context.Context) (bool, error) {
		n, err := r.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = n.Status.Allocatable[corev1.ResourceName(nodefacts.ResourceName)]
		return got.Value() == r.expectedUnits, nil
	})
	if err != nil {
		return fmt.Errorf("%w: allocatable %s = %s, want %d (what discover reported)", err, nodefacts.ResourceName, got.String(), r.expectedUnits)
	}
	r.note("node %s: %s capacity %d (registered by the device plugin with the real kubelet)", nodeName, nodefacts.ResourceName, got.Value())
	return nil
}

// dryRunLabelledPod creates (server-side dry run) a pod labelled for
// endpoint and returns the warnings the API server relayed.
func (r *run) dryRunLabelledPod(ctx context.Context, endpoint string) (string, error) {
	cfg := rest.CopyConfig(r.rest)
	var mu sync.Mutex
	var warnings []string
	cfg.WarningHandler = warningFunc(func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		warnings = append(warnings, msg)
	})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	pod := perfPod("webhook-probe", endpoint, nil)
	pod.Namespace = "default"
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		return "", err
	}
	mu.Lock()
	defer mu.Unlock()
	return strings.Join(warnings, "; "), nil
}

type warningFunc func(string)

func (f warningFunc) HandleWarningHeader(code int, _ string, msg string) {
	if code == 299 {
		f(msg)
	}
}

// podsReport lists a namespace's pods with their phase and readiness.
func (r *run) podsReport(ctx context.Context, ns string) string {
	pods, err := r.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "(cannot list pods: " + err.Error() + ")"
	}
	if len(pods.Items) == 0 {
		return "(no pods in " + ns + ")"
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s/%s: %s", ns, p.Name, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, ", %s ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting: %s %s", w.Reason, w.Message)
			}
			if t := cs.LastTerminationState.Terminated; t != nil {
				fmt.Fprintf(&b, " last exit %d %s", t.ExitCode, t.Reason)
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				fmt.Fprintf(&b, "; %s: %s", c.Type, c.Message)
			}
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func (r *run) checkEndpoint(ctx context.Context) error {
	c, err := r.ctrlClient()
	if err != nil {
		return err
	}
	if _, err := r.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", testNS, err)
	}
	maxMsg := resource.MustParse("64Ki")
	mem := resource.MustParse("64Mi")
	ep := &urmav1.UrmaEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: endpointName},
		Spec: urmav1.UrmaEndpointSpec{
			JettyBudget: 32,
			Profile: urmav1.TrafficProfile{
				MessageSize: resource.MustParse("4Ki"), MaxMessageSize: &maxMsg,
				ConnectionsPerPod: 4, InflightPerConnection: 64,
				Objective: urmav1.ObjectiveThroughput, MemoryBudget: &mem,
			},
		},
	}
	if err := c.Create(ctx, ep); err != nil {
		return fmt.Errorf("create UrmaEndpoint %s/%s: %w", testNS, endpointName, err)
	}
	r.say("created UrmaEndpoint %s/%s: jettyBudget 32, Throughput, 4 KiB messages, 4 connections per pod", testNS, endpointName)
	var last urmav1.UrmaEndpoint
	err = r.poll(ctx, 2*time.Minute, "UrmaEndpoint to report rendered flags", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(ep), &last); err != nil {
			return false, nil
		}
		return last.Status.ObservedGeneration == last.Generation &&
			meta.IsStatusConditionTrue(last.Status.Conditions, urmav1.ConditionReady) &&
			last.Status.ConfigMapName != "" && last.Status.FlagsHash != "", nil
	})
	if err != nil {
		return fmt.Errorf("%w; last status: %+v", err, last.Status)
	}
	cm, err := r.cs.CoreV1().ConfigMaps(testNS).Get(ctx, last.Status.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read ConfigMap %s: %w", last.Status.ConfigMapName, err)
	}
	flags := cm.Data[urmav1.ConfigMapKeyFlags]
	if strings.TrimSpace(flags) == "" {
		return fmt.Errorf("ConfigMap %s has no %s", cm.Name, urmav1.ConfigMapKeyFlags)
	}
	r.flags = flags
	for _, cond := range last.Status.Conditions {
		r.say("condition %s=%s (%s) %s", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	r.note("UrmaEndpoint %s: flags rendered into ConfigMap %s (hash %s, %d flags)", endpointName, cm.Name, last.Status.FlagsHash, len(strings.Fields(flags)))
	r.say("flags:\n%s", proc.Indent(flags, "      "))
	return nil
}
