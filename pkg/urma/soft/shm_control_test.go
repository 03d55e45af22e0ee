package soft

import (
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// loggedShmDeviceAndFakePeer is an shm device whose log the test reads, and
// a hand-driven peer connected to it (fakeShmPeer).
func loggedShmDeviceAndFakePeer(t *testing.T) (*Provider, *shmIO, *logtest.Lines) {
	t.Helper()
	p, sink := loggedProvider(t, shmOpts(t))
	f, _ := fakeShmPeer(t, p.devices[0].side)
	return p, f, sink
}

// A peer that sends the device nonsense on an established shm connection's
// unix socket, or hangs up, loses the connection, and the device logs what
// happened: a message of the largest size is read whole and refused for what
// it is, and so are as many descriptors as a message carries (a HELLO's),
// counted; a longer message, or one with many more descriptors, is refused
// as truncated.
func TestShmHostileControlMessages(t *testing.T) {
	segMap := func() []byte {
		return encodeShmSeg(make([]byte, shmSegMsgLen), &shmSegMsg{typ: shmMsgSegMap, handle: 1, length: 4096})
	}
	cases := []struct {
		name string
		msg  func(f *shmIO) []byte // nil: hang up
		fds  int                   // eventfds passed with msg
		log  string
	}{
		{"hang up", nil, 0, "peer closed its shm socket"},
		{"a HELLO after the handshake", func(f *shmIO) []byte {
			me, _ := ShmEID()
			return encodeShmHello(make([]byte, shmMaxMsgLen), &shmHelloMsg{typ: shmMsgHello, src: me, ringSize: MinShmRing})
		}, 0, "type 1 unknown or out of place"},
		{"a message longer than any", func(*shmIO) []byte { return append(segMap(), make([]byte, 2*shmMaxMsgLen)...) }, 0, "truncated"},
		{"SEG_MAP with shmMaxFds descriptors", func(*shmIO) []byte { return segMap() }, shmMaxFds, "type 3 with 3 descriptors, want 1"},
		{"SEG_MAP with eight descriptors", func(*shmIO) []byte { return segMap() }, 8, "truncated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, f, sink := loggedShmDeviceAndFakePeer(t)
			if c.msg == nil {
				mustOK(t, unix.Shutdown(f.ctlFd, unix.SHUT_RDWR), "hang up")
			} else {
				fds := make([]int, c.fds)
				for i := range fds {
					var err error
					fds[i], err = unix.Eventfd(0, unix.EFD_CLOEXEC)
					mustOK(t, err, "eventfd")
				}
				defer closeAll(fds)
				var rights []byte
				if len(fds) > 0 {
					rights = unix.UnixRights(fds...)
				}
				mustOK(t, unix.Sendmsg(f.ctlFd, c.msg(f), rights, nil, unix.MSG_NOSIGNAL), "send")
			}
			eventually.Holds(t, "the device to log why it closed the connection", 0, func() bool { return sink.Contains(c.log) })
			eventually.Holds(t, "the connection to close", 0, func() bool { return len(p.conns()) == 0 })
		})
	}
}

// A peer that shares a segment and hangs up before the device answers has
// closed the connection, not broken the protocol: the device logs a close.
// The device's own mapMu, held by the test, keeps its answer back until
// the peer has hung up.
func TestShmPeerHangsUpBeforeSegMapped(t *testing.T) {
	p, f, sink := loggedShmDeviceAndFakePeer(t)
	eventually.Holds(t, "the device to adopt the connection", 0, func() bool { return len(p.conns()) == 1 })
	c := p.conns()[0]
	dev := c.io.(*shmIO)
	ro := readOnlyMemfd(t)
	defer unix.Close(ro)

	dev.pull.mapMu.RLock() // the device cannot map, so cannot answer, until released
	msg := encodeShmSeg(make([]byte, shmSegMsgLen), &shmSegMsg{typ: shmMsgSegMap, handle: 1, length: 4096})
	mustOK(t, unix.Sendmsg(f.ctlFd, msg, unix.UnixRights(ro), nil, unix.MSG_NOSIGNAL), "send SEG_MAP")
	mustOK(t, unix.Shutdown(f.ctlFd, unix.SHUT_RDWR), "hang up")
	dev.pull.mapMu.RUnlock()

	<-c.done
	if err := c.deathCause(); err == nil || !strings.Contains(err.Error(), "SEG_MAP") {
		t.Fatalf("the connection died of %v, not of the answer to SEG_MAP", err)
	}
	eventually.Holds(t, "the device to log the close", 0, func() bool { return sink.Contains("connection closed") || sink.Contains("broke the protocol") })
	if sink.Contains("broke the protocol") {
		t.Fatalf("a peer that hung up is logged as a protocol violation: %q", sink.All())
	}
}

// Unregistering a shared segment while the peer's unix socket is full
// (its control reader busy) still unmaps it at the peer once the peer
// reads on: a lost SEG_UNMAP would leave the peer mapping memory this side
// unregistered, for the connection's life. A connection that closes while
// the SEG_UNMAP waits for room closes at once, leaving nothing behind.
func TestShmUnmapWaitsForRoom(t *testing.T) {
	for _, closeFirst := range []bool{false, true} {
		name := map[bool]string{false: "peer reads on", true: "connection closes"}[closeFirst]
		t.Run(name, func(t *testing.T) {
			noLeaks(t)
			pa, pb, _, a, b, target := loggedShmPair(t)
			seg, _ := shareableSegment(t, a, urma.AccessRead)
			b.postRecv(1, 0, 64<<10)
			mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target,
				SGEs: []urma.SGE{{Segment: seg, Len: 64 << 10}}}), "send, sharing the segment")
			if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
				t.Fatalf("send: %+v", c)
			}
			pollN(t, b.rjfc, 1, 10*time.Second)
			eventually.Holds(t, "the share to be ready", 0, func() bool { return pa.readyShares() == 1 })
			sa, sb := pa.conns()[0].io.(*shmIO), pb.conns()[0].io.(*shmIO)
			var handle uint32
			sa.pull.shareMu.Lock()
			for _, sh := range sa.pull.shared {
				handle = sh.handle
			}
			sa.pull.shareMu.Unlock()
			mappedAtB := func() bool {
				sb.pull.mapMu.RLock()
				defer sb.pull.mapMu.RUnlock()
				_, ok := sb.pull.mapped[handle]
				return ok
			}
			if !mappedAtB() {
				t.Fatalf("the peer does not map handle %d", handle)
			}

			// Hold b's control reader in the SEG_MAP of another handle (it
			// maps under mapMu), then fill a's socket to b with SEG_UNMAPs
			// of a handle b refused, which b ignores, until it takes no more.
			ro := readOnlyMemfd(t)
			defer unix.Close(ro)
			const blocker, filler = 1000, 999
			sb.pull.mapMu.RLock()
			msg := encodeShmSeg(make([]byte, shmSegMsgLen), &shmSegMsg{typ: shmMsgSegMap, handle: blocker, length: 4096})
			mustOK(t, unix.Sendmsg(sa.ctlFd, msg, unix.UnixRights(ro), nil, unix.MSG_NOSIGNAL), "send SEG_MAP")
			fill := encodeShmSeg(make([]byte, shmSegMsgLen), &shmSegMsg{typ: shmMsgSegUnmap, handle: filler})
			for n := 0; ; n++ {
				err := unix.Sendmsg(sa.ctlFd, fill, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
				if errors.Is(err, unix.EAGAIN) {
					break
				}
				if err != nil || n > 1<<20 {
					sb.pull.mapMu.RUnlock()
					t.Fatalf("filling the socket: %d messages, %v", n, err)
				}
			}
			if err := seg.Close(); err != nil {
				sb.pull.mapMu.RUnlock() // or the cleanup waits for b's reader for good
				t.Fatalf("unregister: %v", err)
			}
			if closeFirst {
				mustOK(t, pa.Close(), "close the sender") // must not wait for b
				sb.pull.mapMu.RUnlock()
				eventually.Holds(t, "the peer to see the connection close", 0, func() bool { return len(pb.conns()) == 0 })
				return
			}
			sb.pull.mapMu.RUnlock()

			eventually.Holds(t, "the peer to unmap the unregistered segment", 0, func() bool { return !mappedAtB() })
			roundTrip(t, a, target, b)
			alive(t, pb.conns()[0])
		})
	}
}

// readOnlyMemfd is a read-only descriptor of a sealed 4 KiB memfd, as a
// SEG_MAP carries one; the caller closes it, the memory goes with the test.
func readOnlyMemfd(t *testing.T) int {
	t.Helper()
	mem, err := urma.AllocMemory(4096)
	mustOK(t, err, "alloc")
	t.Cleanup(func() { _ = mem.Free() })
	fd, err := shmring.ReopenReadOnly(mem.Fd())
	mustOK(t, err, "reopen")
	return fd
}

// Both sides sharing many segments with each other at once must not block
// each other's control plane. Each side's control reader answers the
// peer's SEG_MAPs on the same unix socket its own SEG_MAPs fill; a reader
// that waited for room to answer would wait for the peer's reader, which
// waits the same way for it: neither reads again, and no share on the
// connection ever becomes ready. Here each side's reader is held (mapMu)
// at its first SEG_MAP while its own side fills its small socket with
// more, so that both readers must answer into a full socket at once.
func TestShmSharingBothWaysAtOnce(t *testing.T) {
	noLeaks(t)
	pa, pb, _, a, b, _ := loggedShmPair(t)
	sa, sb := pa.conns()[0].io.(*shmIO), pb.conns()[0].io.(*shmIO)
	const segs = 64 // many more SEG_MAPs than the shrunk sockets take
	sides := []struct {
		s    *side
		sio  *shmIO
		segs []*segment
	}{{s: a, sio: sa}, {s: b, sio: sb}}
	for i := range sides {
		x := &sides[i]
		// The smallest buffer the kernel allows: a few messages fill it.
		mustOK(t, unix.SetsockoptInt(x.sio.ctlFd, unix.SOL_SOCKET, unix.SO_SNDBUF, 1), "shrink the socket's send buffer")
		for range segs {
			mem, err := urma.AllocMemory(4096)
			mustOK(t, err, "alloc")
			t.Cleanup(func() { _ = mem.Free() })
			seg, err := x.s.ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessRead, TokenPolicy: urma.TokenPlainText, Token: 99})
			mustOK(t, err, "register")
			t.Cleanup(func() { _ = seg.Close() })
			x.segs = append(x.segs, seg.(*segment))
		}
	}

	sa.pull.mapMu.RLock()
	sb.pull.mapMu.RLock()
	for _, x := range sides {
		for _, seg := range x.segs {
			x.sio.share(seg)
		}
	}
	sent := func(sio *shmIO) (n int) {
		sio.pull.shareMu.Lock()
		defer sio.pull.shareMu.Unlock()
		for _, sh := range sio.pull.shared {
			if !sh.failed {
				n++
			}
		}
		return n
	}
	wantA, wantB := sent(sa), sent(sb)
	t.Logf("%d and %d of %d SEG_MAPs fit the sockets", wantA, wantB, segs)
	sa.pull.mapMu.RUnlock()
	sb.pull.mapMu.RUnlock()
	if wantA == segs || wantB == segs {
		t.Fatalf("%d and %d of %d SEG_MAPs fit the sockets: the test must fill them", wantA, wantB, segs)
	}

	eventually.Holds(t, "every SEG_MAP sent to be answered, both ways", 0, func() bool {
		return pa.readyShares() == wantA && pb.readyShares() == wantB
	})
	alive(t, pa.conns()[0])
	alive(t, pb.conns()[0])
}

// A peer that shares ever more segments and never reads the answers does
// not hold the device's control reader, nor grow its queue of answers
// without end: past maxQueuedAnswers the device drops the connection and
// says why.
func TestShmPeerNeverReadsItsAnswers(t *testing.T) {
	noLeaks(t)
	p, f, sink := loggedShmDeviceAndFakePeer(t)
	eventually.Holds(t, "the device to adopt the connection", 0, func() bool { return len(p.conns()) == 1 })
	ro := readOnlyMemfd(t)
	defer unix.Close(ro)
	// A device whose reader waited to answer would stop reading: the
	// peer's send then times out instead of hanging the test.
	mustOK(t, unix.SetsockoptTimeval(f.ctlFd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 10}), "send timeout")
	msg := make([]byte, shmSegMsgLen)
	for h := uint32(1); ; h++ {
		encodeShmSeg(msg, &shmSegMsg{typ: shmMsgSegMap, handle: h, length: 4096})
		err := ignoringEINTR(func() error { return unix.Sendmsg(f.ctlFd, msg, unix.UnixRights(ro), nil, unix.MSG_NOSIGNAL) })
		if peerHungUp(err) {
			break // the device dropped the connection
		}
		mustOK(t, err, "send SEG_MAP (the device stopped reading?)")
		if h > 1<<20 {
			t.Fatalf("the device took %d SEG_MAPs without an answer read", h)
		}
	}
	eventually.Holds(t, "the device to say why it dropped the connection", 0, func() bool { return sink.Contains("answers to its SEG_MAPs wait") })
	eventually.Holds(t, "the connection to close", 0, func() bool { return len(p.conns()) == 0 })
}
