package transport

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// booksConn is a connection cut down to its completion books, with no
// provider behind it: a window of 4 sends with buffer 0 of a 4-buffer pool
// out in one of them (sqWindow 3), every credit work request free and two
// receives posted.
func booksConn(t *testing.T) *urmaConn {
	t.Helper()
	const size = 64
	pool := newPoolOver(make([]byte, 4*size), size, 4)
	if !pool.tryGetN(1, make([]*Buffer, 1)) {
		t.Fatal("take a buffer from a fresh pool")
	}
	c := &urmaConn{
		e:    &engine{bufSize: size},
		pool: pool, rxPool: pool, recv: recvPlan{size: size, count: 2}, windowCap: 4, sqWindow: 3, remoteRQWindow: 4, creditWRs: creditWRs,
		rx:        []*Buffer{{}, {}},
		rxState:   []rxState{rxPosted, rxPosted},
		rxq:       make([]int32, 2),
		readable:  make(chan struct{}, 1),
		writable:  make(chan struct{}, 1),
		flushDone: make(chan struct{}),
	}
	c.state.Store(uint32(stateOpen))
	return c
}

// TestCompletionsOutsideTheBooks: a completion record that names no
// outstanding work (a credit send with every credit work request free, a
// send beyond the window, a buffer or a receive slot past the last one) is
// an error that says so, never a panic or a window grown past its size.
func TestCompletionsOutsideTheBooks(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(c *urmaConn)
		cr      urma.Completion
		wantErr string
	}{
		{
			name:    "credit send done, every credit WR free",
			cr:      urma.Completion{UserCtx: 0},
			wantErr: "credit send completion beyond the 3 reserved work requests",
		},
		{
			name:    "send naming the buffer after the last",
			cr:      urma.Completion{UserCtx: 4 + 1},
			wantErr: "send completion names buffer 4 of 4",
		},
		{
			name:    "send completion, send window full",
			prepare: func(c *urmaConn) { c.sqWindow = c.windowCap },
			cr:      urma.Completion{UserCtx: 1},
			wantErr: "send completion beyond the window of 4",
		},
		{
			name:    "receive naming the slot after the last",
			cr:      urma.Completion{Recv: true, UserCtx: 2 + 1, CompletionLen: 10},
			wantErr: "receive completion names slot 2, not a posted receive",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := booksConn(t)
			if tc.prepare != nil {
				tc.prepare(c)
			}
			c.mu.Lock()
			_, _, err := c.handleLocked(&tc.cr)
			creditWRsFree, sqWindow := c.creditWRs, c.sqWindow
			c.mu.Unlock()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("handle %+v: %v; want an error containing %q", tc.cr, err, tc.wantErr)
			}
			if creditWRsFree > creditWRs || sqWindow > c.windowCap {
				t.Errorf("after the record: %d credit WRs free of %d, send window %d of %d", creditWRsFree, creditWRs, sqWindow, c.windowCap)
			}
		})
	}
}

// TestFailedSendCompletions: a send that completes with an error, or is
// flushed while closing, gives its buffer and its share of the send window
// back (a data send) or its reserved work request (a credit message), and
// nothing more: Close waits for exactly what is outstanding. The
// FLUSH_ERR_DONE record stands for no send.
func TestFailedSendCompletions(t *testing.T) {
	tests := []struct {
		name          string
		closing       bool
		creditWRsFree int // before the record
		cr            urma.Completion
		wantSQWindow  int
		wantFree      int // buffers on the pool's free list after
		wantCreditWRs int
	}{
		{
			name:          "data send rejected by the peer",
			creditWRsFree: creditWRs,
			cr:            urma.Completion{UserCtx: 1, Status: urma.StatusRemAccessAbort},
			wantSQWindow:  4, wantFree: 4, wantCreditWRs: creditWRs,
		},
		{
			name:          "data send flushed while closing",
			closing:       true,
			creditWRsFree: creditWRs,
			cr:            urma.Completion{UserCtx: 1, Status: urma.StatusWRFlushErr},
			wantSQWindow:  4, wantFree: 4, wantCreditWRs: creditWRs,
		},
		{
			name:          "credit message rejected by the peer",
			creditWRsFree: creditWRs - 1,
			cr:            urma.Completion{UserCtx: 0, Status: urma.StatusRemAccessAbort},
			wantSQWindow:  3, wantFree: 3, wantCreditWRs: creditWRs,
		},
		{
			name:          "credit failure, every credit WR free",
			creditWRsFree: creditWRs,
			cr:            urma.Completion{UserCtx: 0, Status: urma.StatusRemAccessAbort},
			wantSQWindow:  3, wantFree: 3, wantCreditWRs: creditWRs,
		},
		{
			name:          "flush done",
			closing:       true,
			creditWRsFree: creditWRs - 1,
			cr:            urma.Completion{UserCtx: 1, Status: urma.StatusWRFlushErrDone},
			wantSQWindow:  3, wantFree: 3, wantCreditWRs: creditWRs - 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := booksConn(t)
			c.creditWRs = tc.creditWRsFree
			if tc.closing {
				c.state.Store(uint32(stateClosing))
			}
			c.mu.Lock()
			_, _, _ = c.handleLocked(&tc.cr)
			sqWindow, creditWRsFree := c.sqWindow, c.creditWRs
			c.mu.Unlock()
			free, _ := c.pool.stats()
			if sqWindow != tc.wantSQWindow || free != tc.wantFree || creditWRsFree != tc.wantCreditWRs {
				t.Errorf("after %+v: send window %d, %d buffers free, %d credit WRs free; want %d, %d, %d",
					tc.cr, sqWindow, free, creditWRsFree, tc.wantSQWindow, tc.wantFree, tc.wantCreditWRs)
			}
			if err := c.pool.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// queuedJFC is a completion queue holding a fixed list of records.
type queuedJFC struct {
	urma.JFC
	records []urma.Completion
}

func (q *queuedJFC) Poll(out []urma.Completion) (int, error) {
	n := copy(out, q.records)
	q.records = q.records[n:]
	return n, nil
}

func (q *queuedJFC) Rearm(bool) error { return nil }

// fdJFCE is a completion channel on a given descriptor that never fires.
type fdJFCE struct {
	urma.JFCE
	fd int
}

func (x fdJFCE) Fd() int                                     { return x.fd }
func (x fdJFCE) Wait([]urma.JFC, time.Duration) (int, error) { return 0, nil }

// TestCompletionChannelDescriptor: a completion channel without a
// descriptor (-1) is refused with that reason; descriptor 0 is a
// descriptor like any other (a process started with stdin closed gets its
// first one there), used if it can be duplicated.
func TestCompletionChannelDescriptor(t *testing.T) {
	const noFd = "completion channel has no file descriptor"
	for _, fd := range []int{-1, 0} {
		c := booksConn(t)
		c.res = &jettyRes{jfce: fdJFCE{fd: fd}, jfc: &queuedJFC{}}
		c.cqes = make([]urma.Completion, 4)
		c.evDone = make(chan struct{})
		err := c.startEvents()
		if err == nil {
			// Running: stop the event loop as teardown does.
			_ = c.evFile.Close()
			<-c.evDone
		}
		if refused := err != nil && strings.Contains(err.Error(), noFd); refused != (fd < 0) {
			t.Errorf("completion channel on descriptor %d: %v", fd, err)
		}
	}
}

// TestPollDrainsAFullQueue: a poll that fills the whole batch may have left
// records behind, so poll goes on until a batch comes back short; records
// left in the queue would wait for a completion event that never comes.
func TestPollDrainsAFullQueue(t *testing.T) {
	const batch = 4
	for _, queued := range []int{0, 1, batch, batch + 1, 2*batch + 3} {
		c := booksConn(t)
		c.state.Store(uint32(stateClosing))
		// Flushed receives while closing: records that change no books.
		jfc := &queuedJFC{records: make([]urma.Completion, queued)}
		for i := range jfc.records {
			jfc.records[i] = urma.Completion{Recv: true, UserCtx: 1, Status: urma.StatusWRFlushErr}
		}
		c.res = &jettyRes{jfc: jfc}
		c.cqes = make([]urma.Completion, batch)
		if got := c.poll(); got != queued || len(jfc.records) != 0 {
			t.Errorf("%d records queued: poll handled %d and left %d", queued, got, len(jfc.records))
		}
	}
}

// TestCloseWaitsForOutstandingSends: Close waits for every outstanding send,
// data and credit, and says how many were still outstanding when the close
// timeout passed.
func TestCloseWaitsForOutstandingSends(t *testing.T) {
	tests := []struct {
		name            string
		sqWindow        int
		creditWRsFree   int
		wantOutstanding int // 0: no log line
	}{
		{"nothing outstanding", 4, creditWRs, 0},
		{"one data send", 3, creditWRs, 1},
		{"one credit message", 4, creditWRs - 1, 1},
		{"one of each", 3, creditWRs - 1, 2},
		{"two data sends and a credit message", 2, creditWRs - 1, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := booksConn(t)
			c.sqWindow, c.creditWRs = tc.sqWindow, tc.creditWRsFree
			var logs logLines
			c.log = logs.logger()
			c.e.s.closeTimeout = time.Nanosecond
			c.waitSendsDone(time.Now().Add(c.e.s.closeTimeout))
			line := logs.find("closing with sends still outstanding")
			switch {
			case tc.wantOutstanding == 0 && line != "":
				t.Errorf("nothing was outstanding, yet: %s", line)
			case tc.wantOutstanding != 0 && !strings.Contains(line, `"outstanding"=`+strconv.Itoa(tc.wantOutstanding)):
				t.Errorf("log %q; want %d sends outstanding", line, tc.wantOutstanding)
			}
		})
	}
}
