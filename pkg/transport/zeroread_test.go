package transport

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// TestZeroLengthRead: a Read of nothing answers as *net.TCPConn's does,
// in every mode and fabric: 0, nil at once whatever the connection's
// state (the peer's end, a reset, a passed deadline), net.ErrClosed only
// after Close. A zero-length read is "nothing happened", never the end of
// the stream: io.EOF there would end a caller's stream on a probe. The
// first row is a plain TCP pair, the reference.
func TestZeroLengthRead(t *testing.T) {
	checkNoLeaks(t)
	type endpoints struct{ reader, peer net.Conn }
	transportPair := func(t *testing.T, scfg, ccfg Config, mode Mode) endpoints {
		p := connect(t, scfg, ccfg)
		if p.client.Mode() != mode || p.server.Mode() != mode {
			t.Fatalf("modes %s/%s (%s), want %s", p.client.Mode(), p.server.Mode(), p.client.FallbackReason(), mode)
		}
		return endpoints{reader: p.client, peer: p.server}
	}
	inproc := func(polling, disabled bool) func(*testing.T) endpoints {
		return func(t *testing.T) endpoints {
			pa, pb := fabricPair(t)
			f := smallFlags()
			f.UsePolling, f.PollerYield = polling, polling
			scfg := cfgWith(pa, f)
			scfg.DisableURMA = disabled
			mode := ModeURMA
			if disabled {
				mode = ModeTCP
			}
			return transportPair(t, scfg, cfgWith(pb, f), mode)
		}
	}
	onFabric := func(fabric string) func(*testing.T) endpoints {
		return func(t *testing.T) endpoints {
			f := flags.Defaults()
			f.BufferCount = 1024
			f.RQSize, f.SQSize = 16, 16
			cfg := Config{Flags: &f, LookupEnv: noEnv, SoftFabric: fabric}
			return transportPair(t, cfg, cfg, ModeURMA)
		}
	}
	modes := []struct {
		name string
		pair func(*testing.T) endpoints
	}{
		{"plain TCP", func(t *testing.T) endpoints {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			peer, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			reader, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = reader.Close(); _ = peer.Close() })
			return endpoints{reader: reader, peer: peer}
		}},
		{"tcp fallback", inproc(false, true)},
		{"tcp fallback, plain client bytes kept", func(t *testing.T) endpoints {
			pa, _ := fabricPair(t)
			ln, raw := plainClient(t, cfgWith(pa, smallFlags()), "GET / HTTP/1.0\r\n\r\n")
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			if kept, ok := c.(*tcpConn); !ok || len(kept.prefix) == 0 {
				t.Fatal("the handshake kept no bytes: the case tests nothing")
			}
			return endpoints{reader: c, peer: raw}
		}},
		{"urma event mode", inproc(false, false)},
		{"urma polling mode", inproc(true, false)},
		{"urma shm fabric", onFabric(FabricShm)},
		{"urma socket fabric", onFabric(FabricSocket)},
	}
	// seeEnd reads until the reader has seen the end (past any bytes
	// kept or sent), so the state is settled before the zero-length read.
	seeEnd := func(t *testing.T, c net.Conn, wantEOF bool) {
		t.Helper()
		var err error
		for err == nil {
			_, err = c.Read(make([]byte, 64))
		}
		if errors.Is(err, io.EOF) != wantEOF {
			t.Fatalf("read after the peer's end: %v (io.EOF wanted: %v)", err, wantEOF)
		}
	}
	states := []struct {
		name  string
		setup func(*testing.T, endpoints)
		want  error // nil: 0, nil
	}{
		{"open, nothing sent", func(*testing.T, endpoints) {}, nil},
		{"read deadline passed", func(_ *testing.T, e endpoints) { _ = e.reader.SetReadDeadline(aLongTimeAgo) }, nil},
		{"peer closed, EOF seen", func(t *testing.T, e endpoints) {
			_ = e.peer.Close()
			seeEnd(t, e.reader, true)
		}, nil},
		{"peer aborted, error seen", func(t *testing.T, e endpoints) {
			abortForTest(e.peer)
			seeEnd(t, e.reader, false)
		}, nil},
		{"closed", func(_ *testing.T, e endpoints) { _ = e.reader.Close() }, net.ErrClosed},
	}
	for _, m := range modes {
		for _, st := range states {
			t.Run(m.name+"/"+st.name, func(t *testing.T) {
				e := m.pair(t)
				st.setup(t, e)
				n, err := e.reader.Read(nil)
				if n != 0 || (st.want == nil && err != nil) || (st.want != nil && !errors.Is(err, st.want)) {
					t.Fatalf("Read(nil): %d, %v; want 0, %v (as *net.TCPConn)", n, err, st.want)
				}
			})
		}
	}
}

// abortForTest ends c with a reset, as a failing side does.
func abortForTest(c net.Conn) {
	switch c := c.(type) {
	case *urmaConn:
		c.fail(errors.New("aborted by the test"))
	case *tcpConn:
		abortTCP(c.Conn)
	default:
		abortTCP(c)
	}
}
