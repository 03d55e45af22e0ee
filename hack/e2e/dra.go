//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	urmav1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/discover"
	"github.com/openeuler/urma-k8s/internal/node/shmdir"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/internal/podenv"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// The two pods of step 8: urma-perf servers labelled for the endpoint, which
// the operator's webhook gives a claim each in DRA mode.
const (
	draServerPod = "dra-perf-server"
	draClientPod = "dra-perf-client"
)

// draDevice is one device of the driver's ResourceSlices for the node.
type draDevice struct {
	urmaName string // attribute device: URMA_DEVICE
	eid      string // attribute eid: URMA_EID
	jetties  int64  // capacity jetties
}

// expectedDRADevices is what the DRA driver should publish for what the
// device plugin's discover reported: every advertised device, with the
// jetties it could give pods before units (both default to no host reserve).
func expectedDRADevices(found []discover.Device) map[string]int64 {
	out := map[string]int64{}
	for _, d := range found {
		if !d.Advertised {
			continue
		}
		b := budget.Config{}.For(d.Caps.MaxJetty, urma.Range{Min: d.ReservedJetty.Min, Max: d.ReservedJetty.Max})
		out[d.Name] = int64(b.Available)
	}
	return out
}

// publishedDRADevices reads the driver's devices for the node from its
// ResourceSlices.
func publishedDRADevices(sl []resourcev1.ResourceSlice) map[string]draDevice {
	out := map[string]draDevice{}
	for _, s := range sl {
		if s.Spec.Driver != slicefacts.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != nodeName {
			continue
		}
		for _, d := range s.Spec.Devices {
			dev := draDevice{}
			if a, ok := d.Attributes[slicefacts.AttrDevice]; ok && a.StringValue != nil {
				dev.urmaName = *a.StringValue
			}
			if a, ok := d.Attributes[slicefacts.AttrEID]; ok && a.StringValue != nil {
				dev.eid = *a.StringValue
			}
			if c, ok := d.Capacity[slicefacts.CapacityJetties]; ok {
				dev.jetties = c.Value.Value()
			}
			out[d.Name] = dev
		}
	}
	return out
}

// sameDevices compares the published devices with the expected capacities
// and says how they differ.
func sameDevices(want map[string]int64, got map[string]draDevice) error {
	var diffs []string
	for name, jetties := range want {
		d, ok := got[name]
		switch {
		case !ok:
			diffs = append(diffs, name+" missing")
		case d.jetties != jetties:
			diffs = append(diffs, fmt.Sprintf("%s has %d jetties, want %d", name, d.jetties, jetties))
		case d.urmaName != name:
			diffs = append(diffs, fmt.Sprintf("%s has attribute device %q", name, d.urmaName))
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, name+" not expected")
		}
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		return errors.New(strings.Join(diffs, "; "))
	}
	return nil
}

// checkDRAInstall installs the chart again, with driver=dra, and checks that
// the driver publishes the devices the device plugin advertised, that the
// DeviceClass is there and that the operator keeps the endpoint's claim
// template.
func (r *run) checkDRAInstall(ctx context.Context) error {
	if len(r.discovered) == 0 {
		return errors.New("no discover report: the fake UB node step did not run")
	}
	// Step 3's pods hold units of the device plugin that step 6 removed;
	// one node runs one of the two drivers, so they go first.
	for _, name := range []string{serverPod, clientPod} {
		if err := r.cs.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", name, err)
		}
	}
	err := r.poll(ctx, 2*time.Minute, "step 3's pods to be gone", func(ctx context.Context) (bool, error) {
		pods, err := r.cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w\n%s", err, r.podsReport(ctx, testNS))
	}
	kubeletRoot := r.paths.kubelet
	sets := append([]string{
		"driver=dra",
		"draDriver.image.repository=" + imageRepo + "urma-dra-driver",
		"draDriver.image.tag=" + imageTag,
		"draDriver.image.pullPolicy=Never",
	}, chartImageSets()...)
	// The fake node's sysfs tree; kubelet's plugin directories under its
	// --root-dir (where it watches for registrations, unlike device
	// plugins); the CDI directory this run's containerd reads.
	sets = append(sets,
		"draDriver.hostSysfs="+r.paths.sysfs,
		"draDriver.kubeletPluginsDir="+filepath.Join(kubeletRoot, "plugins"),
		"draDriver.kubeletRegistryDir="+filepath.Join(kubeletRoot, "plugins_registry"),
		"draDriver.cdiSpecDir="+r.paths.cdi,
	)
	if err := r.helmInstall(ctx, sets); err != nil {
		return err
	}

	want := expectedDRADevices(r.discovered)
	var got map[string]draDevice
	var last error
	err = r.poll(ctx, 2*time.Minute, "the DRA driver's ResourceSlices for "+nodeName+" to match discover", func(ctx context.Context) (bool, error) {
		list, err := r.cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + nodeName})
		if err != nil {
			return false, nil
		}
		got = publishedDRADevices(list.Items)
		last = sameDevices(want, got)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%w: %w", err, last)
	}
	r.draDevices = got
	names := make([]string, 0, len(got))
	for name, d := range got {
		names = append(names, fmt.Sprintf("%s %d jetties", name, d.jetties))
	}
	slices.Sort(names)
	r.note("DRA driver: ResourceSlices of %s publish %s, as discover reported", nodeName, strings.Join(names, ", "))

	if _, err := r.cs.ResourceV1().DeviceClasses().Get(ctx, slicefacts.DriverName, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("DeviceClass %s: %w", slicefacts.DriverName, err)
	}
	// The operator, now in DRA mode, keeps a claim template for the
	// endpoint step 2 made (kept by helm uninstall), asking for its budget.
	tmplName := urmav1.ClaimTemplateName(endpointName)
	var tmpl *resourcev1.ResourceClaimTemplate
	err = r.poll(ctx, 2*time.Minute, "the operator's ResourceClaimTemplate "+tmplName, func(ctx context.Context) (bool, error) {
		t, err := r.cs.ResourceV1().ResourceClaimTemplates(testNS).Get(ctx, tmplName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		tmpl = t
		return true, nil
	})
	if err != nil {
		return err
	}
	reqs := tmpl.Spec.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.DeviceClassName != slicefacts.DriverName || reqs[0].Exactly.Capacity == nil {
		return fmt.Errorf("ResourceClaimTemplate %s: want one request of DeviceClass %s with a jetty capacity, got %+v", tmplName, slicefacts.DriverName, reqs)
	}
	q := reqs[0].Exactly.Capacity.Requests[slicefacts.CapacityJetties]
	r.draBudget = q.Value()
	r.say("DeviceClass %s; ResourceClaimTemplate %s/%s asks for %s jetties", slicefacts.DriverName, testNS, tmplName, q.String())
	return nil
}

// checkDRAPods runs two labelled pods in DRA mode and checks what each got:
// the webhook's claim, its allocation on the node's pool, the CDI spec the
// driver wrote for it, and inside the container the environment and
// mounts that spec describes; then urma-perf between them over shm.
func (r *run) checkDRAPods(ctx context.Context) error {
	if r.draDevices == nil {
		return errors.New("no published devices: step 7 did not run")
	}
	names := []string{draServerPod, draClientPod}
	if err := removeHostShmDir(); err != nil {
		return err
	}
	perfPods, err := r.quickStartPods(draServerPod, draClientPod)
	if err != nil {
		return err
	}
	for _, p := range perfPods {
		if _, err := r.cs.CoreV1().Pods(testNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s (examples/quick-start/pods.yaml): %w", p.Name, err)
		}
	}
	pods, err := r.waitPodsRunning(ctx, testNS, names, 3*time.Minute)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if err := r.checkClaimPod(ctx, p); err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
	}
	// The claims' shm mount is for the shm fabric: every URMA connection
	// must use it.
	r.draServerIP = pods[0].Status.PodIP
	return r.perfBetweenPods(ctx, "urma-perf between the DRA pods", draClientPod, pods[0].Status.PodIP, "shm")
}

// checkClaimPod checks one pod of step 8.
func (r *run) checkClaimPod(ctx context.Context, p corev1.Pod) error {
	c := p.Spec.Containers[0]
	if q, ok := c.Resources.Requests[corev1.ResourceName(nodefacts.ResourceName)]; ok {
		return fmt.Errorf("admitted with a %s request of %s: in DRA mode the webhook adds a claim instead", nodefacts.ResourceName, q.String())
	}
	if len(c.Resources.Claims) != 1 {
		return fmt.Errorf("the container lists %d claims, want the webhook's one: %+v", len(c.Resources.Claims), c.Resources.Claims)
	}
	podClaim := c.Resources.Claims[0].Name
	claimName := ""
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == podClaim && s.ResourceClaimName != nil {
			claimName = *s.ResourceClaimName
		}
	}
	if claimName == "" {
		return fmt.Errorf("no ResourceClaim generated for the pod's claim %s (status %+v)", podClaim, p.Status.ResourceClaimStatuses)
	}
	claim, err := r.cs.ResourceV1().ResourceClaims(testNS).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get ResourceClaim %s: %w", claimName, err)
	}
	res, err := claimResult(claim, p.UID)
	if err != nil {
		return fmt.Errorf("ResourceClaim %s: %w", claimName, err)
	}
	consumed := res.ConsumedCapacity[slicefacts.CapacityJetties]
	if consumed.Value() != r.draBudget {
		return fmt.Errorf("ResourceClaim %s consumed %s jetties of %s, the template asks for %d", claimName, consumed.String(), res.Device, r.draBudget)
	}
	dev, ok := r.draDevices[res.Device]
	if !ok {
		return fmt.Errorf("ResourceClaim %s is allocated %s, which the driver did not publish", claimName, res.Device)
	}
	w, err := claimspec.New(claimspec.Config{Dir: r.paths.cdi, Kind: claimspec.DefaultKind})
	if err != nil {
		return fmt.Errorf("read the CDI directory: %w", err)
	}
	if !w.Exists(string(claim.UID)) {
		return fmt.Errorf("no CDI spec %s in %s: the driver did not prepare claim %s", w.FileName(string(claim.UID)), r.paths.cdi, claimName)
	}

	// Inside the container: what the claim's CDI spec told containerd to add.
	pid, err := r.containerPID(ctx, p.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		return err
	}
	env, err := processEnv(pid)
	if err != nil {
		return err
	}
	wantEnv := map[string]string{
		podenv.Device:      dev.urmaName,
		podenv.JettyBudget: strconv.FormatInt(consumed.Value(), 10),
		podenv.EID:         dev.eid,
		podenv.ShmDir:      shmdir.DefaultDir,
	}
	var wrong []string
	for k, v := range wantEnv {
		if env[k] != v {
			wrong = append(wrong, fmt.Sprintf("%s=%q (want %q)", k, env[k], v))
		}
	}
	if len(wrong) > 0 {
		slices.Sort(wrong)
		return fmt.Errorf("the container's environment: %s", strings.Join(wrong, ", "))
	}
	st, err := checkDevNode(pid, dev.urmaName)
	if err != nil {
		return err
	}
	if err := checkShmDir(pid); err != nil {
		return err
	}
	if _, err := r.checkFlagsFile(pid, env[podenv.FlagsFile]); err != nil {
		return err
	}
	r.say("pod %s (%s, pid %d): claim %s allocated %s/%s, %s jetties; CDI spec %s; sees %s/%s (char %d:%d), the host's %s, %s",
		p.Name, p.Status.PodIP, pid, claimName, res.Pool, res.Device, consumed.String(), w.FileName(string(claim.UID)),
		hostDevDir, dev.urmaName, unix.Major(st.Rdev), unix.Minor(st.Rdev), shmdir.DefaultDir, urmaEnv(env))
	return nil
}

// claimResult returns the one device a claim of the driver was allocated on
// the node's pool, checking that the claim is reserved for the pod.
func claimResult(claim *resourcev1.ResourceClaim, pod types.UID) (resourcev1.DeviceRequestAllocationResult, error) {
	var none resourcev1.DeviceRequestAllocationResult
	if claim.Status.Allocation == nil {
		return none, errors.New("not allocated")
	}
	results := claim.Status.Allocation.Devices.Results
	if len(results) != 1 {
		return none, fmt.Errorf("allocated %d devices, want 1: %+v", len(results), results)
	}
	res := results[0]
	if res.Driver != slicefacts.DriverName || res.Pool != nodeName {
		return none, fmt.Errorf("allocated from driver %s pool %s, want %s pool %s", res.Driver, res.Pool, slicefacts.DriverName, nodeName)
	}
	if !slices.ContainsFunc(claim.Status.ReservedFor, func(c resourcev1.ResourceClaimConsumerReference) bool { return c.UID == pod }) {
		return none, fmt.Errorf("not reserved for the pod (reservedFor %+v)", claim.Status.ReservedFor)
	}
	return res, nil
}

// checkSameDir checks that the container of pid has the host's directory
// dir mounted at the same path: the same device and inode.
func checkSameDir(pid int, dir string) error {
	var in, host unix.Stat_t
	if err := unix.Stat(filepath.Join("/proc", strconv.Itoa(pid), "root", dir), &in); err != nil {
		return fmt.Errorf("the container has no %s: %w", dir, err)
	}
	if err := unix.Stat(dir, &host); err != nil {
		return fmt.Errorf("stat the host's %s: %w", dir, err)
	}
	if in.Mode&unix.S_IFMT != unix.S_IFDIR || in.Dev != host.Dev || in.Ino != host.Ino {
		return fmt.Errorf("%s in the container is not the host's directory (dev %d ino %d, host's dev %d ino %d)", dir, in.Dev, in.Ino, host.Dev, host.Ino)
	}
	return nil
}
