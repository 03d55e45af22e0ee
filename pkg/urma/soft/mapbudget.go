package soft

import (
	"fmt"
	"sync/atomic"
)

// Defaults of the bounds on what peers make this process map (one-copy
// SEND, pull.go). A peer's shared segment costs this process address
// space, not memory (the memory is the peer's), but address space is what
// the Go runtime needs to grow its heap: a peer that made this side map
// thousands of sparse terabyte memfds once starved it into "out of
// memory". The bounds follow what pkg/transport shares: each of its
// connections its own send buffers (urma_sq_size buffers of
// urma_buffer_size, 1 MiB by default), or with urma_pool_remote_read its
// whole pool (urma_buffer_count × urma_buffer_size, 512 MiB by default),
// which it raises MaxMappedPerConn to when larger.
const (
	// DefaultMaxPeerSegments is Options.MaxPeerSegments when left zero.
	DefaultMaxPeerSegments = 1024
	// DefaultMaxMappedPerConn is Options.MaxMappedPerConn when left zero:
	// eight default transport pools, or the send buffers of 4096
	// transport connections.
	DefaultMaxMappedPerConn = 4 << 30
	// DefaultMaxMappedBytes is Options.MaxMappedBytes when left zero:
	// sixteen peers that each share as much as one may.
	DefaultMaxMappedBytes = 16 * DefaultMaxMappedPerConn
)

// mapBudget is a provider's bounds on peer segments and the bytes its
// connections have mapped of them.
type mapBudget struct {
	perConnCount int    // Options.MaxPeerSegments
	perConn      uint64 // Options.MaxMappedPerConn
	total        uint64 // Options.MaxMappedBytes
	used         atomic.Uint64
}

func newMapBudget(o Options) *mapBudget {
	b := &mapBudget{perConnCount: o.MaxPeerSegments, perConn: o.MaxMappedPerConn, total: o.MaxMappedBytes}
	if b.perConnCount <= 0 {
		b.perConnCount = DefaultMaxPeerSegments
	}
	if b.perConn == 0 {
		b.perConn = DefaultMaxMappedPerConn
	}
	if b.total == 0 {
		b.total = DefaultMaxMappedBytes
	}
	return b
}

// take reserves n bytes of the provider's bound, or says why not.
func (b *mapBudget) take(n uint64) error {
	for {
		u := b.used.Load()
		if n > b.total || u > b.total-n {
			return fmt.Errorf("a segment of %d bytes would make this process map %d bytes of its peers' memory, more than Options.MaxMappedBytes (%d) allows", n, u+n, b.total)
		}
		if b.used.CompareAndSwap(u, u+n) {
			return nil
		}
	}
}

// give returns n bytes taken.
func (b *mapBudget) give(n uint64) { b.used.Add(^(n - 1)) }
