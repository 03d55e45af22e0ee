// Package logtest records what code under test logs, so that tests can
// check which lines were said and how often.
package logtest

import (
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// Lines keeps every line a Logger wrote (verbosity 1 included), each as
// funcr renders it: `"msg"="..." "key"=value ...` after the logger's name.
// It is safe for concurrent use; the zero value is ready.
type Lines struct {
	mu    sync.Mutex
	lines []string
}

// Logger returns a logger that records into l and, when t is not nil, also
// passes each line on to t's log.
func (l *Lines) Logger(t testing.TB) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, strings.TrimSpace(prefix+" "+args))
		l.mu.Unlock()
		if t != nil {
			t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 1})
}

// Count is the number of lines containing sub.
func (l *Lines) Count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

// Contains reports whether any line contains sub.
func (l *Lines) Contains(sub string) bool { return l.Count(sub) > 0 }

// All returns a copy of the lines so far.
func (l *Lines) All() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// String is every line, one a line.
func (l *Lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
