package soft

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// fabricSide is a device's side of a fabric between processes, socket or
// shm: its listener, its peers (one per remote device it talks to) and its
// connections to them, one per peer. What differs between the two
// fabrics is how a connection is made (socket.go, shm_handshake.go) and
// what it runs on (linkIO: sockIO or shmIO); shm holds the shm fabric's
// part.
type fabricSide struct {
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
	shm        *shmSide // nil on the socket fabric
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
func listen(d *device, spec DeviceSpec, opts Options) (*fabricSide, error) {
	sd := &fabricSide{
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

func (sd *fabricSide) start() {
	sd.prov.goTracked(sd.acceptLoop)
	sd.prov.goTracked(sd.watchdog)
}

// close stops accepting and dialing and breaks every connection.
func (sd *fabricSide) close() {
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

func (sd *fabricSide) log() logr.Logger {
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
func (sd *fabricSide) peer(eid urma.EID) (*peer, error) {
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
	sd  weak.Pointer[fabricSide]
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

func (sd *fabricSide) acceptLoop() {
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

// publishShmConnsLocked refreshes the list Poll drives; sd.mu is held.
func (sd *fabricSide) publishShmConnsLocked() {
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
func (sd *fabricSide) drive(polling bool) {
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
func (sd *fabricSide) adoptLocked(p *peer, c *conn, reserved bool) *conn {
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
