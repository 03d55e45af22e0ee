package soft

import (
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma/urmatest"
)

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
