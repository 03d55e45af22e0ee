package soft

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/logtest"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// The answers a reader owes coalesce: SUCCESS answers to consecutive sends
// of one sender jetty become one ACK_RUN, whatever other senders interleave;
// any other answer, a gap, or another source jetty starts afresh, so each
// sender still sees its answers in order.
func TestAnswerQueueCoalesces(t *testing.T) {
	tag := func(inst, seq uint32) uint64 { return uint64(inst)<<32 | uint64(seq) }
	ack := func(src, inst, seq uint32, st urma.Status) func(*answerQueue) {
		return func(q *answerQueue) { q.ack(&sendHeader{src: src, dst: 9, tag: tag(inst, seq)}, st, 3) }
	}
	type want struct {
		typ   byte
		tag   uint64
		count uint32
	}
	cases := []struct {
		name string
		ops  []func(*answerQueue)
		want []want
	}{
		{"one", []func(*answerQueue){ack(1, 7, 5, urma.StatusSuccess)},
			[]want{{frameAck, tag(7, 5), 1}}},
		{"stream", []func(*answerQueue){ack(1, 7, 5, urma.StatusSuccess), ack(1, 7, 6, urma.StatusSuccess), ack(1, 7, 7, urma.StatusSuccess)},
			[]want{{frameAckRun, tag(7, 5), 3}}},
		{"interleaved senders", []func(*answerQueue){
			ack(1, 7, 5, urma.StatusSuccess), ack(2, 8, 0, urma.StatusSuccess),
			ack(1, 7, 6, urma.StatusSuccess), ack(2, 8, 1, urma.StatusSuccess)},
			[]want{{frameAckRun, tag(7, 5), 2}, {frameAckRun, tag(8, 0), 2}}},
		{"gap", []func(*answerQueue){ack(1, 7, 5, urma.StatusSuccess), ack(1, 7, 7, urma.StatusSuccess)},
			[]want{{frameAck, tag(7, 5), 1}, {frameAck, tag(7, 7), 1}}},
		{"error closes the run", []func(*answerQueue){
			ack(1, 7, 5, urma.StatusSuccess), ack(1, 7, 6, statusRNR), ack(1, 7, 7, urma.StatusSuccess)},
			[]want{{frameAck, tag(7, 5), 1}, {frameAck, tag(7, 6), 1}, {frameAck, tag(7, 7), 1}}},
		{"sequence wraps", []func(*answerQueue){ack(1, 7, 0xffffffff, urma.StatusSuccess), ack(1, 7, 0, urma.StatusSuccess)},
			[]want{{frameAckRun, tag(7, 0xffffffff), 2}}},
		{"import answers keep their place", []func(*answerQueue){
			ack(1, 7, 5, urma.StatusSuccess), func(q *answerQueue) { q.importResp(4, urma.CodeAccess) }, ack(1, 7, 6, urma.StatusSuccess)},
			[]want{{frameAckRun, tag(7, 5), 2}, {frameImportResp, 0, 0}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := newAnswerQueue()
			for _, op := range c.ops {
				op(&q)
			}
			var got []want
			for _, a := range q.list {
				got = append(got, want{a.typ, a.tag, a.count})
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("answers %+v, want %+v", got, c.want)
			}
			// What is encoded decodes to the same answers.
			b := q.encode(nil)
			for i, w := range c.want {
				fl := fixedLen(b[4])
				if checkFrame(b[4], be.Uint32(b), 1<<20) != nil || b[4] != w.typ {
					t.Fatalf("frame %d: type %d, want %d", i, b[4], w.typ)
				}
				body := b[4 : 4+fl]
				switch w.typ {
				case frameAckRun:
					r, err := decodeAckRun(body)
					if err != nil || r.tag != w.tag || r.count != w.count {
						t.Fatalf("frame %d decodes as %+v, %v", i, r, err)
					}
				case frameAck:
					a, err := decodeAck(body)
					if err != nil || a.tag != w.tag {
						t.Fatalf("frame %d decodes as %+v, %v", i, a, err)
					}
				}
				b = b[4+fl:]
			}
			if len(b) != 0 {
				t.Fatalf("%d bytes left after the answers", len(b))
			}
			q.reset()
			if len(q.list) != 0 || len(q.runs) != 0 {
				t.Fatal("reset left answers behind")
			}
		})
	}
}

// An ACK_RUN completes every send it names, in order, and only those.
func TestAckRunCompletesSends(t *testing.T) {
	pa, pb := newProvider(t, socketOpts()), newProvider(t, socketOpts())
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	target := a.importJetty(b)
	for i := 0; i < 40; i++ {
		b.postRecv(uint64(i), i*64, 64)
	}
	for i := 0; i < 40; i++ {
		mustOK(t, a.send(target, uint64(i), 0, 64, 0), "send")
	}
	cs := pollN(t, a.sjfc, 40, 10*time.Second)
	for i, c := range cs {
		if c.Status != urma.StatusSuccess || c.UserCtx != uint64(i) {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	// A run that names sends the jetty does not have outstanding changes
	// nothing.
	j := a.jetty.(*jetty)
	j.onSuccessRun(target.(*remoteJetty).peer, uint64(j.instance)<<32, 100)
	empty := make([]urma.Completion, 4)
	if n, _ := a.sjfc.Poll(empty); n != 0 {
		t.Fatalf("a stale run completed %+v", empty[:n])
	}
}

// An ACK_RUN costs the sends in flight, not its count: one that starts
// before them and runs to maxAckRun completes exactly them, in order, and
// one beside them completes nothing.
func TestAckRunClippedToSendsInFlight(t *testing.T) {
	noLeaks(t)
	p := newProvider(t, socketOpts())
	a := newSide(t, p, urma.JettyConfig{RNRRetry: 7}, 64)
	f := newFakePeer(t)
	const sends = 5
	done := make(chan struct{})
	f.serve(done, func(nc net.Conn, br *bufio.Reader) {
		var first sendHeader
		for i := 0; i < sends; i++ {
			h, err := readSend(br)
			if err != nil {
				return
			}
			if i == 0 {
				first = h
			}
		}
		run := func(from uint32, count uint32) {
			var b [4 + ackRunLen]byte
			nc.Write(encodeAckRun(b[:], &ackRunFrame{src: first.src, dst: first.dst, tag: first.tag&^0xffffffff | uint64(from), count: count}))
		}
		run(uint32(first.tag)+1000, 10)     // beside them: nothing
		run(uint32(first.tag)-3, maxAckRun) // from before them: all five
		io.Copy(io.Discard, br)             // read until the provider hangs up
	})
	target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
	mustOK(t, err, "import from the fake peer")
	defer target.Close()
	var want []urma.Completion
	for i := 0; i < sends; i++ {
		mustOK(t, a.send(target, uint64(i), 0, 100, 0), "send")
		want = append(want, urma.Completion{UserCtx: uint64(i), Status: urma.StatusSuccess})
	}
	wantInOrder(t, pollN(t, a.sjfc, sends, 5*time.Second), want)
	extra := make([]urma.Completion, 4)
	if n, _ := a.sjfc.Poll(extra); n != 0 {
		t.Fatalf("more completions than sends: %+v", extra[:n])
	}
	target.Close()
	p.Close()
	<-done
}

// A peer that keeps sending frames this side must answer, and never reads
// the answers, loses its connection once more than the bound of them waits
// to be written; the reader never blocks on it and the queue does not grow
// without end.
func TestPeerThatNeverReadsIsCutOff(t *testing.T) {
	cases := []struct {
		name  string
		bound func(sd *fabricSide)
		frame func(j *jetty) []byte // what the peer sends, again and again
		log   string
	}{
		{
			// Sends with a wrong token, each owed its own answer.
			name:  "answers owed",
			bound: func(sd *fabricSide) { sd.maxAnswers = 100 },
			frame: func(j *jetty) []byte {
				return sendFrame(sendHeader{opcode: urma.OpSend, dst: j.id.ID, token: 99}, []byte("x"))
			},
			log: "without reading the answers",
		},
		{
			// RNR answers for a jetty this side does not have, each
			// answered with a CANCEL.
			name:  "cancels owed",
			bound: func(sd *fabricSide) { sd.maxCancels = 100 },
			frame: func(*jetty) []byte {
				var b [4 + ackLen]byte
				return encodeAck(b[:], &ackFrame{status: statusRNR, src: 4242, dst: 5, tag: 4242 << 32})
			},
			log: "RNR answers that no send waits for",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var sink logtest.Lines
			opts := socketOpts()
			opts.Logger = sink.Logger(nil)
			p := newProvider(t, opts)
			a := newSide(t, p, urma.JettyConfig{}, 64)
			tc.bound(p.devices[0].side)
			f := newFakePeer(t)
			buf := bytes.Repeat(tc.frame(a.jetty.(*jetty)), 4096)
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				nc, _ := f.accept()
				if nc == nil {
					return
				}
				defer nc.Close()
				// Never a read: what this side writes fills the socket,
				// then piles up.
				_ = nc.(*net.TCPConn).SetReadBuffer(4096)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := nc.Write(buf); err != nil {
						return
					}
				}
			}()
			target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
			mustOK(t, err, "import from the fake peer")
			defer target.Close()
			deadline := time.Now().Add(5 * time.Second)
			for !sink.Contains(tc.log) {
				if time.Now().After(deadline) {
					t.Fatalf("connection not cut off: %q", sink.All())
				}
				time.Sleep(time.Millisecond) // polling deadline: the reader logs as it fails the connection
			}
		})
	}
}

// The cancels a peer can make this side owe stop at exactly maxCancels:
// the one past it breaks the protocol, while this side's own cancels are
// queued whatever the count.
func TestCancelBlockStopsAtTheBound(t *testing.T) {
	c := &conn{sd: &fabricSide{maxCancels: 3}}
	for i := range 3 {
		if err := c.cancelBlock(1, 2, uint64(i), true); err != nil {
			t.Fatalf("cancel %d of 3 refused: %v", i+1, err)
		}
	}
	var pe protocolError
	if err := c.cancelBlock(1, 2, 3, true); !errors.As(err, &pe) || !strings.Contains(err.Error(), "more than 3 RNR answers") {
		t.Fatalf("cancel 4 of a bound of 3: %v, want a protocol error naming the bound", err)
	}
	if err := c.cancelBlock(1, 2, 4, false); err != nil {
		t.Fatalf("this side's own cancel refused past the bound: %v", err)
	}
	if len(c.q) != 4 || c.cancels != 4 {
		t.Errorf("%d frames queued, %d cancels counted; want 4 and 4", len(c.q), c.cancels)
	}
}

// The socket reader hands every byte over once and in order, whether a
// payload is copied through its buffer or read straight into place with
// readv, however the sender's writes split the stream.
func TestSockReaderDirect(t *testing.T) {
	for _, payload := range []int{0, 1, 100, directReadMin - 1, directReadMin, 70000, 1 << 20} {
		for _, chunk := range []int{1 << 30, 7, 4093, 65536} {
			if chunk == 7 && payload > 100000 {
				continue // too many tiny writes
			}
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			mustOK(t, err, "socketpair")
			r := newSockIO(fds[0], nil)
			// Three frames: header, payload, header, payload, a trailer.
			msg := make([]byte, 5+payload+5+payload+3)
			rng := rand.New(rand.NewPCG(uint64(payload), uint64(chunk)))
			for i := range msg {
				msg[i] = byte(rng.Uint32())
			}
			go func() {
				for b := msg; len(b) > 0; {
					n, err := unix.Write(fds[1], b[:min(chunk, len(b))])
					if err != nil {
						return
					}
					b = b[n:]
				}
				_ = unix.Shutdown(fds[1], unix.SHUT_WR)
			}()
			got := make([]byte, len(msg))
			steps := []struct {
				n    int
				read func([]byte) error
			}{{5, r.ReadFull}, {payload, r.ReadPayload}, {5, r.ReadFull}, {payload, r.ReadPayload}, {3, r.ReadFull}}
			off := 0
			for _, s := range steps {
				if err := s.read(got[off : off+s.n]); err != nil {
					t.Fatalf("payload %d chunk %d: read at %d: %v", payload, chunk, off, err)
				}
				off += s.n
			}
			if !bytes.Equal(got, msg) {
				t.Fatalf("payload %d chunk %d: bytes differ", payload, chunk)
			}
			if err := r.ReadFull(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("after the stream: %v, want EOF", err)
			}
			if r.rx.Load() != uint64(len(msg)) {
				t.Fatalf("counted %d bytes read, want %d", r.rx.Load(), len(msg))
			}
			r.Close()
			_ = unix.Close(fds[1])
		}
	}
}

// A stream that ends inside a frame is an unexpected EOF, not a clean end.
func TestSockReaderTruncated(t *testing.T) {
	r := newSockIO(-1, strings.NewReader("abc"))
	if err := r.ReadFull(make([]byte, 5)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short header: %v", err)
	}
	r = newSockIO(-1, strings.NewReader("abc"))
	if err := r.ReadPayload(make([]byte, 5)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short payload: %v", err)
	}
	r = newSockIO(-1, strings.NewReader("abc"))
	if err := r.Discard(5); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short discard: %v", err)
	}
}

// A send that retries RNR forever keeps a sane retry delay however many
// times it meets "receiver not ready": the count saturates instead of
// wrapping to zero.
func TestRNRForeverPast255Retries(t *testing.T) {
	fab := NewFabric()
	pa, pb := newProvider(t, Options{Fabric: fab}), newProvider(t, Options{Fabric: fab})
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: rnrForever}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	mustOK(t, a.send(target, 1, 0, 64, 0), "send") // b posts nothing: RNR
	j := a.jetty.(*jetty)
	j.mu.Lock()
	s := j.slot(0)
	for i := 0; i < 300; i++ {
		s.state = slotInflight
		j.result(s, statusRNR, 0)
	}
	retries := s.retries
	j.mu.Unlock()
	if retries != 255 {
		t.Fatalf("retries = %d after 300 RNRs, want 255 (saturated)", retries)
	}
	for r := 1; r <= 255; r++ {
		if d := rnrDelay(0, uint8(r)); d <= 0 || d > 10*time.Millisecond {
			t.Fatalf("rnrDelay(0, %d) = %v", r, d)
		}
	}
	b.postRecv(1, 0, 64)
	if c := pollN(t, a.sjfc, 1, 5*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("send after 300 RNRs: %+v", c)
	}
}

// A peer may leave exactly maxAnswers answers unread; the one after breaks
// the protocol.
func TestOwedAnswersBound(t *testing.T) {
	const bound = 3
	c := &conn{sd: &fabricSide{maxAnswers: bound}, answers: newAnswerQueue()}
	for req := range uint32(bound) {
		// Import answers never coalesce: each is one owed answer.
		if err := c.owe(nil, 0, 0, req, urma.CodeSuccess); err != nil {
			t.Fatalf("answer %d of %d owed: %v", req+1, bound, err)
		}
	}
	var pe protocolError
	if err := c.owe(nil, 0, 0, bound, urma.CodeSuccess); !errors.As(err, &pe) {
		t.Fatalf("answer %d owed: %v, want a protocol error", bound+1, err)
	}
}

// A connection that breaks leaves its peer reachable: the next send dials
// a new connection instead of failing on the dead one. It watches the order
// in conn.fail: the dead connection fails its peer's sends (peerDown)
// before it leaves the peer; done after, it failed the next round's send,
// already out on the new connection, with ACK_TIMEOUT (12 to 27 runs of 60
// when a log line sat in the window; with none there, 0 of 300: a weak guard).
func TestSendAfterConnectionBreaks(t *testing.T) {
	noLeaks(t)
	pa, pb := newProvider(t, socketOpts()), newProvider(t, socketOpts())
	a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
	b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
	target := a.importJetty(b)
	for round := range 3 {
		b.postRecv(uint64(round), 0, 64)
		mustOK(t, a.send(target, uint64(round), 0, 64, 0), "send")
		if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
			t.Fatalf("round %d: send completed with %+v", round, c)
		}
		pollN(t, b.rjfc, 1, 10*time.Second)
		// The peer drops the connection; this side sees it end.
		conns := pb.conns()
		if len(conns) != 1 {
			t.Fatalf("round %d: peer has %d connections", round, len(conns))
		}
		conns[0].fail(errors.New("dropped by the test"))
		eventually.Holds(t, "the connection to end at this side", 0, func() bool { return len(pa.conns()) == 0 })
	}
}

// Close lets a send whose frame is being handed to the kernel finish, so
// that once it returns nothing reads the send's memory: with a peer that
// reads nothing, the frame stays half-written until the connection dies of
// silence, and Close returns only then, with the segment free to go.
func TestJettyCloseWaitsForFrameBeingWritten(t *testing.T) {
	noLeaks(t)
	const size = 8 << 20 // more than the socket buffers on both ends hold
	p := newProvider(t, socketOpts())
	a := newSide(t, p, urma.JettyConfig{}, 64)
	f := newFakePeer(t)
	f.maxMsg = size
	stop := make(chan struct{})
	peerDone := make(chan struct{})
	f.serve(peerDone, func(nc net.Conn, _ *bufio.Reader) {
		_ = nc.(*net.TCPConn).SetReadBuffer(4096)
		<-stop // read nothing more
	})
	defer func() { close(stop); <-peerDone }()
	target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
	mustOK(t, err, "import from the fake peer")
	defer target.Close()
	mem, err := urma.AllocMemory(size)
	mustOK(t, err, "alloc")
	defer mem.Free()
	seg, err := a.ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	mustOK(t, err, "register")
	mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target,
		SGEs: []urma.SGE{{Segment: seg, Len: size}}}), "send")
	j := a.jetty.(*jetty)
	eventually.Holds(t, "the frame to be in the writer's hands", 0, func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.slot(0).writing
	})
	closeOutlastsConnection(t, "the jetty", a.jetty, p.conns()[0], "the frame of its send was still being written")
	mustOK(t, seg.Close(), "unregister the send's segment after Close")
}

// The sender holds a send to the peer's MaxMsgSize (from its HELLO), not
// its own: one of exactly the peer's size goes, a byte more completes with
// LOC_LEN at the sender.
func TestSendToPeerMaxMsgSize(t *testing.T) {
	const peerMax = 4096
	cases := []struct {
		size int
		want urma.Status
	}{
		{peerMax, urma.StatusSuccess},
		{peerMax + 1, urma.StatusLocLen},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.size), func(t *testing.T) {
			small := socketOpts()
			small.Devices = []DeviceSpec{{Caps: urma.DeviceCaps{MaxMsgSize: peerMax}}}
			a := newSide(t, newProvider(t, socketOpts()), urma.JettyConfig{}, 64)
			b := newSide(t, newProvider(t, small), urma.JettyConfig{}, 64)
			target := a.importJetty(b)
			b.postRecv(1, 0, 2*peerMax)
			mustOK(t, a.send(target, 1, 0, c.size, 0), "send")
			if got := pollN(t, a.sjfc, 1, 10*time.Second)[0]; got.Status != c.want {
				t.Fatalf("send of %d bytes to a peer taking %d: %+v, want %v", c.size, peerMax, got, c.want)
			}
			if c.want == urma.StatusSuccess {
				if got := pollN(t, b.rjfc, 1, 10*time.Second)[0]; got.Status != urma.StatusSuccess || got.CompletionLen != uint32(c.size) {
					t.Fatalf("receive: %+v", got)
				}
			}
		})
	}
}

// However many consecutive sends one sender jetty gets answered at once, the
// answers never make an ACK_RUN longer than a peer accepts (maxAckRun): the
// run closes there and the next answer starts another.
func TestAckRunLengthBound(t *testing.T) {
	q := newAnswerQueue()
	const n = maxAckRun + 1
	for seq := range uint32(n) {
		q.ack(&sendHeader{src: 1, dst: 9, tag: 7<<32 | uint64(seq)}, urma.StatusSuccess, 0)
	}
	b := q.encode(nil)
	var total uint32
	for len(b) > 0 {
		body := b[4 : 4+fixedLen(b[4])]
		switch b[4] {
		case frameAckRun:
			r, err := decodeAckRun(body)
			if err != nil {
				t.Fatalf("encoded run does not decode: %v", err)
			}
			total += r.count
		case frameAck:
			total++
		default:
			t.Fatalf("frame type %d among the answers", b[4])
		}
		b = b[4+len(body):]
	}
	if total != n {
		t.Fatalf("answers cover %d sends, want %d", total, n)
	}
}

// A HELLO of the wrong size is refused with an error that says the size it
// has and the size it must have.
func TestHelloSizeError(t *testing.T) {
	var b [4 + helloLen]byte
	frame := encodeHello(b[:], &hello{maxMsg: 1 << 20})
	_, err := decodeHello(frame[:len(frame)-1])
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("HELLO of %d bytes, want %d", len(frame)-1, len(frame))) {
		t.Fatalf("short HELLO: %v", err)
	}
}

// A poller that takes frames from the rings (conn.drive) and meets one
// that breaks the protocol fails the connection, even when a well-formed
// frame follows it: it stops at the bad one.
func TestPollerFailsConnectionOnBadFrame(t *testing.T) {
	p := newProvider(t, shmOpts(t))
	sd := p.devices[0].side
	local, remote := shmPair(t, MinShmRing, -1)
	eid, err := ShmEID()
	mustOK(t, err, "EID")
	pr, err := sd.peer(eid)
	mustOK(t, err, "peer")
	c := newConn(sd, pr, local, hello{session: 1, src: eid, maxMsg: 1 << 20}, false, "test", "test")
	var ping [4 + pingLen]byte
	stream := append([]byte{0, 0, 0, 4, 200}, encodePing(ping[:])...) // a frame of unknown type, then a PING
	mustOK(t, remote.write(stream), "write the frames")
	c.drive()
	select {
	case <-c.done:
	default:
		t.Fatal("the poller read past a frame of unknown type and left the connection up")
	}
	if err := c.deathCause(); !strings.Contains(fmt.Sprint(err), "unknown frame type") {
		t.Fatalf("connection died of %v, want the unknown frame type", err)
	}
}

// closeOutlastsConnection closes obj, which waits for something only the
// death of conn can end (the peer never reads or sends on), and fails the
// test if Close returns while conn still lives: busy is what Close would
// then have left behind.
func closeOutlastsConnection(t *testing.T, what string, obj interface{ Close() error }, conn *conn, busy string) {
	t.Helper()
	closed := make(chan bool, 1) // whether the connection was dead when Close returned
	go func() {
		if err := obj.Close(); err != nil {
			t.Errorf("close %s: %v", what, err)
		}
		select {
		case <-conn.done:
			closed <- true
		default:
			closed <- false
		}
	}()
	select {
	case dead := <-closed:
		if !dead {
			t.Fatalf("closing %s returned while %s", what, busy)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("closing %s never returned, though the connection died", what)
	}
}

// rnrPeer is a fake peer for the RNR-block tests: it takes one connection
// and can answer a SEND with RNR and then wait for the CANCEL that must
// follow.
type rnrPeer struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

// answerRNR tells the sender that the send h left an RNR block here.
func (p *rnrPeer) answerRNR(h sendHeader) {
	var b [4 + ackLen]byte
	if _, err := p.nc.Write(encodeAck(b[:], &ackFrame{status: statusRNR, src: h.src, dst: h.dst, tag: h.tag})); err != nil {
		p.t.Errorf("answer RNR: %v", err)
	}
}

// readCancel reads frames (PINGs and the like) until a CANCEL, which it
// returns; the error says what came instead.
func (p *rnrPeer) readCancel() (cancelFrame, error) {
	_ = p.nc.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound on the wait, not on speed
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(p.br, hdr[:]); err != nil {
			return cancelFrame{}, fmt.Errorf("no CANCEL came: %w", err)
		}
		n := int(be.Uint32(hdr[:4]))
		if hdr[4] != frameCancel {
			if _, err := p.br.Discard(n - 1); err != nil {
				return cancelFrame{}, fmt.Errorf("no CANCEL came: %w", err)
			}
			continue
		}
		body := make([]byte, n)
		body[0] = hdr[4]
		if _, err := io.ReadFull(p.br, body[1:]); err != nil {
			return cancelFrame{}, fmt.Errorf("read the CANCEL: %w", err)
		}
		return decodeCancel(body)
	}
}

// smallBufferFakePeer is a fake peer whose connections have a small receive
// buffer from their first packet, so that a large frame stays in the
// sender's hands until the peer reads it. (Shrinking the buffer of an
// accepted connection instead can leave the TCP window shut for good.)
func smallBufferFakePeer(t *testing.T) *fakePeer {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	mustOK(t, err, "listen")
	return fakePeerOn(t, ln)
}

// An RNR answer that reaches a send no longer waiting for it (the jetty was
// closed before the answer came, or while the send's frame was still being
// written) is cancelled at once: nothing would ever resume the block, and
// the receiver would hold it for the connection's life, counting it
// towards maxBlocked.
func TestOrphanRNRBlockIsCancelled(t *testing.T) {
	cases := []struct {
		name string
		size int // the send's length
		// midWrite: the answer comes while the frame is still being
		// written, and the jetty is closed before the frame ends.
		midWrite bool
	}{
		{name: "answer after Close", size: 64},
		{name: "answer during the write, Close before it ends", size: 8 << 20, midWrite: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			opts := socketOpts()
			opts.PeerTimeout = time.Minute // the fake peer sends no PINGs
			p := newProvider(t, opts)
			a := newSide(t, p, urma.JettyConfig{RNRRetry: 7}, 64)
			f := newFakePeer(t)
			if c.midWrite {
				f = smallBufferFakePeer(t)
			}
			f.maxMsg = uint64(c.size)
			accepted := make(chan *rnrPeer, 1)
			go func() {
				nc, br := f.accept()
				if nc == nil {
					accepted <- nil
					return
				}
				accepted <- &rnrPeer{t: t, nc: nc, br: br}
			}()
			target, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: f.eid, ID: 5}, urma.RC, 9)
			mustOK(t, err, "import from the fake peer")
			defer target.Close()
			peer := <-accepted
			if peer == nil {
				t.Fatal("the fake peer took no connection")
			}
			defer peer.nc.Close()
			mem, err := urma.AllocMemory(c.size)
			mustOK(t, err, "alloc")
			defer mem.Free()
			seg, err := a.ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
			mustOK(t, err, "register")
			defer seg.Close()
			mustOK(t, a.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: target,
				SGEs: []urma.SGE{{Segment: seg, Len: uint32(c.size)}}}), "send")
			var hb [4 + sendHdrLen]byte
			_, err = io.ReadFull(peer.br, hb[:])
			mustOK(t, err, "read the SEND's header")
			var h sendHeader
			mustOK(t, decodeSendHeader(hb[4:], be.Uint32(hb[:4]), &h), "decode the SEND's header")
			j := a.jetty.(*jetty)
			if !c.midWrite {
				_, err = peer.br.Discard(int(h.length))
				mustOK(t, err, "read the payload")
				mustOK(t, a.jetty.Close(), "close the jetty")
				peer.answerRNR(h)
			} else {
				peer.answerRNR(h)
				eventually.Holds(t, "the answer to wait for the end of the frame", 0, func() bool {
					j.mu.Lock()
					defer j.mu.Unlock()
					return j.slot(0).deferred
				})
				closed := make(chan error, 1)
				go func() { closed <- a.jetty.Close() }()
				eventually.Holds(t, "Close to have begun", 0, func() bool {
					j.mu.Lock()
					defer j.mu.Unlock()
					return j.closed
				})
				_, err = peer.br.Discard(int(h.length))
				mustOK(t, err, "read the rest of the payload")
				mustOK(t, <-closed, "close the jetty")
			}
			cf, err := peer.readCancel()
			mustOK(t, err, "wait for the CANCEL")
			if want := (cancelFrame{src: h.src, dst: h.dst, tag: h.tag}); cf != want {
				t.Fatalf("CANCEL %+v, want %+v", cf, want)
			}
		})
	}
}

// An answer counts only from the peer the send went to: a hostile or
// buggy peer that learns the tags of an RM jetty (they are consecutive)
// must not complete the jetty's sends to another peer, which has not
// received them, with an ACK or an ACK_RUN of its own.
func TestAnswerFromAnotherPeerIgnored(t *testing.T) {
	forgeries := []struct {
		name  string
		forge func(nc net.Conn, victim, own sendHeader)
	}{
		{"ACK", func(nc net.Conn, victim, own sendHeader) {
			var b [4 + ackLen]byte
			nc.Write(encodeAck(b[:], &ackFrame{status: urma.StatusSuccess, src: victim.src, dst: victim.dst, tag: victim.tag}))
			ackSend(nc, own)
		}},
		{"ACK_RUN", func(nc net.Conn, victim, own sendHeader) {
			var b [4 + ackRunLen]byte
			nc.Write(encodeAckRun(b[:], &ackRunFrame{src: victim.src, dst: victim.dst, tag: victim.tag, count: 2}))
		}},
	}
	for _, c := range forgeries {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			p := newProvider(t, socketOpts())
			a := newSide(t, p, urma.JettyConfig{Mode: urma.RM, RNRRetry: 7}, 64)
			honest, hostile := newFakePeer(t), newFakePeer(t)
			victim := make(chan sendHeader, 1)
			release := make(chan struct{})
			released := sync.OnceFunc(func() { close(release) })
			t.Cleanup(released)
			honestDone, hostileDone := make(chan struct{}), make(chan struct{})
			honest.serve(honestDone, func(nc net.Conn, br *bufio.Reader) {
				h, err := readSend(br)
				if err != nil {
					return
				}
				victim <- h
				<-release
				ackSend(nc, h)
				io.Copy(io.Discard, br) // read until the provider hangs up
			})
			hostile.serve(hostileDone, func(nc net.Conn, br *bufio.Reader) {
				h, err := readSend(br)
				if err != nil {
					return
				}
				c.forge(nc, <-victim, h)
				io.Copy(io.Discard, br)
			})
			toHonest, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: honest.eid, ID: 5}, urma.RM, 9)
			mustOK(t, err, "import from the honest peer")
			defer toHonest.Close()
			toHostile, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: hostile.eid, ID: 6}, urma.RM, 9)
			mustOK(t, err, "import from the hostile peer")
			defer toHostile.Close()
			mustOK(t, a.send(toHonest, 1, 0, 100, 0), "send to the honest peer")
			mustOK(t, a.send(toHostile, 2, 0, 100, 0), "send to the hostile peer")
			// The hostile peer's own send is answered after the forgery:
			// once it completes, the forgery was read.
			wantInOrder(t, pollN(t, a.sjfc, 1, 5*time.Second), []urma.Completion{{UserCtx: 2, Status: urma.StatusSuccess}})
			released()
			wantInOrder(t, pollN(t, a.sjfc, 1, 5*time.Second), []urma.Completion{{UserCtx: 1, Status: urma.StatusSuccess}})
			extra := make([]urma.Completion, 4)
			if n, _ := a.sjfc.Poll(extra); n != 0 {
				t.Fatalf("more completions than sends: %+v", extra[:n])
			}
			toHonest.Close()
			toHostile.Close()
			p.Close()
			<-honestDone
			<-hostileDone
		})
	}
}
