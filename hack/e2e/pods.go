//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	urmav1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/node/shmdir"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

// perfPort is where urma-perf servers listen in the test pods.
const perfPort = 7000

// Names of the two test pods: each runs an urma-perf server; the client
// runs are exec'd in the second (the image has no shell to keep a pod
// alive otherwise, and a client run inherits the container's environment).
const (
	serverPod = "perf-server"
	clientPod = "perf-client"
)

// perfPod is a pod running urma-perf with args (default: an echo server),
// labelled for endpoint so the webhook mounts its flags and adds its
// jetty request.
func perfPod(name, endpoint string, args []string) *corev1.Pod {
	if args == nil {
		args = []string{"server", "--listen", "0.0.0.0:" + strconv.Itoa(perfPort), "--echo", "--json"}
	}
	grace := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: map[string]string{
			urmav1.LabelEndpoint: endpoint, "app.kubernetes.io/name": "urma-e2e-perf",
		}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "perf",
				Image:           imageName("urma-perf"),
				ImagePullPolicy: corev1.PullNever,
				Args:            args,
				Env: []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"},
				}}},
				Ports: []corev1.ContainerPort{{Name: "perf", ContainerPort: perfPort}},
			}},
		},
	}
}

// quickStartPods are the urma-perf pods of docs/quick-start.md, read from
// examples/quick-start/pods.yaml as a reader applies them, renamed server
// and client, in this run's namespace and on this run's image (never
// pulled). They are labelled for the quick start's endpoint, which must be
// the one this run declares.
func (r *run) quickStartPods(server, client string) ([]*corev1.Pod, error) {
	path := filepath.Join(r.o.root, "examples", "quick-start", "pods.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the quick start's pods: %w", err)
	}
	return parseQuickStartPods(b, server, client)
}

// parseQuickStartPods decodes pods.yaml's perf-server and perf-client as
// server and client (in that order), for this run.
func parseQuickStartPods(manifest []byte, server, client string) ([]*corev1.Pod, error) {
	objs, err := parseManifest(string(manifest))
	if err != nil {
		return nil, fmt.Errorf("examples/quick-start/pods.yaml: %w", err)
	}
	byName := map[string]*corev1.Pod{}
	for _, o := range objs {
		var p corev1.Pod
		if o.GetKind() != "Pod" {
			return nil, fmt.Errorf("examples/quick-start/pods.yaml holds a %s, want only Pods", o.GetKind())
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &p, true); err != nil {
			return nil, fmt.Errorf("examples/quick-start/pods.yaml: pod %s: %w", o.GetName(), err)
		}
		byName[p.Name] = &p
	}
	var out []*corev1.Pod
	for _, n := range []struct{ manifest, as string }{{"perf-server", server}, {"perf-client", client}} {
		p := byName[n.manifest]
		if p == nil {
			return nil, fmt.Errorf("examples/quick-start/pods.yaml has no pod %s", n.manifest)
		}
		if got := p.Labels[urmav1.LabelEndpoint]; got != endpointName {
			return nil, fmt.Errorf("examples/quick-start/pods.yaml: %s is labelled for endpoint %q, this run declares %q", n.manifest, got, endpointName)
		}
		p.Name, p.Namespace = n.as, testNS
		for i := range p.Spec.Containers {
			if !strings.Contains(p.Spec.Containers[i].Image, "/urma-perf:") {
				return nil, fmt.Errorf("examples/quick-start/pods.yaml: %s runs %s, not urma-perf", n.manifest, p.Spec.Containers[i].Image)
			}
			p.Spec.Containers[i].Image = imageName("urma-perf")
			p.Spec.Containers[i].ImagePullPolicy = corev1.PullNever
		}
		out = append(out, p)
	}
	return out, nil
}

func (r *run) checkPods(ctx context.Context) error {
	before, err := r.kubeletJetties(ctx)
	if err != nil {
		return err
	}
	r.say("kubelet (pod-resources): %d %s device IDs allocatable, %d assigned", before.allocatable, nodefacts.ResourceName, before.allocated())
	if err := removeHostShmDir(); err != nil {
		return err
	}
	perfPods, err := r.quickStartPods(serverPod, clientPod)
	if err != nil {
		return err
	}
	for _, p := range perfPods {
		if _, err := r.cs.CoreV1().Pods(testNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s (examples/quick-start/pods.yaml): %w", p.Name, err)
		}
	}
	pods, err := r.waitPodsRunning(ctx, testNS, []string{serverPod, clientPod}, 3*time.Minute)
	if err != nil {
		return err
	}
	var requested int64
	for _, p := range pods {
		n, err := r.checkPodView(ctx, p)
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		requested += n
	}
	r.serverIP = pods[0].Status.PodIP

	after, err := r.kubeletJetties(ctx)
	if err != nil {
		return err
	}
	if int64(after.allocated()-before.allocated()) != requested {
		return fmt.Errorf("kubelet assigned %d more %s device IDs, the two pods requested %d (by pod: %v)",
			after.allocated()-before.allocated(), nodefacts.ResourceName, requested, after.byPod)
	}
	r.assigned = after.allocated()
	free0, free1 := before.allocatable-before.allocated(), after.allocatable-after.allocated()
	node, err := r.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node: %w", err)
	}
	q := node.Status.Allocatable[corev1.ResourceName(nodefacts.ResourceName)]
	r.note("jetty units: node allocatable %d; kubelet assigned %d to the two pods (%v); free went from %d to %d",
		q.Value(), requested, after.byPod, free0, free1)
	return nil
}

// waitPodsRunning waits until every named pod runs with all containers
// ready, and returns them in the order given.
func (r *run) waitPodsRunning(ctx context.Context, ns string, names []string, timeout time.Duration) ([]corev1.Pod, error) {
	out := make([]corev1.Pod, len(names))
	err := r.poll(ctx, timeout, "pods "+strings.Join(names, ", ")+" to run", func(ctx context.Context) (bool, error) {
		for i, n := range names {
			p, err := r.cs.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) {
					return false, fmt.Errorf("pod %s/%s is gone", ns, n)
				}
				return false, nil
			}
			if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
				return false, fmt.Errorf("pod %s/%s ended: %s", ns, n, p.Status.Phase)
			}
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				return false, nil
			}
			for _, cs := range p.Status.ContainerStatuses {
				if !cs.Ready {
					return false, nil
				}
			}
			out[i] = *p
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, r.podsReport(ctx, ns))
	}
	return out, nil
}

// checkPodView checks what the webhook and the device plugin gave a pod,
// from the API (spec) and from inside the running container (its process
// environment and its root filesystem, as the node sees them), and returns
// the pod's jetty request.
func (r *run) checkPodView(ctx context.Context, p corev1.Pod) (int64, error) {
	c := p.Spec.Containers[0]
	req := c.Resources.Requests[corev1.ResourceName(nodefacts.ResourceName)]
	if req.Value() <= 0 {
		return 0, fmt.Errorf("admitted without a %s request (requests %v): the webhook did not add it", nodefacts.ResourceName, c.Resources.Requests)
	}
	flagsFile := ""
	for _, e := range c.Env {
		if e.Name == podenv.FlagsFile {
			flagsFile = e.Value
		}
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == urmav1.FlagsMountPath {
			mounted = true
		}
	}
	if flagsFile == "" || !mounted {
		return 0, fmt.Errorf("admitted without the flags (env %s=%q, mount at %s: %v)", podenv.FlagsFile, flagsFile, urmav1.FlagsMountPath, mounted)
	}
	if len(p.Status.ContainerStatuses) == 0 {
		return 0, fmt.Errorf("no container status")
	}
	pid, err := r.containerPID(ctx, p.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		return 0, err
	}
	env, err := processEnv(pid)
	if err != nil {
		return 0, err
	}
	dev, budget := env["URMA_DEVICE"], env["URMA_JETTY_BUDGET"]
	if dev == "" || budget == "" {
		return 0, fmt.Errorf("the container's environment lacks URMA_DEVICE (%q) or URMA_JETTY_BUDGET (%q)", dev, budget)
	}
	if env[podenv.FlagsFile] != flagsFile {
		return 0, fmt.Errorf("the container's %s is %q, the pod spec says %q", podenv.FlagsFile, env[podenv.FlagsFile], flagsFile)
	}
	st, err := checkDevNode(pid, dev)
	if err != nil {
		return 0, err
	}
	if env[podenv.ShmDir] != shmdir.DefaultDir {
		return 0, fmt.Errorf("the container's %s is %q, want %s (the chart's devicePlugin.shmDir)", podenv.ShmDir, env[podenv.ShmDir], shmdir.DefaultDir)
	}
	if err := checkShmDir(pid); err != nil {
		return 0, err
	}
	flags, err := r.checkFlagsFile(pid, flagsFile)
	if err != nil {
		return 0, err
	}
	r.say("pod %s (%s, pid %d): requests %s=%d; sees %s/%s (char %d:%d), %s (%d bytes, the endpoint's flags)",
		p.Name, p.Status.PodIP, pid, nodefacts.ResourceName, req.Value(), hostDevDir, dev, unix.Major(st.Rdev), unix.Minor(st.Rdev),
		urmaEnv(env), len(flags))
	return req.Value(), nil
}

// removeHostShmDir removes the pods' shm directory from the host, as an
// admin's cleanup would while the driver runs. The chart mounts its parent
// into the driver, so that the driver makes it again, on the host and open
// to every pod user, for the pods created next; checkShmDir then finds it.
func removeHostShmDir() error {
	if err := os.RemoveAll(shmdir.DefaultDir); err != nil {
		return fmt.Errorf("remove the host's shm directory %s: %w", shmdir.DefaultDir, err)
	}
	return nil
}

// checkShmDir checks that the container of pid has the host's shm
// directory, and that the driver made it world-writable and sticky again
// after removeHostShmDir (a directory the runtime made for a missing mount
// source would be root's alone, and pods of other users could not meet).
func checkShmDir(pid int) error {
	if err := checkSameDir(pid, shmdir.DefaultDir); err != nil {
		return err
	}
	fi, err := os.Stat(shmdir.DefaultDir)
	if err != nil {
		return fmt.Errorf("stat the host's %s: %w", shmdir.DefaultDir, err)
	}
	if want := os.ModeDir | os.ModeSticky | 0o777; fi.Mode()&(os.ModeType|os.ModeSticky|os.ModePerm) != want {
		return fmt.Errorf("the host's %s, removed before the pods were created, has mode %v, want %v: the driver did not make it again", shmdir.DefaultDir, fi.Mode(), want)
	}
	return nil
}

// checkDevNode checks that the container of pid sees /dev/uburma/<dev> as
// the host's character device, through its root, and returns what it sees.
func checkDevNode(pid int, dev string) (unix.Stat_t, error) {
	inside := filepath.Join("/proc", strconv.Itoa(pid), "root", hostDevDir, dev)
	var st, host unix.Stat_t
	if err := unix.Stat(inside, &st); err != nil {
		return st, fmt.Errorf("the container has no %s/%s: %w", hostDevDir, dev, err)
	}
	if err := unix.Stat(filepath.Join(hostDevDir, dev), &host); err != nil {
		return st, fmt.Errorf("stat the host's %s/%s: %w", hostDevDir, dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != host.Rdev {
		return st, fmt.Errorf("%s/%s in the container is mode %o rdev %d:%d, the host's is a character device %d:%d", hostDevDir, dev,
			st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), unix.Major(host.Rdev), unix.Minor(host.Rdev))
	}
	return st, nil
}

// checkFlagsFile checks that the container of pid has the endpoint's
// rendered flags at flagsFile, and returns them.
func (r *run) checkFlagsFile(pid int, flagsFile string) ([]byte, error) {
	flags, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "root", flagsFile))
	if err != nil {
		return nil, fmt.Errorf("read %s in the container: %w", flagsFile, err)
	}
	if !bytes.Equal(bytes.TrimSpace(flags), bytes.TrimSpace([]byte(r.flags))) {
		return nil, fmt.Errorf("%s in the container differs from the endpoint's rendered flags", flagsFile)
	}
	return flags, nil
}

// urmaEnv lists a container's URMA_* variables, sorted: what the device
// plugin or the claim's CDI spec (and the webhook) gave it.
func urmaEnv(env map[string]string) string {
	var kv []string
	for k, v := range env {
		if strings.HasPrefix(k, "URMA_") {
			kv = append(kv, k+"="+v)
		}
	}
	sort.Strings(kv)
	return strings.Join(kv, " ")
}

// processEnv reads a process's environment from /proc.
func processEnv(pid int) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return nil, fmt.Errorf("read the environment of pid %d: %w", pid, err)
	}
	env := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			env[k] = v
		}
	}
	return env, nil
}
