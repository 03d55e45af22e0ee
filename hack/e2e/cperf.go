//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/openeuler/urma-k8s/hack/internal/imagespec"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
	"github.com/openeuler/urma-k8s/internal/ociimage"
)

// Step 9: a C program that links liburma and brings none (hack/e2e/cperf,
// built by hack/e2e.sh against liburma-soft and packed with only the C
// library it needs) runs in a pod given a software device, finds the
// liburma the DRA driver injected, and exchanges messages with step 8's
// urma-perf server over URMA on the shm fabric, then over TCP.
const (
	cperfImageName = "urma-cperf"
	cperfPod       = "cperf"
	cperfClaim     = "cperf-software-device"
	cperfSize      = 65536 // bytes per echoed request
	cperfSeconds   = 3     // each of the URMA and TCP runs
)

// cperfBinary is the C program's file under bin/.
var cperfBinary = filepath.Join("e2e", cperfImageName)

// lddPathRE finds a library ldd resolved: "name => /path (0x...)" or
// "/path (0x...)" (the loader).
var lddPathRE = regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$`)

// cperfImage is the C program's image: the program, and the loader and
// libraries ldd finds for it on this machine (the C library), but never
// liburma, which the pod must get from the node.
func cperfImage(program string) (ociimage.Image, error) {
	bin, err := os.ReadFile(program)
	if err != nil {
		return ociimage.Image{}, fmt.Errorf("read the C program (hack/e2e.sh builds it): %w", err)
	}
	out, err := exec.Command("ldd", program).CombinedOutput()
	if err != nil {
		return ociimage.Image{}, fmt.Errorf("ldd %s: %w\n%s", program, err, out)
	}
	files := imagespec.BaseFiles()
	for _, m := range lddPathRE.FindAllStringSubmatch(string(out), -1) {
		path := m[1]
		if strings.HasPrefix(filepath.Base(path), "liburma") {
			return ociimage.Image{}, fmt.Errorf("ldd found %s on this machine: the image must not carry liburma", path)
		}
		data, err := os.ReadFile(path) // the link's target, at the link's path
		if err != nil {
			return ociimage.Image{}, fmt.Errorf("read %s for the C program's image: %w", path, err)
		}
		files = append(files, ociimage.File{Path: path, Mode: 0o755, Data: data})
	}
	if len(files) == len(imagespec.BaseFiles()) {
		return ociimage.Image{}, fmt.Errorf("ldd %s named no C library:\n%s", program, out)
	}
	path := "/usr/local/bin/" + cperfImageName
	files = append(files, ociimage.File{Path: path, Mode: 0o755, Data: bin})
	return ociimage.Image{
		Name: imageName(cperfImageName), Arch: runtime.GOARCH,
		Files: files,
		Config: ociimage.Config{
			User:       imagespec.User,
			Entrypoint: []string{path},
			Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
			Labels:     imagespec.Labels(cperfImageName, "make e2e's C workload: links liburma, brings none", imageTag),
		},
	}, nil
}

// cperfResult is what the C program printed.
type cperfResult struct {
	liburma                string  // where the loader found liburma
	device, eid            string  // the device it opened, its EID in hex
	urmaBytes, tcpBytes    uint64  // echoed
	urmaSeconds, tcpSecond float64 // taken
}

// parseCperf reads the C program's output.
func parseCperf(out string) (cperfResult, error) {
	var res cperfResult
	ok := false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "liburma":
			res.liburma = f[1]
		case len(f) == 4 && f[0] == "device" && f[2] == "eid":
			res.device, res.eid = f[1], f[3]
		case len(f) == 3 && (f[0] == "urma" || f[0] == "tcp"):
			n, err1 := strconv.ParseUint(f[1], 10, 64)
			s, err2 := strconv.ParseFloat(f[2], 64)
			if err1 != nil || err2 != nil || s <= 0 {
				return res, fmt.Errorf("bad line %q", sc.Text())
			}
			if f[0] == "urma" {
				res.urmaBytes, res.urmaSeconds = n, s
			} else {
				res.tcpBytes, res.tcpSecond = n, s
			}
		case len(f) == 1 && f[0] == "OK":
			ok = true
		}
	}
	switch {
	case !ok:
		return res, errors.New("the program did not finish (no OK)")
	case res.liburma == "" || res.device == "" || res.urmaBytes == 0 || res.tcpBytes == 0:
		return res, fmt.Errorf("incomplete output: %+v", res)
	}
	return res, nil
}

// checkCProgram is step 9.
func (r *run) checkCProgram(ctx context.Context) error {
	if r.draServerIP == "" {
		return errors.New("no urma-perf server: step 8 did not run")
	}
	softDir := filepath.Join(r.o.work, "liburma")
	chart := filepath.Join(r.o.root, "charts", "urma-k8s")
	r.say("$ helm upgrade %s charts/urma-k8s -n %s --reuse-values --set draDriver.softDevices=1 --set liburma.softDir=%s", releaseName, releaseNS, softDir)
	if _, err := r.helm(ctx, "upgrade", releaseName, chart, "--namespace", releaseNS, "--reuse-values",
		"--set", "draDriver.softDevices=1", "--set", "liburma.softDir="+softDir); err != nil {
		return err
	}
	// The driver publishes the software device, and says of every device
	// which liburma its containers get: this host has no UB liburma.
	wantHW := slicefacts.LiburmaNone
	if _, err := os.Stat(filepath.Join(libinject.DefaultHostLibDir, libinject.SoftLibName)); err == nil {
		wantHW = slicefacts.LiburmaHost
	}
	var last string
	err := r.poll(ctx, 3*time.Minute, "the DRA driver to publish a software device, liburma soft", func(ctx context.Context) (bool, error) {
		list, err := r.cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + nodeName})
		if err != nil {
			return false, nil
		}
		var soft, hw int
		var seen []string
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				lib := ""
				if a := d.Attributes[slicefacts.AttrLiburma]; a.StringValue != nil {
					lib = *a.StringValue
				}
				sw := d.Attributes[slicefacts.AttrSoftware].BoolValue
				seen = append(seen, d.Name+":"+lib)
				switch {
				case sw != nil && *sw && lib == slicefacts.LiburmaSoft:
					soft++
				case (sw == nil || !*sw) && lib == wantHW:
					hw++
				}
			}
		}
		last = strings.Join(seen, " ")
		return soft == 1 && hw == len(r.draDevices), nil
	})
	if err != nil {
		return fmt.Errorf("%w: devices (name:liburma) %s; want one software device soft and the UB devices %s", err, last, wantHW)
	}
	r.say("devices (name:liburma attribute): %s", last)
	published, err := os.ReadFile(filepath.Join(softDir, libinject.SoftLibName))
	if err != nil {
		return fmt.Errorf("the driver did not publish its liburma into %s: %w", softDir, err)
	}
	built, err := os.ReadFile(r.bin(liburmaFile))
	if err != nil {
		return err
	}
	if !bytes.Equal(published, built) {
		return fmt.Errorf("%s/%s is not the liburma the driver's image carries", softDir, libinject.SoftLibName)
	}

	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: cperfClaim, Namespace: testNS},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "urma",
			Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: slicefacts.DriverName,
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
					Expression: `device.attributes["` + slicefacts.DriverName + `"].` + string(slicefacts.AttrSoftware),
				}}},
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					slicefacts.CapacityJetties: resource.MustParse("16"),
				}},
			},
		}}}},
	}
	if _, err := r.cs.ResourceV1().ResourceClaims(testNS).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ResourceClaim %s: %w", cperfClaim, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: cperfPod, Namespace: testNS},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{
				Name: "cperf", Image: imageName(cperfImageName), ImagePullPolicy: corev1.PullNever,
				Args:      []string{r.draServerIP + ":7000", strconv.Itoa(cperfSize), strconv.Itoa(cperfSeconds)},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "urma"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "urma", ResourceClaimName: ptr.To(cperfClaim)}},
		},
	}
	if _, err := r.cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", cperfPod, err)
	}
	var done *corev1.Pod
	err = r.poll(ctx, 3*time.Minute, "pod "+cperfPod+" to finish", func(ctx context.Context) (bool, error) {
		p, err := r.cs.CoreV1().Pods(testNS).Get(ctx, cperfPod, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		done = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	logs, lerr := r.cs.CoreV1().Pods(testNS).GetLogs(cperfPod, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("%w\n%s\nits log:\n%s", err, r.podsReport(ctx, testNS), logs)
	}
	if lerr != nil {
		return fmt.Errorf("the C program's log: %w", lerr)
	}
	if done.Status.Phase != corev1.PodSucceeded {
		return fmt.Errorf("the C program failed:\n%s", logs)
	}
	res, err := parseCperf(string(logs))
	if err != nil {
		return fmt.Errorf("the C program's output: %w\n%s", err, logs)
	}
	if want := filepath.Join(libinject.ContainerLibDir, libinject.SoftLibName); res.liburma != want {
		return fmt.Errorf("the loader found liburma at %s, want the injected %s", res.liburma, want)
	}
	// The server says which fabric carried the C program's connection.
	srvLog, err := r.cs.CoreV1().Pods(testNS).GetLogs(draServerPod, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("the urma-perf server's log: %w", err)
	}
	conn := regexp.MustCompile(`conn from ` + regexp.QuoteMeta(done.Status.PodIP) + `:\d+ mode=urma fabric=shm\b`)
	if !conn.Match(srvLog) {
		return fmt.Errorf("the urma-perf server logged no URMA connection on the shm fabric from %s (%s):\n%s", cperfPod, done.Status.PodIP, srvLog)
	}
	mib := func(b uint64, s float64) float64 { return float64(b) / s / (1 << 20) }
	u, t := mib(res.urmaBytes, res.urmaSeconds), mib(res.tcpBytes, res.tcpSecond)
	r.say("pod %s (%s): liburma %s, device %s (EID %s): the urma-perf server logged its connection mode=urma fabric=shm",
		cperfPod, done.Status.PodIP, res.liburma, res.device, res.eid)
	r.note("C program on injected liburma-soft <-> urma-perf pod: URMA (shm fabric) %.1f MiB/s vs TCP %.1f MiB/s (%.2fx), %d-byte echoed requests, %d s each",
		u, t, u/t, cperfSize, cperfSeconds)
	return nil
}
