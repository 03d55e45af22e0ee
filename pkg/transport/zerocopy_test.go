package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
)

// TestZeroCopy: AllocBuffer/WriteBuffer and ReadBuffer/Release move
// messages without copies on URMA, work the same over TCP, mix with Read,
// and reject misuse.
func TestZeroCopy(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range []struct {
		name     string
		disabled bool
		zerocopy bool
	}{{"urma", false, true}, {"urma copying receives", false, false}, {"tcp", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			f := smallFlags()
			f.RecvZerocopy = tc.zerocopy
			scfg, ccfg := cfgWith(pa, f), cfgWith(pb, f)
			scfg.DisableURMA = tc.disabled
			p := connect(t, scfg, ccfg)
			zw, zr := p.client.(ZeroCopyConn), p.server.(ZeroCopyConn)
			if zw.MaxMessage() != f.BufferSize {
				t.Fatalf("MaxMessage %d, want %d", zw.MaxMessage(), f.BufferSize)
			}
			// More messages than the window: credits must flow while the
			// reader reads.
			var sent bytes.Buffer
			for i := 0; i < 50; i++ {
				n := 1 + (i*97)%zw.MaxMessage()
				for k := 0; k < n; k++ {
					sent.WriteByte(byte(i + k))
				}
			}
			werr := make(chan error, 1)
			go func() {
				rest := sent.Bytes()
				for i := 0; i < 50; i++ {
					b, err := zw.AllocBuffer()
					if err != nil {
						werr <- err
						return
					}
					n := copy(b.Data()[:1+(i*97)%zw.MaxMessage()], rest)
					rest = rest[n:]
					if err := zw.WriteBuffer(b, n); err != nil {
						werr <- err
						return
					}
				}
				werr <- nil
			}()
			var got bytes.Buffer
			for got.Len() < sent.Len() {
				b, err := zr.ReadBuffer()
				if err != nil {
					t.Fatalf("ReadBuffer after %d bytes: %v", got.Len(), err)
				}
				got.Write(b.Bytes())
				if b.Len() != len(b.Bytes()) {
					t.Fatal("Len disagrees with Bytes")
				}
				b.Release()
				b.Release() // a second release is a no-op
			}
			if err := <-werr; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), sent.Bytes()) {
				t.Fatal("data differs")
			}

			// Read and ReadBuffer share the stream: a Read takes part of a
			// message, ReadBuffer returns the rest.
			b, _ := zw.AllocBuffer()
			copy(b.Data(), "hello world")
			if err := zw.WriteBuffer(b, 11); err != nil {
				t.Fatal(err)
			}
			head := make([]byte, 6)
			if _, err := io.ReadFull(p.server, head); err != nil {
				t.Fatal(err)
			}
			rest, err := zr.ReadBuffer()
			if err != nil {
				t.Fatal(err)
			}
			if string(head)+string(rest.Bytes()) != "hello world" {
				t.Fatalf("got %q + %q", head, rest.Bytes())
			}
			rest.Release()

			// Misuse is an error, never a panic.
			b, _ = zw.AllocBuffer()
			if err := zw.WriteBuffer(b, zw.MaxMessage()+1); err == nil {
				t.Error("oversize WriteBuffer succeeded")
			}
			if err := zw.WriteBuffer(b, 1); err == nil {
				t.Error("WriteBuffer of a buffer already taken back succeeded")
			}
			if err := zw.WriteBuffer(nil, 1); err == nil {
				t.Error("WriteBuffer(nil) succeeded")
			}
			if !tc.disabled {
				// A message at or above urma_zerocopy_min_size is handed
				// over in its receive buffer, which cannot be written back;
				// a copied one is an ordinary pool buffer.
				b, _ := zw.AllocBuffer()
				if err := zw.WriteBuffer(b, 600); err != nil {
					t.Fatal(err)
				}
				rb, err := zr.ReadBuffer()
				if err != nil {
					t.Fatal(err)
				}
				err = zr.WriteBuffer(rb, 1)
				if tc.zerocopy && err == nil {
					t.Error("writing a received buffer back succeeded")
				}
				if !tc.zerocopy && err != nil {
					t.Errorf("writing a copied receive back: %v", err)
				}
				rb.Release()
			}

			// After the writer closes, ReadBuffer says io.EOF.
			_ = p.client.Close()
			if _, err := zr.ReadBuffer(); !errors.Is(err, io.EOF) {
				t.Fatalf("ReadBuffer after the peer closed: %v", err)
			}
		})
	}
}

// TestZeroCopyHoldingBuffersStallsThePeer: received buffers the application
// holds are receives the peer cannot use; releasing them lets it go on.
func TestZeroCopyHoldingBuffersStallsThePeer(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	zr := p.server.(ZeroCopyConn)
	done := make(chan error, 1)
	go func() {
		_, err := p.client.Write(make([]byte, 64*1024))
		done <- err
	}()
	var held []*Buffer
	for len(held) < 13 { // the whole window
		b, err := zr.ReadBuffer()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	eventually.Holds(t, "the writer to stall", 5*time.Second, func() bool { return p.client.Debug().RemoteRQWindow == 0 })
	for _, b := range held {
		b.Release()
	}
	go func() { _, _ = io.Copy(io.Discard, p.server) }()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestZeroCopyDoesNotAllocate: in steady state a message sent with
// AllocBuffer/WriteBuffer and taken with ReadBuffer/Release allocates
// nothing, on either side, completion handling included; nor does
// Write/Read.
func TestZeroCopyDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	checkNoLeaks(t)
	for _, polling := range []bool{false, true} {
		pa, pb := fabricPair(t)
		f := smallFlags()
		f.UsePolling, f.PollerYield = polling, polling
		p := connect(t, cfgWith(pa, f), cfgWith(pb, f))
		zw, zr := p.client.(ZeroCopyConn), p.server.(ZeroCopyConn)
		msg := func() {
			b, err := zw.AllocBuffer()
			if err != nil {
				t.Fatal(err)
			}
			if err := zw.WriteBuffer(b, 1000); err != nil { // above urma_zerocopy_min_size
				t.Fatal(err)
			}
			r, err := zr.ReadBuffer()
			if err != nil {
				t.Fatal(err)
			}
			r.Release()
		}
		for i := 0; i < 1000; i++ { // warm up: pools, channels, credits
			msg()
		}
		if avg := testing.AllocsPerRun(2000, msg); avg > 0.01 {
			t.Errorf("polling=%v: %.3f allocations per zero-copy message, want 0", polling, avg)
		}
		// The copying API allocates nothing per message either.
		out, in := make([]byte, 3000), make([]byte, 3000)
		copying := func() {
			if _, err := p.client.Write(out); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(p.server, in); err != nil {
				t.Fatal(err)
			}
		}
		copying()
		if avg := testing.AllocsPerRun(1000, copying); avg > 0.01 {
			t.Errorf("polling=%v: %.3f allocations per Write/Read, want 0", polling, avg)
		}
	}
}

// TestReadBufferAfterPartialRead: ReadBuffer after a Read that took part of
// a message returns the rest, handed over in its receive buffer only when
// the rest, not the whole message, is at least urma_zerocopy_min_size.
func TestReadBufferAfterPartialRead(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	f := smallFlags()
	p := connect(t, cfgWith(pa, f), cfgWith(pb, f))
	zr := p.server.(ZeroCopyConn)
	for _, tc := range []struct {
		name       string
		size, read int
		handedOver bool
	}{
		{"rest below the minimum", f.ZerocopyMinSize + 10, 20, false},
		{"rest at the minimum", f.ZerocopyMinSize + 10, 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := pattern(tc.size, byte(tc.read))
			before := p.server.Debug().BytesReceived
			if _, err := p.client.Write(msg); err != nil {
				t.Fatal(err)
			}
			head := make([]byte, tc.read)
			if _, err := io.ReadFull(p.server, head); err != nil {
				t.Fatal(err)
			}
			b, err := zr.ReadBuffer()
			if err != nil {
				t.Fatal(err)
			}
			defer b.Release()
			if got := p.server.Debug().BytesReceived - before; got != uint64(tc.size) {
				t.Errorf("bytes received counted %d for a message of %d read in two parts", got, tc.size)
			}
			if !bytes.Equal(b.Bytes(), msg[tc.read:]) || b.Len() != tc.size-tc.read {
				t.Fatalf("ReadBuffer after reading %d bytes returned %d bytes (Len %d), not the rest of the message", tc.read, len(b.Bytes()), b.Len())
			}
			if got := b.recv != nil; got != tc.handedOver {
				t.Errorf("a rest of %d bytes (minimum %d) handed over in its receive buffer: %v, want %v", b.Len(), f.ZerocopyMinSize, got, tc.handedOver)
			}
		})
	}
}

// TestWriteBufferBounds: WriteBuffer takes any length from 0 (nothing
// sent) to the whole buffer, in both modes.
func TestWriteBufferBounds(t *testing.T) {
	checkNoLeaks(t)
	for _, disabled := range []bool{false, true} {
		t.Run(map[bool]string{false: "urma", true: "tcp"}[disabled], func(t *testing.T) {
			pa, pb := fabricPair(t)
			scfg := cfgWith(pa, smallFlags())
			scfg.DisableURMA = disabled
			p := connect(t, scfg, cfgWith(pb, smallFlags()))
			zw := p.client.(ZeroCopyConn)
			empty, err := zw.AllocBuffer()
			if err != nil {
				t.Fatal(err)
			}
			if err := zw.WriteBuffer(empty, 0); err != nil {
				t.Fatalf("WriteBuffer of 0 bytes: %v", err)
			}
			full, err := zw.AllocBuffer()
			if err != nil {
				t.Fatal(err)
			}
			msg := pattern(len(full.Data()), 3)
			copy(full.Data(), msg)
			if err := zw.WriteBuffer(full, len(msg)); err != nil {
				t.Fatalf("WriteBuffer of the whole %d-byte buffer: %v", len(msg), err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(p.server, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("read %v; want the whole buffer", err)
			}
		})
	}
}

// TestWriteBufferBeyondThePeersBuffer: a peer with smaller buffers bounds
// a message (MaxMessage); WriteBuffer refuses more, names both sizes,
// takes the buffer back, and the connection goes on.
func TestWriteBufferBeyondThePeersBuffer(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	big, small := smallFlags(), smallFlags()
	big.BufferSize = 4096
	p := connect(t, cfgWith(pa, small), cfgWith(pb, big))
	zw := p.client.(ZeroCopyConn)
	if got := zw.MaxMessage(); got != small.BufferSize {
		t.Fatalf("MaxMessage %d, want the peer's buffer size %d", got, small.BufferSize)
	}
	b, err := zw.AllocBuffer()
	if err != nil {
		t.Fatal(err)
	}
	err = zw.WriteBuffer(b, small.BufferSize+1)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d bytes exceed the largest message of %d", small.BufferSize+1, small.BufferSize)) {
		t.Fatalf("WriteBuffer beyond the peer's buffer: %v", err)
	}
	if b.held.Load() {
		t.Fatal("the refused buffer is still the application's")
	}
	if _, err := p.client.Write([]byte("still open")); err != nil {
		t.Fatalf("write after the refusal: %v", err)
	}
	got := make([]byte, len("still open"))
	if _, err := io.ReadFull(p.server, got); err != nil || string(got) != "still open" {
		t.Fatalf("read %q, %v", got, err)
	}
}
