//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openeuler/urma-k8s/internal/node/discover"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// Where the fake UB node's device nodes live: the host's real /dev, as on
// a UB host, because kubelet hands the runtime host paths and runc creates
// the container's node from the host node's type and numbers.
const hostDevDir = "/dev/uburma"

// devNodesFile lists the device nodes this run created, so that teardown,
// even of a run that died, removes exactly those.
func (r *run) devNodesFile() string { return filepath.Join(r.paths.node, "created-dev-nodes") }

// fakeUBNode writes the fake node's sysfs tree and device nodes, asks the
// device plugin's discover command what it will advertise there
// (r.expectedUnits), and labels the Node for the plugin's DaemonSet.
func (r *run) fakeUBNode(ctx context.Context) error {
	devs := sysfstest.TwoNUMANodes()
	// sysfstest also writes placeholder device nodes; they go to a scratch
	// directory, the real ones are made below.
	if err := sysfstest.WriteTree(r.paths.sysfs, filepath.Join(r.paths.node, "dev-placeholders"), devs...); err != nil {
		return fmt.Errorf("generate the fake sysfs tree: %w", err)
	}
	if entries, err := os.ReadDir(hostDevDir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s already has entries (%d): this looks like a UB host, and a fake node would shadow its devices", hostDevDir, len(entries))
	}
	major, err := unusedCharMajor()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(hostDevDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", hostDevDir, err)
	}
	f, err := os.Create(r.devNodesFile())
	if err != nil {
		return fmt.Errorf("record the device nodes: %w", err)
	}
	defer f.Close()
	for i, d := range devs {
		p := filepath.Join(hostDevDir, d.Name)
		// Record before creating: a crash in between leaves nothing unlisted.
		if _, err := fmt.Fprintln(f, p); err != nil {
			return fmt.Errorf("record %s: %w", p, err)
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(major, uint32(i)))); err != nil {
			return fmt.Errorf("mknod %s c %d %d: %w", p, major, i, err)
		}
	}
	r.say("fake sysfs tree in %s; character devices %s/{udma0,udma1} with major %d (no driver: unused major)", r.paths.sysfs, hostDevDir, major)

	out, err := exec.CommandContext(ctx, r.bin("e2e/urma-device-plugin"), "discover", "--sysfs-root", r.paths.sysfs, "--dev-root", "/dev").Output()
	if err != nil {
		return fmt.Errorf("urma-device-plugin discover on the fake node: %w", err)
	}
	var found []discover.Device
	if err := json.Unmarshal(out, &found); err != nil {
		return fmt.Errorf("read discover's output: %w", err)
	}
	r.discovered = found
	r.expectedUnits = 0
	for _, d := range found {
		state := "not advertised"
		if d.Advertised {
			state = fmt.Sprintf("%d jetties in %d units", d.Budget.Jetties, d.Budget.Units)
			r.expectedUnits += int64(d.Budget.Units)
		}
		r.say("discover: %s (%s, NUMA %d, healthy %v): %s", d.Name, d.Driver, d.NUMANode, d.Healthy, state)
	}
	if r.expectedUnits == 0 {
		return errors.New("the device plugin would advertise nothing on the fake node")
	}
	// Hardware mode runs the plugin on nodes with this label (see the
	// chart's devicePlugin.nodeLabel), as an administrator would set it.
	patch := []byte(`{"metadata":{"labels":{"urma.openeuler.org/present":"true"}}}`)
	if _, err := r.cs.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s: %w", nodeName, err)
	}
	r.say("labelled node %s urma.openeuler.org/present=true", nodeName)
	return nil
}

// unusedCharMajor picks a character major number no driver has registered
// (from /proc/devices), in the range Linux leaves to local use (240-254)
// or just below it.
func unusedCharMajor() (uint32, error) {
	f, err := os.Open("/proc/devices")
	if err != nil {
		return 0, fmt.Errorf("read /proc/devices: %w", err)
	}
	defer f.Close()
	used := map[uint32]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "Block devices:" {
			break
		}
		if fields := strings.Fields(line); len(fields) == 2 {
			if n, err := strconv.ParseUint(fields[0], 10, 32); err == nil {
				used[uint32(n)] = true
			}
		}
	}
	for m := uint32(254); m >= 200; m-- {
		if !used[m] {
			return m, nil
		}
	}
	return 0, errors.New("no unused character major between 200 and 254 in /proc/devices")
}

// removeDevNodes removes the device nodes a run recorded, and /dev/uburma
// when that leaves it empty.
func removeDevNodes(listFile string) error {
	b, err := os.ReadFile(listFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", listFile, err)
	}
	var errs []error
	for _, p := range strings.Fields(string(b)) {
		if filepath.Dir(p) != hostDevDir {
			errs = append(errs, fmt.Errorf("%s lists %s, which is not in %s: left alone", listFile, p, hostDevDir))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if entries, err := os.ReadDir(hostDevDir); err == nil && len(entries) == 0 {
		if err := os.Remove(hostDevDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
