//go:build linux && cgo

package liburma

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A second Provider.Close waits for the first one's teardown and returns
// its result: it returned nil at once, so a caller closing from two places
// could go on (unload, exit, initialise liburma again) while the first was
// still deleting in liburma, and never heard of a failed delete. The
// fake's gate holds a JFC creation, which the first Close waits for; a
// failed context delete gives the teardown a result to share.
func TestProviderCloseTwiceWaitsForTheTeardown(t *testing.T) {
	p := providerOfFake(t, "fakeurma")
	c, err := p.Open("udma0", 0)
	if err != nil {
		t.Fatal(err)
	}
	created := createJFCHeld(t, p, c, urma.JFCConfig{Depth: 16})
	failNextDelete(t, p, "urma_delete_context")
	var firstErr, secondErr error
	first, second := make(chan struct{}), make(chan struct{})
	go func() { defer close(first); firstErr = p.Close() }()
	if !waitBlockedIn(first, "liburma.(*devContext).forceClose") {
		t.Fatalf("the first Close returned (%v) while a JFC was being created", firstErr)
	}
	go func() { defer close(second); secondErr = p.Close() }()
	if !waitParkedIn(second, "liburma.(*Provider).Close", "chan receive") {
		t.Errorf("the second Close returned (%v) while the first was tearing down", secondErr)
	}
	if err := p.lib.fakeGate(""); err != nil {
		t.Fatal(err)
	}
	if cr := <-created; cr.err != nil {
		t.Errorf("CreateJFC: %v", cr.err)
	}
	<-first
	<-second
	if firstErr == nil || !strings.Contains(firstErr.Error(), "delete_context") {
		t.Errorf("first Close: %v, want the failed delete_context", firstErr)
	}
	if !errors.Is(secondErr, firstErr) { // the very same error
		t.Errorf("second Close: %v; the first returned %v", secondErr, firstErr)
	}
}

// waitParkedIn reports whether a goroutine is parked in state (as its
// stack header says, e.g. "chan receive") inside fn before done is closed
// (false: the call finished without parking).
func waitParkedIn(done <-chan struct{}, fn, state string) bool {
	buf := make([]byte, 1<<20)
	for {
		for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
			header, _, _ := bytes.Cut(g, []byte("\n"))
			if bytes.Contains(header, []byte("["+state)) && bytes.Contains(g, []byte(fn)) {
				return true
			}
		}
		select {
		case <-done:
			return false
		case <-time.After(time.Millisecond): // look again
		}
	}
}
