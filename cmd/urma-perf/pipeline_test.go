package main

import (
	"context"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// heldConn is a connection whose answers the test releases one at a time;
// it counts what was written. Its channels block durably, for synctest.
type heldConn struct {
	net.Conn
	answers chan struct{}
	closed  chan struct{}
	once    sync.Once
	mu      sync.Mutex
	writes  int
}

func newHeldConn() *heldConn {
	return &heldConn{answers: make(chan struct{}), closed: make(chan struct{})}
}

func (c *heldConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	return len(p), nil
}

// Read returns one whole answer once the test releases it.
func (c *heldConn) Read(p []byte) (int, error) {
	select {
	case <-c.answers:
		clear(p)
		return len(p), nil
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

func (c *heldConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *heldConn) written() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// TestPipelineDepth: --pipeline N keeps exactly N requests unanswered, and
// times each from its write, not from when it began to wait for room in
// the pipeline. The server here answers one request every 10 ms (of the
// bubble's clock) once the pipeline is full: each request then waits N
// answers, N*10 ms, and the first ones less.
func TestPipelineDepth(t *testing.T) {
	for _, depth := range []int{2, 4} {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := newHeldConn()
			w := &worker{conn: c}
			done := make(chan struct{})
			go func() {
				defer close(done)
				w.runPipelined(ctx, time.Now().Add(time.Hour), sliceSender{conn: c, req: newRequest(64)}, ackSize, depth)
			}()
			stop := func() { // as a signal does (measure)
				cancel()
				_ = c.Close()
				<-done
			}
			defer stop()
			synctest.Wait() // the client sent what it may without an answer
			if got := c.written(); got != depth {
				t.Fatalf("--pipeline %d: %d requests sent before any answer", depth, got)
			}
			const gap = 10 * time.Millisecond
			for answered := 1; answered <= 3*depth; answered++ {
				time.Sleep(gap) // the bubble's clock: the server takes gap per answer
				c.answers <- struct{}{}
				synctest.Wait()
				if got := c.written() - answered; got != depth {
					t.Fatalf("--pipeline %d: %d requests unanswered after %d answers", depth, got, answered)
				}
			}
			stop()
			if w.err != nil || w.requests != uint64(3*depth) {
				t.Fatalf("worker: err %v, %d requests; want none and %d", w.err, w.requests, 3*depth)
			}
			if w.hist.minV != gap || w.hist.maxV != time.Duration(depth)*gap {
				t.Errorf("--pipeline %d: latencies %v..%v, want %v..%v", depth, w.hist.minV, w.hist.maxV, gap, time.Duration(depth)*gap)
			}
		})
	}
}
