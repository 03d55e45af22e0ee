package soft

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// streamer runs many jetties that all stream to the jetties of a peer at
// once, and receive the peer's streams: the load under which a fabric whose
// reading waits on writing deadlocks.
type streamer struct {
	t       testing.TB
	jetties int
	msgs    int // per jetty, each way
	size    int
	sq, rq  int

	ctx     urma.Context
	sjfc    urma.JFC
	rjfc    urma.JFC
	jfrs    []urma.JFR
	js      []urma.Jetty
	targets []urma.RemoteJetty
	mem     *urma.Memory
	seg     urma.Segment
}

func newStreamer(t testing.TB, p *Provider, jetties, msgs, size, sq, rq int) *streamer {
	t.Helper()
	s := &streamer{t: t, jetties: jetties, msgs: msgs, size: size, sq: sq, rq: rq}
	var err error
	s.ctx, err = p.Open("", 0)
	mustOK(t, err, "open")
	s.sjfc, err = s.ctx.CreateJFC(urma.JFCConfig{Depth: uint32(jetties * sq)})
	mustOK(t, err, "create send JFC")
	s.rjfc, err = s.ctx.CreateJFC(urma.JFCConfig{Depth: uint32(jetties * rq)})
	mustOK(t, err, "create receive JFC")
	s.mem, err = urma.AllocMemory(jetties * (sq + rq) * size)
	mustOK(t, err, "alloc")
	s.seg, err = s.ctx.RegisterSegment(s.mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	mustOK(t, err, "register")
	for i := 0; i < jetties; i++ {
		r, err := s.ctx.CreateJFR(urma.JFRConfig{Mode: urma.RC, Depth: uint32(rq), JFC: s.rjfc, Token: 7})
		mustOK(t, err, "create JFR")
		s.jfrs = append(s.jfrs, r)
		j, err := s.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: uint32(sq), SendJFC: s.sjfc, JFR: r, RNRRetry: rnrForever})
		mustOK(t, err, "create jetty")
		s.js = append(s.js, j)
		for k := 0; k < rq; k++ {
			s.postRecv(i, k)
		}
	}
	t.Cleanup(s.close)
	return s
}

func (s *streamer) close() {
	for _, c := range s.targets {
		_ = c.Close()
	}
	for _, j := range s.js {
		_ = j.Close()
	}
	for _, r := range s.jfrs {
		_ = r.Close()
	}
	_ = s.rjfc.Close()
	_ = s.sjfc.Close()
	_ = s.seg.Close()
	_ = s.mem.Free()
	_ = s.ctx.Close()
}

// ids says where the peer finds this side's jetties: "EID id1 id2 ...".
func (s *streamer) ids() string {
	var b strings.Builder
	b.WriteString(s.ctx.EID().String())
	for _, j := range s.js {
		fmt.Fprintf(&b, " %d", j.ID().ID)
	}
	return b.String()
}

// connect imports the peer's jetties, one per local jetty, from ids' fields.
func (s *streamer) connect(fields []string) {
	s.t.Helper()
	if len(fields) != 1+s.jetties {
		s.t.Fatalf("peer sent %d fields, want %d", len(fields), 1+s.jetties)
	}
	eid, err := urma.ParseEID(fields[0])
	mustOK(s.t, err, "peer EID")
	for i := 0; i < s.jetties; i++ {
		id, err := strconv.ParseUint(fields[1+i], 10, 32)
		mustOK(s.t, err, "peer jetty id")
		rj, err := s.ctx.ImportJetty(s.t.Context(), urma.JettyID{EID: eid, ID: uint32(id)}, urma.RC, 7)
		mustOK(s.t, err, "import peer jetty")
		s.targets = append(s.targets, rj)
	}
}

// buf is slot k of jetty i: receive slots first, then send slots.
func (s *streamer) buf(i, k int) (off int) { return (i*(s.sq+s.rq) + k) * s.size }

func (s *streamer) postRecv(i, k int) {
	off := s.buf(i, k)
	mustOK(s.t, s.jfrs[i].PostRecv(&urma.RecvWR{UserCtx: uint64(i)<<32 | uint64(k), SGEs: []urma.SGE{{Segment: s.seg, Offset: uint64(off), Len: uint32(s.size)}}}), "post receive")
}

// run streams msgs messages from every jetty and takes msgs from the peer
// on every JFR, checking that each jetty's messages arrive whole and in
// order. It returns an error naming what was left undone at the deadline.
func (s *streamer) run(deadline time.Time) error {
	sent := make([]int, s.jetties)  // posted
	acked := make([]int, s.jetties) // completed
	recvd := make([]int, s.jetties)
	left := 2 * s.jetties * s.msgs // completions still to come
	cs := make([]urma.Completion, 256)
	wr := urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable}
	sge := []urma.SGE{{Segment: s.seg, Len: uint32(s.size)}}
	mem := s.mem.Bytes()
	for left > 0 {
		if time.Now().After(deadline) {
			var ns, na, nr int
			for i := range sent {
				ns, na, nr = ns+sent[i], na+acked[i], nr+recvd[i]
			}
			return fmt.Errorf("stalled: %d of %d sends posted, %d completed, %d of %d messages received",
				ns, s.jetties*s.msgs, na, nr, s.jetties*s.msgs)
		}
		progress := false
		for i := range s.js {
			for sent[i] < s.msgs && sent[i]-acked[i] < s.sq {
				off := s.buf(i, s.rq+sent[i]%s.sq)
				binary.BigEndian.PutUint64(mem[off:], uint64(i)<<32|uint64(sent[i]))
				sge[0].Offset = uint64(off)
				wr.Target, wr.UserCtx, wr.SGEs = s.targets[i], uint64(i), sge
				if err := s.js[i].PostSend(&wr); err != nil {
					return fmt.Errorf("jetty %d: post send %d: %w", i, sent[i], err)
				}
				sent[i]++
				progress = true
			}
		}
		n, err := s.sjfc.Poll(cs)
		if err != nil {
			return err
		}
		for _, c := range cs[:n] {
			if c.Status != urma.StatusSuccess {
				return fmt.Errorf("jetty %d: send completed with %s", c.UserCtx, c.Status)
			}
			acked[c.UserCtx]++
			left--
		}
		m, err := s.rjfc.Poll(cs)
		if err != nil {
			return err
		}
		for _, c := range cs[:m] {
			i, k := int(c.UserCtx>>32), int(uint32(c.UserCtx))
			if c.Status != urma.StatusSuccess || c.CompletionLen != uint32(s.size) {
				return fmt.Errorf("jetty %d: receive completed with %s, %d bytes", i, c.Status, c.CompletionLen)
			}
			got := binary.BigEndian.Uint64(mem[s.buf(i, k):])
			if want := uint64(i)<<32 | uint64(recvd[i]); got != want {
				return fmt.Errorf("jetty %d: message %d carries stamp %#x, want %#x", i, recvd[i], got, want)
			}
			recvd[i]++
			left--
			if recvd[i]+s.rq <= s.msgs {
				s.postRecv(i, k)
			}
		}
		if n == 0 && m == 0 && !progress {
			time.Sleep(50 * time.Microsecond) // polling mode: nothing arrived yet
		}
	}
	return nil
}

// Load of streamPeers: enough outstanding sends each way (jetties x SQ
// depth = 32K) that a reader which waits for its writer, while the writer
// waits for the peer's reader, deadlocks.
const (
	streamJetties = 256
	streamMsgs    = 300
	streamSize    = 4096
	streamSQ      = 128
	streamRQ      = 128
)

func streamOpts() Options {
	return Options{PeerTimeout: 10 * time.Second, DialTimeout: 10 * time.Second, Logger: quiet()}
}

// TestStreamPeerChild is the other process of TestManyStreamsBothWays.
func TestStreamPeerChild(t *testing.T) {
	if !isChild("stream") {
		t.Skip("helper process for TestManyStreamsBothWays")
	}
	s := newStreamer(t, newProvider(t, streamOpts()), streamJetties, streamMsgs, streamSize, streamSQ, streamRQ)
	fmt.Println("READY", s.ids())
	in := newParentLines()
	s.connect(in.expect(t, "PEER"))
	if err := s.run(time.Now().Add(5 * time.Minute)); err != nil {
		fmt.Println("FAILED", err)
		t.Fatal(err)
	}
	fmt.Println("DONE")
	in.waitEOF() // the parent may still be taking our messages
}

// Issue 9.5: 256 jetties streaming both ways between two processes over
// the socket fabric all finish. Before the fix both readers blocked queueing
// answers while both writers blocked in sendmsg.
func TestManyStreamsBothWays(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process and moves 100 MB")
	}
	c := startChild(t, "TestStreamPeerChild", "stream")
	peer := c.expect("READY", childStartTimeout)
	s := newStreamer(t, newProvider(t, streamOpts()), streamJetties, streamMsgs, streamSize, streamSQ, streamRQ)
	c.say("PEER %s", s.ids())
	s.connect(peer)
	if err := s.run(time.Now().Add(2 * time.Minute)); err != nil {
		t.Fatalf("this side: %v", err)
	}
	c.expect("DONE", time.Minute)
}
