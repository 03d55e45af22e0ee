//go:build linux

package main

// The chaos steps: the product's own parts fail under running workloads.
// Each step runs while an urma-perf stream (a pod of its own, labelled for
// the endpoint, dialling the step's perf server again every few seconds)
// keeps traffic going, breaks one part, waits for the cluster to recover
// and checks what must hold, then checks the stream: it kept answering,
// its errors did not grow, and no connection made during the step fell
// back to TCP. Each records its recovery time for the summary.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

// Streams of the chaos steps, one per driver: each dials the server pod of
// its driver's steps (3 and 8).
const (
	streamPod    = "perf-stream"
	draStreamPod = "dra-perf-stream"
	// streamRedial makes the stream dial each connection again this often,
	// so that connections are made throughout every step.
	streamRedial      = 3 * time.Second
	streamConcurrency = 2
)

// chaosSteps are the steps with the device plugin (after step 5) and with
// the DRA driver (after step 8).
func (r *run) chaosSteps() (devicePlugin, dra []step) {
	devicePlugin = []step{
		{"chaos 1. device plugin pod deleted: re-registers, capacity back, running pods keep their units, a new pod is admitted", r.chaosDevicePluginPod},
		{"chaos 4. operator pod deleted while labelled pods are created: failurePolicy holds, a Deployment's pods admitted once it is back, ConfigMap untouched", r.chaosOperatorPod},
		{"chaos 5. two operator replicas: the leader deleted, no admission and no reconcile lost", r.chaosOperatorLeader},
		{"chaos: the device plugin's stream over the chaos steps", r.stopStreamStep(streamPod)},
	}
	dra = []step{
		{"chaos 2. DRA driver pod deleted with claims prepared: same ResourceSlices, claims stay prepared, a new claim is prepared", r.chaosDRADriverPod},
		{"chaos 3. DRA checkpoint corrupted, driver restarted: moved aside, rebuilt, a new claim is prepared", r.chaosDRACheckpoint},
		{"chaos 6. containerd restarted under running pods: they keep running, the driver keeps serving", r.chaosContainerd},
		{"chaos: the DRA driver's stream over the chaos steps", r.stopStreamStep(draStreamPod)},
	}
	return devicePlugin, dra
}

// recovered records how long the step's recovery took, for the summary.
func (r *run) recovered(d time.Duration) { r.recovery = d }

// ---- the workload's stream

// streamServer is the perf server a stream dials: step 3's with the device
// plugin, step 8's with the DRA driver.
func streamServer(stream string) string {
	if stream == draStreamPod {
		return draServerPod
	}
	return serverPod
}

// ensureStream starts the stream pod unless it runs, and waits until it
// reports answered requests on URMA.
func (r *run) ensureStream(ctx context.Context, name string) (perfjson.StreamReport, error) {
	if _, err := r.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		server, err := r.cs.CoreV1().Pods(testNS).Get(ctx, streamServer(name), metav1.GetOptions{})
		if err != nil {
			return perfjson.StreamReport{}, fmt.Errorf("the stream's server pod %s: %w", streamServer(name), err)
		}
		addr := net.JoinHostPort(server.Status.PodIP, strconv.Itoa(perfPort))
		args := []string{"stream", "--server", addr, "--concurrency", strconv.Itoa(streamConcurrency),
			"--interval", "1s", "--redial", streamRedial.String(), "--json"}
		if _, err := r.cs.CoreV1().Pods(testNS).Create(ctx, perfPod(name, endpointName, args), metav1.CreateOptions{}); err != nil {
			return perfjson.StreamReport{}, fmt.Errorf("create pod %s: %w", name, err)
		}
		if _, err := r.waitPodsRunning(ctx, testNS, []string{name}, 3*time.Minute); err != nil {
			return perfjson.StreamReport{}, err
		}
		r.say("pod %s streams to %s: urma-perf %s", name, addr, strings.Join(args, " "))
	} else if err != nil {
		return perfjson.StreamReport{}, fmt.Errorf("get pod %s: %w", name, err)
	}
	var line perfjson.StreamReport
	err := r.poll(ctx, 2*time.Minute, "pod "+name+" to stream on URMA", func(ctx context.Context) (bool, error) {
		l, err := r.streamLine(ctx, name)
		if err != nil {
			return false, nil
		}
		line = l
		return l.Requests > 0 && l.Open == l.Concurrency && l.URMADials > 0, nil
	})
	if err != nil {
		return line, fmt.Errorf("%w (last line %+v)", err, line)
	}
	if line.Errors != 0 || line.TCPDials != 0 {
		return line, fmt.Errorf("pod %s: the stream met %d errors (last %q) and %d fallbacks (last %q) before any step", name, line.Errors, line.LastError, line.TCPDials, line.LastFallbackReason)
	}
	return line, nil
}

// streamLine is the newest line the stream pod printed.
func (r *run) streamLine(ctx context.Context, name string) (perfjson.StreamReport, error) {
	tail := int64(5)
	b, err := r.cs.CoreV1().Pods(testNS).GetLogs(name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
	if err != nil {
		return perfjson.StreamReport{}, fmt.Errorf("logs of pod %s: %w", name, err)
	}
	return lastStreamLine(string(b))
}

// lastStreamLine finds the last line of a stream's output that is a report
// (kubelet's log may end in a partial line).
func lastStreamLine(out string) (perfjson.StreamReport, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var l perfjson.StreamReport
		if json.Unmarshal([]byte(lines[i]), &l) == nil && l.Time != "" {
			return l, nil
		}
	}
	return perfjson.StreamReport{}, fmt.Errorf("no stream report in %q", out)
}

// streamAfter waits until the stream has made a connection after the
// step recovered (its dials grew past since's) and answered requests on
// it, and returns that line.
func (r *run) streamAfter(ctx context.Context, name string, since perfjson.StreamReport) (perfjson.StreamReport, error) {
	var line perfjson.StreamReport
	err := r.poll(ctx, time.Minute, "pod "+name+" to connect again and stream", func(ctx context.Context) (bool, error) {
		l, err := r.streamLine(ctx, name)
		if err != nil {
			return false, nil
		}
		line = l
		return l.Dials > since.Dials && l.IntervalRequests > 0 && l.Open == l.Concurrency, nil
	})
	if err != nil {
		return line, fmt.Errorf("%w (last line %+v)", err, line)
	}
	return line, nil
}

// checkStream compares the stream's lines from before a step and after
// its recovery: requests went on, nothing failed, nothing fell back.
func checkStream(name string, before, after perfjson.StreamReport) error {
	var bad []string
	if after.Requests <= before.Requests {
		bad = append(bad, fmt.Sprintf("no request answered (%d before, %d after)", before.Requests, after.Requests))
	}
	if n := after.Errors - before.Errors; n > 0 {
		bad = append(bad, fmt.Sprintf("%d errors (the last: %s) and %d reconnects", n, after.LastError, after.Reconnects-before.Reconnects))
	}
	if n := after.TCPDials - before.TCPDials; n > 0 {
		bad = append(bad, fmt.Sprintf("%d connections fell back to TCP (the last: %s)", n, after.LastFallbackReason))
	}
	if len(bad) > 0 {
		return fmt.Errorf("the workload's stream (pod %s) during the step: %s", name, strings.Join(bad, "; "))
	}
	return nil
}

// streamSummary says what the stream did between two lines.
func streamSummary(before, after perfjson.StreamReport) string {
	return fmt.Sprintf("stream: +%d requests, +%d connections made (all on URMA, fabric %s), no error",
		after.Requests-before.Requests, after.Dials-before.Dials, after.Fabric)
}

// withStream runs a step's disruption between two readings of the stream
// and checks it.
func (r *run) withStream(ctx context.Context, name string, step func(ctx context.Context) error) error {
	before, err := r.ensureStream(ctx, name)
	if err != nil {
		return err
	}
	if err := step(ctx); err != nil {
		return err
	}
	after, err := r.streamAfter(ctx, name, before)
	if err != nil {
		return err
	}
	if err := checkStream(name, before, after); err != nil {
		return err
	}
	r.say("%s", streamSummary(before, after))
	return nil
}

// stopStreamStep deletes a stream's pod and notes what it did in all.
func (r *run) stopStreamStep(name string) func(context.Context) error {
	return func(ctx context.Context) error {
		last, err := r.streamLine(ctx, name)
		if err != nil {
			return err
		}
		if last.Errors != 0 || last.TCPDials != 0 {
			return fmt.Errorf("pod %s: %d errors (last %q), %d fallbacks (last %q)", name, last.Errors, last.LastError, last.TCPDials, last.LastFallbackReason)
		}
		r.note("%s over the chaos steps: %d requests in %.0fs, %d connections made, all on URMA (fabric %s), no error, no reconnect",
			name, last.Requests, last.ElapsedSeconds, last.Dials, last.Fabric)
		return r.deletePodsAndWait(ctx, name)
	}
}

// deletePodsAndWait deletes pods of testNS and waits until they are gone
// (their units or claims released).
func (r *run) deletePodsAndWait(ctx context.Context, names ...string) error {
	for _, n := range names {
		if err := r.cs.CoreV1().Pods(testNS).Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", n, err)
		}
	}
	return r.poll(ctx, 2*time.Minute, "pods "+strings.Join(names, ", ")+" to be gone", func(ctx context.Context) (bool, error) {
		for _, n := range names {
			if _, err := r.cs.CoreV1().Pods(testNS).Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
}

// ---- the release's pods

// componentPods lists the release's pods of a chart component
// (device-plugin, dra-driver, operator).
func (r *run) componentPods(ctx context.Context, component string) ([]corev1.Pod, error) {
	l, err := r.cs.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
	if err != nil {
		return nil, fmt.Errorf("list %s pods: %w", component, err)
	}
	return l.Items, nil
}

// onlyPod is the one running pod of a component.
func (r *run) onlyPod(ctx context.Context, component string) (corev1.Pod, error) {
	pods, err := r.componentPods(ctx, component)
	if err != nil {
		return corev1.Pod{}, err
	}
	if len(pods) != 1 {
		return corev1.Pod{}, fmt.Errorf("%d %s pods, want 1:\n%s", len(pods), component, r.podsReport(ctx, releaseNS))
	}
	return pods[0], nil
}

// podReady reports whether a pod runs with every container ready.
func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitReplaced waits until the component has want ready pods, none of them
// one of old, and returns them.
func (r *run) waitReplaced(ctx context.Context, component string, old []types.UID, want int) ([]corev1.Pod, error) {
	var ready []corev1.Pod
	err := r.poll(ctx, 3*time.Minute, fmt.Sprintf("%d new ready %s pod(s)", want, component), func(ctx context.Context) (bool, error) {
		pods, err := r.componentPods(ctx, component)
		if err != nil {
			return false, nil
		}
		ready = ready[:0]
		for i := range pods {
			if podReady(&pods[i]) && !slices.Contains(old, pods[i].UID) {
				ready = append(ready, pods[i])
			}
		}
		return len(ready) >= want, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, r.podsReport(ctx, releaseNS))
	}
	return ready, nil
}

// newLabelledPod creates a pod labelled for the endpoint and waits until it
// runs: what the webhook and the driver of the moment give a new workload.
func (r *run) newLabelledPod(ctx context.Context, name string) (corev1.Pod, error) {
	if _, err := r.cs.CoreV1().Pods(testNS).Create(ctx, perfPod(name, endpointName, nil), metav1.CreateOptions{}); err != nil {
		return corev1.Pod{}, fmt.Errorf("create pod %s: %w", name, err)
	}
	pods, err := r.waitPodsRunning(ctx, testNS, []string{name}, 3*time.Minute)
	if err != nil {
		return corev1.Pod{}, err
	}
	return pods[0], nil
}

// ---- chaos 1: the device plugin's pod

func (r *run) chaosDevicePluginPod(ctx context.Context) error {
	return r.withStream(ctx, streamPod, func(ctx context.Context) error {
		before, err := r.kubeletJetties(ctx)
		if err != nil {
			return err
		}
		kubelet := r.currentKubelet()
		if kubelet == "" {
			return errors.New("kubelet is not running")
		}
		registrations := countLines(r.childLog(kubelet), registrationLine)
		old, err := r.onlyPod(ctx, "device-plugin")
		if err != nil {
			return err
		}
		start := time.Now()
		if err := r.cs.CoreV1().Pods(releaseNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete the device plugin's pod %s: %w", old.Name, err)
		}
		r.say("deleted the device plugin's pod %s; the DaemonSet makes another", old.Name)
		if _, err := r.waitReplaced(ctx, "device-plugin", []types.UID{old.UID}, 1); err != nil {
			return err
		}
		// Registered again with kubelet, which gives the node its
		// capacity back and still accounts the running pods' units.
		var last jettyDevices
		err = r.poll(ctx, 2*time.Minute, "the new device plugin to register and the node's capacity to come back", func(ctx context.Context) (bool, error) {
			if countLines(r.childLog(kubelet), registrationLine) <= registrations {
				return false, nil
			}
			j, err := r.kubeletJetties(ctx)
			if err != nil {
				return false, nil
			}
			last = j
			n, err := r.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			q := n.Status.Allocatable[corev1.ResourceName(nodefacts.ResourceName)]
			return int64(j.allocatable) == r.expectedUnits && q.Value() == r.expectedUnits, nil
		})
		if err != nil {
			return fmt.Errorf("%w (kubelet lists %d allocatable device IDs, want %d)", err, last.allocatable, r.expectedUnits)
		}
		r.recovered(time.Since(start))
		for pod, units := range before.byPod {
			if last.byPod[pod] != units {
				return fmt.Errorf("pod %s had %d units before the device plugin's pod was deleted, kubelet now says %d (all: %v)", pod, units, last.byPod[pod], last.byPod)
			}
		}
		p, err := r.newLabelledPod(ctx, "chaos-dp-new")
		if err != nil {
			return err
		}
		after, err := r.kubeletJetties(ctx)
		if err != nil {
			return err
		}
		got := after.byPod[testNS+"/"+p.Name]
		if got == 0 {
			return fmt.Errorf("the new pod %s runs without units (kubelet: %v)", p.Name, after.byPod)
		}
		r.note("chaos 1: device plugin re-registered and node allocatable back at %d after %s; running pods kept their units %v; new pod %s got %d units",
			r.expectedUnits, r.recovery.Round(100*time.Millisecond), before.byPod, p.Name, got)
		return r.deletePodsAndWait(ctx, p.Name)
	})
}

// registrationLine is what kubelet logs when a device plugin of the jetty
// resource registers.
const registrationLine = `"Got registration request from device plugin with resource" resourceName="` + nodefacts.ResourceName + `"`

// currentKubelet is the name of the kubelet child running now ("kubelet",
// or "kubelet-restarted" after step 5), "" if none.
func (r *run) currentKubelet() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.order) - 1; i >= 0; i-- {
		name := r.order[i]
		if c := r.children[name]; strings.HasPrefix(name, "kubelet") && c != nil && !c.Exited() {
			return name
		}
	}
	return ""
}

// childLog is the log file of a child the run started.
func (r *run) childLog(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.children[name]; c != nil {
		return c.LogPath()
	}
	return ""
}

// countLines counts the lines of a log file that hold every one of subs.
func countLines(path string, subs ...string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(line, s) }) {
			n++
		}
	}
	return n
}
