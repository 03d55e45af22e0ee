package memcopy

import "unsafe"

const canStream = true

// stream copies len(dst) bytes, a multiple of 64, from src to a 16-byte
// aligned dst with non-temporal stores, and fences them so that a later
// store (publishing the buffer) is not seen before them. It runs without
// a preemption point, about 50 µs for 1 MiB, and the race detector does
// not see its writes: its destinations are memory shared with another
// process, which the detector cannot follow anyway.
//
//go:noescape
func stream(dst, src []byte)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
