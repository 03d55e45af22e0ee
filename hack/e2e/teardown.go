//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// netnsDir is where containerd's CRI pins pod network namespaces.
const netnsDir = "/run/netns"

// teardown undoes a run from what is on the machine, not only from what
// this process remembers, so it also cleans up after a run that was killed:
// processes, pod sandboxes (through the CRI, so the CNI releases their
// addresses), mounts, network namespaces, the bridge, cgroups, the fake
// device nodes and -work. Logs stay. It reports what it could not undo.
func (r *run) teardown() error {
	start := time.Now()
	fmt.Fprintf(r.out, "\n==> teardown\n")
	logPath := filepath.Join(r.o.logs, "teardown.log")
	var errs []error
	did := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		appendLog(logPath, time.Now().Format(time.RFC3339)+" "+s+"\n")
		r.say("%s", s)
	}
	fail := func(err error) {
		if err != nil {
			appendLog(logPath, time.Now().Format(time.RFC3339)+" ERROR "+err.Error()+"\n")
			errs = append(errs, err)
		}
	}

	// 1. kubelet first, so it restarts nothing while the rest goes. What
	// this process started it stops itself; what an earlier one started
	// (a -keep run's cluster) it finds in the pids file, then by command
	// line.
	isKubelet := func(name string) bool { return strings.HasPrefix(name, "kubelet") }
	r.stopChildren(isKubelet)
	n, err := stopRecorded(r.pidsFile(), isKubelet)
	fail(err)
	if n > 0 {
		did("stopped %d recorded kubelet process(es)", n)
	}
	if n := killByCmdline(r.o.work, "kubelet"); n > 0 {
		did("stopped %d leftover kubelet process(es)", n)
	}
	// 2. Pod sandboxes, through the CRI while containerd still runs.
	if n, err := r.removeSandboxes(); err != nil {
		fail(err)
	} else if n > 0 {
		did("stopped and removed %d pod sandbox(es) through the CRI", n)
	}
	// 3. Every other component, last started first; then anything left
	// whose command line names -work (shims, a killed run's children).
	n = r.stopChildren(func(string) bool { return true })
	recorded, err := stopRecorded(r.pidsFile(), func(string) bool { return true })
	fail(err)
	n += recorded
	n += killByCmdline(r.o.work, "")
	if n > 0 {
		did("stopped %d process(es)", n)
	}
	// 4. Container processes whose shim is gone, and kubelet's cgroups.
	if k, c, err := removeKubeCgroups(); err != nil {
		fail(err)
	} else if k+c > 0 {
		did("killed %d container process(es), removed %d kubepods cgroup(s)", k, c)
	}
	// 5. kube-proxy's rules (nftables table kube-proxy).
	if _, err := os.Stat(r.bin("k8s/kube-proxy")); err == nil {
		out, err := exec.Command(r.bin("k8s/kube-proxy"), "--cleanup").CombinedOutput()
		appendLog(logPath, "kube-proxy --cleanup:\n"+string(out))
		if err != nil {
			fail(fmt.Errorf("kube-proxy --cleanup: %w (output in %s)", err, logPath))
		}
	}
	if chains, jumps := removeKubeletChains(); chains > 0 {
		did("removed %d iptables chain(s) kubelet added (KUBE-FIREWALL, canaries) and %d jump(s) to them", chains, jumps)
	}
	// 6. Mounts under -work (overlay snapshots, pod volumes, shm) and the
	// run's pod network namespaces.
	if n, err := unmountUnder(r.o.work); err != nil {
		fail(err)
	} else if n > 0 {
		did("unmounted %d mount(s) under %s", n, r.o.work)
	}
	if n, err := removeNetns(filepath.Join(r.o.work, "netns-before")); err != nil {
		fail(err)
	} else if n > 0 {
		did("removed %d pod network namespace(s)", n)
	}
	// 7. The bridge and the Service-range guard route.
	if _, err := os.Stat(filepath.Join("/sys/class/net", bridgeName)); err == nil {
		if out, err := exec.Command("ip", "link", "del", bridgeName).CombinedOutput(); err != nil {
			fail(fmt.Errorf("ip link del %s: %w: %s", bridgeName, err, out))
		} else {
			did("removed bridge %s", bridgeName)
		}
	}
	if out, err := exec.Command("ip", "route", "show", serviceCIDR).Output(); err == nil && bytes.Contains(out, []byte("unreachable")) {
		if out, err := exec.Command("ip", "route", "del", "unreachable", serviceCIDR).CombinedOutput(); err != nil {
			fail(fmt.Errorf("ip route del unreachable %s: %w: %s", serviceCIDR, err, out))
		}
	}
	// 8. The fake device nodes, the host directories the run created, then -work.
	fail(removeDevNodes(r.devNodesFile()))
	if removed, err := removeHostDirs(r.hostDirsFile()); err != nil {
		fail(err)
	} else if len(removed) > 0 {
		did("removed %s", strings.Join(removed, ", "))
	}
	if _, err := os.Stat(r.o.work); err == nil {
		if err := os.RemoveAll(r.o.work); err != nil {
			fail(fmt.Errorf("remove %s: %w", r.o.work, err))
		} else {
			did("removed %s", r.o.work)
		}
	}
	if len(errs) == 0 {
		r.say("teardown done in %s", time.Since(start).Round(100*time.Millisecond))
	}
	return errors.Join(errs...)
}

// stopChildren stops the children this process started whose name match
// accepts, last started first, and returns how many were running.
func (r *run) stopChildren(match func(string) bool) int {
	r.mu.Lock()
	var names []string
	for i := len(r.order) - 1; i >= 0; i-- {
		if match(r.order[i]) {
			names = append(names, r.order[i])
		}
	}
	r.mu.Unlock()
	n := 0
	for _, name := range names {
		r.mu.Lock()
		c := r.children[name]
		r.mu.Unlock()
		if c != nil && !c.Exited() {
			c.Stop()
			n++
		}
	}
	return n
}

// killByCmdline stops every process (but this one) whose command line
// contains dir+"/" and, when exe is set, whose program is named exe:
// SIGTERM, then SIGKILL after a grace period. It returns how many it found.
func killByCmdline(dir, exe string) int {
	pids := findByCmdline(dir+"/", exe)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		if !waitExit(pid, time.Until(deadline)) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return len(pids)
}

func findByCmdline(needle, exe string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmd, []byte(needle)) {
			continue
		}
		if exe != "" {
			argv0, _, _ := bytes.Cut(cmd, []byte{0})
			if filepath.Base(string(argv0)) != exe {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// waitExit waits up to timeout for a process that is not our child to
// exit, on a pidfd (which becomes readable when it does), and reports
// whether it did.
func waitExit(pid int, timeout time.Duration) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return !processAlive(pid) // gone already, or no pidfd: check once
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(max(timeout, 0)/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return n > 0 || !processAlive(pid)
	}
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// removeSandboxes stops and removes every pod sandbox of this run's
// containerd through the CRI, as kubelet would, so the CNI plugin tears
// down each pod's interface and frees its address.
func (r *run) removeSandboxes() (int, error) {
	if _, err := os.Stat(r.paths.containerdSock); err != nil {
		return 0, nil
	}
	conn, err := dialUnix(r.paths.containerdSock)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, nil // containerd is not answering: the sweeps below clean up
	}
	var errs []error
	for _, sb := range list.GetItems() {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.GetId()}); err != nil {
			errs = append(errs, fmt.Errorf("CRI StopPodSandbox %s (%s): %w", sb.GetId(), sb.GetMetadata().GetName(), err))
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.GetId()}); err != nil {
			errs = append(errs, fmt.Errorf("CRI RemovePodSandbox %s (%s): %w", sb.GetId(), sb.GetMetadata().GetName(), err))
		}
	}
	return len(list.GetItems()), errors.Join(errs...)
}

// cgroupMounts returns the mount points of the cgroup filesystems.
func cgroupMounts() ([]string, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out, nil
}

// removeKubeCgroups kills what still runs in kubelet's cgroups (kubepods*
// at the root of each hierarchy) and removes them, deepest first.
func removeKubeCgroups() (killed, removed int, err error) {
	roots, err := cgroupMounts()
	if err != nil {
		return 0, 0, err
	}
	var dirs []string
	for _, root := range roots {
		tops, _ := filepath.Glob(filepath.Join(root, "kubepods*"))
		for _, top := range tops {
			_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
		}
	}
	// A process is in one cgroup of every v1 hierarchy: kill each once.
	seen := map[int]bool{}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid == os.Getpid() || seen[pid] {
				continue
			}
			seen[pid] = true
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var errs []error
	for _, d := range dirs {
		// A killed process leaves its cgroup a moment later: retry briefly.
		var rmErr error
		for try := 0; try < 50; try++ {
			if rmErr = unix.Rmdir(d); rmErr == nil || errors.Is(rmErr, unix.ENOENT) {
				break
			}
			time.Sleep(20 * time.Millisecond) // no event announces an emptied cgroup on v1
		}
		switch {
		case rmErr == nil:
			removed++
		case !errors.Is(rmErr, unix.ENOENT):
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, rmErr))
		}
	}
	return killed, removed, errors.Join(errs...)
}

type mountEntry struct{ point, fstype string }

// readMountinfo parses /proc/self/mountinfo.
func readMountinfo() ([]mountEntry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	var out []mountEntry
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, mountEntry{point: unescapeMount(fields[4]), fstype: fields[sep+1]})
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) (int, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return 0, err
	}
	var points []string
	for _, m := range mounts {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			points = append(points, m.point)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	n := 0
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("umount %s: %w", p, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// hostDirs are directories outside -work that kubelet and containerd
// create whatever they are told: kubelet serves device plugins in
// /var/lib/kubelet/device-plugins, runc keeps container state under
// /run/containerd; and the chart's shmDir (the device plugin's and the DRA
// driver's, a hostPath created on use), where the pods' transports leave
// their sockets. Teardown removes those the run created.
var hostDirs = []string{"/var/lib/kubelet", "/run/containerd", "/var/run/urma-k8s"}

func (r *run) hostDirsFile() string { return filepath.Join(r.o.work, "created-host-dirs") }

// recordHostDirs lists the host directories that do not exist yet: the run
// will create them.
func recordHostDirs(file string) error {
	var created []string
	for _, d := range hostDirs {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			created = append(created, d)
		}
	}
	return writeFile(file, []byte(strings.Join(created, "\n")+"\n"))
}

// removeHostDirs removes the host directories a run recorded as its own.
func removeHostDirs(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	var removed []string
	var errs []error
	for _, d := range strings.Fields(string(b)) {
		known := false
		for _, h := range hostDirs {
			known = known || d == h
		}
		if !known {
			errs = append(errs, fmt.Errorf("%s lists %s, which is not one of %v: left alone", file, d, hostDirs))
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, d)
	}
	return removed, errors.Join(errs...)
}

// kubeletChains are the iptables chains kubelet adds to the host (its
// canary, the hint for kube-proxy's mode, and KUBE-FIREWALL, which drops
// DNAT to 127.0.0.0/8 from outside): table, chain, and the built-in chains
// that jump to it.
var kubeletChains = []struct {
	table, chain string
	from         []string
}{
	{"filter", "KUBE-FIREWALL", []string{"INPUT", "OUTPUT"}},
	{"filter", "KUBE-KUBELET-CANARY", nil},
	{"mangle", "KUBE-KUBELET-CANARY", nil},
	{"nat", "KUBE-KUBELET-CANARY", nil},
	{"mangle", "KUBE-IPTABLES-HINT", nil},
}

// removeKubeletChains deletes kubelet's chains, and the jumps to them,
// with iptables and ip6tables; chains that are not there are no error.
func removeKubeletChains() (chains, jumps int) {
	for _, bin := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		for _, c := range kubeletChains {
			if exec.Command(bin, "-t", c.table, "-n", "-L", c.chain).Run() != nil {
				continue
			}
			for _, from := range c.from {
				// -D removes one jump a call; repeat until none is left.
				deleteJump := func() bool { return exec.Command(bin, "-t", c.table, "-D", from, "-j", c.chain).Run() == nil }
				for deleted := deleteJump(); deleted; deleted = deleteJump() {
					jumps++
				}
			}
			_ = exec.Command(bin, "-t", c.table, "-F", c.chain).Run()
			if exec.Command(bin, "-t", c.table, "-X", c.chain).Run() == nil {
				chains++
			}
		}
	}
	return chains, jumps
}

// recordNetns saves the names of the network namespaces pinned before the
// run, so teardown removes only the ones the run's pods added.
func recordNetns(file string) error {
	entries, _ := os.ReadDir(netnsDir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return writeFile(file, []byte(strings.Join(names, "\n")+"\n"))
}

// removeNetns unpins the CRI's network namespaces (cni-*) that were not
// there before the run.
func removeNetns(beforeFile string) (int, error) {
	before := map[string]bool{}
	if b, err := os.ReadFile(beforeFile); err == nil {
		for _, n := range strings.Fields(string(b)) {
			before[n] = true
		}
	}
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return 0, nil
	}
	var errs []error
	n := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "cni-") || before[e.Name()] {
			continue
		}
		p := filepath.Join(netnsDir, e.Name())
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("umount %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
