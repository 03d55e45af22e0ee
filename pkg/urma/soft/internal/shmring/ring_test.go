package shmring

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/eventually"
)

// pair joins two Streams over fresh rings of ring bytes in this process,
// as a rendezvous would but without its socket: each is the other's peer.
// They are shut down and closed when the test ends.
func pair(t *testing.T, ring int, spin time.Duration) (a, b *Stream) {
	t.Helper()
	a, b = pairOnly(t, ring, spin)
	t.Cleanup(func() {
		for _, s := range []*Stream{a, b} {
			s.Shutdown()
			s.Close()
		}
	})
	return a, b
}

// pairOnly is pair without the cleanup: the caller closes them.
func pairOnly(t *testing.T, ring int, spin time.Duration) (a, b *Stream) {
	t.Helper()
	ea, err := NewEnds(ring)
	mustOK(t, err, "ends")
	eb, err := NewEnds(ring)
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
	a, b = new(Stream), new(Stream)
	if err := a.Join(ea, ring, ring, fb, spin); err != nil {
		eb.Release()
		closeAll(fa)
		t.Fatalf("join a's rings: %v", err)
	}
	if err := b.Join(eb, ring, ring, fa, spin); err != nil {
		a.Close()
		t.Fatalf("join b's rings: %v", err)
	}
	a.ClosePassed()
	b.ClosePassed()
	return a, b
}

// write writes p into s's ring, waiting for room as a writer goroutine
// does, and publishes it.
func (s *Stream) write(p []byte) error {
	iov := []unix.Iovec{{Base: &p[0]}}
	iov[0].SetLen(len(p))
	_, err := s.Writev(iov, true)
	return err
}

// noLeaks checks, at the end of the test, that every goroutine started
// since now has returned.
func noLeaks(t testing.TB) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		eventually.Holds(t, "the test's goroutines to return", 5*time.Second, func() bool { return runtime.NumGoroutine() <= before })
	})
}

func mustOK(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// A timed sleep on an eventfd that was already signalled consumes the
// signal, as an untimed one does: a sleeper that returned without reading
// the counter would find it set again at its next sleep and not sleep.
func TestShmEventWaiterSleepConsumesSignal(t *testing.T) {
	cases := []struct {
		name     string
		deadline func() time.Time
	}{
		{"no deadline", func() time.Time { return time.Time{} }},
		{"deadline an hour away", func() time.Time { return time.Now().Add(time.Hour) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fd, err := newEventfd()
			mustOK(t, err, "eventfd")
			peer, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
			mustOK(t, err, "duplicate eventfd")
			defer unix.Close(peer)
			w, err := newEventWaiter(fd, "test eventfd")
			mustOK(t, err, "waiter")
			defer w.f.Close()
			mustOK(t, signal(peer), "signal")
			mustOK(t, w.sleep(c.deadline()), "sleep")
			var buf [8]byte
			if _, err := unix.Read(peer, buf[:]); !errors.Is(err, unix.EAGAIN) {
				t.Fatalf("eventfd still signalled after the sleep (read: %v)", err)
			}
		})
	}
}

// idleWithData runs r.idle with bytes already in its peer's ring, after
// setting the Polls the reader goroutine saw when it last went idle and the
// Polls since, and reports whether the reader is in polling mode after.
func idleWithData(t *testing.T, r, w *Stream, mode bool, idlePolls, polls uint64) bool {
	t.Helper()
	mustOK(t, w.write([]byte{1}), "write")
	r.pollingMode = mode
	r.idlePolls = idlePolls
	r.Polls.Store(polls)
	mustOK(t, r.Idle(), "idle")
	var b [1]byte
	mustOK(t, r.ReadFull(b[:]), "read")
	return r.pollingMode
}

// A reader goroutine enters polling mode when pollingPolls Polls came since
// it last went idle, not one fewer; in polling mode a park without a Poll
// does not end it, pollingEnd of them in a row do (see the next test).
func TestShmIdleEntersPollingMode(t *testing.T) {
	cases := []struct {
		name             string
		mode             bool
		idlePolls, polls uint64
		want             bool
	}{
		{"no Polls", false, 0, 0, false},
		{"pollingPolls-1 Polls", false, 0, pollingPolls - 1, false},
		{"pollingPolls Polls", false, 0, pollingPolls, true},
		{"pollingPolls-1 Polls after many", false, 100, 100 + pollingPolls - 1, false},
		{"pollingPolls Polls after many", false, 100, 100 + pollingPolls, true},
		{"one park without a Poll", true, 7, 7, true},
	}
	r, w := pair(t, MinSize, time.Hour)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := idleWithData(t, r, w, c.mode, c.idlePolls, c.polls); got != c.want {
				t.Errorf("polling mode %v after %d Polls since the last idle (was %v), want %v", got, c.polls-c.idlePolls, c.mode, c.want)
			}
		})
	}
}

// In polling mode with no Polls coming, the reader goroutine leaves it after
// pollingEnd parks and sleeps announced, so a write wakes it.
func TestShmIdleLeavesPollingMode(t *testing.T) {
	r, w := pair(t, MinSize, time.Hour)
	r.pollingMode = true
	idled := make(chan error, 1)
	go func() { idled <- r.Idle() }()
	eventually.Holds(t, "the reader to announce its sleep", 10*time.Second, func() bool { return r.local.word(offReaderWait).Load()&1 == 1 })
	mustOK(t, w.write([]byte{1}), "write")
	mustOK(t, <-idled, "idle")
	if r.pollingMode {
		t.Error("still in polling mode after sleeping announced")
	}
	if n := w.wakes.Load(); n != 1 {
		t.Errorf("the writer woke the reader %d times, want 1", n)
	}
}

// With a spin longer than the test, nobody ever sleeps on an eventfd: the
// reader between messages and in the middle of one, and the writer waiting
// for room in a full ring all poll shared memory until it changes, so no
// message costs a wake-up, small ones nor ones several times the ring.
func TestShmLongSpinNeverSleeps(t *testing.T) {
	noLeaks(t)
	for _, size := range []int{64, 3*MinSize + 5} {
		a, b := pair(t, MinSize, time.Hour)
		const rounds = 20
		echoed := make(chan error, 1)
		go func() {
			buf := make([]byte, size)
			for range rounds {
				if err := b.Idle(); err != nil {
					echoed <- err
					return
				}
				if err := b.ReadFull(buf); err != nil {
					echoed <- err
					return
				}
				if err := b.write(buf); err != nil {
					echoed <- err
					return
				}
			}
			echoed <- nil
		}()
		msg, reply := make([]byte, size), make([]byte, size)
		for i := range rounds {
			for k := range msg {
				msg[k] = byte(i + k)
			}
			mustOK(t, a.write(msg), "write")
			mustOK(t, a.Idle(), "idle")
			mustOK(t, a.ReadFull(reply), "read the echo")
			if !bytes.Equal(reply, msg) {
				t.Fatalf("%d bytes, round %d: the echo differs", size, i)
			}
		}
		mustOK(t, <-echoed, "echo")
		if n := a.wakes.Load() + b.wakes.Load(); n != 0 {
			t.Errorf("%d-byte messages: %d wake-ups in %d round trips with an hour's spin, want none", size, n, rounds)
		}
	}
}

// A write of exactly the ring's size fills it in one go; a write that then
// finds no room writes nothing and wakes nobody, even a reader that has
// announced a sleep: there is nothing new for it to read.
func TestShmFullRingWriteWakesNobody(t *testing.T) {
	a, b := pair(t, MinSize, -1)
	mustOK(t, a.write(make([]byte, MinSize)), "fill the ring")
	if n, err := b.available(); err != nil || n != MinSize {
		t.Fatalf("the reader sees %d bytes (%v), want the whole ring, %d", n, err, MinSize)
	}
	// The reader announces a sleep, as it does before it checks the ring
	// once more.
	b.local.word(offReaderWait).Add(1)
	p := []byte{7}
	iov := []unix.Iovec{{Base: &p[0]}}
	iov[0].SetLen(1)
	left, err := a.Writev(iov, false)
	if !errors.Is(err, unix.EAGAIN) || len(left) != 1 || left[0].Len != 1 {
		t.Fatalf("write into a full ring: %d iovecs left (%v), want the byte left and EAGAIN", len(left), err)
	}
	if n := a.wakes.Load(); n != 0 {
		t.Errorf("a write that wrote nothing woke the reader %d times, want none", n)
	}
	if a.tail != MinSize || a.local.word(offTail).Load() != MinSize {
		t.Errorf("tail %d, published %d after the refused write, want both %d", a.tail, a.local.word(offTail).Load(), MinSize)
	}
}

// A blocking write of any size streams through the ring while the peer
// reads: exactly the ring, a byte more, several rings, exactly the chunk a
// writer publishes at once and a byte more, each starting where the last
// ended, so that they wrap around the ring's end at different places. The
// bytes arrive whole and in order.
func TestShmBlockingWriteStreamsThroughRing(t *testing.T) {
	noLeaks(t)
	a, b := pair(t, MinSize, -1)
	for i, n := range []int{5, MinSize, MinSize + 1, 3*MinSize + 5, publishChunk, publishChunk + 1, 1} {
		msg := make([]byte, n)
		for k := range msg {
			msg[k] = byte(i*31 + k*7 + k>>8)
		}
		written := make(chan error, 1)
		go func() { written <- a.write(msg) }()
		got := make([]byte, n)
		read := make(chan error, 1)
		go func() { read <- b.ReadFull(got) }()
		hang := time.After(20 * time.Second) // a hang, not a measurement
		for range 2 {
			select {
			case err := <-written:
				mustOK(t, err, "write")
				written = nil
			case err := <-read:
				mustOK(t, err, "read")
				read = nil
			case <-hang:
				// Out of their waits before the rings are unmapped.
				a.Shutdown()
				b.Shutdown()
				for _, ch := range []chan error{written, read} {
					if ch != nil {
						<-ch
					}
				}
				t.Fatalf("%d bytes: the write or the read never finished", n)
			}
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("%d bytes arrived changed", n)
		}
		if a.tx.Load() != b.rx.Load() {
			t.Fatalf("%d bytes: %d written, %d read", n, a.tx.Load(), b.rx.Load())
		}
	}
}

// Closing a connection's rings closes each of its descriptors once: a
// second close of a number another goroutine has just been given would
// close that goroutine's file. Another goroutine opens files all along and
// checks that they stay its own while connections come and go.
func TestShmCloseClosesOnlyItsOwnDescriptors(t *testing.T) {
	var null unix.Stat_t
	mustOK(t, unix.Stat("/dev/null", &null), "stat /dev/null")
	stop := make(chan struct{})
	stolen := make(chan error, 1)
	go func() {
		defer close(stolen)
		var mine []int
		defer func() { closeAll(mine) }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				stolen <- fmt.Errorf("open /dev/null: %w", err)
				return
			}
			mine = append(mine, fd)
			for _, m := range mine {
				var st unix.Stat_t
				if err := unix.Fstat(m, &st); err != nil {
					stolen <- fmt.Errorf("descriptor %d, opened on /dev/null, was closed under its owner: %w", m, err)
					return
				}
				if st.Rdev != null.Rdev || st.Ino != null.Ino {
					stolen <- fmt.Errorf("descriptor %d, opened on /dev/null, was closed under its owner and reused", m)
					return
				}
			}
			if len(mine) == 16 {
				closeAll(mine)
				mine = mine[:0]
			}
		}
	}()
	for range 300 {
		a, b := pairOnly(t, MinSize, -1)
		for _, s := range []*Stream{a, b} {
			s.Shutdown()
			s.Close()
		}
	}
	close(stop)
	if err := <-stolen; err != nil {
		t.Fatal(err)
	}
}

// peek shows the next bytes of the ring without reading them, across the
// ring's end as well, and only when the ring holds all of them.
func TestShmPeek(t *testing.T) {
	for _, start := range []int{0, MinSize - 3} { // the second wraps
		a, b := pair(t, MinSize, -1)
		if start > 0 {
			mustOK(t, b.write(make([]byte, start)), "fill")
			mustOK(t, a.Discard(start), "read the fill")
		}
		want := []byte("peeked bytes")
		mustOK(t, b.write(want), "write")
		got := make([]byte, len(want))
		if !a.Peek(got) || !bytes.Equal(got, want) {
			t.Fatalf("start %d: peek gave %q, want %q", start, got, want)
		}
		if a.Peek(make([]byte, len(want)+1)) {
			t.Fatalf("start %d: peeked more bytes than the ring holds", start)
		}
		if n := a.Buffered(); n != len(want) {
			t.Fatalf("start %d: %d bytes left to read after peeks, want %d", start, n, len(want))
		}
		read := make([]byte, len(want))
		mustOK(t, a.ReadFull(read), "read")
		if !bytes.Equal(read, want) {
			t.Fatalf("start %d: read %q after the peek, want %q", start, read, want)
		}
	}
}

// The peer gets a read-only descriptor of this side's ring region, but
// could reopen the file read-write through /proc/self/fd: the region is
// sealed so that no new writable mapping or write(2) succeeds, while the
// owner's own mapping stays writable.
func TestShmRegionSealedAgainstPeerWrites(t *testing.T) {
	probe, err := unix.MemfdCreate("probe", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	mustOK(t, err, "memfd")
	_, err = unix.FcntlInt(uintptr(probe), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE)
	_ = unix.Close(probe)
	if errors.Is(err, unix.EINVAL) {
		t.Skip("kernel without F_SEAL_FUTURE_WRITE (before 5.1)")
	}
	r, ro, err := newRegion(4096)
	mustOK(t, err, "region")
	defer r.unmap()
	defer unix.Close(ro)
	seals, err := unix.FcntlInt(uintptr(ro), unix.F_GET_SEALS, 0)
	mustOK(t, err, "get seals")
	if want := unix.F_SEAL_FUTURE_WRITE | unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW; seals&want != want {
		t.Fatalf("region seals %#x, want %#x among them", seals, want)
	}
	rw, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", ro), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		defer unix.Close(rw)
		if m, err := unix.Mmap(rw, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
			_ = unix.Munmap(m)
			t.Error("a reopened descriptor mapped the region writable")
		}
		if _, err := unix.Pwrite(rw, []byte("x"), int64(CtlSize)); err == nil {
			t.Error("a reopened descriptor wrote into the region")
		}
	}
	r.ring[0] = 0x5a // the owner still writes its ring
	if r.ring[0] != 0x5a {
		t.Fatal("the owner's mapping lost its write")
	}
}

// The peer shares this side's own eventfds too, and can make them blocking.
// A sleep on one must still end at its deadline: a read(2) of a zero
// counter on a blocking eventfd would hold the thread for good, past the
// stall bound that fails a stopped peer.
func TestEventWaiterSleepsOnABlockingEventfd(t *testing.T) {
	fd, err := newEventfd()
	mustOK(t, err, "eventfd")
	w, err := newEventWaiter(fd, "data")
	mustOK(t, err, "waiter")
	defer w.f.Close()
	mustOK(t, unix.SetNonblock(fd, false), "clear O_NONBLOCK as the peer may")
	for _, signalled := range []bool{false, true} {
		if signalled {
			mustOK(t, addOne(fd), "signal")
		}
		done := make(chan error, 1)
		go func() { done <- w.sleep(time.Now().Add(20 * time.Millisecond)) }()
		select {
		case err := <-done:
			mustOK(t, err, "sleep")
		case <-time.After(10 * time.Second):
			t.Fatalf("signalled %v: the sleep on a blocking eventfd did not end at its deadline", signalled)
		}
	}
	// The signal was taken: the counter is zero again.
	if err := w.reset(uintptr(fd)); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("reset after the signalled sleep: %v, want EAGAIN (a zero counter)", err)
	}
}
