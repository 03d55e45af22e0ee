package transport

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// noEnv is a LookupEnv that finds nothing, so tests never depend on the
// environment they run in.
func noEnv(string) (string, bool) { return "", false }

// envOf is a LookupEnv over a map.
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// smallFlags are flags sized for tests: small queues and pool.
func smallFlags() flags.Flags {
	f := flags.Defaults()
	f.SQSize, f.RQSize = 16, 16
	f.BufferSize = 1024
	f.BufferCount = 256
	f.PreparedJettyCnt = 1
	return f
}

// fabricPair returns two providers on one in-process fabric: two "hosts"
// (or two liburma providers, see testProviders).
func fabricPair(t testing.TB) (urma.Provider, urma.Provider) {
	t.Helper()
	ps := fabricOf(t, 2)
	return ps[0], ps[1]
}

// fabricOf returns n providers that reach each other: n "hosts" on one
// in-process fabric (or n liburma providers, see testProviders).
func fabricOf(t testing.TB, n int) []urma.Provider {
	t.Helper()
	if ps, ok := testProviders(t, n); ok {
		return ps
	}
	f := soft.NewFabric()
	ps := make([]urma.Provider, n)
	for i := range ps {
		p, err := soft.New(soft.Options{Fabric: f, Logger: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		ps[i] = p
	}
	return ps
}

// cfgWith builds a test Config on provider p with flags f.
func cfgWith(p urma.Provider, f flags.Flags) Config {
	return Config{Provider: p, Flags: &f, LookupEnv: noEnv, Logger: logr.Discard()}
}

// pair is a connected client and server.
type pair struct {
	client, server Conn
}

// connect listens with scfg, dials with ccfg, and returns both ends. The
// listener and dialer are closed at cleanup (after the conns, which the
// test closes or cleanup does).
func connect(t testing.TB, scfg, ccfg Config) pair {
	t.Helper()
	ln, d := listenAndDialer(t, scfg, ccfg)
	return dialAccept(t, ln, d)
}

// listenAndDialer listens on loopback with scfg and makes a dialer with
// ccfg; both are closed at cleanup (closing them earlier is fine).
func listenAndDialer(t testing.TB, scfg, ccfg Config) (*Listener, *Dialer) {
	t.Helper()
	ln := listenLoopback(t, scfg)
	d, err := NewDialer(ccfg)
	if err != nil {
		t.Fatalf("new dialer: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return ln, d
}

// listenLoopback is a Listener with cfg on a free loopback port, closed
// when the test ends.
func listenLoopback(t testing.TB, cfg Config) *Listener {
	t.Helper()
	ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// syncBytes is what a client that fell back before its hello sends first.
const syncBytes = "sync"

func dialAccept(t testing.TB, ln *Listener, d *Dialer) pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := acceptAsync(ln)
	cc, err := d.DialContext(ctx, ln.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	// A client that fell back before its hello is a plain TCP client: the
	// server decides on its first four bytes, so it must speak first.
	early := cc.(Conn).Mode() == ModeTCP && cc.(Conn).Debug().HandshakeVersion == 0
	if early {
		if _, err := cc.Write([]byte(syncBytes)); err != nil {
			t.Fatalf("write sync bytes: %v", err)
		}
	}
	r := <-acc
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	if early {
		got := make([]byte, len(syncBytes))
		if _, err := io.ReadFull(r.c, got); err != nil || string(got) != syncBytes {
			t.Fatalf("server read %q, %v; want the client's %q", got, err, syncBytes)
		}
	}
	p := pair{client: cc.(Conn), server: r.c.(Conn)}
	t.Cleanup(func() {
		_ = p.client.Close()
		_ = p.server.Close()
	})
	return p
}

// checkNoLeaks records the goroutines now and, at cleanup, waits for the
// count to come back down.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Fatalf("goroutine leak: %d running, %d before\n%s", runtime.NumGoroutine(), before, filterStacks(string(buf[:n])))
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// filterStacks keeps the goroutines that run this module's code.
func filterStacks(all string) string {
	var keep []string
	for _, g := range strings.Split(all, "\n\n") {
		if strings.Contains(g, "urma-k8s") {
			keep = append(keep, g)
		}
	}
	return strings.Join(keep, "\n\n")
}

// check verifies the pool's books: every buffer on the free list at most
// once, and free plus outside is all of them.
func (p *bufferPool) check() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := make(map[int32]bool, len(p.free))
	for _, i := range p.free {
		if seen[i] {
			return fmt.Errorf("buffer %d is on the free list twice", i)
		}
		seen[i] = true
	}
	if len(p.free)+p.outside != len(p.bufs) {
		return fmt.Errorf("%d free + %d outside != %d buffers", len(p.free), p.outside, len(p.bufs))
	}
	return nil
}

// refCount is how many references the engine holds: its owner's, and one
// for each URMA connection or setup of one.
func (e *engine) refCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.refs
}

// connResult is what one Accept or Dial returned.
type connResult struct {
	c   net.Conn
	err error
}

// acceptAsync runs one Accept on ln and hands its result over.
func acceptAsync(ln net.Listener) <-chan connResult {
	acc := make(chan connResult, 1)
	go func() {
		c, err := ln.Accept()
		acc <- connResult{c, err}
	}()
	return acc
}

// dialAsync runs one dial of d to addr and hands its result over.
func dialAsync(ctx context.Context, d *Dialer, addr string) <-chan connResult {
	dialed := make(chan connResult, 1)
	go func() {
		c, err := d.DialContext(ctx, addr)
		dialed <- connResult{c, err}
	}()
	return dialed
}

// closeIfDialed closes the connection of a result that has one (a
// dialed or accepted one).
func (r connResult) closeIfDialed() {
	if r.err == nil {
		_ = r.c.Close()
	}
}

// newGate is a gate a stalled fake verb waits on, and open, which opens it
// (again: a no-op). Where the caller registers open with t.Cleanup decides
// whether it runs before or after a Listener's or Dialer's Close.
func newGate() (gate <-chan struct{}, open func()) {
	ch := make(chan struct{})
	var once sync.Once
	return ch, func() { once.Do(func() { close(ch) }) }
}

// stallJettyCreate is p with its CreateJetty held until unstall.
func stallJettyCreate(p urma.Provider) (fp *faultProvider, unstall func()) {
	gate, unstall := newGate()
	fp = newFaultProvider(p)
	fp.f.set(func(c *faultConfig) { c.jettyGate = gate })
	return fp, unstall
}

// requireURMA fails the test unless both ends of a connection run on URMA.
func requireURMA(t testing.TB, what string, client, server Conn) {
	t.Helper()
	if client.Mode() != ModeURMA || server.Mode() != ModeURMA {
		t.Fatalf("%s: client %s (%s), server %s (%s); want URMA on both",
			what, client.Mode(), client.FallbackReason(), server.Mode(), server.FallbackReason())
	}
}

// scriptedPeer listens on loopback for one connection, plays serve on it
// (a hand-written server), and hands serve's error over once it returns.
// The listener closes with the test.
func scriptedPeer(t *testing.T, serve func(c net.Conn) error) (addr string, served <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			err = serve(c)
		}
		done <- err
	}()
	return ln.Addr().String(), done
}

// exchange writes msg from a to b and back, checking both arrive intact.
func exchange(t *testing.T, a, b net.Conn, msg string) {
	t.Helper()
	for _, dir := range []struct{ from, to net.Conn }{{a, b}, {b, a}} {
		errc := make(chan error, 1)
		go func() {
			_, err := dir.from.Write([]byte(msg))
			errc <- err
		}()
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(dir.to, got); err != nil {
			t.Fatalf("read: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("write: %v", err)
		}
		if string(got) != msg {
			t.Fatalf("got %q, want %q", got, msg)
		}
	}
}

// fakeHello is a hello that passes every validity rule but names a jetty
// that exists nowhere.
func fakeHello() handshake.Hello {
	h := handshake.Hello{
		BufferSize: 8192, RecvBufferCnt: 127, JettyID: 7, UASID: 1, TPType: handshake.TPCTP,
		SegUASID: 1, SegVA: 0x1000, SegLen: 4096, SegTokenID: 1,
	}
	h.EID[0], h.SegEID[0] = 0xfe, 0xfe
	return h
}

// plainClient listens with cfg and connects a plain TCP client to it,
// which sends first; both are closed at cleanup.
func plainClient(t *testing.T, cfg Config, first string) (*Listener, net.Conn) {
	t.Helper()
	ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	if _, err := raw.Write([]byte(first)); err != nil {
		t.Fatal(err)
	}
	return ln, raw
}

// rawHello sends hello bytes (and then ack, if not nil) from a plain TCP
// client and returns the connection and the server's reply hello.
func rawHello(t *testing.T, addr string, hello []byte) (net.Conn, handshake.Hello, error) {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := raw.Write(hello); err != nil {
		t.Fatal(err)
	}
	magic := make([]byte, 4)
	if _, err := io.ReadFull(raw, magic); err != nil {
		t.Fatalf("read reply magic: %v", err)
	}
	h, _, err := handshake.ReadHello(raw, magic)
	return raw, h, err
}

// stream writes total bytes of seeded random data in writes of random
// sizes up to maxWrite and returns their SHA-256.
func stream(w io.Writer, seed uint64, total, maxWrite int) ([32]byte, error) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := sha256.New()
	buf := make([]byte, maxWrite)
	for sent := 0; sent < total; {
		n := min(1+r.IntN(maxWrite), total-sent)
		for i := range buf[:n] {
			buf[i] = byte(r.Uint32())
		}
		h.Write(buf[:n])
		if _, err := w.Write(buf[:n]); err != nil {
			return [32]byte{}, fmt.Errorf("write at %d: %w", sent, err)
		}
		sent += n
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// drain reads total bytes in reads of random sizes up to maxRead and
// returns their SHA-256.
func drain(r io.Reader, seed uint64, total, maxRead int) ([32]byte, error) {
	rng := rand.New(rand.NewPCG(seed, 1))
	h := sha256.New()
	buf := make([]byte, maxRead)
	for got := 0; got < total; {
		n, err := r.Read(buf[:min(1+rng.IntN(maxRead), total-got)])
		h.Write(buf[:n])
		got += n
		if err != nil {
			return [32]byte{}, fmt.Errorf("read at %d of %d: %w", got, total, err)
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// fabricCfg is a Config for the default software provider on fabric, with
// its shm directory dir and flags small enough for tests.
func fabricCfg(fabric, dir string, reg prometheus.Registerer) Config {
	f := smallFlags()
	return Config{Flags: &f, SoftFabric: fabric, LookupEnv: envOf(map[string]string{EnvShmDir: dir}), Registerer: reg}
}

// pattern is n bytes that differ from message to message.
func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}

// counterValue reads one counter series from reg, 0 when absent.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// gatherFlat flattens a registry into "name{labels}" -> value; histograms
// give their _count.
func gatherFlat(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[strings.Replace(key, mf.GetName(), mf.GetName()+"_count", 1)] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// deathBound is how soon a dead peer must surface as an error.
const deathBound = 10 * time.Second

// readUntilError reads c until an error, in the background.
func readUntilError(c net.Conn) (started chan struct{}, errc chan error) {
	started, errc = make(chan struct{}), make(chan error, 1)
	go func() {
		close(started)
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				errc <- err
				return
			}
		}
	}()
	return started, errc
}

// logLines collects log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
	}, funcr.Options{})
}

func (l *logLines) find(sub string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			return s
		}
	}
	return ""
}

// offered reports whether c's reader has offered its slice to the provider.
func (c *urmaConn) offered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.direct.armed
}

// injected is what the attacker of issue 40 made a victim read.
const injected = "INJECTED: transfer 1000000 to mallory\n"

// stallBound is how long a test waits for a handshake that should end at
// HandshakeTimeout (stallTimeout) before it declares it unbounded.
const (
	stallTimeout = 300 * time.Millisecond
	stallBound   = 10 * time.Second
)
