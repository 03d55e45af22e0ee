package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
)

// keepAlive makes a silently dead peer (no FIN, no RST) visible on the TCP
// control connection within about 30s; URMA error completions and the
// software fabric's peer timeout usually say so sooner.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

func checkNetwork(network string) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
		return nil
	}
	return fmt.Errorf("network %q is not supported: the transport's control plane is TCP (tcp, tcp4, tcp6)", network)
}

func newMetrics(cfg Config) (*metrics.Metrics, error) {
	if cfg.Registerer == nil {
		return nil, nil
	}
	return metrics.New(cfg.Registerer)
}

// Listener accepts connections that run on URMA when the client can, and on
// TCP otherwise (a plain TCP client is served transparently). Handshakes run
// concurrently, so a slow client does not hold up Accept. Connections
// waiting for Accept plus handshakes that hold a jetty are bounded by
// Config.AcceptBacklog, as the kernel bounds a plain listener's queue;
// handshakes in progress by handshakesPerSeat times that.
type Listener struct {
	ln     net.Listener
	e      *engine
	log    interface{ Info(string, ...any) }
	ctx    context.Context
	cancel context.CancelFunc
	conns  chan Conn
	// handshakes has an element for each handshake in progress, up to its
	// connection's entry into conns: the accept loop puts one in before it
	// takes a connection from the kernel.
	handshakes chan struct{}
	// seats has an element (a seat) for each handshake that holds a jetty
	// and each connection in conns: a handshake takes one before it sets
	// up a jetty, or once it completed without one; Accept (or a failed
	// handshake) gives it back. A client that is silent or stalls in its
	// hello holds no seat, so a few of them cannot keep honest clients
	// waiting.
	seats   chan struct{}
	closed  chan struct{}
	failed  chan struct{} // the accept loop stopped on an error (loopErr)
	wg      sync.WaitGroup
	once    sync.Once
	mu      sync.Mutex
	loopErr error
}

var _ net.Listener = (*Listener)(nil)

// Listen listens on a TCP address and brings URMA up (the software provider
// listens on the same host address unless Config.Provider is given). If URMA
// cannot be used, every connection falls back to TCP and says why
// (Listener.FallbackReason). Errors are only for what makes the listener
// itself impossible: a bad network or address, a bad configuration.
func Listen(network, address string, cfg Config) (net.Listener, error) {
	return ListenTransport(network, address, cfg)
}

// ListenTransport is Listen returning the concrete *Listener.
func ListenTransport(network, address string, cfg Config) (*Listener, error) {
	if err := checkNetwork(network); err != nil {
		return nil, err
	}
	s, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg)
	if err != nil {
		return nil, err
	}
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	ln, err := lc.Listen(context.Background(), network, address)
	if err != nil {
		return nil, err
	}
	e := newEngine(s, metrics.RoleServer, m)
	var host netip.Addr
	if ta, ok := ln.Addr().(*net.TCPAddr); ok {
		host, _ = netip.AddrFromSlice(ta.IP)
	}
	e.start(host)
	l := &Listener{
		ln: ln, e: e, log: e.log,
		conns:      make(chan Conn, s.acceptBacklog), // never full: conns hold seats
		handshakes: make(chan struct{}, handshakesPerSeat*s.acceptBacklog),
		seats:      make(chan struct{}, s.acceptBacklog),
		closed:     make(chan struct{}),
		failed:     make(chan struct{}),
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// handshakesPerSeat is how many handshakes a Listener runs at once for
// each seat of its AcceptBacklog. Before its hello a handshake costs a
// goroutine and a TCP connection, no jetty, so clients that stay silent
// for urma_first_bytes_timeout, or stall in their hello for
// HandshakeTimeout, take a share of these and not the seats of honest
// clients.
const handshakesPerSeat = 4

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		// At the bound, leave further clients in the kernel's listen
		// backlog: every connection taken costs a goroutine and a TCP
		// connection until it waits for Accept, or is dropped.
		select {
		case l.handshakes <- struct{}{}:
		case <-l.closed:
			return
		}
		tcp, err := l.ln.Accept()
		if err != nil {
			<-l.handshakes
			select {
			case <-l.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of descriptors and the like: back off and retry, as
				// net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				l.log.Info("accept failed, retrying", "error", err.Error(), "backoff", backoff)
				select {
				case <-time.After(backoff):
				case <-l.closed:
					return
				}
				continue
			}
			l.mu.Lock()
			l.loopErr = err
			l.mu.Unlock()
			close(l.failed)
			return
		}
		backoff = 0
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-l.handshakes }()
			seat := &seat{seats: l.seats}
			c, err := serverHandshake(l.ctx, l.e, tcp, seat)
			if err != nil {
				seat.give()
				l.log.Info("dropping a connection", "error", err.Error())
				return
			}
			if !seat.take(l.ctx) { // closed meanwhile
				abortConn(c)
				return
			}
			l.conns <- c // never blocks: it has its seat
		}()
	}
}

// seat is one handshake's claim on a seat of the listener's AcceptBacklog
// (Listener.seats), which its connection keeps until it is Accepted.
type seat struct {
	seats chan struct{}
	held  bool
}

// take waits for a seat until ctx ends; it reports whether one is held.
func (s *seat) take(ctx context.Context) bool {
	if s.held {
		return true
	}
	select {
	case s.seats <- struct{}{}:
		s.held = true
	case <-ctx.Done():
	}
	return s.held
}

// give gives the seat back, if one is held.
func (s *seat) give() {
	if s.held {
		<-s.seats
		s.held = false
	}
}

// freeSeat gives back the seat of a connection that was Accepted, so that
// the next handshake may have it.
func (l *Listener) freeSeat() { <-l.seats }

// abortConn ends a connection nobody accepted. The application never saw
// it, so nothing it wrote can be lost, and waiting for the peer (Close's
// drain and close marker, up to CloseTimeout) would only hold up
// Listener.Close: the peer gets a reset, as the kernel resets connections
// still in a closed listener's queue.
func abortConn(c Conn) {
	if a, ok := c.(interface{ abort() }); ok {
		a.abort()
		return
	}
	_ = c.Close()
}

// isTemporary reports errors Accept recovers from (EMFILE, ENFILE, ...),
// which the net package still marks Temporary.
func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// Accept waits for the next connection, URMA or TCP.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		l.freeSeat()
		return c, nil
	case <-l.closed:
	case <-l.failed:
	}
	// Prefer a connection that is ready over the close.
	select {
	case c := <-l.conns:
		l.freeSeat()
		return c, nil
	default:
	}
	l.mu.Lock()
	err := l.loopErr
	l.mu.Unlock()
	select {
	case <-l.closed:
		err = net.ErrClosed
	default:
	}
	return nil, &net.OpError{Op: "accept", Net: "urma", Addr: l.ln.Addr(), Err: err}
}

// Close stops accepting and aborts handshakes in progress and connections
// not accepted yet (their peers get a reset, at once); connections already
// accepted stay open, and the URMA resources go when the last of them
// closes.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.closed)
		l.cancel()
		err = l.ln.Close()
		l.wg.Wait()
		for {
			select {
			case c := <-l.conns:
				abortConn(c)
				continue
			default:
			}
			break
		}
		l.e.unref()
	})
	return err
}

// Addr is the TCP address the listener accepts on.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// FallbackReason says why every connection of this listener will use TCP,
// "" when URMA is available.
func (l *Listener) FallbackReason() string {
	if fb := l.e.unavailable(); fb != nil {
		return fb.String()
	}
	return ""
}
