package soft

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// loggedShmDeviceAndFakePeer is an shm device whose log the test reads, and
// a hand-driven peer connected to it (fakeShmPeer).
func loggedShmDeviceAndFakePeer(t *testing.T) (*Provider, *shmIO, *logSink) {
	t.Helper()
	p, sink := loggedProvider(t, shmOpts(t))
	f, _ := fakeShmPeer(t, p.devices[0].sock)
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
					fds[i], err = newEventfd()
					mustOK(t, err, "eventfd")
				}
				defer closeAll(fds)
				var rights []byte
				if len(fds) > 0 {
					rights = unix.UnixRights(fds...)
				}
				mustOK(t, unix.Sendmsg(f.ctlFd, c.msg(f), rights, nil, unix.MSG_NOSIGNAL), "send")
			}
			waitUntil(t, "the device to log why it closed the connection", func() bool { return sink.has(c.log) })
			waitUntil(t, "the connection to close", func() bool { return len(p.conns()) == 0 })
		})
	}
}

// A peer that shares a segment and hangs up before the device answers has
// closed the connection, not broken the protocol: the device logs a close.
// The device's own mapMu, held by the test, keeps its answer back until
// the peer has hung up.
func TestShmPeerHangsUpBeforeSegMapped(t *testing.T) {
	p, f, sink := loggedShmDeviceAndFakePeer(t)
	waitUntil(t, "the device to adopt the connection", func() bool { return len(p.conns()) == 1 })
	c := p.conns()[0]
	dev := c.io.(*shmIO)
	mem, err := urma.AllocMemory(4096)
	mustOK(t, err, "alloc")
	t.Cleanup(func() { _ = mem.Free() })
	ro, err := reopenReadOnly(mem.Fd())
	mustOK(t, err, "reopen")
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
	waitUntil(t, "the device to log the close", func() bool { return sink.has("connection closed") || sink.has("broke the protocol") })
	if sink.has("broke the protocol") {
		t.Fatalf("a peer that hung up is logged as a protocol violation: %q", sink.lines)
	}
}
