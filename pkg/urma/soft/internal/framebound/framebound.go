// Package framebound is the rule both of the software provider's fabrics
// apply to a peer in the middle of a frame: how long, in all, a reader may
// wait for the rest of a frame it has started.
//
// A peer that stops in a frame is failed once its PeerTimeout passes
// without a byte, but one that trickles the frame, a byte just under every
// PeerTimeout, would hold the frame, and whoever reads it (a Poll, the
// reader goroutine, a receive being written and so a JFR.Close), for good:
// so the bound is per frame, not per gap. It grows with what arrived, so
// that a large frame from a slow but healthy peer (a busy machine, a
// CPU-throttled container, a slow link) is never failed: such a peer
// delivers far more than a MiB per PeerTimeout (a ring's copy runs at
// GB/s), while a trickler earns next to nothing and is failed about
// PeerTimeout after it started the frame's rest. A hostile peer that keeps
// to a MiB per PeerTimeout is still bounded: a frame is at most the
// device's MaxMsgSize long.
package framebound

import (
	"errors"
	"fmt"
	"time"
)

// Grace is how much of a frame that arrived earns its reader another
// PeerTimeout of waiting for the rest.
const Grace = 1 << 20

// ErrStalled is under the error of a peer that stopped, or took too long,
// in the middle of a frame.
var ErrStalled = errors.New("peer stalled mid-frame")

// For is how long, in all, a reader may wait for the rest of a frame of
// which arrived bytes came so far: peerTimeout, plus peerTimeout for every
// Grace that came.
func For(peerTimeout time.Duration, arrived uint64) time.Duration {
	return peerTimeout + time.Duration(float64(peerTimeout)*float64(arrived)/Grace)
}

// Overdue is the error of a peer that took longer than bound over the rest
// of a frame, for which this side waited waited.
func Overdue(waited, bound time.Duration) error {
	return fmt.Errorf("%w: waited %v in all for the rest of a frame, past its bound %v",
		ErrStalled, waited.Round(time.Millisecond), bound.Round(time.Millisecond))
}
