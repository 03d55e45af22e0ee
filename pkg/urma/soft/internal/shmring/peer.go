package shmring

import "sync/atomic"

// What a misbehaving peer does, for tests that play one against a real
// side: they hold the peer's Stream and break its rules on purpose.

// Word names a control word of a region (see the package documentation).
type Word int

// The control words.
const (
	WordTail         Word = offTail
	WordHead         Word = offHead
	WordReaderSleeps Word = offReaderWait
	WordWriterSleeps Word = offWriterWait
	WordPulled       Word = offPulled
)

// Word is this side's control word w, which the peer reads.
func (s *Stream) Word(w Word) *atomic.Uint64 { return s.local.word(int(w)) }

// PeerWord reads the peer's control word w.
func (s *Stream) PeerWord(w Word) uint64 { return s.remote.word(int(w)).Load() }

// Word is the control word w of the region these ends will write into.
func (e *Ends) Word(w Word) *atomic.Uint64 { return e.local.word(int(w)) }

// WriteUnannounced writes p into this side's ring and publishes it without
// waking the peer's reader, as a peer may: only a poller takes it. It
// does not wait for room.
func (s *Stream) WriteUnannounced(p []byte) {
	off := s.tail & s.wmask
	k := copy(s.local.ring[off:], p)
	copy(s.local.ring, p[k:])
	s.tail += uint64(len(p))
	s.local.word(offTail).Store(s.tail)
}

// WakePeer signals the peer's data eventfd whether or not its reader
// sleeps.
func (s *Stream) WakePeer() error { return signal(s.peerDataFd) }

// WakeSelf signals this side's own data eventfd, as the peer does when it
// writes: a sleeping reader, or a poller that waits, wakes.
func (s *Stream) WakeSelf() { _ = addOne(s.dataFd) }
