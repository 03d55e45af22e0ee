//go:build linux && cgo

package liburma

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A send error that Poll finds moves its jetty to ERROR only once no
// PostSend is between its state check and its post: udma accepts a post on
// a jetty in ERROR, and one that lands after the flush never completes
// (the transport would wait for it, and hold its buffer, for good). The
// test holds the jetty as a PostSend past its check does and polls the
// error: Poll must wait for the jetty, not flush it under the post.
func TestSendErrorWaitsForAPostInProgress(t *testing.T) {
	requireFake(t) // the send fails before PostSend returns only in the fake
	p := newTestProvider(t)
	a, b := openFlushPeer(t, p, "udma0", 4), openFlushPeer(t, p, "udma1", 4)
	// No retries: B posts no receive, so the send fails at once.
	j, err := a.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 4, SendJFC: a.jfc, JFR: a.jfr, RNRRetry: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(t, j) })
	target := importPeer(t, a, b)
	if err := j.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target, UserCtx: 1}); err != nil {
		t.Fatal(err)
	}

	posting := &j.(*jetty).mu
	posting.Lock() // a PostSend past its state check
	var got []urma.Completion
	var pollErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]urma.Completion, 8)
		var n int
		n, pollErr = a.jfc.Poll(buf)
		got = buf[:n]
	}()
	if !waitBlockedIn(done, "liburma.(*jfc).take") {
		posting.Unlock()
		t.Fatalf("Poll moved the jetty to ERROR (state %d) and flushed it while a post was in progress", j.State())
	}
	if s := j.State(); s != urma.JettyReady {
		t.Errorf("jetty %v while a post is in progress", s)
	}
	posting.Unlock()
	<-done
	if pollErr != nil || len(got) != 1 || got[0].Status != urma.StatusRNRRetryCntExc || got[0].UserCtx != 1 {
		t.Fatalf("poll: %+v %v, want send 1's RNR_RETRY_CNT_EXC", got, pollErr)
	}
	if s := j.State(); s != urma.JettyError {
		t.Errorf("jetty %v after its send failed, want ERROR", s)
	}
	if err := j.PostSend(&urma.SendWR{Opcode: urma.OpSend, Target: target, UserCtx: 2}); err == nil {
		t.Error("a post on the jetty in ERROR was accepted")
	}
}

// waitBlockedIn reports whether a goroutine waits for a mutex inside fn
// before done is closed (false: the call finished without waiting). It
// reads the goroutines' stacks: nothing else tells a goroutine blocked on a
// lock from one not yet scheduled.
func waitBlockedIn(done <-chan struct{}, fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
			locking := bytes.Contains(g, []byte("sync.(*Mutex).Lock")) || bytes.Contains(g, []byte("sync.(*RWMutex).Lock"))
			if locking && bytes.Contains(g, []byte(fn)) {
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
