package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// TestIntegrity: many connections at once, both directions at once, random
// write and read sizes; every byte arrives, in order (checksums).
func TestIntegrity(t *testing.T) {
	checkNoLeaks(t)
	tests := []struct {
		name    string
		conns   int
		total   int
		polling bool
		fabric  string // "": an in-process fabric pair; else the default provider on this fabric
		bufSize int
	}{
		{name: "inproc event", conns: 8, total: 256 << 10, bufSize: 1024},
		{name: "inproc polling", conns: 4, total: 128 << 10, polling: true, bufSize: 4096},
		{name: "socket fabric", conns: 4, total: 256 << 10, fabric: FabricSocket},
		{name: "shm fabric, zero config", conns: 4, total: 256 << 10, fabric: FabricAuto},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var scfg, ccfg Config
			if tc.fabric != "" {
				// The zero Config, but for a pool small enough for a test:
				// the default software provider, on the shm fabric (a
				// peer on this host), or on the socket fabric, forced.
				f := flags.Defaults()
				f.BufferCount = 1024
				scfg = Config{Flags: &f, LookupEnv: noEnv, SoftFabric: tc.fabric}
				ccfg = scfg
			} else {
				pa, pb := fabricPair(t)
				f := smallFlags()
				f.BufferSize = tc.bufSize
				f.UsePolling, f.PollerYield = tc.polling, tc.polling
				scfg, ccfg = cfgWith(pa, f), cfgWith(pb, f)
			}
			ln, d := listenAndDialer(t, scfg, ccfg)
			type flow struct {
				sent, got  [32]byte
				werr, rerr error
			}
			flows := make([]flow, 2*tc.conns)
			var wg sync.WaitGroup
			for i := 0; i < tc.conns; i++ {
				p := dialAccept(t, ln, d)
				if p.client.Mode() != ModeURMA {
					t.Fatalf("conn %d: %s", i, p.client.FallbackReason())
				}
				if want := map[string]string{FabricAuto: FabricShm, FabricSocket: FabricSocket}[tc.fabric]; want != "" {
					if got := p.client.Debug().Fabric; got != want {
						t.Fatalf("conn %d runs on fabric %q, want %q", i, got, want)
					}
				}
				for dir, ends := range [][2]net.Conn{{p.client, p.server}, {p.server, p.client}} {
					f := &flows[2*i+dir]
					seed := uint64(2*i + dir)
					wg.Add(2)
					go func() {
						defer wg.Done()
						f.sent, f.werr = stream(ends[0], seed, tc.total, 20000)
					}()
					go func() {
						defer wg.Done()
						f.got, f.rerr = drain(ends[1], seed, tc.total, 9000)
					}()
				}
			}
			wg.Wait()
			for i, f := range flows {
				switch {
				case f.werr != nil:
					t.Errorf("flow %d: %v", i, f.werr)
				case f.rerr != nil:
					t.Errorf("flow %d: %v", i, f.rerr)
				case f.sent != f.got:
					t.Errorf("flow %d: checksum mismatch", i)
				}
			}
		})
	}
}

// TestSlowReader: a writer far ahead of its reader is held back by the
// window (no loss, no unbounded buffering), and everything arrives once the
// reader catches up.
func TestSlowReader(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	const total = 200 << 10
	var sent [32]byte
	werr := make(chan error, 1)
	go func() {
		var err error
		sent, err = stream(p.client, 7, total, 4096)
		werr <- err
	}()
	cl := p.client.(*urmaConn)
	eventually.Holds(t, "the writer to stall on the receive window", 10*time.Second, func() bool {
		d := cl.Debug()
		return d.WindowStalls > 0 && d.RemoteRQWindow == 0
	})
	if b := p.server.Debug().BufferedMessages; b > smallFlags().RQSize {
		t.Fatalf("reader holds %d messages, more than its %d receives", b, smallFlags().RQSize)
	}
	got, err := drain(p.server, 3, total, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if got != sent {
		t.Fatal("checksum mismatch")
	}
}

// TestGracefulClose: the peer reads every byte written before Close, then
// io.EOF; writes after the peer closed fail.
func TestGracefulClose(t *testing.T) {
	checkNoLeaks(t)
	for _, polling := range []bool{false, true} {
		t.Run(fmt.Sprintf("polling=%v", polling), func(t *testing.T) {
			pa, pb := fabricPair(t)
			f := smallFlags()
			f.UsePolling, f.PollerYield = polling, polling
			p := connect(t, cfgWith(pa, f), cfgWith(pb, f))
			const total = 64 << 10
			msg := bytes.Repeat([]byte{0xab}, total)
			done := make(chan error, 1)
			go func() {
				if _, err := p.client.Write(msg); err != nil {
					done <- err
					return
				}
				done <- p.client.Close()
			}()
			got, err := io.ReadAll(p.server)
			if err != nil {
				t.Fatalf("ReadAll: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, msg) {
				t.Fatalf("read %d bytes, want %d", len(got), total)
			}
			if _, err := p.server.Write([]byte("x")); err == nil {
				t.Fatal("write to a closed peer succeeded")
			}
			// Operations on the closed side fail with net.ErrClosed.
			if _, err := p.client.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("read after Close: %v", err)
			}
			if _, err := p.client.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("write after Close: %v", err)
			}
			if err := p.client.Close(); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// TestWriteDeadlineOnFullWindow: a write blocked on an empty window returns
// at its deadline with a timeout, having written part of the data.
func TestWriteDeadlineOnFullWindow(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	_ = p.client.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	big := make([]byte, 1<<20) // far more than the window
	n, err := p.client.Write(big)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write: %d, %v; want a timeout", n, err)
	}
	w := p.client.(*urmaConn).windowCap * smallFlags().BufferSize
	if n != w {
		t.Fatalf("wrote %d bytes before the deadline, want one window (%d)", n, w)
	}
	// The connection still works: drain what was written.
	_ = p.client.SetWriteDeadline(time.Time{})
	if _, err := io.ReadFull(p.server, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	exchange(t, p.client, p.server, "after the timeout")
}

// TestZeroLengthWrite: an empty Write sends nothing but reports what a
// write would: nothing on an open connection, a timeout once the write
// deadline passed, net.ErrClosed after Close.
func TestZeroLengthWrite(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	if n, err := p.client.Write(nil); n != 0 || err != nil {
		t.Fatalf("empty write: %d, %v", n, err)
	}
	_ = p.client.SetWriteDeadline(aLongTimeAgo)
	if _, err := p.client.Write(nil); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("empty write past the deadline: %v; want a timeout", err)
	}
	_ = p.client.SetWriteDeadline(time.Time{})
	_ = p.client.Close()
	if _, err := p.client.Write(nil); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("empty write after Close: %v; want net.ErrClosed", err)
	}
	if d := p.client.Debug(); d.MessagesSent != 0 {
		t.Errorf("%d messages sent for empty writes", d.MessagesSent)
	}
}

// TestZeroLengthWriteBuffer: WriteBuffer of 0 bytes sends nothing but, as
// Write(nil) does, reports what a write would: nothing on an open
// connection, a timeout once the write deadline passed, net.ErrClosed
// after Close. It takes the buffer back in every case.
func TestZeroLengthWriteBuffer(t *testing.T) {
	checkNoLeaks(t)
	cases := []struct {
		name  string
		setup func(Conn)
		want  error // nil: no error
	}{
		{"open", func(Conn) {}, nil},
		{"write deadline passed", func(c Conn) { _ = c.SetWriteDeadline(aLongTimeAgo) }, os.ErrDeadlineExceeded},
		{"closed", func(c Conn) { _ = c.Close() }, net.ErrClosed},
	}
	for _, mode := range []Mode{ModeURMA, ModeTCP} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", mode, tc.name), func(t *testing.T) {
				pa, pb := fabricPair(t)
				scfg := cfgWith(pa, smallFlags())
				scfg.DisableURMA = mode == ModeTCP
				p := connect(t, scfg, cfgWith(pb, smallFlags()))
				if p.client.Mode() != mode {
					t.Fatalf("client in %s mode (%s), want %s", p.client.Mode(), p.client.FallbackReason(), mode)
				}
				zc := p.client.(ZeroCopyConn)
				b, err := zc.AllocBuffer()
				if err != nil {
					t.Fatal(err)
				}
				tc.setup(p.client)
				err = zc.WriteBuffer(b, 0)
				switch {
				case tc.want == nil && err != nil:
					t.Fatalf("WriteBuffer of 0 bytes: %v, want nil", err)
				case tc.want != nil && !errors.Is(err, tc.want):
					t.Fatalf("WriteBuffer of 0 bytes: %v, want %v (as Write(nil))", err, tc.want)
				}
				_, werr := p.client.Write(nil)
				if !errors.Is(werr, tc.want) && (tc.want != nil || werr != nil) {
					t.Errorf("Write(nil) in the same state: %v, want %v", werr, tc.want)
				}
				if b.held.Load() {
					t.Error("WriteBuffer did not take the buffer back")
				}
				if d := p.client.Debug(); d.MessagesSent != 0 {
					t.Errorf("%d messages sent for empty writes", d.MessagesSent)
				}
			})
		}
	}
}
