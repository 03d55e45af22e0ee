package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// TestShmSendMemory: on the shm fabric the peer maps what a SEND
// from it may read by reference, and nothing else. By default that is the
// sending connection's own send buffers (urma_shm_send_buffers), never the
// pool, which holds the receive buffers of every connection; with them off
// nothing is shared and SENDs cross the ring by copy; urma_pool_remote_read
// shares the whole pool. Either way the bytes arrive intact, and closing
// the connection unmaps its buffers in the peer.
func TestShmSendMemory(t *testing.T) {
	const bufSize, bufCount, sq = 16 << 10, 64, 16
	for _, tc := range []struct {
		name        string
		sendBuffers bool
		remoteRead  bool
		wantMapped  int // bytes the server maps of the client's memory
		wantOwn     int // the client's own send buffers, in Debug
	}{
		// The default: the connection's own send buffers, one for each
		// send its window lets out at once.
		{name: "default", sendBuffers: true, wantMapped: (sq - creditWRs) * bufSize, wantOwn: sq - creditWRs},
		{name: "off", wantMapped: 0},
		// urma_pool_remote_read: the whole pool.
		{name: "pool", sendBuffers: true, remoteRead: true, wantMapped: bufCount * bufSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mk := func() Config {
				c := fabricCfg(FabricShm, dir, nil)
				c.Flags.BufferSize, c.Flags.BufferCount, c.Flags.SQSize = bufSize, bufCount, sq
				c.Flags.ShmSendBuffers = tc.sendBuffers
				c.Flags.PoolRemoteRead = tc.remoteRead
				return c
			}
			p := connect(t, mk(), mk())
			if p.client.Mode() != ModeURMA || p.client.Debug().Fabric != FabricShm {
				t.Fatalf("client %s on %q (%s), want URMA on shm", p.client.Mode(), p.client.Debug().Fabric, p.client.FallbackReason())
			}
			if d := p.client.Debug(); d.OwnSendBuffers != tc.wantOwn || !strings.Contains(d.String(), fmt.Sprintf(" own_send_buffers=%d ", tc.wantOwn)) {
				t.Fatalf("Debug says %d own send buffers (%s), want %d", d.OwnSendBuffers, d, tc.wantOwn)
			}
			msg := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB: above the by-reference minimum
			got := make([]byte, len(msg))
			for i := 0; i < 32; i++ {
				msg[0] = byte(i)
				if _, err := p.client.Write(msg); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(p.server, got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("message %d arrived changed", i)
				}
			}
			uc := p.client.(*urmaConn)
			pool := memfdInode(t, uc.e.pool.mem)
			if tc.wantMapped == 0 {
				if m := mappingsOf(t, pool, "r--s"); len(m) != 0 {
					t.Fatalf("the peer maps the client's pool (%v), want nothing shared", m)
				}
				return
			}
			shared := pool // what the peer may map of the client's memory
			if !tc.remoteRead {
				shared = memfdInode(t, uc.ownSend.mem)
				if m := mappingsOf(t, pool, "r--s"); len(m) != 0 {
					t.Fatalf("the peer maps the client's pool (%v), want only the connection's send buffers", m)
				}
			}
			// The peer maps the memory once the first send from it shares
			// it; that is a state, with no event to wait on.
			eventually.Holds(t, "the peer to map the client's send memory read-only", 10*time.Second, func() bool { return len(mappingsOf(t, shared, "r--s")) > 0 })
			if m := mappingsOf(t, shared, "r--s"); len(m) != 1 || m[0] != tc.wantMapped {
				t.Fatalf("the peer's views of the client's memory %v, want one of %d bytes", m, tc.wantMapped)
			}
			if tc.remoteRead {
				return // the pool lives as long as the engine
			}
			if err := p.client.Close(); err != nil {
				t.Fatal(err)
			}
			// Gone from the peer (SEG_UNMAP) and from the client.
			eventually.Holds(t, "the closed connection's send buffers to be unmapped on both sides", 10*time.Second, func() bool {
				return len(mappingsOf(t, shared, "r--s"))+len(mappingsOf(t, shared, "rw-s")) == 0
			})
		})
	}
}

// memfdInode is the inode of registered memory's memfd: /proc/self/maps
// names it in every mapping of that memory, its owner's and a peer's view.
func memfdInode(t testing.TB, m *urma.Memory) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(m.Fd(), &st); err != nil {
		t.Fatal(err)
	}
	return strconv.FormatUint(st.Ino, 10)
}

// mappingsOf lists the sizes of this process's mappings of the registered
// memory whose memfd has inode ino, with permissions perms: "rw-s" its
// owner's, "r--s" a peer's read-only view (the shm fabric's).
func mappingsOf(t testing.TB, ino, perms string) []int {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != perms || f[4] != ino || !strings.HasPrefix(f[5], "/memfd:urma-mem") {
			continue
		}
		from, to, ok := strings.Cut(f[0], "-")
		lo, err1 := strconv.ParseUint(from, 16, 64)
		hi, err2 := strconv.ParseUint(to, 16, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("unreadable mapping %q", line)
		}
		sizes = append(sizes, int(hi-lo))
	}
	return sizes
}

// TestPoolRegistrationAccess: the pool's registration asks for no remote
// access by default, and for remote read only (with the engine's token)
// when urma_pool_remote_read is set.
func TestPoolRegistrationAccess(t *testing.T) {
	for _, tc := range []struct {
		name       string
		remoteRead bool
		want       urma.Access
		wantPolicy urma.TokenPolicy
	}{
		{name: "default", want: urma.AccessLocalOnly},
		{name: "remote read", remoteRead: true, want: urma.AccessRead, wantPolicy: urma.TokenPlainText},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			fp := newFaultProvider(pa)
			f := smallFlags()
			f.PoolRemoteRead = tc.remoteRead
			p := connect(t, cfgWith(fp, f), cfgWith(pb, smallFlags()))
			uc, ok := p.server.(*urmaConn)
			if !ok {
				t.Fatalf("server is %s (%s), want URMA", p.server.Mode(), p.server.FallbackReason())
			}
			pool := uc.e.pool.seg.ID()
			for _, r := range fp.f.registrations() {
				if r.id.VA != pool.VA {
					continue
				}
				if r.cfg.Access != tc.want || r.cfg.TokenPolicy != tc.wantPolicy {
					t.Fatalf("pool registered with access %#x, token policy %v; want %#x, %v", r.cfg.Access, r.cfg.TokenPolicy, tc.want, tc.wantPolicy)
				}
				return
			}
			t.Fatalf("no registration of the pool (%#x) among %+v", pool.VA, fp.f.registrations())
		})
	}
}

// TestShmSendBuffersRunDry: a connection's own send buffers are few (one
// per send queue entry); when the application holds them all, writes take
// pool buffers instead of waiting, and sends from both kinds complete back
// to the pool each came from, in order. Another connection refuses them.
func TestShmSendBuffersRunDry(t *testing.T) {
	checkNoLeaks(t)
	ln, d := shmListenAndDialer(t, 4<<10)
	p, other := dialAccept(t, ln, d), dialAccept(t, ln, d)
	uc, ok := p.client.(*urmaConn)
	if !ok || uc.ownSend == nil {
		t.Fatalf("client %s (%s) without send buffers of its own", p.client.Mode(), p.client.FallbackReason())
	}
	zc := p.client.(ZeroCopyConn)
	own := len(uc.ownSend.bufs)
	held := make([]*Buffer, own)
	for i := range held {
		b, err := zc.AllocBuffer()
		if err != nil {
			t.Fatal(err)
		}
		if b.pool != uc.ownSend {
			t.Fatalf("buffer %d of %d came from the engine pool while own buffers were free", i, own)
		}
		held[i] = b
	}
	if err := other.client.(ZeroCopyConn).WriteBuffer(held[0], 1); err == nil || !strings.Contains(err.Error(), "another connection's send buffers") {
		t.Fatalf("another connection sending from this connection's send buffers: %v, want a refusal that says so", err)
	}
	if held[0].held.Load() {
		t.Fatal("the refused buffer is still the application's")
	}
	held[0] = nil // given back by the refusal

	// Writes while the own buffers are all out go through the pool. The
	// server reads meanwhile: credits come back only as it does.
	const writes = 48
	labels := make([]string, len(held)-1)
	total := writes * 4 << 10
	for i := range labels {
		labels[i] = fmt.Sprintf("held buffer %d", i)
		total += len(labels[i])
	}
	got := make([]byte, total)
	readErr := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(p.server, got)
		readErr <- err
	}()
	msg := bytes.Repeat([]byte{0xa5}, 4<<10)
	var want []byte
	for i := 0; i < writes; i++ {
		msg[0] = byte(i)
		if _, err := p.client.Write(msg); err != nil {
			t.Fatalf("write %d with the own buffers held: %v", i, err)
		}
		want = append(want, msg...)
	}
	for i, b := range held[1:] {
		n := copy(b.Data(), labels[i])
		if err := zc.WriteBuffer(b, n); err != nil {
			t.Fatal(err)
		}
		want = append(want, labels[i]...)
	}
	if err := <-readErr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the stream arrived changed or out of order")
	}
	// Every send completes back to the pool it came from: all own buffers
	// free again, and of the dialer's engine pool only its two
	// connections' receive queues in use.
	eventually.Holds(t, "the send completions", 10*time.Second, func() bool {
		free, _ := uc.ownSend.stats()
		_, inUse := uc.e.pool.stats()
		return free == own && inUse == 2*uc.e.rqSize
	})
}

// TestTakeBufferWakesForEitherPool: a writer whose own send buffers and
// the engine pool are both dry waits for a buffer to come back to either.
// It used to wait on the engine pool alone, which other connections' receive
// queues can keep dry for good, and slept on although its own send buffers
// came back.
func TestTakeBufferWakesForEitherPool(t *testing.T) {
	for _, tc := range []struct {
		name     string
		giveBack func(own, pool *Buffer)
		want     func(own, pool *Buffer) *Buffer
	}{
		{"own buffer back", func(own, _ *Buffer) { own.Release() }, func(own, _ *Buffer) *Buffer { return own }},
		{"engine buffer back", func(_, pool *Buffer) { pool.Release() }, func(_, pool *Buffer) *Buffer { return pool }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			pool, own := newHeapPool(1024, 1), newHeapPool(1024, 1)
			heldPool, heldOwn := pool.tryGet(), own.tryGet()
			if heldPool == nil || heldOwn == nil {
				t.Fatal("fresh pools gave no buffer")
			}
			stop := make(chan struct{})
			type taken struct {
				b   *Buffer
				err error
			}
			got := make(chan taken, 1)
			go func() {
				b, err := pool.getPreferring(own, stop, nil, false)
				got <- taken{b, err}
			}()
			// Give the buffer back only once the writer waits on both
			// pools, so that the put must wake it.
			eventually.Holds(t, "the writer to wait on both pools", 10*time.Second, func() bool {
				return pool.waiters() == 1 && own.waiters() == 1
			})
			tc.giveBack(heldOwn, heldPool)
			select {
			case r := <-got:
				if r.err != nil || r.b != tc.want(heldOwn, heldPool) {
					t.Fatalf("took %p (err %v), want %p", r.b, r.err, tc.want(heldOwn, heldPool))
				}
			case <-time.After(10 * time.Second):
				close(stop)
				<-got
				t.Fatal("the writer still waits 10s after a buffer came back")
			}
			if pool.waiters() != 0 || own.waiters() != 0 {
				t.Fatalf("waiters left behind: engine pool %d, own %d", pool.waiters(), own.waiters())
			}
		})
	}
	// Both dry and failing fast: ErrPoolExhausted at once, no waiter left.
	pool, own := newHeapPool(1024, 1), newHeapPool(1024, 1)
	_, _ = pool.tryGet(), own.tryGet()
	if _, err := pool.getPreferring(own, nil, nil, true); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("both pools dry, failing fast: %v, want ErrPoolExhausted", err)
	}
	// Own buffers free: taken first, though the engine pool has some too.
	pool, own = newHeapPool(1024, 1), newHeapPool(1024, 1)
	if b, err := pool.getPreferring(own, nil, nil, false); err != nil || b.pool != own {
		t.Fatalf("took %v (err %v), want a buffer of the own pool first", b, err)
	}
}

// TestSentBuffer: a send completion's user context names a buffer of the
// engine pool or, with sendCtxOwn, of the connection's own send buffers;
// one that names a buffer the connection does not have is an error, not a
// buffer of the other kind.
func TestSentBuffer(t *testing.T) {
	pool := newHeapPool(1024, 4)
	own := newHeapPool(1024, 2)
	for _, tc := range []struct {
		name    string
		ownSend *bufferPool
		ctx     uint64
		want    *Buffer
	}{
		{name: "pool", ctx: 4, want: &pool.bufs[3]},
		{name: "pool, past its end", ctx: 5},
		{name: "own", ownSend: own, ctx: sendCtxOwn | 2, want: &own.bufs[1]},
		{name: "own, past its end", ownSend: own, ctx: sendCtxOwn | 3},
		{name: "own, without own buffers", ctx: sendCtxOwn | 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &urmaConn{pool: pool, ownSend: tc.ownSend}
			b, err := c.sentBuffer(tc.ctx)
			if b != tc.want || (err == nil) != (tc.want != nil) {
				t.Fatalf("sentBuffer(%#x) = %p, %v; want %p", tc.ctx, b, err, tc.want)
			}
			if b != nil && c.sendCtx(b) != tc.ctx {
				t.Fatalf("sendCtx of the buffer = %#x, want %#x back", c.sendCtx(b), tc.ctx)
			}
		})
	}
}

// TestShmSendBuffersCloseMidStream: connections closed while their writers
// still send from their own send buffers give them all back: the writers
// stop with an error, and the peer unmaps every connection's buffers.
func TestShmSendBuffersCloseMidStream(t *testing.T) {
	checkNoLeaks(t)
	ln, d := shmListenAndDialer(t, 16<<10)
	const conns = 4
	var wg sync.WaitGroup
	var regions []string // the inodes of the clients' send buffers
	for i := 0; i < conns; i++ {
		p := dialAccept(t, ln, d)
		uc, ok := p.client.(*urmaConn)
		if !ok || uc.ownSend == nil {
			t.Fatalf("connection %d (%s) has no send buffers of its own", i, p.client.Mode())
		}
		regions = append(regions, memfdInode(t, uc.ownSend.mem))
		wg.Add(2)
		go func() { // the server reads until the client is gone
			defer wg.Done()
			_, _ = io.Copy(io.Discard, p.server)
		}()
		go func() {
			defer wg.Done()
			msg := make([]byte, 16<<10)
			for k := 0; ; k++ {
				if k == 64 {
					// Close mid-stream, from another goroutine than the
					// writer, with sends in flight.
					go func() { _ = p.client.Close() }()
				}
				if _, err := p.client.Write(msg); err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	eventually.Holds(t, "every closed connection's send buffers to be unmapped on both sides", 10*time.Second, func() bool {
		for _, ino := range regions {
			if len(mappingsOf(t, ino, "r--s"))+len(mappingsOf(t, ino, "rw-s")) != 0 {
				return false
			}
		}
		return true
	})
}

// shmListenAndDialer is a Listener and a Dialer on the shm fabric, meeting
// in a directory of their own, with buffers of bufSize bytes.
func shmListenAndDialer(t *testing.T, bufSize int) (*Listener, *Dialer) {
	t.Helper()
	dir := t.TempDir()
	mk := func() Config {
		c := fabricCfg(FabricShm, dir, nil)
		c.Flags.BufferSize = bufSize
		return c
	}
	return listenAndDialer(t, mk(), mk())
}
