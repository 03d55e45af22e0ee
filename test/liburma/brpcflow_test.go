package liburma_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// What testdata/brpcflow.c and its Go peer agree on.
const (
	msgs       = 6
	guardToken = 0x5eed
	recvBuf    = 1 << 20
)

var sizes = [msgs]uint32{1, 0, 4096, 100, 65536, 1 << 20}

func pattern(msg, i uint32) byte { return byte(msg*31 + i*7) }

// TestBrpcCallSequence runs brpcflow.c, which drives liburma.so.0 through
// brpc's UrmaTransport calls in brpc's order, against a Go peer on
// pkg/urma/soft, on each fabric (auto: the C program's shm EID, index 0): ids exchanged out of band, receives
// posted first, SEND and SEND_IMM both ways with their immediates, events
// taken from the JFCE fd in epoll edge-triggered, tokens checked per
// message, the two-phase flush, completion fields, teardown in brpc's
// order. The C program checks its side and says OK; this test checks the
// peer's.
func TestBrpcCallSequence(t *testing.T) {
	for _, fabric := range []string{"auto", "shm", "socket"} {
		t.Run(fabric, func(t *testing.T) {
			dir := t.TempDir()
			opts := soft.Options{Logger: logr.Discard(), ShmDir: dir}
			env := []string{"URMA_SHM_DIR=" + dir, "URMA_SHM_SOCKET_DIR=" + dir + "/c", "URMA_DEVICE=soft0", "URMA_SOFT_FABRIC=" + fabric}
			if fabric == "socket" {
				opts = soft.Options{Logger: logr.Discard(), Listen: "127.0.0.1:0"}
				env = append(env, "POD_IP=127.0.0.1")
			}
			p, err := soft.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			c := startChild(t, program("brpcflow"), env)
			runPeer(t, p, c)
		})
	}
}

// child is a C program under test, spoken to by lines.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	errs  *bytes.Buffer
}

func startChild(t *testing.T, path string, env []string) *child {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = append(os.Environ(), env...)
	c := &child{t: t, cmd: cmd, lines: make(chan string, 16), errs: &bytes.Buffer{}}
	cmd.Stderr = c.errs
	var err error
	if c.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = c.in.Close()
		<-done
		_ = cmd.Wait()
	})
	return c
}

// expect reads the child's next line, which must start with prefix.
func (c *child) expect(prefix string) string {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("%s ended waiting for %s: %v\n%s", c.cmd.Path, prefix, c.cmd.Wait(), c.errs)
		}
		if !strings.HasPrefix(l, prefix) {
			c.t.Fatalf("%s said %q, want %s\n%s", c.cmd.Path, l, prefix, c.errs)
		}
		return l
	case <-time.After(time.Minute):
		c.t.Fatalf("%s said nothing for a minute waiting for %s\n%s", c.cmd.Path, prefix, c.errs)
	}
	return ""
}

func (c *child) say(format string, args ...any) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.in, format+"\n", args...); err != nil {
		c.t.Fatalf("write to %s: %v\n%s", c.cmd.Path, err, c.errs)
	}
}

// finish waits for the child to exit 0.
func (c *child) finish() {
	c.t.Helper()
	_ = c.in.Close()
	if err := c.cmd.Wait(); err != nil {
		c.t.Fatalf("%s: %v\n%s", c.cmd.Path, err, c.errs)
	}
}

// peerSide is the Go peer: a JFC for everything, and three jetties with
// JFRs of their own: main (no token, as brpc's), guarded (a token), and
// norecv (no receive ever posted).
type peerSide struct {
	ctx                  urma.Context
	jfce                 urma.JFCE
	jfc                  urma.JFC
	main, guarded, spare urma.Jetty
	norecv               urma.Jetty
	mainJFR, guardedJFR  urma.JFR
	mem                  *urma.Memory
	seg                  urma.Segment
}

func newPeerSide(t *testing.T, p *soft.Provider) *peerSide {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s := &peerSide{}
	var err error
	s.ctx, err = p.Open("", 0)
	must(err)
	s.jfce, err = s.ctx.CreateJFCE()
	must(err)
	s.jfc, err = s.ctx.CreateJFC(urma.JFCConfig{Depth: 1024, JFCE: s.jfce})
	must(err)
	jetty := func(policy urma.TokenPolicy, token urma.Token) (urma.JFR, urma.Jetty) {
		r, err := s.ctx.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 16, MaxSGE: 2, JFC: s.jfc, TokenPolicy: policy, Token: token})
		must(err)
		j, err := s.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 16, MaxSGE: 2, SendJFC: s.jfc, JFR: r, RNRRetry: urma.RNRRetryForever})
		must(err)
		t.Cleanup(func() { _ = j.Close(); _ = r.Close() })
		return r, j
	}
	s.mainJFR, s.main = jetty(urma.TokenNone, 0)
	s.guardedJFR, s.guarded = jetty(urma.TokenPlainText, guardToken)
	_, s.norecv = jetty(urma.TokenNone, 0)
	_, s.spare = jetty(urma.TokenNone, 0)
	s.mem, err = urma.AllocMemory(2 * msgs * recvBuf)
	must(err)
	s.seg, err = s.ctx.RegisterSegment(s.mem, urma.SegmentConfig{Access: urma.AccessRead | urma.AccessWrite})
	must(err)
	t.Cleanup(func() {
		_ = s.seg.Close()
		_ = s.mem.Free()
		_ = s.jfc.Close()
		_ = s.jfce.Close()
		_ = s.ctx.Close()
	})
	return s
}

// take polls n records, sleeping on the JFCE between tries, at most a
// minute.
func (s *peerSide) take(t *testing.T, n int) []urma.Completion {
	t.Helper()
	out := make([]urma.Completion, 0, n)
	buf := make([]urma.Completion, n)
	fired := make([]urma.JFC, 1)
	deadline := time.Now().Add(time.Minute)
	for {
		if err := s.jfc.Rearm(false); err != nil {
			t.Fatal(err)
		}
		k, err := s.jfc.Poll(buf[:n-len(out)])
		if err != nil {
			t.Fatal(err)
		}
		if out = append(out, buf[:k]...); len(out) == n {
			return out
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("%d of %d records after a minute: %+v", len(out), n, out)
		}
		if k, err := s.jfce.Wait(fired, left); err != nil {
			t.Fatal(err)
		} else if k > 0 {
			s.jfc.Ack(uint32(k))
		}
	}
}

func runPeer(t *testing.T, p *soft.Provider, c *child) {
	s := newPeerSide(t, p)
	var eidHex string
	var uasid, jettyID, tokenID, guardedID uint32
	var va, length uint64
	hello := c.expect("HELLO ")
	if _, err := fmt.Sscanf(hello, "HELLO %s %d %d %d %d %d %d", &eidHex, &uasid, &jettyID, &va, &length, &tokenID, &guardedID); err != nil {
		t.Fatalf("C's hello %q: %v", hello, err)
	}
	raw, err := hex.DecodeString(eidHex)
	if err != nil || len(raw) != 16 {
		t.Fatalf("C's EID %q", eidHex)
	}
	var eid urma.EID
	copy(eid[:], raw)
	// brpc's order on the peer too: the segment, then the jetty.
	rseg, err := s.ctx.ImportSegment(urma.SegmentID{EID: eid, UASID: uasid, VA: va, Len: length, TokenID: tokenID}, 0)
	if err != nil {
		t.Fatalf("import C's segment: %v", err)
	}
	t.Cleanup(func() { _ = rseg.Close() })
	imp := func(id uint32, token urma.Token) urma.RemoteJetty {
		r, err := s.ctx.ImportJetty(t.Context(), urma.JettyID{EID: eid, UASID: uasid, ID: id}, urma.RM, token)
		if err != nil {
			t.Fatalf("import C's jetty %d: %v", id, err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	toMain := imp(jettyID, 0)
	buf := s.mem.Bytes()
	for m := range msgs {
		if err := s.mainJFR.PostRecv(&urma.RecvWR{UserCtx: uint64(m), SGEs: []urma.SGE{{Segment: s.seg, Offset: uint64(m) * recvBuf, Len: recvBuf}}}); err != nil {
			t.Fatal(err)
		}
	}
	mine, sid := s.main.ID(), s.seg.ID()
	c.say("HELLO %s %d %d %d %d %d %d %d", hex.EncodeToString(mine.EID[:]), mine.UASID, mine.ID, sid.VA, sid.Len, sid.TokenID, s.guarded.ID().ID, s.norecv.ID().ID)

	// SEND and SEND_IMM to C, the larger ones gathered from two SGEs.
	for m := range uint32(msgs) {
		off := uint64(msgs+m) * recvBuf
		for i := range sizes[m] {
			buf[off+uint64(i)] = pattern(m, i)
		}
		wr := &urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: toMain, UserCtx: uint64(100 + m)}
		if m%2 == 1 {
			wr.Opcode, wr.Imm, wr.Flags = urma.OpSendWithImm, uint64(1000+m), wr.Flags|urma.SendSolicitedEnable
		}
		if half := sizes[m] / 2; half > 0 {
			wr.SGEs = []urma.SGE{{Segment: s.seg, Offset: off, Len: half}, {Segment: s.seg, Offset: off + uint64(half), Len: sizes[m] - half}}
		} else if sizes[m] > 0 {
			wr.SGEs = []urma.SGE{{Segment: s.seg, Offset: off, Len: sizes[m]}}
		}
		if err := s.main.PostSend(wr); err != nil {
			t.Fatal(err)
		}
	}
	c.say("SENT %d", msgs)
	c.expect(fmt.Sprintf("SENT %d", msgs))
	var sent, got []urma.Completion
	for _, cr := range s.take(t, 2*msgs) {
		if cr.Recv {
			got = append(got, cr)
		} else {
			sent = append(sent, cr)
		}
	}
	for i, cr := range sent {
		if cr.Status != urma.StatusSuccess || cr.UserCtx != uint64(100+i) || cr.CompletionLen != sizes[i] {
			t.Errorf("peer's send %d: %+v", i, cr)
		}
	}
	for i, cr := range got {
		m := uint32(i)
		wantOp, wantImm := urma.CROpSend, uint64(0)
		if m%2 == 1 {
			wantOp, wantImm = urma.CROpSendWithImm, uint64(2000+m)
		}
		if cr.Status != urma.StatusSuccess || cr.UserCtx != uint64(m) || cr.CompletionLen != sizes[m] || cr.Opcode != wantOp || cr.Imm != wantImm ||
			cr.RemoteID.EID != eid || cr.RemoteID.ID != jettyID || cr.LocalID != mine.ID {
			t.Errorf("peer's receive %d: %+v; want %d bytes, opcode %d, imm %d, from C's jetty %d", i, cr, sizes[m], wantOp, wantImm, jettyID)
			continue
		}
		for j := range sizes[m] {
			if b := buf[uint64(m)*recvBuf+uint64(j)]; b != pattern(m, j) {
				t.Errorf("peer's receive %d: byte %d is %#x, want %#x", i, j, b, pattern(m, j))
				break
			}
		}
	}

	// Tokens: C's guarded JFR takes only the right one, per message.
	wrongTo, rightTo := imp(guardedID, guardToken+1), imp(guardedID, guardToken)
	copy(buf[msgs*recvBuf:], "wrongright")
	send := func(j urma.Jetty, to urma.RemoteJetty, ctx uint64, off uint64) {
		if err := j.PostSend(&urma.SendWR{Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: to, UserCtx: ctx,
			SGEs: []urma.SGE{{Segment: s.seg, Offset: msgs*recvBuf + off, Len: 5}}}); err != nil {
			t.Fatal(err)
		}
	}
	send(s.spare, wrongTo, 1, 0) // a jetty of its own: the error puts it in ERROR
	if cr := s.take(t, 1)[0]; cr.Status != urma.StatusRemAccessAbort || cr.UserCtx != 1 {
		t.Fatalf("send with a wrong token: %+v, want REM_ACCESS_ABORT", cr)
	}
	send(s.main, rightTo, 2, 5) // waits, retrying, for C's receive
	if err := s.guardedJFR.PostRecv(&urma.RecvWR{UserCtx: 7, SGEs: []urma.SGE{{Segment: s.seg, Len: 64}}}); err != nil {
		t.Fatal(err)
	}
	c.say("GUARD")
	c.expect("GUARDED")
	crs := s.take(t, 2)
	for _, cr := range crs {
		switch {
		case cr.Recv && (cr.LocalID != s.guarded.ID().ID || cr.CompletionLen != 5 || string(buf[:5]) != "right"):
			t.Errorf("receive on the guarded jetty: %+v %q, want C's right-token message", cr, buf[:5])
		case !cr.Recv && (cr.Status != urma.StatusSuccess || cr.UserCtx != 2):
			t.Errorf("send with the right token: %+v", cr)
		}
	}
	c.expect("FLUSHED")
	c.expect("OK")
	c.finish()
	if n, err := s.jfc.Poll(make([]urma.Completion, 4)); n != 0 || err != nil {
		t.Errorf("peer has %d records more (%v): C's wrong-token or flushed sends arrived", n, err)
	}
}
