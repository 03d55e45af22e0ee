package shmring

import (
	"fmt"
	"runtime"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/framebound"
)

// ready reports whether a reader (data) or writer (not data) has what it
// waits for: bytes in the peer's ring, room in this side's; a corrupt ring
// counts as ready, so that the next access reports it. A writer waits
// without the write lock, so it reckons with the published tail (the lock's
// holder publishes what it wrote before it lets go).
func (s *Stream) ready(data bool) bool {
	var n uint64
	var err error
	if data {
		n, err = s.available()
	} else {
		n, err = s.room(s.local.word(offTail).Load())
	}
	return n > 0 || err != nil || s.closed.Load()
}

// spinWait polls ready for the spin budget; it reports whether it came
// true. Polling shared memory costs no syscall while the peer is busy.
func (s *Stream) spinWait(data bool) bool {
	if s.spin <= 0 {
		return s.ready(data)
	}
	start := time.Now()
	for i := 0; ; i++ {
		if s.ready(data) {
			return true
		}
		if i&63 == 63 && time.Since(start) > s.spin {
			return false
		}
	}
}

// wait blocks until ready(data): it spins, then sleeps on its eventfd.
func (s *Stream) wait(data bool) error {
	if s.spinWait(data) {
		if s.closed.Load() {
			return ErrClosed
		}
		return nil
	}
	return s.sleep(data, time.Time{})
}

// restSpin is how long a poller waiting for the rest of a frame yields
// before it parks: one park (PollPark), the most a park can make it late,
// so that it never burns more time than parking at once could have cost.
// A running writer publishes every publishChunk, tens of microseconds
// of copying: well within it.
const restSpin = PollPark

// waitRest waits for the rest of a frame whose start was read: the writer
// is copying it (the link starts a frame only when the ring holds some of
// it). A dead writer's process closes the socket and so the ring, but a
// live one that stops (stopped by SIGSTOP or a debugger, buggy, hostile)
// would hold the reader, or the application's Poll, for good: after
// s.Stall without a byte the wait fails, and with it the connection. So
// would one that trickles the frame, a byte just under every s.Stall: the
// waits for one frame's rest add up, and once they pass framebound.For the
// bytes of it read so far, the wait fails too. Only the time spent waiting
// counts: a frame that takes long because this side copies it slowly is
// not the peer's stall.
//
// The reader goroutine waits as for any data (a short spin, then an
// announced sleep, timed). A poller must not sleep on the data eventfd:
// the reader goroutine may be asleep on it (idle), and two sleepers would
// break the odd/even sleep word, share one read deadline and queue behind
// each other's read. So it yields for restSpin, then parks for PollPark at
// a time, checking the ring after each park: no wake-up to lose.
func (s *Stream) waitRest() error {
	s.inRest.Store(true)
	defer s.inRest.Store(false)
	start := time.Now()
	// The wait ends at the gap's bound or the frame's, whichever comes
	// first.
	bound := framebound.For(s.Stall, s.rx.Load()-s.frameRx)
	wait, whole := s.Stall, false
	if left := bound - s.frameWaited; left < wait {
		wait, whole = max(left, 0), true
	}
	deadline := start.Add(wait)
	if !s.PollerReads {
		if !s.spinWait(true) {
			if err := s.sleep(true, deadline); err != nil {
				return err
			}
		}
	} else {
		for i := 0; !s.ready(true); i++ {
			if i&63 == 63 && time.Since(start) > restSpin {
				break
			}
			runtime.Gosched()
		}
		for !s.ready(true) {
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			s.restParks.Add(1)
			time.Sleep(min(left, PollPark))
		}
	}
	s.frameWaited += time.Since(start)
	if !s.ready(true) {
		if whole {
			return framebound.Overdue(s.frameWaited, bound)
		}
		return fmt.Errorf("%w for %v", framebound.ErrStalled, s.Stall)
	}
	return s.closedErr()
}

func (s *Stream) closedErr() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// sleep sleeps on the eventfd until ready(data), or until deadline passes
// (zero: none; the caller checks ready), announcing each sleep in this
// side's control page first and checking ready after the announcement, so
// a wake-up that races with it is not lost.
func (s *Stream) sleep(data bool, deadline time.Time) error {
	off, ew := offWriterWait, s.space
	if data {
		off, ew = offReaderWait, s.data
	}
	w := s.local.word(off)
	for !s.ready(data) {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return nil
		}
		w.Add(1) // odd: wake me
		var err error
		if !s.ready(data) {
			err = ew.sleep(deadline)
		}
		w.Add(1)
		if err != nil {
			return fmt.Errorf("sleep on eventfd: %w", err)
		}
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Polling mode: when pollers polled JFCs without a JFCE at least
// pollingPolls times since the reader goroutine last went idle, they take
// what the rings bring, and the reader goroutine parks for at most PollPark
// at a time without asking the peer for wake-ups, so that no message costs
// a syscall or a goroutine switch. An application in event mode polls JFCs
// that have a JFCE, which do not count. PollingEnd parks in a row without a
// Poll end polling mode: a poller descheduled for a park on a busy machine
// does not.
const (
	pollingPolls = 16
	PollPark     = time.Millisecond
	pollingEnd   = 3
)

// Idle waits, between frames, until the peer's ring has bytes: it spins,
// then sleeps: parked without a wake-up while pollers drive the rings,
// else announced, so that the peer writes the eventfd, once per sleep.
func (s *Stream) Idle() error {
	polls := s.Polls.Load()
	if polls-s.idlePolls >= pollingPolls {
		s.pollingMode = true
	}
	s.idlePolls = polls
	if s.spin > 0 && !s.pollingMode {
		start := time.Now()
		for i := 0; ; i++ {
			if s.ready(true) {
				return s.closedErr()
			}
			if i&63 == 63 && (s.Polls.Load() != polls || time.Since(start) > s.spin) {
				break
			}
		}
	}
	for quiet := 0; s.pollingMode; {
		if err := s.data.sleep(time.Now().Add(PollPark)); err != nil {
			return err
		}
		now := s.Polls.Load()
		if now != s.idlePolls {
			quiet = 0
		} else if quiet++; quiet == s.PollingEnd {
			s.pollingMode = false
		}
		s.idlePolls = now
		if s.ready(true) {
			return s.closedErr()
		}
	}
	return s.sleep(true, time.Time{})
}

// WaitWritable waits until this side's ring has room (the writer
// goroutine, without the write lock).
func (s *Stream) WaitWritable() error { return s.wait(false) }
