package soft

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"

	"github.com/openeuler/urma-k8s/pkg/urma/urmatest"
)

// newProvider creates a provider that closes with the test.
func newProvider(t testing.TB, opts Options) *Provider {
	t.Helper()
	if opts.Logger.GetSink() == nil {
		opts.Logger = testr.NewWithInterface(t, testr.Options{Verbosity: 0})
	}
	p, err := New(opts)
	if err != nil {
		t.Fatalf("create provider: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close provider: %v", err)
		}
	})
	return p
}

// quiet is a logger that drops everything; unlike logr.Discard it keeps
// newProvider from substituting the test logger (benchmarks, children).
func quiet() logr.Logger { return funcr.New(func(string, string) {}, funcr.Options{}) }

// noLeaks checks, at the end of the test, that every goroutine started since
// now has returned.
func noLeaks(t testing.TB) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("%d goroutines leaked:\n%s", runtime.NumGoroutine()-before, buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(time.Millisecond) // polling deadline: goroutines end on their own schedule
		}
	})
}

func TestConformanceInproc(t *testing.T) {
	urmatest.Run(t, func(t *testing.T) urmatest.Pair {
		noLeaks(t)
		fab := NewFabric()
		a := newProvider(t, Options{Fabric: fab})
		b := newProvider(t, Options{Fabric: fab})
		return urmatest.Pair{A: a, B: b, KillB: func() { _ = b.Close() }, PeerGoneTimeout: 2 * time.Second}
	})
}

func TestConformanceSocket(t *testing.T) {
	urmatest.Run(t, func(t *testing.T) urmatest.Pair {
		noLeaks(t)
		opts := Options{Listen: "127.0.0.1:0", PeerTimeout: 600 * time.Millisecond, DialTimeout: time.Second}
		a := newProvider(t, opts)
		b := newProvider(t, opts)
		return urmatest.Pair{A: a, B: b, KillB: func() { _ = b.Close() }, PeerGoneTimeout: 3 * time.Second}
	})
}

// shmOpts places the shm fabric's sockets in a directory of the test: a
// short one, since a unix socket path holds at most 107 bytes.
func shmOpts(t testing.TB) Options {
	t.Helper()
	dir, err := os.MkdirTemp("", "shm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return Options{ShmDir: dir, PeerTimeout: 600 * time.Millisecond, DialTimeout: time.Second}
}

func TestConformanceShmOneProcess(t *testing.T) {
	urmatest.Run(t, func(t *testing.T) urmatest.Pair {
		noLeaks(t)
		opts := shmOpts(t)
		a := newProvider(t, opts)
		b := newProvider(t, opts)
		return urmatest.Pair{A: a, B: b, KillB: func() { _ = b.Close() }, PeerGoneTimeout: 3 * time.Second}
	})
}

// twoProcessPeerTimeout is the peer timeout of the two-process tests: a
// child killed with SIGKILL is noticed at once (its sockets close), so it
// only has to outlast a busy machine's scheduling of two -race processes.
const twoProcessPeerTimeout = 3 * time.Second

// Both cross-host fabrics between two processes: B's provider lives in a
// child process and the suite drives it through a remote provider
// (remote_test.go), registered memory shared by memfd. KillB is kill -9 of
// the child.
func TestConformanceTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	var rp *remoteProc
	t.Cleanup(func() {
		if rp != nil && rp.alive() {
			rp.kill()
		}
	})
	for _, fabric := range []string{"shm", "socket"} {
		t.Run(fabric, func(t *testing.T) {
			urmatest.Run(t, func(t *testing.T) urmatest.Pair {
				if rp == nil || !rp.alive() {
					rp = startRemoteProc(t)
				}
				opts := Options{Listen: "127.0.0.1:0"}
				if fabric == "shm" {
					opts = shmOpts(t)
				}
				opts.PeerTimeout, opts.DialTimeout = twoProcessPeerTimeout, 5*time.Second
				a := newProvider(t, opts)
				b := newRemoteProvider(t, rp, opts.ShmDir)
				return urmatest.Pair{A: a, B: b, KillB: rp.kill, PeerGoneTimeout: 3 * time.Second}
			})
		})
	}
}
