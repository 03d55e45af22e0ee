// Package urma is a Go view of URMA, the Unified Remote Memory Access verbs of
// openEuler's Unified Bus (UB).
//
// The package declares the objects a two-sided transport and a device plugin
// need (devices, contexts, completion event channels, completion queues, receive
// queues, jetties, segments and tokens) and the Provider boundary behind which an
// implementation lives. Production runs on UB hardware through liburma; everywhere
// else the software provider in pkg/urma/soft moves real bytes between processes
// with the same semantics. Callers only see the interfaces declared here, so a
// cgo provider over liburma can be added without touching them.
//
// Object order mirrors liburma: Provider -> Context -> JFCE -> JFC -> JFR ->
// Jetty. Registered memory is always mmap'd (see AllocMemory, and
// AllocPrivateMemory for memory no peer maps), never the Go heap, because
// hardware reads it asynchronously and the Go garbage collector may move or
// free heap memory.
//
// This package knows nothing of Kubernetes or of any transport built on it.
package urma
