// Package streamcopy copies bytes into memory that another core reads next,
// such as a send buffer shared with a peer process.
//
// A plain copy writes through the cache: each line of a buffer the peer read
// last is first fetched for ownership from the peer's core, which costs more
// than the copy itself once the buffer no longer fits in cache. Non-temporal
// (streaming) stores skip that fetch and write whole lines to memory; the
// reader then loads them from memory. Go's runtime streams only copies of
// 1 MiB and more, so this package does it from a smaller size.
package streamcopy

// Threshold is the size from which Copy streams; below it a plain copy is
// cheaper than the fence that streaming ends with.
const Threshold = 16 << 10

// Copy copies min(len(dst), len(src)) bytes from src to dst and returns how
// many, as the built-in copy does. dst and src must not overlap.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < Threshold || !canStream {
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
