package memcopy

import "unsafe"

const canStream = true

// stream copies len(dst) bytes, a multiple of 64, from src to a 16-byte
// aligned dst with non-temporal stores, and fences them so that a later
// store (publishing the buffer) is not seen before them.
//
//go:noescape
func stream(dst, src []byte)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
