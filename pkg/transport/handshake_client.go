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
