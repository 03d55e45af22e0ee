//go:build !amd64

package memcopy

const canStream = false

func stream(dst, src []byte) { copy(dst, src) }

func uintptrOf([]byte) uintptr { return 0 }
