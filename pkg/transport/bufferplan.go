package transport

import (
	"fmt"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// How large a connection's messages are, and how many it receives at once.
//
// brpc's flags give every connection urma_rq_size receives of
// urma_buffer_size bytes from the engine's one registered pool, and a
// message is at most one buffer: with the default 8 KiB, a 64 KiB Write is
// eight SENDs, eight receive completions and eight send completions, and a
// 1 MiB one a hundred and twenty-eight. On hardware, which pins the pool,
// those sizes are the operator's to choose. The software provider pins
// nothing: there, unless urma_buffer_size or urma_buffer_count is given
// (flags.Given, which every operator-rendered flags file gives), the
// transport sizes the buffers of connections between its own peers itself
// (autoSized):
//
//   - receives: autoRecvCount of them (urma_rq_size when that is given),
//     together autoRecvBytes, at most autoMaxBuffer each, in a region of
//     the connection's own on small pages: a page is charged only when a
//     message lands on it, and a Read that waits for a message has it
//     placed in its own slice (urma_read_direct), so a receive buffer is
//     touched only while its reader lags;
//   - sends: one buffer of the peer's receive size per slot of the send
//     window, of the connection's own (sendbuffers.go), so a Write of up to
//     the peer's buffer is one SEND.
//
// The hello carries the receive size and count (buffer_size,
// recv_buffer_cnt), which is all a sender, ours or brpc's, obeys: no
// message above the peer's buffer_size, no more at once than its receives.
// A server serves a brpc client (whose hello lacks our extension) from the
// engine pool as configured; a client, whose hello goes first, announces
// its own receives to any server, which a brpc server obeys as well.
const (
	// autoRecvBytes is what a connection's own receive buffers span
	// together: the most a peer can have in flight to it. Address space,
	// charged only as messages land.
	autoRecvBytes = 16 << 20
	// autoRecvCount is how many receives such a connection posts when
	// urma_rq_size is not given: the peer's window is 3 fewer messages.
	autoRecvCount = 16
	// autoMaxBuffer is the largest receive and send buffer the transport
	// chooses: a message of up to 1 MiB is one SEND.
	autoMaxBuffer = 1 << 20
)

// recvPlan is how a connection receives: how large each receive buffer is
// (the hello's buffer_size), how many it posts (its recv_buffer_cnt + 1),
// and whether the buffers are a region of its own rather than the engine
// pool's.
type recvPlan struct {
	size, count int
	own         bool
}

// planBuffers decides, once the provider and device are known, whether the
// transport sizes connections' buffers itself (see above) and how.
func (e *engine) planBuffers() {
	e.poolRecv = recvPlan{size: e.bufSize, count: e.rqSize}
	f := &e.s.flags
	if _, isSoft := e.prov.(*soft.Provider); !isSoft || f.Given("urma_buffer_size") || f.Given("urma_buffer_count") {
		return
	}
	count := e.rqSize
	if !f.Given("urma_rq_size") {
		count = min(count, autoRecvCount)
	}
	size := min(autoMaxBuffer, prevPow2(autoRecvBytes/count))
	if m := e.dev.Caps.MaxMsgSize; m != 0 && uint64(size) > m {
		size = prevPow2(int(min(m, uint64(autoMaxBuffer))))
	}
	if size <= e.bufSize {
		return // no larger than the pool's: nothing to gain
	}
	e.autoSized = true
	e.autoRecv = recvPlan{size: size, count: count, own: true}
}

// recvPlanFor is how a connection receives: from buffers of its own, sized
// by the transport, when the engine sizes them itself and the peer is ours
// (or, for a client, not yet known), else from the engine pool.
func (e *engine) recvPlanFor(ourPeer bool) recvPlan {
	if e.autoSized && ourPeer {
		return e.autoRecv
	}
	return e.poolRecv
}

// prevPow2 is the largest power of two not above n (n > 0).
func prevPow2(n int) int {
	p := 1
	for p <= n/2 {
		p *= 2
	}
	return p
}

// newRecvRegion maps and registers plan.count receive buffers of plan.size
// bytes, on small pages, local-only: only this side's provider writes them.
func (e *engine) newRecvRegion(plan recvPlan) (*bufferPool, error) {
	pool, err := allocPool(plan.size, plan.count, urma.AllocPrivatePages, func(mem *urma.Memory) (urma.Segment, error) {
		return e.uctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	})
	if err != nil {
		return nil, fmt.Errorf("receive buffers of its own: %w", err)
	}
	return pool, nil
}
