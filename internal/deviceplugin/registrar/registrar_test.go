package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openeuler/urma-k8s/internal/deviceplugin/kubelettest"
	"github.com/openeuler/urma-k8s/internal/deviceplugin/server"
	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

const resource = "urma.openeuler.org/jetty"

func socketDir(t *testing.T) string {
	t.Helper()
	dir, cleanup, err := kubelettest.SocketDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	return dir
}

// waitBound is how long a test waits for an event before failing: 15 s,
// or an eighth of what is left before the test binary's own deadline when
// that is shorter. Under `make mutation` gremlins gives each run a few
// times the package's normal test time and counts a run it has to kill as
// TIMED OUT, neither killed nor lived; a mutant that stops an event from
// happening must fail the wait well before that. Nothing asserts speed: a
// passing run sees its events in milliseconds.
func waitBound(t *testing.T) time.Duration {
	bound := 15 * time.Second
	if deadline, ok := t.Deadline(); ok {
		bound = min(bound, time.Until(deadline)/8)
	}
	return bound
}

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound(t))
	t.Cleanup(cancel)
	return ctx
}

type plugin struct {
	reg  *Registrar
	inv  *inventory.Inventory
	stop func()
}

// startPlugin runs a registrar over an inventory with one device of 3 units.
func startPlugin(t *testing.T, dir string, mutate func(*Config)) *plugin {
	t.Helper()
	return startPluginWith(t, dir, mutate, testr.New(t), nil)
}

// startPluginWith is startPlugin with a logger of the test's choice and a
// hook that sees the registrar before it runs.
func startPluginWith(t *testing.T, dir string, mutate func(*Config), log logr.Logger, before func(*Registrar)) *plugin {
	t.Helper()
	inv := inventory.New(16)
	inv.Publish(inventory.Snapshot{JettiesPerUnit: 16, Devices: []inventory.Device{
		{Name: "udma0", Healthy: true, NUMANode: 0, Budget: budget.Budget{Units: 3, Jetties: 48}, DevNode: "/dev/uburma/udma0"},
	}})
	m := metrics.New()
	cfg := Config{
		SocketDir: dir, ResourceName: resource, Options: server.Options(),
		CheckInterval: time.Hour, BackoffInitial: time.Millisecond, BackoffMax: 20 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	reg := New(cfg, server.New(server.Config{}, inv, log, m), log, m)
	if before != nil {
		before(reg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	p := &plugin{reg: reg, inv: inv}
	stopped := false
	p.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		case <-time.After(waitBound(t)):
			t.Errorf("Run did not return after its context was canceled")
		}
	}
	t.Cleanup(p.stop)
	return p
}

func startKubelet(t *testing.T, dir string) *kubelettest.Kubelet {
	t.Helper()
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

// listed waits until the kubelet has n registrations and a ListAndWatch
// list of want units.
func listed(t *testing.T, k *kubelettest.Kubelet, registrations, units int) kubelettest.State {
	t.Helper()
	s, err := k.WaitFor(waitCtx(t), func(s kubelettest.State) bool {
		p, ok := s.Plugins[resource]
		return s.Registrations[resource] == registrations && ok && p.Streaming && len(p.Devices) == units
	})
	if err != nil {
		t.Fatalf("%v; state %+v", err, s)
	}
	return s
}

func TestRegisters(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	p := startPlugin(t, dir, nil)
	s := listed(t, k, 1, 3)
	pl := s.Plugins[resource]
	if pl.Request.Version != pluginapi.Version || pl.Request.Endpoint != DefaultSocketName {
		t.Errorf("registration %+v", pl.Request)
	}
	if !pl.Options.GetPreferredAllocationAvailable || !pl.Request.Options.GetPreferredAllocationAvailable {
		t.Errorf("options %+v / %+v", pl.Options, pl.Request.Options)
	}
	if pl.Devices[0].ID != "udma0-0" || pl.Devices[0].Topology.Nodes[0].ID != 0 {
		t.Errorf("devices %v", pl.Devices)
	}
	eventually.Holds(t, "registered state", waitBound(t), func() bool { return p.reg.Serving() && p.reg.Registered() })
	// kubelet allocates through the registered endpoint.
	resp, err := k.Client(resource).Allocate(waitCtx(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"udma0-1"}}}})
	if err != nil || resp.ContainerResponses[0].Envs[podenv.JettyBudget] != "16" {
		t.Fatalf("Allocate via kubelet: %v, %v", resp, err)
	}
}

func TestUpdatesReachKubelet(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	p := startPlugin(t, dir, nil)
	listed(t, k, 1, 3)
	p.inv.Publish(inventory.Snapshot{JettiesPerUnit: 16, Devices: []inventory.Device{
		{Name: "udma0", Healthy: false, Reason: "no EID", NUMANode: 0, Budget: budget.Budget{Units: 3, Jetties: 48}},
		{Name: "udma1", Healthy: true, NUMANode: 1, Budget: budget.Budget{Units: 2, Jetties: 32}, DevNode: "/dev/uburma/udma1"},
	}})
	s := listed(t, k, 1, 5)
	for _, d := range s.Plugins[resource].Devices {
		if want := strings.HasPrefix(d.ID, "udma1"); (d.Health == pluginapi.Healthy) != want {
			t.Errorf("%s is %s", d.ID, d.Health)
		}
	}
}

func TestStartsBeforeKubelet(t *testing.T) {
	dir := socketDir(t)
	p := startPlugin(t, dir, nil)
	// Serving, though there is no kubelet to register with yet.
	eventually.Holds(t, "serving without a kubelet", waitBound(t), p.reg.Serving)
	if p.reg.Registered() {
		t.Fatal("registered without a kubelet")
	}
	k := startKubelet(t, dir)
	listed(t, k, 1, 3)
}

// While kubelet is away, registration is retried with a doubling delay up
// to BackoffMax, and said at the default verbosity only on the first
// failure and then every twelfth (about once a minute at the defaults).
func TestRegistrationRetriesBackOffAndLogSparingly(t *testing.T) {
	dir := socketDir(t)
	logs := &logtest.Lines{}
	delays := make(chan time.Duration, 64)
	p := startPluginWith(t, dir, nil, logs.Logger(t), func(r *Registrar) {
		r.retryIn = func(d time.Duration) {
			select {
			case delays <- d:
			default:
			}
		}
	})
	ms := time.Millisecond
	want := []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 20 * ms, 20 * ms, 20 * ms, 20 * ms, 20 * ms, 20 * ms, 20 * ms, 20 * ms}
	for i, w := range want {
		select {
		case got := <-delays:
			if got != w {
				t.Errorf("retry %d after %v, want %v", i+1, got, w)
			}
		case <-time.After(waitBound(t)):
			t.Fatalf("no retry %d", i+1)
		}
	}
	p.stop()
	// Each failure is one line; the first and the twelfth at level 0.
	levels := map[int]string{}
	for _, line := range logs.All() {
		if !strings.Contains(line, "registration with kubelet failed; retrying") {
			continue
		}
		var attempt int
		if i := strings.LastIndex(line, `"attempt"=`); i < 0 {
			t.Fatalf("failure line without its attempt: %s", line)
		} else if _, err := fmt.Sscanf(line[i:], `"attempt"=%d`, &attempt); err != nil {
			t.Fatalf("failure line %q: %v", line, err)
		}
		if _, dup := levels[attempt]; dup {
			t.Errorf("attempt %d logged twice", attempt)
		}
		at := strings.Index(line, `"level"=`)
		if at < 0 {
			t.Fatalf("failure line without its level: %s", line)
		}
		levels[attempt] = line[at:][:len(`"level"=0`)]
	}
	for attempt := 1; attempt <= len(want); attempt++ {
		wantLevel := `"level"=1`
		if attempt == 1 || attempt == 12 {
			wantLevel = `"level"=0`
		}
		if levels[attempt] != wantLevel {
			t.Errorf("attempt %d logged at %q, want %s", attempt, levels[attempt], wantLevel)
		}
	}
}

// A kubelet.sock that appears anew makes the plugin serve afresh and
// register again; while registering fails the plugin still says it serves
// (its /healthz stays 200), its socket being served.
func TestServingWhileReRegistrationFails(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	logs := &logtest.Lines{}
	p := startPluginWith(t, dir, nil, logs.Logger(t), nil)
	listed(t, k, 1, 3)
	// kubelet lists us before our Register call has returned; stopped
	// then, the call fails and is retried before kubelet.sock's creation
	// is handled.
	eventually.Holds(t, "registered", waitBound(t), p.reg.Registered)
	k.Stop()
	// Not a kubelet: registering with it fails.
	if err := os.WriteFile(filepath.Join(dir, kubeletSocketName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, "registration dropped for the new kubelet.sock", waitBound(t), func() bool { return !p.reg.Registered() })
	// Several failed attempts: a retry while serving must register again
	// on the socket it serves, not serve afresh each time (which would
	// also drop the stream of a kubelet that follows it).
	eventually.Holds(t, "failed re-registrations", waitBound(t), func() bool { return logs.Count("registration with kubelet failed") >= 3 })
	// Only now: while the old server is stopped and the new one not yet
	// up, the plugin rightly says it does not serve.
	if !p.reg.Serving() {
		t.Fatal("not serving while re-registering, though the socket is served")
	}
	p.stop()
	// Served at start, and once more for the new kubelet.sock (ending
	// any stream the old kubelet still follows), not again per attempt.
	if n := logs.Count(`"msg"="serving the device plugin"`); n != 2 {
		t.Errorf("served %d times, want twice:\n%s", n, logs.String())
	}
}

// While the plugin cannot serve its socket (here a directory holds its
// path), a kubelet starting must neither make it claim to serve (its
// /healthz would answer 200 though kubelet cannot reach it) nor make it
// give up serving: once the path is free it serves and registers.
func TestKubeletStartsWhileTheSocketCannotBeServed(t *testing.T) {
	dir := socketDir(t)
	blocker := filepath.Join(dir, DefaultSocketName)
	if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &logtest.Lines{}
	// One value per failed attempt: whether kubelet.sock's creation had
	// been handled (the log line comes first, on the same goroutine).
	attempts := make(chan bool, 64)
	p := startPluginWith(t, dir, nil, logs.Logger(t), func(r *Registrar) {
		r.retryIn = func(time.Duration) {
			select {
			case attempts <- logs.Contains("kubelet.sock created"):
			default:
			}
		}
	})
	waitAttempt := func(what string, seen bool) {
		t.Helper()
		timeout := time.After(waitBound(t))
		for {
			select {
			case got := <-attempts:
				if got == seen {
					return
				}
			case <-timeout:
				t.Fatalf("timed out waiting for %s:\n%s", what, logs.String())
			}
		}
	}
	// The first attempt failed, so the directory is watched.
	waitAttempt("a failed attempt to serve", false)
	k := startKubelet(t, dir)
	waitAttempt("an attempt after kubelet.sock appeared", true)
	if p.reg.Serving() || p.reg.Registered() {
		t.Fatalf("serving %v, registered %v while the socket path is a directory:\n%s", p.reg.Serving(), p.reg.Registered(), logs.String())
	}
	// It kept trying to serve, and did not call a kubelet that would dial
	// back a socket nobody serves: nothing but the path coming free
	// (whose removal event this plugin sees, but a full disk's end, say,
	// raises none) would have brought it back to serving.
	if logs.Contains("registration with kubelet failed") {
		t.Fatalf("registered with kubelet while not serving:\n%s", logs.String())
	}
	// Moved away in one step: removed piecemeal, the emptied directory is
	// removed by the plugin's own retry, which serves there before
	// RemoveAll's last unlink.
	gone := filepath.Join(dir, "blocker-gone")
	if err := os.Rename(blocker, gone); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	listed(t, k, 1, 3)
}

// A socket left by a previous run is replaced without complaint, and a
// clean stop removes ours without logging an error.
func TestStaleSocketAndCleanStopLogNoErrors(t *testing.T) {
	dir := socketDir(t)
	sock := filepath.Join(dir, DefaultSocketName)
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, dir)
	logs := &logtest.Lines{}
	p := startPluginWith(t, dir, nil, logs.Logger(t), nil)
	listed(t, k, 1, 3)
	p.stop()
	for _, bad := range []string{"cannot serve the device plugin socket", "gRPC server failed", "cannot remove our socket"} {
		if logs.Contains(bad) {
			t.Errorf("logged %q:\n%s", bad, logs.String())
		}
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("our socket after a clean stop: %v, want it removed", err)
	}
}

func TestKubeletRestart(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	startPlugin(t, dir, nil)
	listed(t, k, 1, 3)
	for i := range 3 {
		var err error
		k, err = k.Restart()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Stop)
		// The new kubelet knows nothing; the plugin must come back by itself.
		listed(t, k, 1, 3)
		if _, err := os.Stat(filepath.Join(dir, DefaultSocketName)); err != nil {
			t.Fatalf("restart %d: our socket: %v", i, err)
		}
	}
}

func TestOwnSocketRemoved(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	startPlugin(t, dir, nil)
	listed(t, k, 1, 3)
	if err := os.Remove(filepath.Join(dir, DefaultSocketName)); err != nil {
		t.Fatal(err)
	}
	listed(t, k, 2, 3)
}

func TestPeriodicCheckWithoutFsnotify(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	startPlugin(t, dir, func(c *Config) {
		c.pollOnly = true
		c.CheckInterval = 5 * time.Millisecond
	})
	listed(t, k, 1, 3)
	// A restart whose events nobody sees: the inode checks must notice.
	k, err := k.Restart()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	listed(t, k, 1, 3)
	// kubelet.sock replaced while our socket survives. A hard link keeps
	// the old inode allocated so that the new kubelet.sock cannot reuse it:
	// with coarse timestamps the two would otherwise look identical to a
	// stat (a real kubelet restart takes long enough to differ).
	if err := os.Link(filepath.Join(dir, kubeletSocketName), filepath.Join(dir, "old-kubelet.sock")); err != nil {
		t.Fatal(err)
	}
	k.Stop()
	k2 := startKubelet(t, dir)
	listed(t, k2, 1, 3)
	// Our socket removed while kubelet stays: the check serves and
	// registers again.
	if err := os.Remove(filepath.Join(dir, DefaultSocketName)); err != nil {
		t.Fatal(err)
	}
	listed(t, k2, 2, 3)
}

func TestShutdownRemovesSocketAndGoroutines(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	base := runtime.NumGoroutine()
	p := startPlugin(t, dir, nil)
	listed(t, k, 1, 3)
	p.stop()
	if _, err := os.Stat(filepath.Join(dir, DefaultSocketName)); !os.IsNotExist(err) {
		t.Fatalf("socket after shutdown: %v", err)
	}
	if p.reg.Serving() || p.reg.Registered() {
		t.Fatal("state not cleared on shutdown")
	}
	// The kubelet's stream to us has ended; let its goroutines settle.
	if _, err := k.WaitFor(waitCtx(t), func(s kubelettest.State) bool { return !s.Plugins[resource].Streaming }); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(waitBound(t))
	for runtime.NumGoroutine() > base {
		if time.Now().After(end) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines %d > %d:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
	}
}

func TestRemoveOwnSocketLeavesForeignFile(t *testing.T) {
	dir := socketDir(t)
	r := New(Config{SocketDir: dir, ResourceName: resource}, server.New(server.Config{}, inventory.New(16), testr.New(t), nil), testr.New(t), nil)
	s, err := r.serve()
	if err != nil {
		t.Fatal(err)
	}
	ours := s.ino
	s.srv.Stop()
	<-s.done
	if _, err := os.Stat(r.SocketPath()); err != nil {
		t.Fatalf("stopping the server unlinked the socket: %v", err)
	}
	// Another instance took the path over (e.g. a rolling update).
	if err := os.Remove(r.SocketPath()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.SocketPath(), []byte("someone else's"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.removeOwnSocket(ours)
	if b, err := os.ReadFile(r.SocketPath()); err != nil || string(b) != "someone else's" {
		t.Fatalf("foreign file at our path: %q, %v", b, err)
	}
	if err := os.Remove(r.SocketPath()); err != nil {
		t.Fatal(err)
	}
	s, err = r.serve()
	if err != nil {
		t.Fatal(err)
	}
	s.srv.Stop()
	<-s.done
	r.removeOwnSocket(s.ino)
	if _, err := os.Stat(r.SocketPath()); !os.IsNotExist(err) {
		t.Fatalf("our own socket survived removeOwnSocket: %v", err)
	}
}

func TestDefaults(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		in   Config
		want Config
	}{
		{"unset", Config{}, Config{CheckInterval: DefaultCheckInterval, BackoffInitial: DefaultBackoffInitial, BackoffMax: DefaultBackoffMax, RegisterTimeout: DefaultRegisterTimeout}},
		{"negative", Config{CheckInterval: -ms, BackoffInitial: -ms, RegisterTimeout: -ms}, Config{CheckInterval: DefaultCheckInterval, BackoffInitial: DefaultBackoffInitial, BackoffMax: DefaultBackoffMax, RegisterTimeout: DefaultRegisterTimeout}},
		{"set", Config{CheckInterval: ms, BackoffInitial: 2 * ms, BackoffMax: 3 * ms, RegisterTimeout: 4 * ms}, Config{CheckInterval: ms, BackoffInitial: 2 * ms, BackoffMax: 3 * ms, RegisterTimeout: 4 * ms}},
		{"backoff max equal to initial", Config{BackoffInitial: 2 * ms, BackoffMax: 2 * ms}, Config{CheckInterval: DefaultCheckInterval, BackoffInitial: 2 * ms, BackoffMax: 2 * ms, RegisterTimeout: DefaultRegisterTimeout}},
		{"backoff max below initial", Config{BackoffInitial: 2 * ms, BackoffMax: ms}, Config{CheckInterval: DefaultCheckInterval, BackoffInitial: 2 * ms, BackoffMax: DefaultBackoffMax, RegisterTimeout: DefaultRegisterTimeout}},
		{"initial above the default max", Config{BackoffInitial: 2 * DefaultBackoffMax}, Config{CheckInterval: DefaultCheckInterval, BackoffInitial: 2 * DefaultBackoffMax, BackoffMax: 2 * DefaultBackoffMax, RegisterTimeout: DefaultRegisterTimeout}},
	}
	for _, tt := range tests {
		got := tt.in
		got.defaults()
		tt.want.SocketDir, tt.want.SocketName = DefaultSocketDir, DefaultSocketName
		if got != tt.want {
			t.Errorf("%s: defaults() = %+v\nwant %+v", tt.name, got, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	long := "/" + strings.Repeat("d", 100)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"ok", Config{ResourceName: resource}, ""},
		{"relative dir", Config{SocketDir: "plugins", ResourceName: resource}, "absolute"},
		{"name with slash", Config{SocketName: "a/b.sock", ResourceName: resource}, "plain file name"},
		{"kubelet's name", Config{SocketName: "kubelet.sock", ResourceName: resource}, "plain file name"},
		{"too long", Config{SocketDir: long, ResourceName: resource}, "unix sockets allow"},
		// The socket and kubelet.sock both 12 bytes: paths of 107 (the
		// limit, sun_path less its NUL) and 108 bytes.
		{"path at the limit", Config{SocketDir: "/" + strings.Repeat("d", 93), SocketName: "urma-12.sock", ResourceName: resource}, ""},
		{"path one beyond", Config{SocketDir: "/" + strings.Repeat("d", 94), SocketName: "urma-12.sock", ResourceName: resource}, "is 108 bytes; unix sockets allow 107"},
		{"no resource", Config{}, "resource name"},
		// Kubelet refuses to register anything but an extended resource
		// name; the plugin would retry that forever.
		{"resource without domain", Config{ResourceName: "jetty"}, "not an extended resource name"},
		{"resource in kubernetes.io", Config{ResourceName: "kubernetes.io/jetty"}, "not an extended resource name"},
		{"resource in a kubernetes.io subdomain", Config{ResourceName: "node.kubernetes.io/jetty"}, "not an extended resource name"},
		{"resource with requests. prefix", Config{ResourceName: "requests.example.com/jetty"}, "not an extended resource name"},
		{"resource with a space", Config{ResourceName: "example.com/urma jetty"}, "not an extended resource name"},
		{"resource with two slashes", Config{ResourceName: "example.com/a/b"}, "not an extended resource name"},
		{"resource with an empty name", Config{ResourceName: "example.com/"}, "not an extended resource name"},
		{"resource with a bad domain", Config{ResourceName: "Example_com/jetty"}, "not an extended resource name"},
		{"resource in another domain", Config{ResourceName: "example.com/jetty"}, ""},
		{"resource in a one-label domain", Config{ResourceName: "example/jetty"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want %q", err, tt.want)
			}
		})
	}
}

// replaceKubelet stops k and starts a new fake kubelet whose kubelet.sock is
// a new file: a hard link keeps the old inode allocated so that the new
// socket cannot reuse it (with coarse timestamps the two would otherwise
// look identical to a stat).
func replaceKubelet(t *testing.T, k *kubelettest.Kubelet) *kubelettest.Kubelet {
	t.Helper()
	old := filepath.Join(k.Dir(), fmt.Sprintf("old-kubelet-%d.sock", time.Now().UnixNano()))
	if err := os.Link(filepath.Join(k.Dir(), kubeletSocketName), old); err != nil {
		t.Fatal(err)
	}
	k.Stop()
	return startKubelet(t, k.Dir())
}

// Serving removes a stale file at our path itself, and fsnotify reports
// that removal after the new socket is up: it must not be taken for
// someone removing ours, which would serve again (dropping kubelet's
// stream) and remove the new socket in turn, and so on.
func TestOwnStaleSocketRemovalIsNotAnotherRemoval(t *testing.T) {
	dir := socketDir(t)
	if err := os.WriteFile(filepath.Join(dir, DefaultSocketName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, dir)
	logs := &logtest.Lines{}
	startPluginWith(t, dir, nil, logs.Logger(t), nil)
	listed(t, k, 1, 3)
	// A kubelet restart that leaves our socket alone: its Create event is
	// queued after our removal's, so once the new kubelet has us, the
	// removal's event was handled.
	k2 := replaceKubelet(t, k)
	listed(t, k2, 1, 3)
	// At start, and once for the new kubelet (see reregister); the
	// removal's event must not add another.
	if n := logs.Count("serving the device plugin"); n != 2 {
		t.Errorf("served %d times, want twice:\n%s", n, logs.String())
	}
	if logs.Contains("our socket was removed") {
		t.Errorf("our own removal of the stale file was taken for someone else's:\n%s", logs.String())
	}
}

// registrationServer is a kubelet whose Register runs a hook first.
type registrationServer struct {
	pluginapi.UnimplementedRegistrationServer
	during func()
}

func (s *registrationServer) Register(context.Context, *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	s.during()
	return &pluginapi.Empty{}, nil
}

// A kubelet that restarts while our Register call to it is in flight: the
// call succeeds against the old one, and the new kubelet.sock must still
// bring a registration with the new kubelet.
func TestKubeletRestartDuringRegistration(t *testing.T) {
	dir := socketDir(t)
	sock := filepath.Join(dir, kubeletSocketName)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	newKubelet := make(chan *kubelettest.Kubelet, 1)
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, &registrationServer{during: func() {
		select {
		case k := <-newKubelet:
			newKubelet <- k // restarted already
			return
		default:
		}
		if err := os.Link(sock, filepath.Join(dir, "old-kubelet.sock")); err != nil {
			t.Error(err)
		}
		k, err := kubelettest.Start(dir)
		if err != nil {
			t.Error(err)
		}
		newKubelet <- k
	}})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	startPlugin(t, dir, nil)
	var k *kubelettest.Kubelet
	select {
	case k = <-newKubelet:
		newKubelet <- k
	case <-waitCtx(t).Done():
		t.Fatal("the plugin never called Register")
	}
	if k == nil {
		t.FailNow()
	}
	t.Cleanup(k.Stop)
	listed(t, k, 1, 3)
}

// kubelet.sock replaced in one step (renamed over), so that it is never
// missing: the periodic check alone must see the new one and register
// with it.
func TestPeriodicCheckSeesKubeletSockRenamedOver(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	startPlugin(t, dir, func(c *Config) {
		c.pollOnly = true
		c.CheckInterval = 5 * time.Millisecond
	})
	listed(t, k, 1, 3)
	// The new kubelet serves in a directory of its own, where a symbolic
	// link to our socket lets it dial us back (a hard link would change
	// our socket's ctime, and so its identity), until its socket is renamed
	// over the old kubelet's.
	dir2 := socketDir(t)
	if err := os.Symlink(filepath.Join(dir, DefaultSocketName), filepath.Join(dir2, DefaultSocketName)); err != nil {
		t.Fatal(err)
	}
	k2 := startKubelet(t, dir2)
	if err := os.Rename(filepath.Join(dir2, kubeletSocketName), filepath.Join(dir, kubeletSocketName)); err != nil {
		t.Fatal(err)
	}
	listed(t, k2, 1, 3)
}

// kubelet.sock's identity changing while kubelet goes on (a chmod, chown
// or SELinux relabel changes its ctime) looks like a kubelet restart. The
// kubelet still follows our stream and refuses a second registration on
// the same socket (see kubelettest), so the plugin must end that stream by
// serving afresh before it registers again, not register beside it.
func TestKubeletSockChangedWhileKubeletStays(t *testing.T) {
	dir := socketDir(t)
	k := startKubelet(t, dir)
	p := startPlugin(t, dir, func(c *Config) {
		c.pollOnly = true
		c.CheckInterval = 5 * time.Millisecond
	})
	listed(t, k, 1, 3)
	touchKubeletSock(t, dir)
	listed(t, k, 2, 3)
	eventually.Holds(t, "registered again", waitBound(t), p.reg.Registered)
}

// touchKubeletSock changes kubelet.sock's identity without replacing it,
// as a chmod or relabel under a running kubelet does.
func touchKubeletSock(t *testing.T, dir string) {
	t.Helper()
	sock := filepath.Join(dir, kubeletSocketName)
	before := inode(sock)
	for mode := os.FileMode(0o600); inode(sock) == before; mode ^= 0o100 {
		if err := os.Chmod(sock, mode); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched() // until the ctime's clock has ticked
	}
}

// A serve that fails, whether the first or one that replaces a live server
// (stopped to end kubelet's stream for a changed kubelet.sock), leaves the
// plugin not serving until a serve succeeds: otherwise its /healthz answers
// 200 while nothing serves kubelet, and the liveness probe never restarts
// a plugin kubelet cannot reach. The retries go on and bring it back.
func TestFailedServeIsNotServing(t *testing.T) {
	tests := []struct {
		name string
		// breakServes, if set, runs once the plugin is up and makes its
		// next serve fail (by setting fail); otherwise serves fail from
		// the start.
		breakServes func(t *testing.T, dir string, k *kubelettest.Kubelet, fail *atomic.Bool)
		// registrations kubelet has seen once serving works again.
		registrations int
	}{
		{name: "first serve", registrations: 1},
		{
			name: "re-serve for a changed kubelet.sock",
			breakServes: func(t *testing.T, dir string, k *kubelettest.Kubelet, fail *atomic.Bool) {
				listed(t, k, 1, 3)
				fail.Store(true)
				touchKubeletSock(t, dir)
			},
			registrations: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := socketDir(t)
			k := startKubelet(t, dir)
			var fail atomic.Bool
			fail.Store(tt.breakServes == nil)
			// Whether the registrar claimed to serve, after each attempt
			// made while serves fail. The hook runs on Run's goroutine
			// right after the attempt: it sees the state the attempt left.
			// Once registered nothing retries, so with fail set every
			// retry is a failed serve.
			serving := make(chan bool, 64)
			p := startPluginWith(t, dir, func(c *Config) {
				c.pollOnly = true
				c.CheckInterval = 5 * time.Millisecond
			}, testr.New(t), func(r *Registrar) {
				r.listen = func(path string) (net.Listener, error) {
					if fail.Load() {
						return nil, errors.New("listen refused by the test")
					}
					return net.Listen("unix", path)
				}
				r.retryIn = func(time.Duration) {
					if !fail.Load() {
						return
					}
					select {
					case serving <- r.Serving():
					default:
					}
				}
			})
			if tt.breakServes != nil {
				tt.breakServes(t, dir, k, &fail)
			}
			for i := range 3 {
				select {
				case got := <-serving:
					if got {
						t.Fatalf("failed serve %d left the plugin claiming to serve", i+1)
					}
				case <-time.After(waitBound(t)):
					t.Fatalf("no failed serve %d", i+1)
				}
			}
			if p.reg.Serving() || p.reg.Registered() {
				t.Fatalf("serving %v, registered %v while serves fail", p.reg.Serving(), p.reg.Registered())
			}
			fail.Store(false)
			listed(t, k, tt.registrations, 3)
			eventually.Holds(t, "serving and registered again", waitBound(t), func() bool { return p.reg.Serving() && p.reg.Registered() })
		})
	}
}

// Our socket replaced (here by a directory, which no one, root included,
// can listen over) while registration is being retried, and noticed by the
// retry itself before any event or check: the server is stopped to serve
// afresh, and while that fails the plugin must not claim to serve.
func TestSocketReplacedDuringRetryIsNotServing(t *testing.T) {
	dir := socketDir(t)
	blocker := filepath.Join(dir, DefaultSocketName)
	logs := &logtest.Lines{}
	type failedServe struct{ logged, serving bool }
	failed := make(chan failedServe, 1)
	p := startPluginWith(t, dir, func(c *Config) {
		// Neither events nor checks: the retry alone sees the change.
		c.pollOnly = true
	}, logs.Logger(t), func(r *Registrar) {
		// The file system is changed here, on Run's goroutine between
		// two attempts, so that no attempt races the change.
		step := 0
		r.retryIn = func(time.Duration) {
			step++
			switch step {
			case 1: // registration failed (no kubelet) while serving
				if err := os.Remove(blocker); err != nil {
					t.Error(err)
				}
				if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o755); err != nil {
					t.Error(err)
				}
			case 2: // the retry found the socket replaced and could not serve
				failed <- failedServe{logs.Contains("cannot serve the device plugin socket"), r.Serving()}
				if err := os.RemoveAll(blocker); err != nil {
					t.Error(err)
				}
			}
		}
	})
	select {
	case got := <-failed:
		if !got.logged {
			t.Fatalf("the second retry was not a failed serve:\n%s", logs.String())
		}
		if got.serving {
			t.Fatalf("claims to serve though its server is stopped and serving failed:\n%s", logs.String())
		}
	case <-time.After(waitBound(t)):
		t.Fatalf("no failed serve:\n%s", logs.String())
	}
	// The path is free again: it serves, and registers once kubelet is up.
	k := startKubelet(t, dir)
	listed(t, k, 1, 3)
	eventually.Holds(t, "serving and registered", waitBound(t), func() bool { return p.reg.Serving() && p.reg.Registered() })
}

// serveRegistration serves a Registration server on dir's kubelet.sock, as
// a kubelet would, until the test ends.
func serveRegistration(t *testing.T, dir string, s pluginapi.RegistrationServer) (stop func()) {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(dir, kubeletSocketName))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, s)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	stop = func() {
		srv.Stop()
		<-served
	}
	t.Cleanup(stop)
	return stop
}

// Ready is what the node agent's readiness probe asks: kubelet has the
// plugin only once it registered it and follows its list, and has it no
// more once its stream ends or a restarted kubelet has not yet
// registered it.
func TestReady(t *testing.T) {
	dir := socketDir(t)
	p := startPlugin(t, dir, nil)
	eventually.Holds(t, "serving without a kubelet", waitBound(t), p.reg.Serving)
	if p.reg.Ready() {
		t.Fatal("ready without a kubelet")
	}

	// A kubelet that accepts the registration and never dials back.
	stop := serveRegistration(t, dir, &registrationServer{during: func() {}})
	eventually.Holds(t, "registered with a kubelet that does not follow", waitBound(t), p.reg.Registered)
	if p.reg.Ready() {
		t.Fatal("ready, though kubelet never asked for the list")
	}
	stop()
	if err := kubelettest.CleanupSockets(dir); err != nil {
		t.Fatal(err)
	}

	k := startKubelet(t, dir)
	listed(t, k, 1, 3)
	eventually.Holds(t, "ready once kubelet follows the list", waitBound(t), p.reg.Ready)

	// Kubelet stops: its stream ends, and kubelet.sock goes without a
	// new one to register with.
	k.Stop()
	eventually.Holds(t, "not ready once kubelet stopped", waitBound(t), func() bool { return !p.reg.Ready() })
	// Kubelet starts again: it removes every socket, ours too, and is
	// not ready until it registered the plugin served afresh.
	if err := kubelettest.CleanupSockets(dir); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, "serving afresh", waitBound(t), func() bool {
		_, err := os.Stat(filepath.Join(dir, DefaultSocketName))
		return err == nil && p.reg.Serving()
	})
	if p.reg.Ready() {
		t.Fatal("ready before the restarted kubelet is there")
	}
	k2 := startKubelet(t, dir)
	listed(t, k2, 1, 3)
	eventually.Holds(t, "ready for the restarted kubelet", waitBound(t), p.reg.Ready)
}
