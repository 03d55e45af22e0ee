//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openeuler/urma-k8s/internal/dra/checkpoint"
	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

// draCheckpoint is the DRA driver's checkpoint on the node: its plugin data
// directory is under the chart's draDriver.kubeletPluginsDir (step 7).
func (r *run) draCheckpoint() string {
	return filepath.Join(r.paths.kubelet, "plugins", slicefacts.DriverName, checkpoint.FileName)
}

// podClaimUIDs are the UIDs of the ResourceClaims of pods of testNS.
func (r *run) podClaimUIDs(ctx context.Context, pods ...string) ([]string, error) {
	var uids []string
	for _, name := range pods {
		p, err := r.cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("get pod %s: %w", name, err)
		}
		if len(p.Status.ResourceClaimStatuses) == 0 {
			return nil, fmt.Errorf("pod %s has no ResourceClaim", name)
		}
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.ResourceClaimName == nil {
				continue
			}
			c, err := r.cs.ResourceV1().ResourceClaims(testNS).Get(ctx, *s.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("get ResourceClaim %s of pod %s: %w", *s.ResourceClaimName, name, err)
			}
			uids = append(uids, string(c.UID))
		}
	}
	slices.Sort(uids)
	return uids, nil
}

// preparedOnNode says which of uids the driver has not prepared on the node:
// not in its checkpoint, or without a CDI spec.
func (r *run) preparedOnNode(uids []string) error {
	saved, err := checkpoint.Load(r.draCheckpoint())
	if err != nil {
		return err
	}
	w, err := claimspec.New(claimspec.Config{Dir: r.paths.cdi, Kind: claimspec.DefaultKind})
	if err != nil {
		return err
	}
	var missing []string
	for _, uid := range uids {
		if _, ok := saved[uid]; !ok {
			missing = append(missing, uid+" (not in the checkpoint)")
		}
		if !w.Exists(uid) {
			missing = append(missing, uid+" (no CDI spec)")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("claims of running pods not prepared: %s", strings.Join(missing, ", "))
	}
	return nil
}

// nodeSlices are the driver's ResourceSlices of the node, by name.
func (r *run) nodeSlices(ctx context.Context) (map[string]resourcev1.ResourceSlice, error) {
	l, err := r.cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + nodeName})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	out := map[string]resourcev1.ResourceSlice{}
	for _, s := range l.Items {
		if s.Spec.Driver == slicefacts.DriverName {
			out[s.Name] = s
		}
	}
	return out, nil
}

// sameSlices says how two sets of slices differ: names, and the devices
// each publishes.
func sameSlices(before, after map[string]resourcev1.ResourceSlice) error {
	var diffs []string
	for name, b := range before {
		a, ok := after[name]
		switch {
		case !ok:
			diffs = append(diffs, "slice "+name+" is gone")
		case !equality.Semantic.DeepEqual(a.Spec.Devices, b.Spec.Devices):
			diffs = append(diffs, "slice "+name+" publishes other devices")
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			diffs = append(diffs, "slice "+name+" is new")
		}
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		return errors.New(strings.Join(diffs, "; "))
	}
	return nil
}

func sliceNames(s map[string]resourcev1.ResourceSlice) []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// newClaimPod runs a new labelled pod, checks that the driver prepared its
// claim, and deletes it again.
func (r *run) newClaimPod(ctx context.Context, name string) error {
	if _, err := r.newLabelledPod(ctx, name); err != nil {
		return err
	}
	uids, err := r.podClaimUIDs(ctx, name)
	if err != nil {
		return err
	}
	if err := r.preparedOnNode(uids); err != nil {
		return fmt.Errorf("the new pod %s: %w", name, err)
	}
	return r.deletePodsAndWait(ctx, name)
}

// draRegistered are what kubelet logs when the DRA driver has registered
// and kubelet has connected to it.
var draRegistered = []string{`"Connection changed"`, `driverName="` + slicefacts.DriverName + `"`, "connected=true"}

// restartDRADriver deletes the driver's pod and waits for the DaemonSet's
// next one to be ready and registered with kubelet. The pod is ready a
// moment before kubelet has connected to it, and a pod whose claims
// kubelet meets meanwhile fails ("DRA driver ... is not registered") and
// waits for its next sync, about a minute later: that is kubelet's retry,
// not the driver's recovery.
func (r *run) restartDRADriver(ctx context.Context) (corev1.Pod, error) {
	old, err := r.onlyPod(ctx, "dra-driver")
	if err != nil {
		return corev1.Pod{}, err
	}
	kubeletLog := r.childLog(r.currentKubelet())
	registrations := countLines(kubeletLog, draRegistered...)
	if err := r.cs.CoreV1().Pods(releaseNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		return corev1.Pod{}, fmt.Errorf("delete the DRA driver's pod %s: %w", old.Name, err)
	}
	r.say("deleted the DRA driver's pod %s; the DaemonSet makes another", old.Name)
	pods, err := r.waitReplaced(ctx, "dra-driver", []types.UID{old.UID}, 1)
	if err != nil {
		return corev1.Pod{}, err
	}
	err = r.poll(ctx, 2*time.Minute, "kubelet to connect to the new DRA driver", func(context.Context) (bool, error) {
		return countLines(kubeletLog, draRegistered...) > registrations, nil
	})
	if err != nil {
		return corev1.Pod{}, err
	}
	return pods[0], nil
}

// ---- chaos 2: the DRA driver's pod

func (r *run) chaosDRADriverPod(ctx context.Context) error {
	return r.withStream(ctx, draStreamPod, func(ctx context.Context) error {
		uids, err := r.podClaimUIDs(ctx, draServerPod, draClientPod, draStreamPod)
		if err != nil {
			return err
		}
		if err := r.preparedOnNode(uids); err != nil {
			return fmt.Errorf("before the step: %w", err)
		}
		before, err := r.nodeSlices(ctx)
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := r.restartDRADriver(ctx); err != nil {
			return err
		}
		if err := r.newClaimPod(ctx, "chaos-dra-new"); err != nil {
			return err
		}
		r.recovered(time.Since(start))
		var last error
		err = r.poll(ctx, time.Minute, "the new driver's ResourceSlices to be the old ones", func(ctx context.Context) (bool, error) {
			after, err := r.nodeSlices(ctx)
			if err != nil {
				return false, nil
			}
			last = sameSlices(before, after)
			return last == nil, nil
		})
		if err != nil {
			return fmt.Errorf("%w: %w", err, last)
		}
		if err := r.preparedOnNode(uids); err != nil {
			return fmt.Errorf("after the driver's pod was replaced: %w", err)
		}
		r.note("chaos 2: DRA driver replaced and a new claim prepared %s after its pod was deleted; ResourceSlices %v unchanged; the %d running pods' claims still prepared",
			r.recovery.Round(100*time.Millisecond), sliceNames(before), len(uids))
		return nil
	})
}

// ---- chaos 3: the DRA driver's checkpoint corrupted

// corrupt changes one character of a checkpoint's checksum: the file stays
// valid JSON of the right version, and fails only its checksum.
func corrupt(data []byte) ([]byte, error) {
	key := []byte(`"checksum": "`)
	i := bytes.Index(data, key)
	if i < 0 || i+len(key) >= len(data) {
		return nil, errors.New("the checkpoint has no checksum")
	}
	out := bytes.Clone(data)
	j := i + len(key)
	if out[j] == '0' {
		out[j] = '1'
	} else {
		out[j] = '0'
	}
	return out, nil
}

func (r *run) chaosDRACheckpoint(ctx context.Context) error {
	return r.withStream(ctx, draStreamPod, func(ctx context.Context) error {
		uids, err := r.podClaimUIDs(ctx, draServerPod, draClientPod, draStreamPod)
		if err != nil {
			return err
		}
		path := r.draCheckpoint()
		good, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read the driver's checkpoint: %w", err)
		}
		bad, err := corrupt(good)
		if err != nil {
			return err
		}
		asideBefore, _ := filepath.Glob(path + ".unusable-*")
		if err := os.WriteFile(path, bad, 0o600); err != nil {
			return fmt.Errorf("corrupt the driver's checkpoint: %w", err)
		}
		if _, err := checkpoint.Load(path); !errors.Is(err, checkpoint.ErrUnusable) {
			return fmt.Errorf("the corrupted checkpoint loads, or fails otherwise: %w", err)
		}
		r.say("corrupted %s (one character of its checksum)", path)
		start := time.Now()
		driver, err := r.restartDRADriver(ctx)
		if err != nil {
			return err
		}
		var aside []string
		err = r.poll(ctx, 2*time.Minute, "the new driver to move the checkpoint aside and rebuild it", func(ctx context.Context) (bool, error) {
			aside, _ = filepath.Glob(path + ".unusable-*")
			return len(aside) > len(asideBefore) && r.preparedOnNode(uids) == nil, nil
		})
		if err != nil {
			if perr := r.preparedOnNode(uids); perr != nil {
				return fmt.Errorf("%w: %w", err, perr)
			}
			return fmt.Errorf("%w (checkpoints moved aside: %q)", err, aside)
		}
		if err := r.newClaimPod(ctx, "chaos-dra-heal"); err != nil {
			return err
		}
		r.recovered(time.Since(start))
		kept := aside[len(aside)-1]
		if got, err := os.ReadFile(kept); err != nil || !bytes.Equal(got, bad) {
			return fmt.Errorf("%s does not hold the corrupted checkpoint (%w)", kept, err)
		}
		logs, err := r.cs.CoreV1().Pods(releaseNS).GetLogs(driver.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("logs of the driver %s: %w", driver.Name, err)
		}
		rebuilt := ""
		for _, l := range strings.Split(string(logs), "\n") {
			if strings.Contains(l, "prepared claims rebuilt") {
				rebuilt = l
			}
		}
		if rebuilt == "" {
			return fmt.Errorf("the driver %s did not log the rebuild:\n%s", driver.Name, logs)
		}
		r.note("chaos 3: corrupted checkpoint moved aside as %s; the %d running pods' claims rebuilt and a new claim prepared %s after the driver's pod was deleted; its log: %s",
			filepath.Base(kept), len(uids), r.recovery.Round(100*time.Millisecond), strings.TrimSpace(rebuilt))
		return nil
	})
}

// ---- chaos 6: containerd restarted

// podState is what must not change when containerd restarts: the pod and
// its containers.
type podState struct {
	uid        types.UID
	containers string // IDs and restart counts
}

func (r *run) podStates(ctx context.Context) (map[string]podState, error) {
	out := map[string]podState{}
	for _, ns := range []string{testNS, releaseNS} {
		l, err := r.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list pods of %s: %w", ns, err)
		}
		for i := range l.Items {
			p := &l.Items[i]
			if !podReady(p) {
				return nil, fmt.Errorf("pod %s/%s is not ready", ns, p.Name)
			}
			var cs []string
			for _, c := range p.Status.ContainerStatuses {
				cs = append(cs, fmt.Sprintf("%s:%s restarts=%d", c.Name, c.ContainerID, c.RestartCount))
			}
			out[ns+"/"+p.Name] = podState{uid: p.UID, containers: strings.Join(cs, ",")}
		}
	}
	return out, nil
}

func (r *run) chaosContainerd(ctx context.Context) error {
	return r.withStream(ctx, draStreamPod, func(ctx context.Context) error {
		before, err := r.podStates(ctx)
		if err != nil {
			return err
		}
		r.mu.Lock()
		var old string
		for _, name := range r.order {
			if c := r.children[name]; strings.HasPrefix(name, "containerd") && c != nil && !c.Exited() {
				old = name
			}
		}
		child := r.children[old]
		r.mu.Unlock()
		if child == nil {
			return errors.New("containerd is not running")
		}
		start := time.Now()
		child.Stop()
		r.say("containerd stopped (%s); starting it again", child.ExitStatus())
		c, err := r.start("containerd-restarted", r.bin("containerd/containerd"), "--config", filepath.Join(r.paths.config, "containerd.toml"))
		if err != nil {
			return err
		}
		err = r.poll(ctx, time.Minute, "the restarted containerd to answer", func(ctx context.Context) (bool, error) {
			if c.Exited() {
				return false, fmt.Errorf("containerd exited (%s)%s", c.ExitStatus(), c.LogTail())
			}
			_, err := r.ctr(ctx, "version")
			return err == nil, nil
		})
		if err != nil {
			return err
		}
		var changed []string
		err = r.poll(ctx, 2*time.Minute, "every pod to run on, its containers the same", func(ctx context.Context) (bool, error) {
			after, err := r.podStates(ctx)
			if err != nil {
				return false, nil
			}
			changed = changed[:0]
			for name, b := range before {
				if a, ok := after[name]; !ok || a != b {
					changed = append(changed, fmt.Sprintf("%s: %+v, was %+v", name, a, b))
				}
			}
			return len(changed) == 0, nil
		})
		if err != nil {
			return fmt.Errorf("%w: %s", err, strings.Join(changed, "; "))
		}
		if err := r.newClaimPod(ctx, "chaos-containerd-new"); err != nil {
			return err
		}
		r.recovered(time.Since(start))
		r.note("chaos 6: containerd restarted; the %d pods ran on with the same containers and the DRA driver prepared a new claim %s after the stop",
			len(before), r.recovery.Round(100*time.Millisecond))
		return nil
	})
}
