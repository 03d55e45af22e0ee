package soft

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// shmPair joins two shmIOs over fresh rings of ring bytes in this process,
// as a rendezvous would but without its socket: each is the other's peer.
// They are shut down and closed when the test ends.
func shmPair(t *testing.T, ring int, spin time.Duration) (a, b *shmIO) {
	t.Helper()
	ea, err := shmring.NewEnds(ring)
	mustOK(t, err, "ends")
	eb, err := shmring.NewEnds(ring)
	if err != nil {
		ea.Release()
		t.Fatalf("ends: %v", err)
	}
	// Each side gets copies of the other's descriptors, as SCM_RIGHTS
	// would give it.
	dup := func(fds []int) []int {
		out := make([]int, 0, len(fds))
		for _, fd := range fds {
			d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
			mustOK(t, err, "duplicate descriptor")
			out = append(out, d)
		}
		return out
	}
	fa, fb := dup(ea.Fds()), dup(eb.Fds())
	a, err = newShmIO(ea, ring, ring, fb, spin)
	if err != nil {
		eb.Release()
		closeAll(fa)
		t.Fatalf("join a's rings: %v", err)
	}
	b, err = newShmIO(eb, ring, ring, fa, spin)
	if err != nil {
		a.Close()
		t.Fatalf("join b's rings: %v", err)
	}
	a.ClosePassed()
	b.ClosePassed()
	t.Cleanup(func() {
		for _, s := range []*shmIO{a, b} {
			s.Shutdown()
			s.Close()
		}
	})
	return a, b
}

// write writes p into s's ring, waiting for room as the writer goroutine
// does, and publishes it.
func (s *shmIO) write(p []byte) error {
	iov := []unix.Iovec{{Base: &p[0]}}
	iov[0].SetLen(len(p))
	_, err := s.Writev(iov, true)
	return err
}

// localRx is the bytes s has read so far.
func localRx(s *shmIO) uint64 {
	rx, _ := s.Counters()
	return rx.Load()
}
