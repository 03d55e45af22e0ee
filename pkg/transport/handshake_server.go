package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
)

// aLongTimeAgo is a deadline in the past, to abort blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// boundHandshake bounds a handshake begun at begun by timeout (or ctx's
// deadline, if sooner): the returned context ends then, or when ctx does,
// and the TCP connection's deadline follows it, so every step, fabric
// imports included, gives up together. The returned func disarms both.
func boundHandshake(ctx context.Context, tcp net.Conn, begun time.Time, timeout time.Duration) (context.Context, func()) {
	hctx, cancel := context.WithDeadline(ctx, begun.Add(timeout))
	d, _ := hctx.Deadline()
	_ = tcp.SetDeadline(d)
	aborted := make(chan struct{})
	stop := context.AfterFunc(hctx, func() {
		defer close(aborted)
		_ = tcp.SetDeadline(aLongTimeAgo)
	})
	return hctx, func() {
		if !stop() {
			<-aborted // it ran, or runs: let it finish before the reset below
		}
		cancel()
		_ = tcp.SetDeadline(time.Time{})
	}
}

func appendHello(dst []byte, v handshake.Version, h handshake.Hello) []byte {
	if v == handshake.V3 {
		return handshake.AppendV3(dst, h)
	}
	return handshake.AppendV2(dst, h)
}

func appendFallbackHello(dst []byte, v handshake.Version) []byte {
	if v == handshake.V3 {
		return handshake.AppendV3Fallback(dst)
	}
	return handshake.AppendV2Fallback(dst)
}

func magicOf(v handshake.Version) string {
	if v == handshake.V3 {
		return handshake.MagicV3
	}
	return handshake.MagicV2
}

// clientHandshake runs the client side on a fresh TCP connection and
// returns the connection in whichever mode it ends up.
//
//	send hello -> read the server's hello -> import its segment, then its
//	jetty -> send the ACK (always, flags 0 after a fallback)
//
// A client that cannot use URMA at all, or cannot set up the connection's
// jetty in time, sends nothing and is a plain TCP client; the server
// serves it transparently.
//
// The handshake's time begins at connected, when the TCP connection came
// up, not when this is called: the server's clocks (its
// urma_first_bytes_timeout, its HandshakeTimeout) began when it accepted
// the connection, so whatever the dial did in between (the engine's
// bring-up) counts.
func clientHandshake(ctx context.Context, e *engine, tcp net.Conn, connected time.Time) (Conn, error) {
	start := time.Now()
	role := metrics.RoleClient
	done := func(c Conn, result string) (Conn, error) {
		e.metrics.Handshake(result, role, time.Since(start).Seconds())
		if c.Mode() == ModeTCP {
			tc := c.(*tcpConn)
			e.metrics.Fallback(string(tc.why.reason), role)
			e.log.V(1).Info("connection falls back to TCP", "remote", tcp.RemoteAddr().String(), "reason", tc.why.String())
		}
		return c, nil
	}
	// fail ends a handshake that neither side can go on with: the
	// connection is closed, and err says what happened.
	fail := func(err error) (Conn, error) {
		e.metrics.Handshake(metrics.ResultError, role, time.Since(start).Seconds())
		_ = tcp.Close()
		return nil, err
	}
	tcpMode := func(fb fallback, prefix []byte, version int) Conn {
		return newTCPConn(tcp, role, fb, prefix, version, e.bufSize, e.metrics)
	}
	if e.unavailable() != nil {
		return done(tcpMode(*e.unavailable(), nil, 0), metrics.ResultFallback)
	}
	version := handshake.Version(e.s.flags.ClientHandshakeVersion)
	hctx, stop := boundHandshake(ctx, tcp, connected, e.s.handshakeTimeout)
	end, within := clientSetupDeadline(hctx, connected, e.s.firstBytes)
	c, fb := e.setUpBy(hctx, tcp, role, e.spec(), end, within,
		"the client stopped waiting before sending its hello and speaks plain TCP (a server serves a client without a hello as one)")
	if fb != nil {
		stop()
		if err := ctx.Err(); err != nil {
			// The dial's context ended while it waited, not the bound.
			return fail(fmt.Errorf("URMA handshake with %s: set up the connection's jetty: %w", tcp.RemoteAddr(), err))
		}
		if fb.reason == ReasonBudgetExhausted && e.s.failOnBudget {
			return fail(fmt.Errorf("dial %s: %s (Config.FailWhenBudgetExhausted)", tcp.RemoteAddr(), fb))
		}
		// Nothing sent yet: the server serves us as the plain TCP client
		// we now are.
		return done(tcpMode(*fb, nil, 0), metrics.ResultFallback)
	}
	conn, result, err := c.clientExchange(hctx, connected, version)
	stop()
	if err != nil {
		c.release()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return fail(fmt.Errorf("URMA handshake with %s: %w", tcp.RemoteAddr(), err))
	}
	startWatching(conn)
	return done(conn, result)
}

// clientExchange does the client's bytes, the handshake (ctx) begun at
// begun; an error means the connection is unusable.
func (c *urmaConn) clientExchange(ctx context.Context, begun time.Time, version handshake.Version) (Conn, string, error) {
	tcp := c.tcp
	fallBack := func(fb *fallback, prefix []byte, sendAck bool) (Conn, string, error) {
		if sendAck {
			if _, err := tcp.Write(handshake.AppendAck(nil, false)); err != nil {
				return nil, "", fmt.Errorf("send ACK: %w", err)
			}
		}
		c.release()
		return newTCPConn(tcp, c.role, *fb, prefix, int(version), c.e.bufSize, c.e.metrics), metrics.ResultFallback, nil
	}
	if _, err := tcp.Write(appendHello(nil, version, c.localHello())); err != nil {
		return nil, "", fmt.Errorf("send hello: %w", err)
	}
	var magic [handshake.MagicLen]byte
	if n, err := io.ReadFull(tcp, magic[:]); err != nil {
		if n > 0 && !isTimeout(err) {
			// A foreign server answered with fewer bytes and closed.
			return fallBack(fallbackf(ReasonPeerNotURMA, "the server answered %q, not a hello", magic[:n]), magic[:n], false)
		}
		if timedOut(ctx, err) {
			return nil, "", noHello(ctx, begun, fmt.Sprintf("sent %d bytes", n), err)
		}
		if errors.Is(err, io.EOF) {
			return nil, "", fmt.Errorf("read the server's hello: %s: %w", serverClosed, err)
		}
		return nil, "", fmt.Errorf("read the server's hello: %w", err)
	}
	if string(magic[:]) != magicOf(version) {
		// Not a URMA server: keep its bytes for the application, as brpc
		// does, and send no ACK it would not understand.
		return fallBack(fallbackf(ReasonPeerNotURMA, "the server answered %q, not %q", magic[:], magicOf(version)), magic[:], false)
	}
	h, _, err := handshake.ReadHello(tcp, magic[:])
	if err != nil {
		if timedOut(ctx, err) {
			return nil, "", noHello(ctx, begun, "began its hello and did not end it", err)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, "", fmt.Errorf("read the server's hello: the server closed the connection partway through its hello (it failed or was shutting down): %w", err)
		}
		if !errors.Is(err, handshake.ErrInvalidHello) {
			return nil, "", fmt.Errorf("read the server's hello: %w", err)
		}
		if handshake.IsFallback(h) {
			return fallBack(c.peerDeclined("the server answered with a fallback hello"), nil, true)
		}
		return fallBack(fallbackf(ReasonInvalidHello, "server hello: %v", err), nil, true)
	}
	if !h.HasExtension() && !c.spec.tokenless {
		return fallBack(fallbackf(ReasonTokenMismatch,
			"the server's hello has no token extension (a brpc server): it cannot present our token, so its sends would be refused; dial with Config.NoToken to use URMA with brpc servers"), nil, true)
	}
	end, bound := c.importDeadline(ctx, begun)
	if fb := c.importPeer(ctx, h, end, bound); fb != nil {
		return fallBack(fb, nil, true)
	}
	if _, err := tcp.Write(handshake.AppendAck(nil, true)); err != nil {
		return nil, "", fmt.Errorf("send ACK: %w", err)
	}
	if err := c.establish(int(version)); err != nil {
		return nil, "", err
	}
	return c, metrics.ResultURMA, nil
}

// serverClosed says what a server that ends the connection instead of
// answering our hello likely is; a bare EOF told the user nothing. A
// transport (or brpc) server answers every hello, with a fallback hello at
// worst, so one that closes instead does not speak this protocol, or
// refused the connection (a limit, an access check) or was shutting down.
const serverClosed = "the server closed the connection before answering the URMA handshake: it is likely no urma-k8s or brpc server speaking this protocol, or it refused the connection or was shutting down"

// noHello is the error of a client whose server's hello did not arrive
// whole within the handshake's time (ctx, begun at begun). Falling back
// is not safe then: the server may yet answer and read what we send next
// as our ACK, or be no transport server and have taken our hello for
// application bytes. A transport server answers within three quarters of
// its own HandshakeTimeout (its imports give up then), so a client that
// waits at least as long as its servers gets its answer.
func noHello(ctx context.Context, begun time.Time, got string, err error) error {
	end, _ := ctx.Deadline()
	return fmt.Errorf("read the server's hello: the server %s within %s (Config.HandshakeTimeout, or the dial's context deadline if sooner); not a fallback to TCP, as it may yet answer our hello or have taken it for application bytes. A transport server answers within three quarters of its own HandshakeTimeout (falling back to TCP if its imports take longer), so this one is overloaded, or no transport server, or waits longer than we do: raise Config.HandshakeTimeout (and the dial's context deadline) to at least the server's: %w",
		got, end.Sub(begun).Round(time.Millisecond), err)
}

// handshakeImportDeadline is when a handshake's imports of the peer's
// segment and jetty give up: three quarters of the handshake's time (ctx,
// begun at begun) into it. That leaves a quarter for the step that
// follows (the server's fallback hello, the client's fallback ACK) to
// reach a peer that gives up at the end of its own handshake, on the same
// timeout. Both sides then go on as plain TCP (import_failed here,
// peer_declined there) instead of one failing the connection, or falling
// back onto a connection the other has dropped.
func handshakeImportDeadline(ctx context.Context, begun time.Time) time.Time {
	end, ok := ctx.Deadline()
	if !ok {
		return time.Time{}
	}
	return begun.Add(end.Sub(begun) * 3 / 4)
}

// importDeadline is when the client's imports of the server's segment and
// jetty give up: at three quarters of the handshake's time (see
// handshakeImportDeadline), and within three quarters of urma_ack_timeout
// from now, the time a server (on the same flag) waits for our ACK from
// when it sent its hello, so that our fallback ACK arrives while it
// listens.
func (c *urmaConn) importDeadline(ctx context.Context, begun time.Time) (time.Time, string) {
	return sooner(handshakeImportDeadline(ctx, begun), handshakeBound, time.Now(), c.e.s.ackTimeout, "urma_ack_timeout")
}

// sooner is end (set by bound), or three quarters of d (the flag name)
// after from when that comes first or end is zero; d not positive bounds
// nothing. It returns the bound that set the time, for a fallback's detail.
func sooner(end time.Time, bound string, from time.Time, d time.Duration, name string) (time.Time, string) {
	if d > 0 {
		if t := from.Add(d * 3 / 4); end.IsZero() || t.Before(end) {
			return t, fmt.Sprintf("%s (%s)", name, d)
		}
	}
	return end, bound
}

// clientSetupDeadline is when the client stops waiting for its jetty's
// setup (see setUpBy), which comes before it sends anything, in the
// handshake (ctx) begun at begun, and the bound that sets it, for the
// fallback's detail: three quarters of the handshake's time, as on a
// server, and within three quarters of urma_first_bytes_timeout
// (firstBytes; none when not positive), the time a server on the same
// flag waits for our hello before it serves us as a plain TCP client.
// Past that it would take a hello sent late for application bytes; a
// client that stops waiting in time sends nothing of the handshake and
// is the plain TCP client the server then serves.
func clientSetupDeadline(ctx context.Context, begun time.Time, firstBytes time.Duration) (time.Time, string) {
	end, bound := sooner(handshakeImportDeadline(ctx, begun), handshakeBound, begun, firstBytes, "urma_first_bytes_timeout")
	return end, fmt.Sprintf("%s, three quarters of %s", end.Sub(begun).Round(time.Millisecond), bound)
}

// helloBy is when a client that connected at connected must have its hello
// under way: clientSetupDeadline's bound, three quarters of
// urma_first_bytes_timeout, or of HandshakeTimeout if sooner or there is
// none, the times a server on the same settings waits for it (the dial's
// context, which the server does not know, bounds nothing here).
func (e *engine) helloBy(connected time.Time) time.Time {
	end, _ := sooner(connected.Add(e.s.handshakeTimeout*3/4), handshakeBound, connected, e.s.firstBytes, "urma_first_bytes_timeout")
	return end
}

// handshakeBound names handshakeImportDeadline's bound in a fallback's
// detail.
const handshakeBound = "the handshake's time (HandshakeTimeout, or the dial's context deadline if sooner)"

// importPeer applies the peer's hello (applyPeer), its imports given up at
// end (none when zero), three quarters of bound; the fallback's detail
// says when an import gave up for that.
func (c *urmaConn) importPeer(ctx context.Context, h handshake.Hello, end time.Time, bound string) *fallback {
	ictx, cancel := until(ctx, end)
	defer cancel()
	fb := c.applyPeer(ictx, h)
	if fb != nil && fb.reason == ReasonImportFailed && ictx.Err() != nil && ctx.Err() == nil {
		fb.detail += fmt.Sprintf(" (given up at three quarters of %s, for the fallback to reach the %s while it listens)", bound, peerRole(c.role))
	}
	return fb
}

// until is ctx ended at end too, unless end is zero.
func until(ctx context.Context, end time.Time) (context.Context, context.CancelFunc) {
	if end.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, end)
}

// timedOut reports whether err is the handshake's (ctx) time running out,
// not its cancellation by the caller (which also aborts I/O as a timeout).
func timedOut(ctx context.Context, err error) bool {
	return isTimeout(err) && !errors.Is(ctx.Err(), context.Canceled)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// serverHandshake runs the server side on an accepted connection. It
// returns nil and no error when the connection was dropped for a protocol
// breakdown (logged), which the listener simply forgets.
//
//	read 4 bytes -> not a magic: plain TCP, those bytes kept
//	read the hello -> invalid, or we cannot do URMA: fallback hello
//	otherwise import the client's segment and jetty, send our hello
//	read the ACK -> bit 0: URMA; clear: TCP; set after we fell back: fail
//
// The handshake takes p, its place in the listener's AcceptBacklog,
// before it sets up a jetty.
func serverHandshake(ctx context.Context, e *engine, tcp net.Conn, p *place) (Conn, error) {
	start := time.Now()
	role := metrics.RoleServer
	hctx, stop := boundHandshake(ctx, tcp, start, e.s.handshakeTimeout)
	conn, result, err := serverExchange(hctx, start, e, tcp, p)
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
	place   *place // taken before a jetty is set up
	version handshake.Version
	hello   handshake.Hello // the client's, as far as it was decoded
	conn    *urmaConn       // nil when the server falls back
	why     *fallback       // why it falls back
}

// serverExchange does the server's bytes, the handshake (ctx) begun at
// begun; an error means the connection is unusable.
func serverExchange(ctx context.Context, begun time.Time, e *engine, tcp net.Conn, p *place) (Conn, string, error) {
	s := &serverSide{e: e, begun: begun, tcp: tcp, place: p}
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

// limitReads bounds the reads that follow to d from now, when d > 0 ends
// before the handshake (ctx) does, and says whether it did; restore puts
// the handshake's deadline back.
func (s *serverSide) limitReads(ctx context.Context, d time.Duration) (restore func(), limited bool) {
	end, _ := ctx.Deadline()
	if d <= 0 || !time.Now().Add(d).Before(end) {
		return func() {}, false
	}
	_ = s.tcp.SetReadDeadline(time.Now().Add(d))
	return func() {
		_ = s.tcp.SetReadDeadline(end)
		if ctx.Err() != nil {
			_ = s.tcp.SetDeadline(aLongTimeAgo) // cancelled meanwhile: stay cancelled
		}
	}, true
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
	if fb := s.takePlace(ctx, end); fb != nil {
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

// takePlace waits until end for a place in the listener's AcceptBacklog,
// which bounds the connections that hold a jetty: past end the client is
// told to fall back while it still listens.
func (s *serverSide) takePlace(ctx context.Context, end time.Time) *fallback {
	pctx, cancel := until(ctx, end)
	defer cancel()
	if s.place.take(pctx) {
		return nil
	}
	return fallbackf(ReasonResources,
		"no place among the listener's %d (Config.AcceptBacklog) connections that hold a jetty or wait for Accept within %s, three quarters of HandshakeTimeout: the application does not Accept as fast as clients come",
		cap(s.place.slots), end.Sub(s.begun).Round(time.Millisecond))
}

// setUp makes the connection's URMA half within the handshake's URMA
// time, which ends at end (handshakeImportDeadline): past it the server
// answers with its fallback hello while the client still listens.
func (s *serverSide) setUp(ctx context.Context, spec jettySpec, end time.Time) (*urmaConn, *fallback) {
	return s.e.setUpBy(ctx, s.tcp, metrics.RoleServer, spec, end,
		fmt.Sprintf("%s, three quarters of HandshakeTimeout", end.Sub(s.begun).Round(time.Millisecond)),
		"the server stopped waiting so that its fallback reaches the client while it listens")
}

// setUpBy makes a connection's URMA half (newURMAConn: its jetty, taken
// from the pool or created, its receive buffers, its receives posted) by
// end, or ctx's end if sooner; within names that bound in a fallback's
// detail, and stopped says what the handshake does instead. Provider
// calls may stall (a slow device, a blocked verb) and cannot be
// interrupted, so newURMAConn runs on a goroutine of its own: past end
// the handshake stops waiting for it and falls back, and what the call
// makes when it does finish is released at once. That goroutine holds an
// engine reference (newURMAConn takes it first), so the engine, and the
// provider context the verb runs on, outlive it; and a place among the
// engine's setups, so that a provider that stays stalled leaves at most
// that many goroutines behind, however many connections come meanwhile.
func (e *engine) setUpBy(ctx context.Context, tcp net.Conn, role string, spec jettySpec, end time.Time, within, stopped string) (*urmaConn, *fallback) {
	wctx, cancel := until(ctx, end)
	defer cancel()
	// No setup begins once end has passed: a select with a free place
	// would pick it half the time, and a quick setup would then carry the
	// handshake on as URMA past end (a late hello, which a server that
	// already serves the client as plain TCP reads as application bytes),
	// a slow one would be work done for nothing.
	noTime := func() (*urmaConn, *fallback) {
		return nil, fallbackf(ReasonResources,
			"no time was left to set up the connection's jetty within %s: it had passed before the setup could begin (the handshake's earlier steps took it); %s",
			within, stopped)
	}
	if wctx.Err() != nil {
		return noTime()
	}
	select {
	case e.setups <- struct{}{}:
		if wctx.Err() != nil { // passed meanwhile, as the place freed
			<-e.setups
			return noTime()
		}
	case <-wctx.Done():
		return nil, fallbackf(ReasonResources,
			"the provider has not returned from the jetty setups of %d earlier connections (%s) within %s: a slow device or a stalled verb",
			cap(e.setups), e.setupsBound(), within)
	}
	type made struct {
		c  *urmaConn
		fb *fallback
	}
	got := make(chan made)
	abandoned := make(chan struct{})
	go func() {
		c, fb := newURMAConn(e, tcp, role, spec)
		<-e.setups
		select {
		case got <- made{c, fb}:
		case <-abandoned:
			if c != nil {
				e.log.V(1).Info("releasing a jetty set up after its handshake stopped waiting", "remote", tcp.RemoteAddr().String())
				c.release()
			}
		}
	}()
	select {
	case m := <-got:
		return m.c, m.fb
	case <-wctx.Done():
	}
	// end bounds the wait, not the use of a result in hand, as with the
	// imports (importPeer, whose import that returned is used): a setup
	// that has returned by the time the handshake stops waiting is used,
	// not picked against the deadline at random. The quarter of the
	// peer's wait that end leaves covers that instant.
	select {
	case m := <-got:
		return m.c, m.fb
	default:
	}
	close(abandoned)
	return nil, fallbackf(ReasonResources,
		"the provider did not set up the connection's jetty (take a prepared one or create one, register its buffers, post its receives) within %s: a slow device or a stalled verb; %s, and releases the jetty when the provider returns it",
		within, stopped)
}

// setupsBound names the bound on the engine's setups, for a fallback's
// detail.
func (e *engine) setupsBound() string {
	if e.role == metrics.RoleClient {
		return "the most a dialer runs"
	}
	return "the most a listener runs, Config.AcceptBacklog"
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
	// A client we set up a jetty for (its receive buffers posted, its place
	// in the jetty budget taken) sends its ACK once it has read our hello
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
