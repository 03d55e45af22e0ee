// Package memcopy copies bytes the way their next reader wants them.
//
// Stream is for memory another core reads next, such as a send buffer
// shared with a peer process: a plain copy writes through the cache, and
// each line of a buffer the peer read last is first fetched for ownership
// from the peer's core, which costs more than the copy itself once the
// buffers no longer fit in cache. Non-temporal (streaming) stores skip
// that fetch and write whole lines to memory; the reader then loads them
// from memory.
//
// Cached is for memory this goroutine's caller reads next, such as the
// slice a Read fills: Go's copy streams past the cache from 1 MiB, so the
// caller would load what it asked for back from memory.
package memcopy

// StreamThreshold is the size from which Stream streams; below it a plain
// copy is cheaper than the fence that streaming ends with.
const StreamThreshold = 16 << 10

// Stream copies min(len(dst), len(src)) bytes from src to dst with
// streaming stores and returns how many, as the built-in copy does. dst and
// src must not overlap.
func Stream(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < StreamThreshold || !canStream {
		return copy(dst, src)
	}
	// Streaming stores need a 16-byte-aligned destination and whole
	// 64-byte blocks: the unaligned head and the tail are copied plainly.
	head := int(-uintptrOf(dst) & 15)
	copy(dst[:head], src[:head])
	body := (n - head) &^ 63
	stream(dst[head:head+body], src[head:head+body])
	copy(dst[head+body:n], src[head+body:n])
	return n
}

// cachedChunk keeps each built-in copy below the size from which Go's copy
// streams (1 MiB), and within a core's L2 cache.
const cachedChunk = 256 << 10

// Cached copies min(len(dst), len(src)) bytes from src to dst through the
// cache and returns how many, as the built-in copy does.
func Cached(dst, src []byte) int {
	n := min(len(dst), len(src))
	for k := 0; k < n; {
		k += copy(dst[k:n], src[k:min(n, k+cachedChunk)])
	}
	return n
}
