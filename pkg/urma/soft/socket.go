package soft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/framebound"
)

const ioBufSize = 128 << 10

// sockDevice is a device's presence on the socket fabric: its listener, its
// peers (one per remote device it talks to) and their connections.
type sockDevice struct {
	dev      *device
	prov     *Provider
	ln       net.Listener
	eid      urma.EID
	session  uint64 // random per device instance, for logs
	resolver Resolver
	peerTO   time.Duration
	dialTO   time.Duration
	ctx      context.Context // cancelled by close: stops dials
	cancel   context.CancelFunc
	// maxAnswers and maxCancels are the constants; tests lower them.
	maxAnswers, maxCancels int
	maxConns               int           // Options.MaxConns
	maxPerProc             int           // Options.MaxConnsPerProcess
	limitRefusals          atomic.Uint64 // peers refused for maxConns or maxPerProc (Provider.ConnLimitRefusals)
	evictions              atomic.Uint64 // connections evicted to make room (connslots.go)
	// connDying, set by tests, runs in conn.fail between the connection's
	// death and the failing of its peer's sends: a send posted there meets
	// the dead connection before peerDown does.
	connDying func(*conn)
	// afterWatch, set by tests, runs after each pass of the watchdog.
	afterWatch atomic.Pointer[func()]
	shm        *shmNet // nil on the socket fabric
	// shmConns is the connections whose rings Poll drives (shm fabric), a
	// copy replaced on every change, so that Poll takes no lock.
	shmConns atomic.Pointer[[]*conn]
	// polls counts the Polls of JFCs without a JFCE that drive the rings
	// (drive): what tells the connections' reader goroutines to enter
	// polling mode (shmring.Stream.Idle).
	polls atomic.Uint64

	mu     sync.Mutex
	closed bool
	// peers holds the peer entries weakly: see peer.
	peers       map[urma.EID]weak.Pointer[peer]
	conns       map[*conn]struct{}
	handshaking map[net.Conn]procKey // accepted, HELLO not yet answered; who dialed them
	// reserved counts the connections dialed in that admit made room
	// for and adoptLocked has not yet adopted.
	reserved int
	// byProc counts what each process that dialed in holds (shm), for
	// Options.MaxConnsPerProcess; adoptSeq numbers the connections in the
	// order they were adopted (conn.seq), for eviction.
	byProc   map[procKey]*procCount
	adoptSeq uint64
}

// listen opens the device's listener (TCP, or a unix socket for the shm
// fabric) and works out its EID.
func listen(d *device, spec DeviceSpec, opts Options) (*sockDevice, error) {
	sd := &sockDevice{
		dev: d, prov: d.prov, session: rand.Uint64(), resolver: opts.Resolver,
		peerTO: opts.PeerTimeout, dialTO: opts.DialTimeout, maxAnswers: maxAnswers, maxCancels: maxCancels, maxConns: opts.MaxConns,
		maxPerProc: opts.MaxConnsPerProcess,
		peers:      make(map[urma.EID]weak.Pointer[peer]), conns: make(map[*conn]struct{}),
		handshaking: make(map[net.Conn]procKey), byProc: make(map[procKey]*procCount),
	}
	sd.ctx, sd.cancel = context.WithCancel(context.Background())
	var err error
	if opts.ShmDir != "" {
		err = listenShm(sd, spec, opts)
	} else {
		err = listenTCP(sd, spec, opts)
	}
	if err != nil {
		sd.cancel()
		return nil, err
	}
	return sd, nil
}

// listenTCP opens the socket fabric's TCP listener.
func listenTCP(sd *sockDevice, spec DeviceSpec, opts Options) error {
	addr := spec.Listen
	if addr == "" {
		addr = opts.Listen
	}
	if len(spec.EIDs) > 1 {
		return fmt.Errorf("device %s: a socket device has one EID, got %d", spec.Name, len(spec.EIDs))
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("device %s: listen on %s: %w", spec.Name, addr, err)
	}
	if len(spec.EIDs) == 1 {
		sd.eid = spec.EIDs[0]
	} else {
		adv := spec.Advertise
		if adv == "" {
			adv = ln.Addr().String()
		}
		ap, err := netip.ParseAddrPort(adv)
		if err == nil {
			sd.eid, err = SocketEID(ap)
		}
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("device %s: advertise address %q (set DeviceSpec.Advertise when listening on an unspecified address): %w", spec.Name, adv, err)
		}
	}
	sd.ln = ln
	return nil
}

func (sd *sockDevice) start() {
	sd.prov.goTracked(sd.acceptLoop)
	sd.prov.goTracked(sd.watchdog)
}

// close stops accepting and dialing and breaks every connection.
func (sd *sockDevice) close() {
	sd.mu.Lock()
	if sd.closed {
		sd.mu.Unlock()
		return
	}
	sd.closed = true
	conns := make([]*conn, 0, len(sd.conns))
	for c := range sd.conns {
		conns = append(conns, c)
	}
	for nc := range sd.handshaking {
		_ = nc.Close() // a silent dialer must not hold Close up for the dial timeout
	}
	sd.mu.Unlock()
	sd.cancel()
	_ = sd.ln.Close()
	for _, c := range conns {
		c.fail(errors.New("device closing"))
	}
}

func (sd *sockDevice) log() logr.Logger {
	return sd.prov.log.WithValues("device", sd.dev.info.Name, "eid", sd.eid.String())
}

// peer returns the peer entry for a remote device, creating it.
//
// The device holds its entries weakly: an entry lives exactly as long as
// something can act on it or tell it from another (a connection, a dial,
// an import, a send, a jetty's record of the connection a send went out
// on), so an EID finds the same entry for as long as that matters (one
// connection per device pair, crossing dials, generations), while a device
// that many peers connected to over time (each process its own shm EID)
// keeps no entry for those gone. An entry nothing uses is dropped once the
// garbage collector frees it; the next contact makes a fresh one, which
// nothing can tell from the old.
func (sd *sockDevice) peer(eid urma.EID) (*peer, error) {
	if eid.IsZero() {
		return nil, errors.New("zero EID")
	}
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.closed {
		return nil, errors.New("device closing")
	}
	if p := sd.peers[eid].Value(); p != nil {
		return p, nil
	}
	p := &peer{sd: sd, eid: eid, gen: 1}
	sd.peers[eid] = weak.Make(p)
	// The cleanup holds the device weakly: a strong hold could reach p
	// through it and keep both alive for good.
	runtime.AddCleanup(p, forgetPeer, peerKey{sd: weak.Make(sd), eid: eid})
	return p, nil
}

// peerKey names a peer entry for forgetPeer.
type peerKey struct {
	sd  weak.Pointer[sockDevice]
	eid urma.EID
}

// forgetPeer drops the map entry of a freed peer, unless a new one took
// its place.
func forgetPeer(k peerKey) {
	sd := k.sd.Value()
	if sd == nil {
		return
	}
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.peers[k.eid].Value() == nil {
		delete(sd.peers, k.eid)
	}
}

// resolve finds the address to dial for eid.
func (sd *sockDevice) resolve(ctx context.Context, eid urma.EID) (string, error) {
	if sd.resolver != nil {
		addr, err := sd.resolver(ctx, eid)
		if err != nil {
			return "", fmt.Errorf("resolve EID %s: %w", eid, err)
		}
		if addr != "" {
			return addr, nil
		}
	}
	if ap, ok := SocketAddr(eid); ok {
		return ap.String(), nil
	}
	return "", fmt.Errorf("EID %s does not encode an address and no resolver knows it", eid)
}

func (sd *sockDevice) acceptLoop() {
	for {
		nc, err := sd.ln.Accept()
		if err != nil {
			if sd.ctx.Err() != nil {
				return
			}
			sd.log().Error(err, "accept failed")
			if !sd.prov.sleep(10 * time.Millisecond) {
				return
			}
			continue
		}
		proc, ok := sd.beginHandshake(nc)
		if !ok {
			continue
		}
		if sd.shm != nil {
			sd.prov.goTracked(func() { sd.handshakeInShm(nc, proc) })
		} else {
			sd.prov.goTracked(func() { sd.handshakeIn(nc) })
		}
	}
}

// handshakeIn answers a dialer's HELLO and, unless a connection dialed the
// other way wins, adopts the connection.
//
// Exactly one connection per pair of devices: when both dial at once, the
// connection dialed by the device with the smaller EID wins; the acceptor
// with the smaller EID turns the other dial down (DUPLICATE) while its own
// dial or dialed connection stands, and the dialer then waits for that one.
func (sd *sockDevice) handshakeIn(nc net.Conn) {
	defer sd.endHandshake(nc)
	_ = nc.SetDeadline(time.Now().Add(sd.dialTO))
	var buf [4 + helloLen]byte
	var h hello
	_, err := io.ReadFull(nc, buf[:]) // exactly the HELLO: nothing of what follows is read here
	if err == nil {
		h, err = decodeHello(buf[:])
	}
	if err != nil {
		sd.log().Info("refusing connection: bad HELLO", "remote", nc.RemoteAddr().String(), "reason", err.Error())
		_ = nc.Close()
		return
	}
	var ackBuf [4 + helloAckLen]byte
	ack := helloAck{session: sd.session, eid: sd.eid, maxMsg: sd.dev.caps.MaxMsgSize}
	if h.dst != sd.eid || h.src == sd.eid {
		ack.status = helloWrongEID
		_, _ = nc.Write(encodeHelloAck(ackBuf[:], &ack))
		sd.log().Info("refusing connection: wrong EID", "remote", nc.RemoteAddr().String(), "asked", h.dst.String(), "from", h.src.String())
		_ = nc.Close()
		return
	}
	if err := checkSourceAddr(nc.RemoteAddr(), h.src); err != nil {
		ack.status = helloRefused
		_, _ = nc.Write(encodeHelloAck(ackBuf[:], &ack))
		sd.log().Info("refusing connection", "remote", nc.RemoteAddr().String(), "from", h.src.String(), "reason", err.Error())
		_ = nc.Close()
		return
	}
	p, err := sd.peer(h.src)
	if err != nil {
		_ = nc.Close()
		return
	}
	reserved, err := sd.admit(p, procKey{})
	if err != nil {
		ack.status = helloConnLimit
		_, _ = nc.Write(encodeHelloAck(ackBuf[:], &ack))
		sd.log().Info("refusing connection", "remote", nc.RemoteAddr().String(), "from", h.src.String(), "reason", err.Error())
		_ = nc.Close()
		return
	}
	defer func() {
		if reserved {
			sd.unreserve(procKey{})
		}
	}()
	fd, local, remote, err := detachFD(nc)
	if err != nil {
		sd.log().Error(err, "refusing connection")
		return
	}
	c := newConn(sd, p, newSockIO(fd, nil), h, false, local, remote)
	p.mu.Lock()
	peerWins := bytes.Compare(h.src[:], sd.eid[:]) < 0
	mineStands := p.dialing || (p.conn != nil && p.conn.dialedByMe)
	if !peerWins && mineStands {
		p.mu.Unlock()
		ack.status = helloDuplicate
		_, _ = unix.Write(fd, encodeHelloAck(ackBuf[:], &ack)) // 44 bytes into an empty send buffer: does not block
		_ = unix.Close(fd)
		return
	}
	// The HELLO_ACK is the connection's first frame: queue it before
	// anything else can be.
	var it txItem
	it.n = uint8(len(encodeHelloAck(it.ctl[:], &ack)))
	c.q = append(c.q, it)
	old := sd.adoptLocked(p, c, reserved)
	reserved = false
	p.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection from the peer"))
	}
}

// publishShmConnsLocked refreshes the list Poll drives; sd.mu is held.
func (sd *sockDevice) publishShmConnsLocked() {
	if sd.shm == nil {
		return
	}
	list := make([]*conn, 0, len(sd.conns))
	for c := range sd.conns {
		list = append(list, c)
	}
	sd.shmConns.Store(&list)
}

// drive lets a poller take what the shm rings hold (see conn.drive);
// polling says that it polls a JFC without a JFCE, for its own sake (see
// shmring.Stream.Idle).
func (sd *sockDevice) drive(polling bool) {
	conns := sd.shmConns.Load()
	if conns == nil {
		return
	}
	if polling {
		sd.polls.Add(1)
	}
	for _, c := range *conns {
		c.drive()
	}
}

// adoptLocked makes c the peer's connection, hands it the sends waiting for
// one and starts it; p.mu is held. reserved says that admit made room for
// c (for the process c.proc), which it now takes. It returns the connection c replaces, which the
// caller fails after unlocking.
func (sd *sockDevice) adoptLocked(p *peer, c *conn, reserved bool) *conn {
	c.gen = p.gen // the pending sends were given it
	c.mu.Lock()   // the watchdog may see c as soon as it is in sd.conns
	c.q = append(c.q, p.pending...)
	c.mu.Unlock()
	clear(p.pending)
	p.pending = p.pending[:0]
	sd.mu.Lock()
	if reserved {
		sd.reserved--
	}
	if sd.closed {
		// The pending sends are lost: the dial ends with no connection,
		// and dialLoop fails generation p.gen.
		if reserved {
			sd.releaseLinkLocked(c.proc)
		}
		sd.mu.Unlock()
		c.io.Close()
		return nil
	}
	if !reserved {
		sd.holdLinkLocked(c.proc) // a replacement: counted from now, as its predecessor is until it goes
	}
	p.gen++
	sd.adoptSeq++
	c.seq = sd.adoptSeq
	sd.conns[c] = struct{}{}
	sd.publishShmConnsLocked()
	sd.mu.Unlock()
	old := p.conn
	p.conn = c
	sd.log().Info("connected", "peer", p.eid.String(), "dialed", c.dialedByMe, "peerSession", c.session)
	if s, ok := c.io.(*shmIO); ok {
		s.watchers.Add(1)
		sd.prov.goTracked(func() { s.watch(c.fail) })
	}
	sd.prov.goTracked(c.readLoop)
	sd.prov.goTracked(c.writeLoop)
	c.ring()
	return old
}

// watchdog declares silent connections dead and keeps idle ones alive: every
// PeerTimeout/4 it sends a PING on connections that wrote nothing, and fails
// those that read nothing for four ticks, or took too long over a frame
// (watchFrame). On the shm fabric it fails connections whose live peer
// stopped (watchShm) instead.
func (sd *sockDevice) watchdog() {
	tick := max(sd.peerTO/4, time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	var conns []*conn
	for {
		select {
		case <-t.C:
		case <-sd.ctx.Done():
			return
		}
		conns = conns[:0]
		sd.mu.Lock()
		for c := range sd.conns {
			conns = append(conns, c)
		}
		sd.mu.Unlock()
		var awaited map[*peer]bool // made once a tick, when a connection needs it
		awaitedPeers := func() map[*peer]bool {
			if awaited == nil {
				awaited = sd.dev.awaitedPeers()
			}
			return awaited
		}
		for _, c := range conns {
			if s, ok := c.io.(*shmIO); ok {
				sd.watchShm(c, s, awaitedPeers)
				continue
			}
			rx := c.rx.Load()
			if rx != c.lastRx {
				c.lastRx, c.idleTicks = rx, 0
			} else if c.idleTicks++; c.idleTicks >= 4 {
				c.fail(fmt.Errorf("peer silent for %v", sd.peerTO))
				continue
			}
			if s, ok := c.io.(*sockIO); ok && sd.watchFrame(c, s, rx) {
				continue
			}
			if tx := c.tx.Load(); tx == c.lastTx {
				var it txItem
				it.n = uint8(len(encodePing(it.ctl[:])))
				if c.enqueue(&it) == nil {
					c.ring()
				}
			} else {
				c.lastTx = tx
			}
		}
		clear(conns)
		if f := sd.afterWatch.Load(); f != nil {
			(*f)()
		}
	}
}

// watchFrame fails a socket connection whose peer takes too long over a
// frame, and reports whether it did. A peer that trickles a frame, a byte
// now and then, is never silent for PeerTimeout, yet holds the reader
// goroutine, the sends waiting for answers behind the frame and a receive
// being written (and so JFR.Close) for as long as it likes. The reader
// marks a frame from its first byte to its end (sockReader.frame); the
// frame is timed from the tick that first saw it, so it is failed no
// earlier than framebound.For the bytes read since (the socket's bytes, as
// near to the frame's as the watchdog can tell) and at most a tick later.
func (sd *sockDevice) watchFrame(c *conn, s *sockIO, rx uint64) bool {
	f := s.frame.Load()
	if f&1 == 0 {
		return false // between frames
	}
	now := time.Now()
	if f != c.frameSeen {
		c.frameSeen, c.frameSince, c.frameRx = f, now, rx
		return false
	}
	waited, bound := now.Sub(c.frameSince), framebound.For(sd.peerTO, rx-c.frameRx)
	if waited <= bound {
		return false
	}
	c.fail(framebound.Overdue(waited, bound))
	return true
}

// watchShm fails an shm connection whose peer process lives but stopped
// (SIGSTOP, a debugger, a hang): its unix socket reports a dead peer, not
// a stopped one. A stopped peer neither reads this side's ring nor writes
// its own, so the watch is on the words it moves (the tail of its ring,
// the head of its reading of this side's, and the bytes it pulled out of
// this side's memory, which a long one-copy SEND moves while the ring
// words stand still); no heartbeat, so an idle peer costs no wake-up and
// is never timed out. The connection fails when the peer moved none of
// them for PeerTimeout (four ticks at least, so that this process being
// held up does not count) while something of this side waits on it: bytes
// to read, sends or imports to answer (waitsOnPeer). A peer that moves
// any of them, however slowly, is making progress, and
// RNR answers are progress: an RNR wait, however long, is no stall.
func (sd *sockDevice) watchShm(c *conn, s *shmIO, awaited func() map[*peer]bool) {
	w, ok := s.WatchWords()
	if !ok {
		return // closed: its reader fails it
	}
	if w.PeerTail != c.peerTail || w.PeerHead != c.peerHead || w.PeerPulled != c.peerPulled {
		c.peerTail, c.peerHead, c.peerPulled, c.idleTicks = w.PeerTail, w.PeerHead, w.PeerPulled, 0
		return
	}
	why := c.waitsOnPeer(w, awaited)
	if why == nil {
		c.idleTicks = 0
		return
	}
	if c.idleTicks == 0 {
		c.quietSince = time.Now()
	}
	if c.idleTicks++; c.idleTicks >= 4 && time.Since(c.quietSince) >= sd.peerTO {
		c.fail(fmt.Errorf("%w for %v", why, sd.peerTO))
	}
}

// peer is a remote device this device talks to.
type peer struct {
	sd  *sockDevice
	eid urma.EID
	// used says this side uses its link to the peer: it dialed the peer,
	// imported or sent over the link, or a send of the peer's passed a
	// token check. A link dialed in that is not used may be evicted to
	// make room (connslots.go). It outlives a connection for as long as
	// the entry does, so a peer that replaces its link keeps it used.
	used atomic.Bool

	mu       sync.Mutex
	conn     *conn
	dialing  bool
	dialDone chan struct{} // closed when the current dial ends
	lastErr  error         // why the last dial failed
	pending  []txItem      // sends waiting for a connection
	// gen is the generation the pending sends go out on: the next
	// connection adopted takes it, and a dial that ends without one
	// fails it; either way the next pending send gets a new one.
	gen uint64
}

// send queues a transmission of a jetty's slot of length bytes and returns
// the connection to kick once j.mu is released (nil while a connection is
// being dialed) and the generation of the connection that carries it (see
// jetty.peerDown). Otherwise the status says why not: ACK_TIMEOUT, the
// peer cannot be reached now; LOC_LEN, the message is longer than the
// connected peer takes (found here, the failing send stops its jetty's
// queue before anything behind it goes out). j.mu is held.
func (p *peer) send(j *jetty, seq uint64, tx, length uint32) (*conn, uint64, urma.Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.used.Load() {
		p.used.Store(true)
	}
	if c := p.conn; c != nil {
		switch {
		case uint64(length) > c.peerMax:
			return nil, c.gen, urma.StatusLocLen
		case c.enqueue(&txItem{j: j, seq: seq, tx: tx}) != nil:
			return nil, c.gen, urma.StatusAckTimeout
		}
		return c, c.gen, urma.StatusSuccess
	}
	if p.sd.ctx.Err() != nil {
		return nil, p.gen, urma.StatusAckTimeout
	}
	p.pending = append(p.pending, txItem{j: j, seq: seq, tx: tx})
	p.startDialLocked()
	return nil, p.gen, urma.StatusSuccess
}

// cancel tells the peer to drop the RNR block of the send tagged
// (j, seq) at jetty dst. j.mu is held.
func (p *peer) cancel(j *jetty, seq uint64, dst uint32) {
	p.mu.Lock()
	c := p.conn
	p.mu.Unlock()
	if c == nil {
		return // no connection, no block
	}
	_ = c.cancelBlock(j.id.ID, dst, uint64(j.instance)<<32|uint64(uint32(seq)), false) // never refused
}

func (p *peer) startDialLocked() {
	p.used.Store(true)
	if p.dialing {
		return
	}
	p.dialing = true
	p.dialDone = make(chan struct{})
	p.sd.prov.goTracked(p.dialLoop)
}

// connect returns the peer's connection, dialing if needed.
func (p *peer) connect(ctx context.Context) (*conn, error) {
	p.mu.Lock()
	if p.conn != nil {
		c := p.conn
		p.mu.Unlock()
		return c, nil
	}
	p.startDialLocked()
	done := p.dialDone
	p.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, urma.Errorf("import", urma.CodeTimeout, "connect to %s: %w", p.eid, ctx.Err())
	case <-p.sd.ctx.Done():
		return nil, errClosed("import", "device")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		return p.conn, nil
	}
	if p.lastErr == nil {
		return nil, urma.Errorf("import", urma.CodeConnRefused, "connect to %s: the connection closed", p.eid)
	}
	// The cause stays reachable: errors.Is answers both ErrUnreachable
	// (the code) and, say, ErrConnLimit.
	return nil, urma.Errorf("import", urma.CodeConnRefused, "connect to %s: %w", p.eid, p.lastErr)
}

var errDuplicate = errors.New("peer kept the connection it dialed")

// dialLoop connects to the peer, retrying while the peer answers DUPLICATE
// (its own dial to us wins and should arrive shortly), for at most the dial
// timeout. If no connection results, the sends waiting for one fail.
func (p *peer) dialLoop() {
	sd := p.sd
	ctx, cancel := context.WithTimeout(sd.ctx, sd.dialTO)
	defer cancel()
	var err error
	for backoff := time.Millisecond; ; backoff = min(2*backoff, 100*time.Millisecond) {
		if err = p.dialOnce(ctx); err == nil {
			break
		}
		p.mu.Lock()
		up := p.conn != nil
		p.mu.Unlock()
		if up || !errors.Is(err, errDuplicate) {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			err = fmt.Errorf("%w; the peer's own connection did not arrive in %v", err, sd.dialTO)
		}
		if ctx.Err() != nil {
			break
		}
	}
	p.mu.Lock()
	p.dialing = false
	failed := p.conn == nil
	gen := p.gen
	if failed {
		p.lastErr = err
		clear(p.pending)
		p.pending = p.pending[:0]
		p.gen++ // a send posted from now on waits for the next dial
	}
	close(p.dialDone)
	p.mu.Unlock()
	if failed {
		sd.log().Info("cannot reach peer", "peer", p.eid.String(), "reason", fmt.Sprint(err))
		sd.dev.forEachJetty(func(j *jetty) { j.peerDown(p, gen) })
	}
}

// dialOnce dials and handshakes once.
func (p *peer) dialOnce(ctx context.Context) error {
	sd := p.sd
	if sd.shm != nil {
		return p.dialOnceShm(ctx)
	}
	addr, err := sd.resolve(ctx, p.eid)
	if err != nil {
		return err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() }) // device closing: do not wait for the deadline
	defer stop()
	var buf [4 + helloLen]byte
	h := hello{session: sd.session, src: sd.eid, dst: p.eid, maxMsg: sd.dev.caps.MaxMsgSize}
	if _, err := nc.Write(encodeHello(buf[:], &h)); err != nil {
		_ = nc.Close()
		return fmt.Errorf("send HELLO to %s: %w", addr, err)
	}
	var abuf [4 + helloAckLen]byte
	var a helloAck
	if _, err = io.ReadFull(nc, abuf[:]); err == nil {
		a, err = decodeHelloAck(abuf[:])
	}
	if err != nil {
		_ = nc.Close()
		return fmt.Errorf("handshake with %s: %w", addr, err)
	}
	switch {
	case a.status == helloDuplicate:
		_ = nc.Close()
		return errDuplicate
	case a.status == helloRefused:
		_ = nc.Close()
		return fmt.Errorf("%s refused this device: its connection does not come from the address its EID %s names", addr, sd.eid)
	case a.status == helloConnLimit:
		_ = nc.Close()
		return fmt.Errorf("%s refused the connection: device %s holds as many connections as it may, %w", addr, p.eid, ErrConnLimit)
	case a.status == helloWrongEID || a.eid != p.eid:
		_ = nc.Close()
		return fmt.Errorf("%s is device %s, not %s", addr, a.eid, p.eid)
	}
	fd, local, remote, err := detachFD(nc)
	if err != nil {
		return err
	}
	c := newConn(sd, p, newSockIO(fd, nil), hello{session: a.session, src: a.eid, maxMsg: a.maxMsg}, true, local, remote)
	p.mu.Lock()
	old := sd.adoptLocked(p, c, false)
	p.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection"))
	}
	return nil
}

// importJetty asks the peer whether id may be imported with token.
func (p *peer) importJetty(ctx context.Context, id uint32, mode urma.TransportMode, token urma.Token) (urma.Code, error) {
	return p.ask(ctx, "import_jetty", func(b []byte, req uint32) []byte {
		return encodeImportJetty(b, &importJettyReq{mode: mode, req: req, jetty: id, token: uint32(token)})
	})
}

// importSegment asks the peer whether a segment may be imported with token.
func (p *peer) importSegment(ctx context.Context, id urma.SegmentID, token urma.Token) (urma.Code, error) {
	return p.ask(ctx, "import_seg", func(b []byte, req uint32) []byte {
		return encodeImportSeg(b, &importSegReq{req: req, uasid: id.UASID, tokenID: id.TokenID, va: id.VA, len: id.Len, token: uint32(token)})
	})
}

func (p *peer) ask(ctx context.Context, op string, encode func([]byte, uint32) []byte) (urma.Code, error) {
	p.used.Store(true)
	c, err := p.connect(ctx)
	if err != nil {
		return 0, err
	}
	ch := make(chan urma.Code, 1)
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return 0, urma.Errorf(op, urma.CodeConnRefused, "connection to %s broke: %w", p.eid, c.err)
	}
	c.nextReq++
	req := c.nextReq
	c.imports[req] = ch
	c.mu.Unlock()
	var it txItem
	it.n = uint8(len(encode(it.ctl[:], req)))
	if c.enqueue(&it) == nil {
		c.kick()
	}
	code, answered, broke := awaitAnswer(ctx, ch, c.done)
	switch {
	case answered:
		return code, nil
	case broke:
		return 0, urma.Errorf(op, urma.CodeConnRefused, "connection to %s broke: %w", p.eid, c.deathCause())
	}
	c.mu.Lock()
	delete(c.imports, req)
	c.mu.Unlock()
	return 0, urma.Errorf(op, urma.CodeTimeout, "no answer from %s: %w", p.eid, ctx.Err())
}

// awaitAnswer waits for the answer to a request on a connection that may
// die (done) or be given up on (ctx). An answer that came before the
// connection died wins: the reader delivers it before it reads on and
// meets the end, but a select with both ready would pick either.
func awaitAnswer(ctx context.Context, ch <-chan urma.Code, done <-chan struct{}) (code urma.Code, answered, broke bool) {
	select {
	case code = <-ch:
		return code, true, false
	case <-done:
		select {
		case code = <-ch:
			return code, true, false
		default:
			return 0, false, true
		}
	case <-ctx.Done():
		return 0, false, false
	}
}
