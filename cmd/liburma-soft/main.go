//go:build linux && cgo

// Command liburma-soft is liburma.so.0 over the software provider: a C
// shared library with liburma's ABI (UMDK 26.06, as pkg/urma/liburma's
// urma_compat.h declares it) whose devices are pkg/urma/soft devices, so
// that an unmodified C or C++ program linked against liburma (brpc's
// UrmaTransport, Mooncake's transfer engine) moves real bytes, to other
// such programs and to Go programs using pkg/urma/soft, over the same shm
// and socket fabrics. docs/liburma-soft.md says what it implements.
//
// It is built with -buildmode=c-shared by hack/build-liburma-soft.sh
// (`make build` writes bin/liburma.so.0), never run as a program. The C
// half, abi.c, is the only code that touches liburma's structures; the Go
// half, exports.go over internal/liburmasoft, owns every object behind a
// handle. A refused function (refused.c) returns what liburma returns for
// an operation its provider lacks.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../../pkg/urma/liburma -O2 -Wall -Werror
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/openeuler/urma-k8s/internal/liburmasoft"
)

func main() {}

// lib is the library's process-wide state, as liburma's is: a C program
// has one liburma, initialised once (urma_init), and names objects by
// pointers the library hands out.
var lib = newState()

type state struct {
	core *liburmasoft.Library
	objs handles
	log  logr.Logger

	logLevel atomic.Int32
	refusals sync.Map // function name -> struct{}: each refusal is logged once
}

func newState() *state {
	s := &state{}
	stderr := funcr.New(func(prefix, args string) {
		fmt.Fprintln(os.Stderr, "liburma (urma-k8s software provider):", strings.TrimSpace(prefix+" "+args))
	}, funcr.Options{Verbosity: 2})
	s.log = logr.New(&levelSink{LogSink: stderr.GetSink(), s: s})
	s.core = liburmasoft.NewLibrary(nil, s.log)
	return s
}

func (s *state) setLevel(l int) { s.logLevel.Store(int32(l)) }
func (s *state) level() int     { return int(s.logLevel.Load()) }

var errRefused = errors.New("not implemented by the software provider")

// refused logs, once per function, that the program called one the
// library does not implement.
func (s *state) refused(fn string) {
	if _, seen := s.refusals.LoadOrStore(fn, struct{}{}); !seen {
		s.log.Error(errRefused, "returning what liburma returns for an operation its provider lacks (URMA_EINVAL)", "function", fn)
	}
}

// levelSink writes what URMA_LOG_LEVEL asks for to stderr: errors always
// (liburma's default level), with warning or info the library's and the
// provider's events too, with debug everything.
type levelSink struct {
	logr.LogSink
	s *state
}

func (l *levelSink) Enabled(v int) bool {
	switch lvl := l.s.level(); {
	case lvl >= liburmasoft.LevelDebug:
		return true
	case lvl >= liburmasoft.LevelWarning:
		return v == 0
	}
	return false
}

func (l *levelSink) WithValues(kv ...any) logr.LogSink {
	return &levelSink{LogSink: l.LogSink.WithValues(kv...), s: l.s}
}

func (l *levelSink) WithName(name string) logr.LogSink {
	return &levelSink{LogSink: l.LogSink.WithName(name), s: l.s}
}
