package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// brpcPeer is a URMA endpoint that behaves as brpc's UrmaTransport
// (src/brpc/urma/urma_endpoint.cpp, urma_handshake.cpp) where it matters to
// us: its hello has no extension; it registers everything without a token
// and imports ours with none; it validates credits strictly; it returns
// credits only once more than (rq - 3) / 2 are pending (SendAck), and ends
// with a plain FIN. It is driven by the test goroutine, event by event.
type brpcPeer struct {
	t      *testing.T
	sq, rq int
	ctx    urma.Context
	jfce   urma.JFCE
	jfc    urma.JFC
	jfr    urma.JFR
	jetty  urma.Jetty
	mem    *urma.Memory
	seg    urma.Segment
	target urma.RemoteJetty
	rseg   urma.RemoteSegment
	tcp    net.Conn
	peer   handshake.Hello // the other side's hello
	// presents makes the peer one that sends the token it is given: its
	// hello carries our extension (its SQ depth), and it imports the
	// other side's jetty and segment with the token of that side's hello.
	presents bool

	// brpc's windows (ApplyRemoteHello) and credit state (SendAck).
	remoteBlock          int
	localCap, remoteCap  int
	sqWin, rqWin, immWin int
	newRQWRs             int
	nextSend             int
	received             []byte
	cqes                 []urma.Completion
	evs                  [1]urma.JFC
}

// brpcBlock is brpc's receive block size in these tests.
const brpcBlock = 4096

func newBrpcPeer(t *testing.T, prov urma.Provider, sq, rq int) *brpcPeer {
	t.Helper()
	b := &brpcPeer{t: t, sq: sq, rq: rq, cqes: make([]urma.Completion, 32)}
	t.Cleanup(b.close)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	b.ctx, err = prov.Open("", 0)
	must(err)
	b.jfce, err = b.ctx.CreateJFCE()
	must(err)
	b.jfc, err = b.ctx.CreateJFC(urma.JFCConfig{Depth: uint32(sq + rq), JFCE: b.jfce})
	must(err)
	must(b.jfc.Rearm(false))
	b.jfr, err = b.ctx.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: uint32(rq), MaxSGE: 1, JFC: b.jfc, MinRNRTimer: 4})
	must(err)
	b.jetty, err = b.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: uint32(sq), MaxSGE: 1, SendJFC: b.jfc, JFR: b.jfr, RNRRetry: 7})
	must(err)
	b.mem, err = urma.AllocMemory((rq + sq) * brpcBlock)
	must(err)
	b.seg, err = b.ctx.RegisterSegment(b.mem, urma.SegmentConfig{Access: urma.AccessRead | urma.AccessWrite})
	must(err)
	for i := 0; i < rq; i++ {
		must(b.postRecv(i))
	}
	return b
}

func (b *brpcPeer) close() {
	closePeer(b.tcp, b.mem, b.ctx, b.target, b.rseg, b.jetty, b.jfr, b.jfc, b.jfce, b.seg)
}

func (b *brpcPeer) postRecv(slot int) error {
	return b.jfr.PostRecv(&urma.RecvWR{UserCtx: uint64(slot), SGEs: []urma.SGE{{Segment: b.seg, Offset: uint64(slot * brpcBlock), Len: brpcBlock}}})
}

// hello is brpc's MakeLocalParsedHello: the context's EID, CTP, its pool
// segment, no extension.
func (b *brpcPeer) hello() handshake.Hello {
	id, sid := b.jetty.ID(), b.seg.ID()
	h := handshake.Hello{
		BufferSize: brpcBlock, RecvBufferCnt: uint32(b.rq - 1), JettyID: id.ID, EID: b.ctx.EID(), UASID: id.UASID,
		TPType: handshake.TPCTP, SegEID: sid.EID, SegUASID: sid.UASID, SegVA: sid.VA, SegLen: sid.Len, SegTokenID: sid.TokenID,
	}
	if b.presents {
		h.SQSize = uint32(b.sq)
	}
	return h
}

// importPeer is brpc's ApplyRemoteHello and ImportPeer: windows from the
// peer's hello, its segment then its jetty, with no token (or, presenting,
// the token of that hello).
func (b *brpcPeer) importPeer(h handshake.Hello) error {
	b.peer = h
	b.remoteBlock = int(h.BufferSize)
	b.localCap = min(b.sq, int(h.RecvBufferCnt)+1) - creditWRs
	b.remoteCap = b.rq - creditWRs
	b.immWin, b.sqWin, b.rqWin = creditWRs, b.localCap, b.localCap
	token := urma.Token(0)
	if b.presents && h.HasToken {
		token = urma.Token(h.Token)
	}
	rseg, err := b.ctx.ImportSegment(urma.SegmentID{EID: h.SegEID, UASID: h.SegUASID, VA: h.SegVA, Len: h.SegLen, TokenID: h.SegTokenID}, token)
	if err != nil {
		return fmt.Errorf("import segment: %w", err)
	}
	b.rseg = rseg
	target, err := b.ctx.ImportJetty(context.Background(), urma.JettyID{EID: h.EID, UASID: h.UASID, ID: h.JettyID}, urma.RM, token)
	if err != nil {
		return fmt.Errorf("import jetty: %w", err)
	}
	b.target = target
	return nil
}

// dial is brpc's client handshake (v2). It reports whether URMA was
// negotiated; when not, brpc goes on in TCP without an ACK.
func (b *brpcPeer) dial(addr string) (bool, error) {
	var err error
	if b.tcp, err = net.Dial("tcp", addr); err != nil {
		return false, err
	}
	_ = b.tcp.SetDeadline(time.Now().Add(20 * time.Second))
	defer func() { _ = b.tcp.SetDeadline(time.Time{}) }()
	if _, err := b.tcp.Write(handshake.AppendV2(nil, b.hello())); err != nil {
		return false, err
	}
	magic := make([]byte, handshake.MagicLen)
	if _, err := io.ReadFull(b.tcp, magic); err != nil {
		return false, err
	}
	h, _, err := handshake.ReadHello(b.tcp, magic)
	if errors.Is(err, handshake.ErrInvalidHello) {
		return false, nil // not negotiated: TCP, no ACK
	}
	if err != nil {
		return false, err
	}
	if err := b.importPeer(h); err != nil {
		return false, err
	}
	_, err = b.tcp.Write(handshake.AppendAck(nil, true))
	return err == nil, err
}

// accept is brpc's server handshake on the next connection of ln. It
// reports whether the client asked for URMA; a failed handshake closes the
// connection, as brpc's FailHandshake does.
func (b *brpcPeer) accept(ln net.Listener) (ok bool, err error) {
	if b.tcp, err = ln.Accept(); err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			_ = b.tcp.Close()
		}
	}()
	_ = b.tcp.SetDeadline(time.Now().Add(20 * time.Second))
	defer func() { _ = b.tcp.SetDeadline(time.Time{}) }()
	magic := make([]byte, handshake.MagicLen)
	if _, err := io.ReadFull(b.tcp, magic); err != nil {
		return false, err
	}
	h, v, err := handshake.ReadHello(b.tcp, magic)
	if err != nil {
		return false, fmt.Errorf("brpc fails the handshake on this client hello: %w", err)
	}
	if err := b.importPeer(h); err != nil {
		return false, err
	}
	if v == handshake.V3 {
		_, err = b.tcp.Write(handshake.AppendV3(nil, b.hello()))
	} else {
		_, err = b.tcp.Write(handshake.AppendV2(nil, b.hello()))
	}
	if err != nil {
		return false, err
	}
	ack, _, err := handshake.ReadAck(b.tcp)
	if err != nil {
		return false, err
	}
	return ack.UseURMA(), nil
}

// pump waits up to a tick for completion events and handles every
// completion, as brpc's PollCq does; an error is what brpc would fail the
// socket with.
func (b *brpcPeer) pump() error {
	n, err := b.jfce.Wait(b.evs[:], 20*time.Millisecond)
	if err != nil {
		return fmt.Errorf("wait for events: %w", err)
	}
	if n > 0 {
		b.jfc.Ack(uint32(n))
	}
	if err := b.drain(); err != nil {
		return err
	}
	if err := b.jfc.Rearm(false); err != nil {
		return err
	}
	return b.drain()
}

func (b *brpcPeer) drain() error {
	for {
		k, err := b.jfc.Poll(b.cqes)
		if err != nil {
			return err
		}
		for i := range b.cqes[:k] {
			if err := b.handle(&b.cqes[i]); err != nil {
				return err
			}
		}
		if k == 0 {
			return nil
		}
	}
}

// handle is brpc's HandleCompletion.
func (b *brpcPeer) handle(cr *urma.Completion) error {
	if cr.Status != urma.StatusSuccess {
		return fmt.Errorf("completion status %s", cr.Status)
	}
	if !cr.Recv {
		if cr.UserCtx == 0 {
			if b.immWin >= creditWRs {
				return errors.New("credit completion beyond the reserved WRs")
			}
			b.immWin++
			return b.sendAck(0)
		}
		if b.sqWin >= b.localCap {
			return errors.New("send completion beyond the window")
		}
		b.sqWin++
		return nil
	}
	if cr.Opcode == urma.CROpSendWithImm && cr.Imm > 0 {
		if cr.Imm > uint64(b.localCap) || b.rqWin > b.localCap-int(cr.Imm) {
			return fmt.Errorf("credit %d exceeds the window (%d of %d)", cr.Imm, b.rqWin, b.localCap)
		}
		b.rqWin += int(cr.Imm)
	} else if cr.CompletionLen == 0 {
		return errors.New("zero-length receive without a credit")
	}
	slot := int(cr.UserCtx)
	b.received = append(b.received, b.mem.Bytes()[slot*brpcBlock:slot*brpcBlock+int(cr.CompletionLen)]...)
	if err := b.postRecv(slot); err != nil {
		return err
	}
	if cr.CompletionLen > 0 {
		return b.sendAck(1)
	}
	return nil
}

// sendAck is brpc's SendAck: credits go back only past half its window.
func (b *brpcPeer) sendAck(n int) error {
	b.newRQWRs += n
	if b.newRQWRs > b.remoteCap/2 && b.immWin > 0 {
		imm := b.newRQWRs
		b.newRQWRs = 0
		b.immWin--
		return b.jetty.PostSend(&urma.SendWR{
			Opcode: urma.OpSendWithImm, Flags: urma.SendCompleteEnable | urma.SendSolicitedEnable,
			Target: b.target, Imm: uint64(imm),
		})
	}
	return nil
}

// write sends p in messages of at most the peer's block, waiting for
// credits like brpc's writer; it fails once the deadline passes.
func (b *brpcPeer) write(p []byte, deadline time.Time) error {
	for len(p) > 0 {
		if b.sqWin == 0 || b.rqWin == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("brpc writer stalled: send window %d, remote receive window %d", b.sqWin, b.rqWin)
			}
			if err := b.pump(); err != nil {
				return err
			}
			continue
		}
		k := min(len(p), b.remoteBlock, brpcBlock)
		off := (b.rq + b.nextSend) * brpcBlock
		b.nextSend = (b.nextSend + 1) % b.sq
		copy(b.mem.Bytes()[off:], p[:k])
		b.sqWin--
		b.rqWin--
		if err := b.jetty.PostSend(&urma.SendWR{
			Opcode: urma.OpSend, Flags: urma.SendCompleteEnable, Target: b.target, UserCtx: 1,
			SGEs: []urma.SGE{{Segment: b.seg, Offset: uint64(off), Len: uint32(k)}},
		}); err != nil {
			return err
		}
		p = p[k:]
	}
	return nil
}

// read returns the next n bytes received, waiting until the deadline.
func (b *brpcPeer) read(n int, deadline time.Time) ([]byte, error) {
	for len(b.received) < n {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("brpc reader has %d of %d bytes: the sender stalled", len(b.received), n)
		}
		if err := b.pump(); err != nil {
			return nil, err
		}
	}
	out := b.received[:n:n]
	b.received = b.received[n:]
	return out, nil
}

// streamBoth moves n bytes from the brpc peer to c and n bytes back, one
// direction after the other, within a deadline that only a stall reaches.
func streamBoth(t *testing.T, b *brpcPeer, c net.Conn, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	up, down := pattern(n, 1), pattern(n, 2)
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, n)
		_, err := io.ReadFull(c, buf)
		if err == nil && string(buf) != string(up) {
			err = errors.New("the bytes from the brpc peer differ")
		}
		got <- err
	}()
	if err := b.write(up, deadline); err != nil {
		t.Fatalf("brpc peer -> us: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("brpc peer -> us: %v", err)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(down)
		sent <- err
	}()
	back, err := b.read(n, deadline)
	if err != nil {
		t.Fatalf("us -> brpc peer: %v (our side: %s)", err, c.(Conn).Debug())
	}
	if string(back) != string(down) {
		t.Fatal("the bytes to the brpc peer differ")
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}
