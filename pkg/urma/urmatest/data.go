package urmatest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func init() {
	register("Devices", testDevices)
	register("SendRecvBytes", testSendRecvBytes)
	register("InlineCopiedAtPost", testInlineCopiedAtPost)
	register("OrderRC", func(t *testing.T, pr Pair) { testOrder(t, pr, urma.RC) })
	register("OrderRM", func(t *testing.T, pr Pair) { testOrder(t, pr, urma.RM) })
	register("OrderUnderRNR", testOrderUnderRNR)
	register("Bidirectional", testBidirectional)
	register("ConcurrentJetties", testConcurrentJetties)
}

// Devices are listed with usable ports, EIDs and capabilities, and Open
// checks its arguments.
func testDevices(t *testing.T, pr Pair) {
	for _, p := range []urma.Provider{pr.A, pr.B} {
		devs, err := p.Devices()
		must(t, err, "list devices of %s", p.Name())
		if len(devs) == 0 {
			t.Fatalf("%s lists no device", p.Name())
		}
		for _, d := range devs {
			switch {
			case d.Name == "":
				t.Errorf("%s: device without a name", p.Name())
			case !d.HasUsablePort():
				t.Errorf("%s/%s: no ACTIVE port in %v", p.Name(), d.Name, d.Ports)
			case len(d.EIDs) == 0 || d.EIDs[0].EID.IsZero():
				t.Errorf("%s/%s: no EID in %v", p.Name(), d.Name, d.EIDs)
			case d.Caps.MaxJFCDepth == 0 || d.Caps.MaxJFSDepth == 0 || d.Caps.MaxJFRDepth == 0 || d.Caps.MaxMsgSize == 0:
				t.Errorf("%s/%s: capabilities missing: %+v", p.Name(), d.Name, d.Caps)
			case d.Caps.TransMode&(urma.TransModeRC|urma.TransModeRM) == 0:
				t.Errorf("%s/%s: neither RC nor RM in transport modes %#x", p.Name(), d.Name, d.Caps.TransMode)
			}
		}
		_, err = p.Open("no-such-device-xyz", 0)
		wantErr(t, err, urma.ErrNoDev, "open an unknown device")
		_, err = p.Open(devs[0].Name, len(devs[0].EIDs))
		wantErr(t, err, urma.ErrInval, "open an EID index past the table")
		c, err := p.Open(devs[0].Name, 0)
		must(t, err, "open %s", devs[0].Name)
		if c.EID() != devs[0].EIDs[0].EID || c.Device().Name != devs[0].Name {
			t.Errorf("context reports %s/%s, want %s/%s", c.Device().Name, c.EID(), devs[0].Name, devs[0].EIDs[0].EID)
		}
		must(t, c.Close(), "close context")
	}
}

// Real bytes arrive: the receive buffer holds exactly the sent bytes, the
// bytes past the message are untouched, and every completion field is right.
func testSendRecvBytes(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	cases := []struct {
		name     string
		size     int
		opcode   urma.Opcode
		sendSGEs []int // piece sizes; their sum is size
		recvSGEs []int // piece sizes; at least size in total
	}{
		{"empty", 0, urma.OpSend, nil, []int{64}},
		{"1B", 1, urma.OpSend, []int{1}, []int{1}},
		{"64B-imm", 64, urma.OpSendWithImm, []int{64}, []int{64}},
		{"4KiB-exact", 4096, urma.OpSend, []int{4096}, []int{4096}},
		{"64KiB+7-larger-buffer", 65543, urma.OpSendWithImm, []int{65543}, []int{1 << 17}},
		{"1MiB", 1 << 20, urma.OpSend, []int{1 << 20}, []int{1 << 20}},
		{"gather-3-scatter-2", 10000, urma.OpSendWithImm, []int{1, 4999, 5000}, []int{3333, 8000}},
		{"gather-4-scatter-4", 4 * 1500, urma.OpSend, []int{1500, 1500, 1500, 1500}, []int{1000, 1000, 1000, 3000}},
	}
	const recvBase = 2 << 20 // receive buffers live in the upper half
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			userCtx := uint64(0xabc0000 + i)
			imm := uint64(0x1122334455667788) + uint64(i)
			// Receive pieces, spaced apart so an overrun would show.
			var rsges []urma.SGE
			off, total := recvBase, 0
			for _, n := range c.recvSGEs {
				rsges = append(rsges, urma.SGE{Segment: b.seg, Offset: uint64(off), Len: uint32(n)})
				fill(b.bytes(off, n+64), 0xee)
				off += n + 64
				total += n
			}
			must(t, b.jfr.PostRecv(&urma.RecvWR{UserCtx: userCtx + 1, SGEs: rsges}), "post receive")
			// Send pieces, in reverse order in memory to prove gathering.
			var ssges []urma.SGE
			soff := 0
			want := make([]byte, 0, c.size)
			for _, n := range c.sendSGEs {
				fillRandom(a.bytes(soff, n), uint64(soff+i))
				ssges = append(ssges, urma.SGE{Segment: a.seg, Offset: uint64(soff), Len: uint32(n)})
				want = append(want, a.bytes(soff, n)...)
				soff += n + 8
			}
			wr := &urma.SendWR{Opcode: c.opcode, Flags: urma.SendCompleteEnable, Target: target, UserCtx: userCtx, SGEs: ssges, Imm: imm}
			must(t, a.jetty.PostSend(wr), "post send")
			sc := wait(t, a.sendJFC, 1, waitTimeout)[0]
			rc := wait(t, b.recvJFC, 1, waitTimeout)[0]

			// A send completion carries no opcode (urma_types.h:1154,
			// "Only for recv"): providers leave it zero. Its length is the
			// bytes sent.
			if sc.Status != urma.StatusSuccess || sc.Recv || sc.UserCtx != userCtx || sc.Opcode != 0 ||
				sc.CompletionLen != uint32(c.size) || sc.LocalID != a.jetty.ID().ID || sc.RemoteID.ID != b.jetty.ID().ID {
				t.Errorf("send completion %+v: want SUCCESS, s_r 0, user_ctx %#x, no opcode, length %d, local %d, remote %d",
					sc, userCtx, c.size, a.jetty.ID().ID, b.jetty.ID().ID)
			}
			wantOp, wantImm := urma.CROpSend, uint64(0)
			if c.opcode == urma.OpSendWithImm {
				wantOp, wantImm = urma.CROpSendWithImm, imm
			}
			aid := a.jetty.ID()
			if rc.Status != urma.StatusSuccess || !rc.Recv || rc.UserCtx != userCtx+1 || rc.CompletionLen != uint32(c.size) ||
				rc.Opcode != wantOp || rc.Imm != wantImm || rc.LocalID != b.jetty.ID().ID ||
				rc.RemoteID.ID != aid.ID || rc.RemoteID.EID != aid.EID {
				t.Errorf("receive completion %+v: want SUCCESS, s_r 1, user_ctx %#x, len %d, opcode %d, imm %#x, local %d, remote %v",
					rc, userCtx+1, c.size, wantOp, wantImm, b.jetty.ID().ID, aid)
			}
			// Reassemble what landed, piece by piece, and check the guards.
			got := make([]byte, 0, total)
			for _, s := range rsges {
				got = append(got, b.bytes(int(s.Offset), int(s.Len))...)
				guard := b.bytes(int(s.Offset)+int(s.Len), 64)
				if bytes.Count(guard, []byte{0xee}) != 64 {
					t.Errorf("bytes past receive SGE at %d were written", s.Offset)
				}
			}
			if !bytes.Equal(got[:c.size], want) {
				t.Errorf("received bytes differ from sent bytes (size %d)", c.size)
			}
			if bytes.Count(got[c.size:], []byte{0xee}) != total-c.size {
				t.Errorf("receive buffer written past the message's %d bytes", c.size)
			}
		})
	}
}

// An inline send's bytes are copied at post (udma copies them into the
// send queue entry: hw/udma/udma_u_jfs.c:459-471, handle_sq_inline): the
// caller may reuse its memory at once, and inline sends queued together
// each keep their own bytes. The jetty's MaxInline is the most one inline
// send carries: more fails the post.
func testInlineCopiedAtPost(t *testing.T, pr Pair) {
	const n, size = 4, 64
	a := open(t, pr.A, pr.DeviceA, epConfig{MaxInline: size})
	b := open(t, pr.B, pr.DeviceB, epConfig{})
	target := a.importFrom(b, b.cfg.Token)
	over := a.sendWR(target, 99, 0, size+1)
	over.Flags |= urma.SendInline
	wantErr(t, a.jetty.PostSend(over), urma.ErrInval, "an inline send past MaxInline")
	// No receive is posted yet and RNR retries forever: all n stay queued,
	// each posted from the same memory with other bytes in it.
	for i := range n {
		fill(a.bytes(0, size), byte(0xa0+i))
		wr := a.sendWR(target, uint64(i), 0, size)
		wr.Flags |= urma.SendInline
		must(t, a.jetty.PostSend(wr), "post inline send %d", i)
	}
	fill(a.bytes(0, size), 0xff)
	for i := range n {
		b.postRecv(uint64(i), i*size, size)
	}
	for _, c := range wait(t, b.recvJFC, n, waitTimeout) {
		i := int(c.UserCtx)
		if c.Status != urma.StatusSuccess || c.CompletionLen != size || i >= n {
			t.Fatalf("inline send received as %+v", c)
		}
		if got, want := b.bytes(i*size, size), bytes.Repeat([]byte{byte(0xa0 + i)}, size); !bytes.Equal(got, want) {
			t.Errorf("inline send %d carried % x, want the bytes it was posted with (% x)", i, got[:8], want[:8])
		}
	}
	for _, c := range wait(t, a.sendJFC, n, waitTimeout) {
		if c.Status != urma.StatusSuccess {
			t.Fatalf("inline send completed as %+v", c)
		}
	}
}

// testOrder streams numbered messages of varied sizes through a small
// window and checks they arrive in order, intact.
func testOrder(t *testing.T, pr Pair, mode urma.TransportMode) {
	devs, err := pr.A.Devices()
	must(t, err, "list devices")
	if mode == urma.RM && !deviceCaps(devs, pr.DeviceA).OrderedRM {
		t.Skip("device does not report ordered RM")
	}
	cfg := epConfig{Mode: mode, SQDepth: 16, RQDepth: 16}
	a := open(t, pr.A, pr.DeviceA, cfg)
	b := open(t, pr.B, pr.DeviceB, cfg)
	target := a.importFrom(b, b.cfg.Token)
	const total, slot = 3000, 8192
	stream(t, a, b, target, total, slot)
}

// With far fewer receive buffers than sends in flight, senders meet
// "receiver not ready" again and again; retries must still deliver every
// message once, in order.
func testOrderUnderRNR(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{SQDepth: 32})
	b := open(t, pr.B, pr.DeviceB, epConfig{RQDepth: 2})
	target := a.importFrom(b, b.cfg.Token)
	stream(t, a, b, target, 1500, 4096)
}

// stream sends total numbered messages a -> b and checks order and content.
func stream(t testing.TB, a, b *endpoint, target urma.RemoteJetty, total, slot int) {
	t.Helper()
	sq, rq := int(a.cfg.SQDepth), int(b.cfg.RQDepth)
	// Sends use the lower half of memory, receives the upper half, so an
	// endpoint can send and receive at once.
	rbase := b.cfg.MemSize / 2
	if sq*slot > a.cfg.MemSize/2 || rq*slot > rbase {
		t.Fatalf("stream: %d-byte slots do not fit the endpoints' memory", slot)
	}
	for i := 0; i < rq; i++ {
		b.postRecv(uint64(i), rbase+i*slot, slot)
	}
	sizeOf := func(n int) int { return 8 + (n*7919)%(slot-8) }
	sent, done, recvd := 0, 0, 0
	buf := make([]urma.Completion, 32)
	var spins int
	for recvd < total {
		progress := false
		for sent < total && sent-done < sq {
			off := (sent % sq) * slot
			n := sizeOf(sent)
			msg := a.bytes(off, n)
			fillRandom(msg, uint64(sent))
			binary.LittleEndian.PutUint64(msg, uint64(sent))
			wr := a.sendWR(target, uint64(sent), off, n)
			if sent%3 != 0 {
				wr.Flags = 0 // unsignaled: completes silently, and its slot with the next signaled one
			}
			if sent == total-1 || (sent+1)%sq == 0 {
				wr.Flags = urma.SendCompleteEnable
			}
			if err := a.jetty.PostSend(wr); err != nil {
				if errors.Is(err, urma.ErrAgain) {
					break
				}
				t.Fatalf("post send %d: %v", sent, err)
			}
			sent++
			progress = true
		}
		n, err := a.sendJFC.Poll(buf)
		must(t, err, "poll send JFC")
		for _, c := range buf[:n] {
			if c.Status != urma.StatusSuccess {
				t.Fatalf("send %d completed with %s", c.UserCtx, c.Status)
			}
			done = int(c.UserCtx) + 1
			progress = true
		}
		n, err = b.recvJFC.Poll(buf)
		must(t, err, "poll receive JFC")
		for _, c := range buf[:n] {
			if c.Status != urma.StatusSuccess {
				t.Fatalf("receive %d completed with %s", recvd, c.Status)
			}
			off := rbase + int(c.UserCtx)*slot
			msg := b.bytes(off, int(c.CompletionLen))
			seq := int(binary.LittleEndian.Uint64(msg))
			if seq != recvd || int(c.CompletionLen) != sizeOf(recvd) {
				t.Fatalf("message %d arrived as number %d, length %d (want %d): out of order", recvd, seq, c.CompletionLen, sizeOf(recvd))
			}
			want := make([]byte, c.CompletionLen)
			fillRandom(want, uint64(seq))
			binary.LittleEndian.PutUint64(want, uint64(seq))
			if !bytes.Equal(msg, want) {
				t.Fatalf("message %d corrupted", seq)
			}
			recvd++
			b.postRecv(c.UserCtx, off, slot)
			progress = true
		}
		if progress {
			spins = 0
			continue
		}
		if spins++; spins > 200000 {
			t.Fatalf("stalled: sent %d, send-completed %d, received %d of %d", sent, done, recvd, total)
		}
		backoff(spins)
	}
}

func deviceCaps(devs []urma.DeviceInfo, name string) urma.DeviceCaps {
	for _, d := range devs {
		if name == "" || d.Name == name {
			return d.Caps
		}
	}
	return urma.DeviceCaps{}
}

// Both sides send to each other at once, over the same pair of devices.
func testBidirectional(t *testing.T, pr Pair) {
	a := open(t, pr.A, pr.DeviceA, epConfig{SQDepth: 8, RQDepth: 8})
	b := open(t, pr.B, pr.DeviceB, epConfig{SQDepth: 8, RQDepth: 8})
	ta := a.importFrom(b, b.cfg.Token)
	tb := b.importFrom(a, a.cfg.Token)
	parallel(t, 2, func(i int, tb2 testing.TB) {
		if i == 0 {
			stream(tb2, a, b, ta, 500, 4096)
		} else {
			stream(tb2, b, a, tb, 500, 4096)
		}
	})
}

// Several jetty pairs stream concurrently without mixing their messages.
func testConcurrentJetties(t *testing.T, pr Pair) {
	const pairs = 4
	cfg := epConfig{SQDepth: 8, RQDepth: 8, MemSize: 256 << 10}
	eps := make([][2]*endpoint, pairs)
	targets := make([]urma.RemoteJetty, pairs)
	for i := range eps {
		eps[i] = [2]*endpoint{open(t, pr.A, pr.DeviceA, cfg), open(t, pr.B, pr.DeviceB, cfg)}
		targets[i] = eps[i][0].importFrom(eps[i][1], eps[i][1].cfg.Token)
	}
	parallel(t, pairs, func(i int, tb testing.TB) {
		stream(tb, eps[i][0], eps[i][1], targets[i], 400, 8192)
	})
}

// parallel runs f on n goroutines; a Fatalf inside ends that goroutine and
// fails the test.
func parallel(t *testing.T, n int, f func(i int, tb testing.TB)) {
	var wg sync.WaitGroup
	errs := make([]string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := &collect{TB: t}
			defer func() {
				if r := recover(); r != nil && r != any(sub) {
					errs[i] = fmt.Sprint("panic: ", r)
				} else if sub.failed != "" {
					errs[i] = sub.failed
				}
			}()
			f(i, sub)
		}()
	}
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			t.Errorf("goroutine %d: %s", i, e)
		}
	}
}

// collect turns a goroutine's Fatalf into a recorded failure.
type collect struct {
	testing.TB
	failed string
}

func (c *collect) Fatalf(format string, args ...any) {
	c.failed = fmt.Sprintf(format, args...)
	panic(c)
}

func (c *collect) Helper() {}
