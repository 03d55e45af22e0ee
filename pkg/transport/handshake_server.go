package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
)

// serverHandshake runs the server side on an accepted connection. It
// returns nil and no error when the connection was dropped for a protocol
// breakdown (logged), which the listener simply forgets.
//
//	read 4 bytes -> not a magic: plain TCP, those bytes kept
//	read the hello -> invalid, or we cannot do URMA: fallback hello
//	otherwise import the client's segment and jetty, send our hello
//	read the ACK -> bit 0: URMA; clear: TCP; set after we fell back: fail
//
// The handshake takes seat, its seat in the listener's AcceptBacklog,
// before it sets up a jetty.
func serverHandshake(ctx context.Context, e *engine, tcp net.Conn, seat *seat) (Conn, error) {
	start := time.Now()
	role := metrics.RoleServer
	hctx, stop := boundHandshake(ctx, tcp, start, e.s.handshakeTimeout)
	conn, result, err := serverExchange(hctx, start, e, tcp, seat)
	stop()
	e.metrics.Handshake(result, role, time.Since(start).Seconds())
	if err != nil {
		_ = tcp.Close()
		return nil, fmt.Errorf("URMA handshake with %s: %w", tcp.RemoteAddr(), err)
	}
	startWatching(conn)
	if tc, ok := conn.(*tcpConn); ok {
		e.metrics.Fallback(string(tc.why.reason), role)
		e.log.V(1).Info("connection falls back to TCP", "remote", tcp.RemoteAddr().String(), "reason", tc.why.String())
	}
	return conn, nil
}

// serverSide is the server's half of one handshake.
type serverSide struct {
	e       *engine
	begun   time.Time // when the handshake began
	tcp     net.Conn
	seat    *seat // taken before a jetty is set up
	version handshake.Version
	hello   handshake.Hello // the client's, as far as it was decoded
	conn    *urmaConn       // nil when the server falls back
	why     *fallback       // why it falls back
}

// serverExchange does the server's bytes, the handshake (ctx) begun at
// begun; an error means the connection is unusable.
func serverExchange(ctx context.Context, begun time.Time, e *engine, tcp net.Conn, seat *seat) (Conn, string, error) {
	s := &serverSide{e: e, begun: begun, tcp: tcp, seat: seat}
	magic, fb, err := s.readFirstBytes(ctx)
	if err != nil {
		return nil, metrics.ResultError, err
	}
	if fb != nil {
		return s.tcpMode(fb, magic, 0)
	}
	s.version, _ = handshake.IsMagic(magic)
	h, _, err := handshake.ReadHello(tcp, magic)
	if err != nil && !errors.Is(err, handshake.ErrInvalidHello) {
		return nil, metrics.ResultError, fmt.Errorf("read the client's hello: %w", err)
	}
	s.hello = h
	s.decide(ctx, err)
	if s.why != nil && s.why.reason == ReasonBudgetExhausted && e.s.failOnBudget {
		return nil, metrics.ResultError, fmt.Errorf("%s (Config.FailWhenBudgetExhausted)", s.why)
	}
	conn, result, err := s.finish(ctx)
	if err != nil && s.conn != nil {
		s.conn.release()
	}
	return conn, result, err
}

// readFirstBytes reads the four bytes that tell a hello from a plain TCP
// client, within urma_first_bytes_timeout: a URMA client sends its hello
// at once, so a client still silent then waits for the server to speak
// first and is served as plain TCP with whatever it sent (a fallback,
// returned with those bytes).
func (s *serverSide) readFirstBytes(ctx context.Context) ([]byte, *fallback, error) {
	var magic [handshake.MagicLen]byte
	wait := s.e.s.handshakeTimeout
	restore, limited := s.limitReads(ctx, s.e.s.firstBytes)
	if limited {
		wait = s.e.s.firstBytes
	}
	n, err := io.ReadFull(s.tcp, magic[:])
	restore()
	switch {
	case err == nil:
	case isTimeout(err):
		return magic[:n], fallbackf(ReasonPeerSilent, "the client sent %d bytes within %s (urma_first_bytes_timeout), not a hello", n, wait), nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		// It sent a few bytes (or none) and closed: the application sees
		// them and then EOF.
		return magic[:n], fallbackf(ReasonPeerNotURMA, "the client sent %d bytes and closed", n), nil
	default:
		return nil, nil, fmt.Errorf("read the client's first bytes: %w", err)
	}
	if _, ok := handshake.IsMagic(magic[:]); !ok {
		return magic[:], fallbackf(ReasonPeerNotURMA, "the client's first bytes %q are not a hello", magic[:]), nil
	}
	return magic[:], nil, nil
}

// decide chooses URMA (s.conn, the client's segment and jetty imported) or
// why not (s.why), from the client's hello and its error.
func (s *serverSide) decide(ctx context.Context, helloErr error) {
	e := s.e
	switch {
	case helloErr != nil:
		s.why = fallbackf(ReasonInvalidHello, "client hello: %v", helloErr)
		return
	case e.unavailable() != nil:
		s.why = e.unavailable()
		return
	}
	if fb := e.checkClientAddress(s.hello, s.tcp.RemoteAddr()); fb != nil {
		s.why = fb
		return
	}
	spec, fb := e.specFor(s.hello)
	if fb != nil {
		s.why = fb
		return
	}
	end := handshakeImportDeadline(ctx, s.begun)
	if fb := s.takeSeat(ctx, end); fb != nil {
		s.why = fb
		return
	}
	c, fb := s.setUp(ctx, spec, end)
	if fb != nil {
		s.why = fb
		return
	}
	if fb := c.importPeer(ctx, s.hello, end, "HandshakeTimeout"); fb != nil {
		c.release()
		s.why = fb
		return
	}
	s.conn = c
}

// takeSeat waits until end for a seat in the listener's AcceptBacklog,
// which bounds the connections that hold a jetty: past end the client is
// told to fall back while it still listens.
func (s *serverSide) takeSeat(ctx context.Context, end time.Time) *fallback {
	sctx, cancel := until(ctx, end)
	defer cancel()
	if s.seat.take(sctx) {
		return nil
	}
	// docs/troubleshooting.md quotes this detail: keep its words.
	return fallbackf(ReasonResources,
		"no place among the listener's %d (Config.AcceptBacklog) connections that hold a jetty or wait for Accept within %s, three quarters of HandshakeTimeout: the application does not Accept as fast as clients come",
		cap(s.seat.seats), end.Sub(s.begun).Round(time.Millisecond))
}

// setUp makes the connection's URMA half within the handshake's URMA
// time, which ends at end (handshakeImportDeadline): past it the server
// answers with its fallback hello while the client still listens.
func (s *serverSide) setUp(ctx context.Context, spec jettySpec, end time.Time) (*urmaConn, *fallback) {
	return s.e.setUpBy(ctx, s.tcp, metrics.RoleServer, spec, end,
		fmt.Sprintf("%s, three quarters of HandshakeTimeout", end.Sub(s.begun).Round(time.Millisecond)),
		"the server stopped waiting so that its fallback reaches the client while it listens")
}

// specFor chooses the queues for a client whose hello is h: the engine's,
// unless the client is a brpc peer (no extension). brpc presents no token,
// so its connection gets a jetty and hello page without one (unless
// urma_require_token refuses it), and it returns credits only past half its
// receive queue, so our send queue is made deep enough for a window above
// that (up to its whole receive queue, within the device's limits).
func (e *engine) specFor(h handshake.Hello) (jettySpec, *fallback) {
	spec := e.spec()
	if h.HasExtension() {
		return spec, nil
	}
	// brpc's own receives are the pool's size; ours for it are too.
	spec.recv = e.recvPlanFor(false)
	if !spec.tokenless {
		if e.s.requireToken {
			return spec, fallbackf(ReasonTokenMismatch, "the client's hello has no token extension (a brpc client, which cannot present a token) and urma_require_token is set")
		}
		spec.tokenless = true
	}
	peerRQ := int(h.RecvBufferCnt) + 1
	if spec.sq < brpcMinSQ(peerRQ) {
		spec.sq = max(spec.sq, min(peerRQ, e.maxSQ()))
	}
	return spec, nil
}

// maxSQ is the deepest send queue the device takes, its completion queue
// included.
func (e *engine) maxSQ() int {
	limit := maxQueueDepth
	if c := e.dev.Caps.MaxJFSDepth; c != 0 {
		limit = min(limit, int(c))
	}
	if c := e.dev.Caps.MaxJFCDepth; c != 0 {
		limit = min(limit, int(c)-e.rqSize-1)
	}
	return limit
}

// maxQueueDepth is the deepest queue brpc and the flags allow.
const maxQueueDepth = 4096

// finish sends our hello (or the fallback hello), reads the client's ACK
// and makes the connection.
func (s *serverSide) finish(ctx context.Context) (Conn, string, error) {
	var reply []byte
	if s.conn != nil {
		reply = appendHello(nil, s.version, s.conn.localHello())
	} else {
		reply = appendFallbackHello(nil, s.version)
	}
	if _, err := s.tcp.Write(reply); err != nil {
		return nil, metrics.ResultError, fmt.Errorf("send hello: %w", err)
	}
	// A foreign client (no extension in its hello: brpc) that we decline
	// may send no ACK at all: brpc's URMA client goes straight to TCP.
	// Its first bytes then cannot pass for an ACK (reserved bits set), or
	// it says nothing until the handshake timeout, or it sends fewer than
	// four bytes and ends its side (an ACK is one 4-byte write, so those
	// are application bytes, as readFirstBytes takes them); either way it
	// is served as TCP with nothing lost. Our own clients always send the
	// ACK.
	lenient := s.conn == nil && !s.hello.HasExtension()
	// A client we set up a jetty for (its receive buffers posted, its jetty
	// counted against the budget) sends its ACK once it has read our hello
	// and imported our jetty: wait for it within urma_ack_timeout, not the
	// whole handshake timeout, so that clients which never send it cannot
	// hold the budget and push honest ones to TCP. Without a jetty nothing
	// is held, and a declined brpc client may take its time (above).
	restore, ackBounded := func() {}, false
	if s.conn != nil {
		restore, ackBounded = s.limitReads(ctx, s.e.s.ackTimeout)
	}
	ack, raw, err := handshake.ReadAck(s.tcp)
	restore()
	switch {
	case err != nil && lenient && (isTimeout(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)):
		return s.tcpMode(s.why, raw, int(s.version))
	case err != nil && ackBounded && isTimeout(err) && ctx.Err() == nil:
		return nil, metrics.ResultError, fmt.Errorf("no ACK within %s (urma_ack_timeout) of our hello: dropping the connection gives back the jetty set up for it: %w", s.e.s.ackTimeout, err)
	case err != nil:
		return nil, metrics.ResultError, err
	case lenient && ack.Reserved():
		return s.tcpMode(s.why, raw, int(s.version))
	case !ack.UseURMA() && s.conn != nil:
		fb := s.conn.peerDeclined("the client's ACK (flags %#x) asks for TCP", uint32(ack))
		s.conn.release()
		s.conn = nil
		return s.tcpMode(fb, nil, int(s.version))
	case !ack.UseURMA():
		return s.tcpMode(s.why, nil, int(s.version))
	case s.conn == nil:
		return nil, metrics.ResultError, fmt.Errorf("the client asks for URMA (ACK flags %#x) although the server fell back (%s)", uint32(ack), s.why)
	}
	if err := s.conn.establish(int(s.version)); err != nil {
		return nil, metrics.ResultError, err
	}
	return s.conn, metrics.ResultURMA, nil
}

func (s *serverSide) tcpMode(fb *fallback, prefix []byte, version int) (Conn, string, error) {
	return newTCPConn(s.tcp, metrics.RoleServer, *fb, prefix, version, s.e.bufSize, s.e.metrics), metrics.ResultFallback, nil
}
