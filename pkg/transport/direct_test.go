package transport

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// directPair connects a client and a server on the default software
// provider, forced onto fabric, with urma_read_direct as given.
func directPair(t *testing.T, fabric string, direct bool) (client Conn, server *urmaConn) {
	t.Helper()
	f := flags.Defaults()
	f.BufferCount = 1024
	f.RQSize, f.SQSize = 16, 16
	f.ReadDirect = direct
	cfg := Config{Flags: &f, LookupEnv: noEnv, SoftFabric: fabric}
	p := connect(t, cfg, cfg)
	if p.server.Mode() != ModeURMA {
		t.Fatalf("server fell back: %s", p.server.FallbackReason())
	}
	return p.client, p.server.(*urmaConn)
}

type readResult struct {
	n   int
	err error
}

// readAsync starts a Read of p on c and returns where its result comes.
func readAsync(c Conn, p []byte) <-chan readResult {
	done := make(chan readResult, 1)
	go func() {
		n, err := c.Read(p)
		done <- readResult{n, err}
	}()
	return done
}

func await(t *testing.T, ch <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the read did not return")
		return readResult{}
	}
}

// A Read that waits for a message with room for it gets the message
// copied straight into its slice (Debug counts it), on both cross-process
// fabrics; more messages than the receive queue holds, so a placed
// receive that were not reposted would stall the writer. With
// urma_read_direct off, nothing is placed and the bytes are the same.
func TestDirectRead(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		fabric string
		direct bool
	}{
		{FabricSocket, true}, {FabricShm, true}, {FabricSocket, false}, {FabricShm, false},
	}
	for _, tc := range tests {
		name := tc.fabric + map[bool]string{true: " direct", false: " copied"}[tc.direct]
		t.Run(name, func(t *testing.T) {
			client, server := directPair(t, tc.fabric, tc.direct)
			const msgs = 40 // past the 16-deep receive queue, twice
			rng := rand.New(rand.NewPCG(1, 2))
			buf := make([]byte, 8192)
			for i := 0; i < msgs; i++ {
				msg := make([]byte, 600+rng.IntN(7000))
				for k := range msg {
					msg[k] = byte(rng.Uint32())
				}
				res := readAsync(server, buf)
				if tc.direct {
					eventually.Holds(t, "the reader to offer its slice", 10*time.Second, server.offered)
				}
				if _, err := client.Write(msg); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				r := await(t, res)
				if r.err != nil || !bytes.Equal(buf[:r.n], msg) {
					t.Fatalf("read %d: %d bytes, %v; want the %d bytes written", i, r.n, r.err, len(msg))
				}
			}
			want := uint64(0)
			if tc.direct {
				want = msgs
			}
			// A Read may return a placed message before its completion is
			// handled, which is when the message is counted received.
			eventually.Holds(t, "every message's completion", 10*time.Second, func() bool {
				return server.Debug().MessagesReceived == msgs
			})
			if d := server.Debug(); d.DirectReads != want || d.MessagesReceived != msgs {
				t.Fatalf("%d of %d messages read directly, want %d of %d", d.DirectReads, d.MessagesReceived, want, msgs)
			}
		})
	}
}

// A Read whose offer is out keeps it through a wake-up that brings
// nothing (a notice of a message it read already, say), and the message
// that comes next is placed. Taken back and made again on every wake-up,
// the offer left a gap in which a message passed it by and was copied
// after all: now and then under load, one message in forty.
func TestDirectReadOfferOutlivesAnEmptyWake(t *testing.T) {
	checkNoLeaks(t)
	// The socket fabric: the in-process one passes every offer by.
	ps := make([]urma.Provider, 2)
	for i := range ps {
		p, err := soft.New(soft.Options{Listen: "127.0.0.1:0", Logger: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		ps[i] = p
	}
	sp := newFaultProvider(ps[0])
	sp.f.set(func(c *faultConfig) { c.placing = true })
	f := smallFlags()
	f.ReadDirect = true
	p := connect(t, cfgWith(sp, f), cfgWith(ps[1], f))
	requireURMA(t, "direct reads", p.client, p.server)
	server := p.server.(*urmaConn)
	if server.direct.jfr == nil {
		t.Skip("the provider places no message in a reader's slice")
	}
	buf := make([]byte, 64<<10) // room to offer: urma_zerocopy_min_size and more
	res := readAsync(server, buf)
	eventually.Holds(t, "the reader to sleep with its slice offered", 10*time.Second, func() bool {
		return server.offered() && server.readSleeps.Load() == 1
	})
	offers := sp.f.offers.Load()
	notify(server.readable) // a wake-up that brings nothing
	eventually.Holds(t, "the reader to sleep again", 10*time.Second, func() bool {
		return server.readSleeps.Load() == 2
	})
	if n := sp.f.offers.Load() - offers; n != 0 || !server.offered() {
		t.Fatalf("after a wake-up that brought nothing the reader made %d offers more and has one out: %v; want its first to stand", n, server.offered())
	}
	msg := bytes.Repeat([]byte("placed "), 100)
	if _, err := p.client.Write(msg); err != nil {
		t.Fatal(err)
	}
	if r := await(t, res); r.err != nil || !bytes.Equal(buf[:r.n], msg) {
		t.Fatalf("read %d bytes, %v; want the %d written", r.n, r.err, len(msg))
	}
	if d := server.Debug(); d.DirectReads != 1 {
		t.Fatalf("%d reads placed directly; want the one", d.DirectReads)
	}
}

// An offer the reader takes back loses nothing: the message it was for
// lands in the receive buffer and the next Read takes it. The reader takes
// it back when its deadline passes, and when the message does not fit its
// slice; a reader whose connection closes returns at once.
func TestDirectReadTakenBack(t *testing.T) {
	checkNoLeaks(t)
	for _, fabric := range []string{FabricSocket, FabricShm} {
		t.Run(fabric, func(t *testing.T) {
			client, server := directPair(t, fabric, true)
			msg := bytes.Repeat([]byte("0123456789abcdef"), 256) // 4 KiB

			// The deadline passes while the slice is offered.
			if err := server.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 8192)
			if n, err := server.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past its deadline: %d bytes, %v", n, err)
			}
			if err := server.SetReadDeadline(time.Time{}); err != nil {
				t.Fatal(err)
			}
			if _, err := client.Write(msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("after the deadline: %v, bytes equal %v", err, bytes.Equal(got, msg))
			}

			// Too large for the slice offered: the slice gets the first part.
			before := server.Debug().DirectReads
			small := make([]byte, 1024)
			res := readAsync(server, small)
			eventually.Holds(t, "the reader to offer its slice", 10*time.Second, server.offered)
			if _, err := client.Write(msg); err != nil {
				t.Fatal(err)
			}
			r := await(t, res)
			if r.err != nil || r.n != len(small) || !bytes.Equal(small, msg[:len(small)]) {
				t.Fatalf("read into a smaller slice: %d bytes, %v", r.n, r.err)
			}
			if _, err := io.ReadFull(server, got[:len(msg)-len(small)]); err != nil || !bytes.Equal(got[:len(msg)-len(small)], msg[len(small):]) {
				t.Fatalf("the rest of the message: %v", err)
			}
			if d := server.Debug(); d.DirectReads != before {
				t.Fatalf("%d messages read directly, want none", d.DirectReads-before)
			}

			// Close while the slice is offered.
			res = readAsync(server, buf)
			eventually.Holds(t, "the reader to offer its slice", 10*time.Second, server.offered)
			if err := server.Close(); err != nil {
				t.Fatal(err)
			}
			if r := await(t, res); r.err == nil {
				t.Fatalf("read on a closed connection returned %d bytes and no error", r.n)
			}
		})
	}
}

// The completion of a placed message may be handled in the moment between
// the reader's Wait and its bookkeeping ("between"), or only after the
// reader returned ("after"): either way the handler takes the receive as
// read and reposts it, never queues the message a second time, and the
// next Read offers its slice again. The test holds the completion
// handlers off (pollMu) until the reader has waited, then lets them in at
// that moment or once the read returned.
func TestDirectReadCompletionOrder(t *testing.T) {
	checkNoLeaks(t)
	for _, fabric := range []string{FabricSocket, FabricShm} {
		for _, between := range []bool{true, false} {
			name := fabric + map[bool]string{true: " between", false: " after"}[between]
			t.Run(name, func(t *testing.T) {
				f := flags.Defaults()
				f.BufferCount = 1024
				f.RQSize, f.SQSize = 16, 16
				// The reader may see the placement by spinning (shm), not by
				// an event, which the held-off handlers would send. Where it
				// does not spin (the socket fabric, readerSpin) or its spin
				// ended first (a loaded machine), the read deadline wakes it.
				f.EventSpin = 10 * time.Millisecond
				cfg := Config{Flags: &f, LookupEnv: noEnv, SoftFabric: fabric}
				p := connect(t, cfg, cfg)
				client, server := p.client, p.server.(*urmaConn)
				handled := func() bool {
					server.poll()
					server.mu.Lock()
					defer server.mu.Unlock()
					return server.direct.slot < 0 || server.direct.handled
				}
				exercised := 0
				buf := make([]byte, 4096)
				// Lets the handlers in again should the test fail while it
				// holds them off: the connection's Close waits for them.
				held := func() {}
				defer func() { held() }()
				for i := 0; i < 3; i++ {
					var once sync.Once
					release := func() { once.Do(server.pollMu.Unlock) }
					held = release
					server.pollMu.Lock()
					var settling atomic.Bool // the reader has the placed message
					server.direct.afterWait = func() {
						settling.Store(true)
						server.mu.Lock()
						if !server.direct.handled {
							exercised++
						}
						server.mu.Unlock()
						if between {
							release()
							eventually.Holds(t, "the placed message's completion", 10*time.Second, handled)
						}
					}
					msg := bytes.Repeat([]byte{byte('a' + i)}, 1000)
					res := readAsync(server, buf)
					eventually.Holds(t, "the reader to offer its slice", 10*time.Second, server.offered)
					if _, err := client.Write(msg); err != nil {
						t.Fatal(err)
					}
					eventually.Holds(t, "the message to land in the offered slice", 10*time.Second, func() bool {
						if settling.Load() {
							return true // a spinning reader saw it land
						}
						server.mu.Lock()
						defer server.mu.Unlock()
						return server.placementLanded()
					})
					_ = server.SetReadDeadline(time.Now()) // a message placed is read, deadline or not
					var r readResult
					select {
					case r = <-res:
					case <-time.After(10 * time.Second):
						// Never hold the handlers off for good: a reader the
						// deadline did not wake would need the event loop.
						release()
						r = await(t, res)
					}
					release()
					_ = server.SetReadDeadline(time.Time{})
					if r.err != nil || !bytes.Equal(buf[:r.n], msg) {
						t.Fatalf("message %d: %q, %v", i, buf[:r.n], r.err)
					}
					eventually.Holds(t, "the placed message's completion", 10*time.Second, handled)
				}
				if exercised != 3 {
					t.Fatalf("the reader settled before the completion was handled in %d of 3 reads; want all (the test did not test)", exercised)
				}
				if d := server.Debug(); d.DirectReads != 3 || d.BufferedMessages != 0 {
					t.Fatalf("%d direct reads, %d messages queued; want 3 and none (a placed message queued again)", d.DirectReads, d.BufferedMessages)
				}
			})
		}
	}
}

// A receive whose placed message was handled is reposted while the reader
// is still settling; a peer that sends past its credits can fill it again
// before the reader looks. That second message is an ordinary one: the
// handler queues it instead of taking it for the placed message again.
func TestDirectReadReusedReceiveIsQueued(t *testing.T) {
	checkNoLeaks(t)
	client, server := directPair(t, FabricShm, true)
	cl := client.(*urmaConn)
	rq := len(server.rx)
	msgs := make([][]byte, rq+1)
	for i := range msgs {
		msgs[i] = bytes.Repeat([]byte{byte('A' + i)}, 700)
	}
	server.direct.afterWait = func() {
		// The placed message's completion, handled: its receive is
		// posted again, last.
		eventually.Holds(t, "the placed message's completion", 10*time.Second, func() bool {
			server.poll()
			server.mu.Lock()
			defer server.mu.Unlock()
			return server.direct.handled
		})
		// The peer sends rq more, ignoring its window, so that the last
		// one fills that receive again; the window is put back after,
		// so that the credits the reads return balance it.
		cl.mu.Lock()
		extra := rq - cl.remoteRQWindow
		cl.remoteRQWindow += extra
		cl.mu.Unlock()
		for _, m := range msgs[1:] {
			if _, err := client.Write(m); err != nil {
				t.Errorf("write: %v", err)
				return
			}
		}
		cl.mu.Lock()
		cl.remoteRQWindow -= extra
		cl.mu.Unlock()
		eventually.Holds(t, "every message to be handled", 10*time.Second, func() bool {
			server.poll()
			return server.Debug().MessagesReceived == uint64(len(msgs))
		})
	}
	buf := make([]byte, 4096)
	res := readAsync(server, buf)
	eventually.Holds(t, "the reader to offer its slice", 10*time.Second, server.offered)
	if _, err := client.Write(msgs[0]); err != nil {
		t.Fatal(err)
	}
	if r := await(t, res); r.err != nil || !bytes.Equal(buf[:r.n], msgs[0]) {
		t.Fatalf("placed message: %q, %v", buf[:r.n], r.err)
	}
	server.direct.afterWait = nil
	for i, m := range msgs[1:] {
		got := make([]byte, len(m))
		if err := server.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, m) {
			t.Fatalf("message %d (of %q): %v, bytes equal %v", i+1, m[:1], err, bytes.Equal(got, m))
		}
	}
}

// A reader that waits without offering, after a message was placed,
// idles the placement: otherwise the provider, whose last offer was taken,
// would hold the next large message for an offer that does not come. A
// length prefix read on its own is such a Read, and ReadBuffer (which
// hands over the receive buffer itself) never offers.
func TestDirectReadUnofferedWaitIdlesPlacement(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		name string
		read func(c *urmaConn, want []byte) error // waits for want, unoffered
	}{
		{name: "small Read", read: func(c *urmaConn, want []byte) error {
			small := make([]byte, c.direct.min-1)
			n, err := c.Read(small)
			if err == nil && !bytes.Equal(small[:n], want[:len(small)]) {
				err = errors.New("read other bytes than written")
			}
			return err
		}},
		{name: "ReadBuffer", read: func(c *urmaConn, want []byte) error {
			b, err := c.ReadBuffer()
			if err != nil {
				return err
			}
			defer b.Release()
			if !bytes.Equal(b.Bytes(), want) {
				return errors.New("read other bytes than written")
			}
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client, server := directPair(t, FabricShm, true)
			msg := bytes.Repeat([]byte("direct"), 1000)
			buf := make([]byte, 8192)
			res := readAsync(server, buf)
			eventually.Holds(t, "the reader to offer its slice", 10*time.Second, server.offered)
			if _, err := client.Write(msg); err != nil {
				t.Fatalf("write: %v", err)
			}
			if r := await(t, res); r.err != nil || !bytes.Equal(buf[:r.n], msg) {
				t.Fatalf("read: %d bytes, %v", r.n, r.err)
			}
			if !server.direct.p.Pending() {
				t.Fatal("the placed message's placement is not pending: the test shows nothing")
			}
			done := make(chan readResult, 1)
			go func() { done <- readResult{err: tc.read(server, msg)} }()
			eventually.Holds(t, "the unoffered wait to idle the placement", 10*time.Second, func() bool { return !server.direct.p.Pending() })
			if server.offered() {
				t.Fatal("the reader offered")
			}
			if _, err := client.Write(msg); err != nil {
				t.Fatalf("write: %v", err)
			}
			if r := await(t, done); r.err != nil {
				t.Fatalf("unoffered read: %v", r.err)
			}
		})
	}
}
