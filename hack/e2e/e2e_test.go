//go:build linux

package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/openeuler/urma-k8s/hack/internal/imagespec"
)

func TestParseOptions(t *testing.T) {
	now := time.Date(2026, 11, 30, 18, 0, 5, 0, time.UTC)
	root := t.TempDir()
	o, err := parseOptions([]string{"-root", root}, io.Discard, now)
	if err != nil {
		t.Fatal(err)
	}
	if o.work != "/tmp/urma-e2e" || o.binDir != filepath.Join(root, "bin") || o.logs != "/tmp/urma-e2e-logs/20261130-180005" {
		t.Errorf("defaults = work %q bin %q logs %q", o.work, o.binDir, o.logs)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-root", root, "-work", "relative"}, "absolute path"},
		{[]string{"-root", root, "-work", "/"}, "absolute path below /"},
		{[]string{"-root", root, "-timeout", "0s"}, "must be positive"},
		{[]string{"-root", root, "extra"}, "unexpected arguments"},
	} {
		if _, err := parseOptions(tc.args, io.Discard, now); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseOptions(%q) error = %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestPickNodeIP(t *testing.T) {
	if ip, err := pickNodeIP("192.0.2.7"); err != nil || ip != "192.0.2.7" {
		t.Errorf("pickNodeIP(192.0.2.7) = %q, %v", ip, err)
	}
	for _, bad := range []string{"127.0.0.1", "::1", "fd00::2", "nonsense"} {
		if _, err := pickNodeIP(bad); err == nil {
			t.Errorf("pickNodeIP(%q) accepted", bad)
		}
	}
}

func TestFirstServiceIP(t *testing.T) {
	ip, err := firstServiceIP()
	if err != nil || ip.String() != "10.96.0.1" {
		t.Errorf("firstServiceIP() = %v, %v; want 10.96.0.1 (the kubernetes Service's ClusterIP in %s)", ip, err, serviceCIDR)
	}
}

const clientLog = `"level"=0 "msg"="URMA provider chosen" "role"="client" "provider"="soft-socket" "choice"="auto"
"level"=0 "msg"="URMA ready" "role"="client" "provider"="soft-socket" "device"="udma0"
`

func TestParsePerfRun(t *testing.T) {
	report := `{
  "server": "10.244.0.4:7000", "size": 4096, "concurrency": 2, "durationSeconds": 3, "requests": 10,
  "qps": 3.3, "sentBytesPerSec": 100, "urmaConns": 1, "tcpConns": 1,
  "conns": [
    {"mode": "urma", "local": "a", "requests": 6},
    {"mode": "tcp", "local": "b", "requests": 4, "fallbackReason": "peer_declined"}
  ]
}`
	rep, fabrics, err := parsePerfRun(report, clientLog)
	if err != nil {
		t.Fatal(err)
	}
	if rep.URMAConns != 1 || len(fabrics) != 2 || fabrics[0] != "provider soft-socket" {
		t.Errorf("report %+v, fabrics %q", rep, fabrics)
	}
	if got := fabricSummary(&perfRun{report: rep, fabrics: fabrics}); got != "provider soft-socket x1" {
		t.Errorf("fabricSummary = %q", got)
	}
	text := formatPerfRuns([]*perfRun{{label: "URMA", report: rep, fabrics: fabrics}})
	for _, want := range []string{"URMA conn 0: URMA, provider soft-socket, 6 requests", "URMA conn 1: TCP, -, 4 requests, fell back: peer_declined"} {
		if !strings.Contains(text, want) {
			t.Errorf("formatPerfRuns lacks %q:\n%s", want, text)
		}
	}

	// What urma-perf reports per connection wins over the process's log:
	// its provider, and a fabric above all.
	perConn := strings.Replace(report, `{"mode": "urma", "local": "a"`, `{"mode": "urma", "provider": "soft-shm", "local": "a"`, 1)
	if _, fabrics, err := parsePerfRun(perConn, clientLog); err != nil || fabrics[0] != "provider soft-shm" {
		t.Errorf("per-connection provider: %q, %v", fabrics, err)
	}
	perConn = strings.Replace(report, `{"mode": "urma", "local": "a"`, `{"mode": "urma", "provider": "soft-shm", "fabric": "shm", "local": "a"`, 1)
	if _, fabrics, err := parsePerfRun(perConn, clientLog); err != nil || fabrics[0] != "fabric shm" {
		t.Errorf("per-connection fabric: %q, %v", fabrics, err)
	}
	// No provider logged: the fabric is unknown, not guessed.
	if _, fabrics, err := parsePerfRun(report, ""); err != nil || fabrics[0] != "" {
		t.Errorf("no log: fabrics %q, %v", fabrics, err)
	}

	for _, tc := range []struct{ name, out, want string }{
		{"not json", "warning: x", "not urma-perf client's JSON"},
		{"no conns", `{"requests": 3, "conns": []}`, "no connection"},
		{"no requests", `{"requests": 0, "conns": [{"mode": "urma"}]}`, "no request completed"},
	} {
		if _, _, err := parsePerfRun(tc.out, ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/urma-e2e/a`:       "/tmp/urma-e2e/a",
		`/tmp/with\040space`:    "/tmp/with space",
		`/tmp/tab\011and\134bs`: "/tmp/tab\tand\\bs",
		`/tmp/trailing\04`:      `/tmp/trailing\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRemoveDevNodesTouchesOnlyDevUburma(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "keep-me")
	if err := os.WriteFile(victim, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(dir, "created-dev-nodes")
	if err := os.WriteFile(list, []byte(victim+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := removeDevNodes(list); err == nil || !strings.Contains(err.Error(), "left alone") {
		t.Errorf("removeDevNodes error = %v, want it to refuse a path outside %s", err, hostDevDir)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("%s was removed: %v", victim, err)
	}
	if err := removeDevNodes(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("no list file (nothing created): %v", err)
	}
}

func TestRemoveHostDirsTouchesOnlyKnownDirs(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "keep-me")
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(dir, "created-host-dirs")
	if err := os.WriteFile(list, []byte(victim+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	removed, err := removeHostDirs(list)
	if err == nil || len(removed) != 0 || !strings.Contains(err.Error(), "left alone") {
		t.Errorf("removeHostDirs = %v, %v; want a refusal", removed, err)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("%s was removed: %v", victim, err)
	}
}

func TestWaitExitAndProcessAlive(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pid := cmd.Process.Pid
	if !processAlive(pid) {
		t.Fatal("a running process reads as not alive")
	}
	if waitExit(pid, 50*time.Millisecond) {
		t.Fatal("waitExit reported the exit of a process that still runs")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if !waitExit(pid, 10*time.Second) {
		t.Fatal("waitExit missed the exit")
	}
	<-done
	if processAlive(pid) {
		t.Error("a reaped process reads as alive")
	}
}

func TestParseManifest(t *testing.T) {
	objs, err := parseManifest("---\n# Source: a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n# only a comment\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: b\n  namespace: x\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[0].GetKind() != "ConfigMap" || objs[1].GetNamespace() != "x" {
		t.Errorf("parseManifest = %v", objs)
	}
}

func TestBuildImage(t *testing.T) {
	var perf imagespec.Spec
	for _, s := range imagespec.Project {
		if s.Name == "urma-perf" {
			perf = s
		}
	}
	img := buildImage(perf, []byte("bin"), []byte("lib"))
	if img.Name != "e2e.local/urma-k8s/urma-perf:e2e" || img.Config.User != "65532:65532" || img.Config.Entrypoint[0] != "/usr/local/bin/urma-perf" {
		t.Errorf("image = %+v", img)
	}
	if got := img.Config.Labels["org.opencontainers.image.licenses"]; got != imagespec.License {
		t.Errorf("licenses label = %q, want %q", got, imagespec.License)
	}
	var found bool
	for _, f := range img.Files {
		if f.Path == "/usr/local/bin/urma-perf" && bytes.Equal(f.Data, []byte("bin")) && f.Mode == 0o755 {
			found = true
		}
	}
	if !found {
		t.Error("the binary is not at /usr/local/bin/urma-perf, mode 0755")
	}
	for _, f := range img.Files {
		if f.Path == imagespec.LiburmaPath {
			t.Error("the urma-perf image carries liburma, which only the node agents' do")
		}
	}
	dp := buildImage(imagespec.Project[0], []byte("bin"), []byte("lib"))
	if f := dp.Files[len(dp.Files)-1]; f.Path != imagespec.LiburmaPath || string(f.Data) != "lib" {
		t.Errorf("the %s image does not carry liburma at %s: %+v", imagespec.Project[0].Name, imagespec.LiburmaPath, f)
	}
	p := buildImage(pauseImage, []byte("pause"), nil)
	if p.Config.Entrypoint[0] != "/pause" || p.Config.User != "65535:65535" {
		t.Errorf("pause entrypoint = %v, user %s", p.Config.Entrypoint, p.Config.User)
	}
	for _, f := range p.Files {
		if strings.HasPrefix(f.Path, "/usr/local/bin") {
			t.Errorf("the pause image holds %s", f.Path)
		}
	}
}

func TestCgroupLayoutNamesThisHost(t *testing.T) {
	got, err := cgroupLayout()
	if err != nil {
		t.Skipf("no cgroup filesystem: %v", err)
	}
	if !strings.HasPrefix(got, "v1") && !strings.HasPrefix(got, "v2") && !strings.HasPrefix(got, "hybrid") {
		t.Errorf("cgroupLayout = %q", got)
	}
}

// The pods' shm directory is a hostPath the chart creates on the host
// (shmDir, for both drivers) and the transports leave sockets in: teardown
// must know it as a host directory the run may create, or every run leaves
// it behind with its stale sockets.
func TestHostDirsCoverTheChartsShmDirs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "charts", "urma-k8s", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		DevicePlugin struct {
			ShmDir string `json:"shmDir"`
		} `json:"devicePlugin"`
		DRADriver struct {
			ShmDir string `json:"shmDir"`
		} `json:"draDriver"`
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatalf("charts/urma-k8s/values.yaml: %v", err)
	}
	for name, dir := range map[string]string{"devicePlugin.shmDir": values.DevicePlugin.ShmDir, "draDriver.shmDir": values.DRADriver.ShmDir} {
		if dir == "" {
			t.Errorf("%s is empty in values.yaml", name)
			continue
		}
		covered := false
		for _, h := range hostDirs {
			rel, err := filepath.Rel(h, dir)
			covered = covered || (err == nil && rel != ".." && !strings.HasPrefix(rel, "../"))
		}
		if !covered {
			t.Errorf("%s %s is under none of teardown's host directories %v", name, dir, hostDirs)
		}
	}
}

// TestQuickStartPods checks that the run creates the quick start's own pods
// (examples/quick-start/pods.yaml): renamed, in the run's namespace, on the
// run's image, with everything else, the pod affinity included, as a reader
// applies it.
func TestQuickStartPods(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "quick-start", "pods.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pods, err := parseQuickStartPods(b, "s", "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 2 || pods[0].Name != "s" || pods[1].Name != "c" {
		t.Fatalf("pods = %v, want s and c", pods)
	}
	for _, p := range pods {
		c := p.Spec.Containers[0]
		if p.Namespace != testNS || c.Image != imageName("urma-perf") || c.ImagePullPolicy != "Never" {
			t.Errorf("pod %s: namespace %s, image %s (%s); want %s, %s, Never", p.Name, p.Namespace, c.Image, c.ImagePullPolicy, testNS, imageName("urma-perf"))
		}
	}
	if a := pods[1].Spec.Affinity; a == nil || a.PodAffinity == nil || len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Errorf("the client lost the manifest's pod affinity: %+v", a)
	}

	for _, bad := range []struct{ name, from, to, want string }{
		{"another endpoint", "urma.openeuler.org/endpoint: perf", "urma.openeuler.org/endpoint: other", `labelled for endpoint "other"`},
		{"another image", "ghcr.io/openeuler/urma-perf:", "ghcr.io/openeuler/urma-operator:", "not urma-perf"},
		{"a misspelt field", "containerPort:", "containerPorts:", "containerPorts"},
		{"a pod missing", "name: perf-client", "name: perf-other", "no pod perf-client"},
	} {
		_, err := parseQuickStartPods([]byte(strings.ReplaceAll(string(b), bad.from, bad.to)), "s", "c")
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: err = %v, want one saying %q", bad.name, err, bad.want)
		}
	}
}

func TestParseCperf(t *testing.T) {
	good := "liburma /opt/urma-k8s/lib/liburma.so.0\ndevice soft0 eid fd75726d6173\nurma 1048576 2.000\ntcp 4194304 2.000\nOK\n"
	res, err := parseCperf(good)
	if err != nil || res.liburma != "/opt/urma-k8s/lib/liburma.so.0" || res.device != "soft0" || res.urmaBytes != 1<<20 || res.tcpBytes != 4<<20 || res.tcpSecond != 2 {
		t.Fatalf("parseCperf = %+v, %v", res, err)
	}
	for name, out := range map[string]string{
		"no OK":            strings.TrimSuffix(good, "OK\n"),
		"no URMA run":      strings.Replace(good, "urma 1048576 2.000\n", "", 1),
		"a bad byte count": strings.Replace(good, "tcp 4194304", "tcp many", 1),
		"zero seconds":     strings.Replace(good, "urma 1048576 2.000", "urma 1048576 0", 1),
	} {
		if _, err := parseCperf(out); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestLddPaths(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n\tliburma.so.0 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f11)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f22)\n"
	var got []string
	for _, m := range lddPathRE.FindAllStringSubmatch(out, -1) {
		got = append(got, m[1])
	}
	if want := []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}; !slices.Equal(got, want) {
		t.Errorf("ldd paths %v, want %v", got, want)
	}
}
