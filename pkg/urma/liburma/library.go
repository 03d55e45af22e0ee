//go:build linux && cgo

package liburma

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// library is one loaded liburma with its dispatch table.
type library struct {
	path   string  // the name it was first loaded by
	handle uintptr // its dlopen handle, the key in libraries
	c      *C.shim_lib
	refs   int // Providers using it; 0: liburma is uninitialised, the table stays
	// ownsInit is set when our urma_init succeeded; when someone else in
	// the process initialised liburma first (EEXIST), they uninitialise it.
	ownsInit bool
}

// libraries holds every liburma this process loaded, by dlopen handle.
// liburma's urma_init and urma_uninit act on the whole process (a second
// urma_init returns EEXIST, core/urma_main.c:216-219), so Providers share a
// loaded library and count their references; the last Close uninitialises
// it, and the table stays for the next Provider. The key is the handle, not
// the path: one file under two names (a symlink, $URMA_LIBRARY beside
// liburma.so.0) is one library with one initialisation, and counted by path
// the first name's last Close would uninitialise it under the other's
// providers. This is the package's only
// shared state, and it mirrors liburma's own.
var libraries = struct {
	sync.Mutex
	m map[uintptr]*library
}{m: make(map[uintptr]*library)}

// openLibrary loads and initialises the library at path, or takes another
// reference to it, under whichever name it was loaded.
func openLibrary(path string) (*library, error) {
	libraries.Lock()
	defer libraries.Unlock()
	c, err := dlopen(path)
	if err != nil {
		return nil, err
	}
	// dlopen gives the handle it gave before for a file already loaded.
	h := uintptr(C.shim_handle(c))
	l := libraries.m[h]
	if l != nil {
		C.shim_free(c) // l's table holds the library
		if l.refs > 0 {
			l.refs++
			return l, nil
		}
		// Every Provider closed and liburma was uninitialised: initialise
		// it again with the table kept from before, not a new one.
	} else {
		l = &library{path: path, handle: h, c: c}
	}
	// The handle stays open for the life of the process: liburma starts
	// threads and registers providers that do not survive dlclose.
	switch st := C.shim_init(l.c); {
	case st == 0:
		l.ownsInit = true
	case syscall.Errno(st) == syscall.EEXIST:
		// Another user in this process initialised liburma already, or our
		// last urma_uninit failed: then ownsInit is still set, and the next
		// last Close tries again.
	default:
		if libraries.m[h] == nil {
			// Nothing started: the table and our dlopen reference go, or
			// every New on a node whose liburma has no provider leaks both.
			C.shim_free(c)
		}
		return nil, statusErr("urma_init", st, "initialise %s", path)
	}
	l.refs = 1
	libraries.m[h] = l
	return l, nil
}

// release drops a reference; the last one uninitialises liburma. The
// library stays in libraries, for the next openLibrary to initialise again.
func (l *library) release() error {
	libraries.Lock()
	defer libraries.Unlock()
	if l.refs--; l.refs > 0 {
		return nil
	}
	if l.ownsInit {
		if st := C.shim_uninit(l.c); st != 0 {
			// Still initialised, and still ours: had we let go, the next
			// New would meet EEXIST and nobody would uninitialise it.
			return statusErr("urma_uninit", st, "uninitialise %s", l.path)
		}
		l.ownsInit = false
	}
	return nil
}

// initOutside initialises the liburma at path as another user in the
// process would, behind the back of libraries, and returns its uninit. No
// Provider calls it: tests use it to meet EEXIST, as killContexts is the
// fake's hook for a crash. The handle stays open, as libraries' do.
func initOutside(path string) (uninit func() error, err error) {
	c, err := dlopen(path)
	if err != nil {
		return nil, err
	}
	if st := C.shim_init(c); st != 0 {
		return nil, statusErr("urma_init", st, "initialise %s", path)
	}
	return func() error {
		if st := C.shim_uninit(c); st != 0 {
			return statusErr("urma_uninit", st, "uninitialise %s", path)
		}
		return nil
	}, nil
}

// fakeHook calls the test hook name of the fake liburma with arg, C memory
// or nil; real liburma has none, and it fails with ENOSYS. As
// killContexts, no Provider calls it: tests make the fake do what hardware
// does on its own.
func (l *library) fakeHook(name string, arg unsafe.Pointer) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if st := C.shim_fake_hook(l.c, cname, arg); st != 0 {
		return statusErr(name, st, "call the fake's test hook %s", name)
	}
	return nil
}

// fakeGate arms the fake liburma's gate for the function call: the next
// call to it waits in the middle of its work until fakeGate(""). A test
// hook, as fakeHook.
func (l *library) fakeGate(call string) error {
	if call == "" {
		return l.fakeHook("fakeurma_gate", nil)
	}
	ccall := C.CString(call)
	defer C.free(unsafe.Pointer(ccall))
	return l.fakeHook("fakeurma_gate", unsafe.Pointer(ccall))
}

// dlopen loads the library at path through the shim, which resolves the
// liburma functions it calls.
func dlopen(path string) (*C.shim_lib, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	c := C.shim_open(cpath, &msg[0], C.size_t(len(msg)))
	if c == nil {
		return nil, urma.Errorf("dlopen", urma.CodeNoEnt, "load %s: %s", path, C.GoString(&msg[0]))
	}
	return c, nil
}

// statusErr turns a liburma status (an errno value or URMA_FAIL) into the
// verb's error.
func statusErr(op string, st C.int, format string, args ...any) error {
	return urma.Errorf(op, urma.Code(st), "%s (liburma status %d)", fmt.Sprintf(format, args...), int(st))
}

// postErr is statusErr for posts: a full queue is URMA_ENOMEM to liburma
// (hw/udma/udma_u_jfs.c:945-947, udma_u_jfr.c:457-460) and ErrAgain to Go.
func postErr(op string, st C.int, format string, args ...any) error {
	if syscall.Errno(st) == syscall.ENOMEM {
		return urma.Errorf(op, urma.CodeAgain, "%s: queue full", fmt.Sprintf(format, args...))
	}
	return statusErr(op, st, format, args...)
}

// nop makes one cgo call that does nothing, so benchmarks can show what
// the crossing into C costs by itself.
func (l *library) nop() { C.shim_nop(l.c) }
