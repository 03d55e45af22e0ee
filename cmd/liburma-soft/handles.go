//go:build linux && cgo

package main

import (
	"sync"
	"sync/atomic"
)

// handles names the Go objects behind the C ones: each C object carries
// its handle (the handle field where liburma's struct has one, a field of
// the library's own wrapper otherwise), never a Go pointer. A handle is
// never reused, so one kept past its object's deletion finds nothing.
type handles struct {
	next atomic.Uint64
	objs sync.Map // uint64 -> object
}

func (h *handles) add(obj any) uint64 {
	id := h.next.Add(1)
	h.objs.Store(id, obj)
	return id
}

func (h *handles) remove(id uint64) { h.objs.Delete(id) }

// lookup is the object of handle id if it is a T.
func lookup[T any](h *handles, id uint64) (T, bool) {
	var zero T
	if id == 0 {
		return zero, false
	}
	v, ok := h.objs.Load(id)
	if !ok {
		return zero, false
	}
	t, ok := v.(T)
	return t, ok
}
