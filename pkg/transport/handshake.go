package transport

import (
	"context"
	"encoding/binary"
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

// boundHandshake bounds a handshake by timeout (or ctx's deadline, if
// sooner): the returned context ends then, or when ctx does, and the TCP
// connection's deadline follows it, so every step, fabric imports included,
// gives up together. The returned func disarms both.
func boundHandshake(ctx context.Context, tcp net.Conn, timeout time.Duration) (context.Context, func()) {
	hctx, cancel := context.WithTimeout(ctx, timeout)
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
// A client that cannot use URMA at all sends nothing and is a plain TCP
// client; the server serves it transparently.
func clientHandshake(ctx context.Context, e *engine, tcp net.Conn) (Conn, error) {
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
	tcpMode := func(fb fallback, prefix []byte, version int) Conn {
		return newTCPConn(tcp, role, fb, prefix, version, e.bufSize, e.metrics)
	}
	if e.unavailable() != nil {
		return done(tcpMode(*e.unavailable(), nil, 0), metrics.ResultFallback)
	}
	c, fb := newURMAConn(e, tcp, role)
	if fb != nil {
		if fb.reason == ReasonBudgetExhausted && e.s.failOnBudget {
			e.metrics.Handshake(metrics.ResultError, role, time.Since(start).Seconds())
			_ = tcp.Close()
			return nil, fmt.Errorf("dial %s: %s (Config.FailWhenBudgetExhausted)", tcp.RemoteAddr(), fb)
		}
		return done(tcpMode(*fb, nil, 0), metrics.ResultFallback)
	}
	version := handshake.Version(e.s.flags.ClientHandshakeVersion)
	hctx, stop := boundHandshake(ctx, tcp, e.s.handshakeTimeout)
	conn, result, err := c.clientExchange(hctx, version)
	stop()
	if err != nil {
		c.release()
		_ = tcp.Close()
		e.metrics.Handshake(metrics.ResultError, role, time.Since(start).Seconds())
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return nil, fmt.Errorf("URMA handshake with %s: %w", tcp.RemoteAddr(), err)
	}
	return done(conn, result)
}

// clientExchange does the client's bytes; an error means the connection is
// unusable.
func (c *urmaConn) clientExchange(ctx context.Context, version handshake.Version) (Conn, string, error) {
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
		return nil, "", fmt.Errorf("read the server's hello: %w", err)
	}
	if string(magic[:]) != magicOf(version) {
		// Not a URMA server: keep its bytes for the application, as brpc
		// does, and send no ACK it would not understand.
		return fallBack(fallbackf(ReasonPeerNotURMA, "the server answered %q, not %q", magic[:], magicOf(version)), magic[:], false)
	}
	h, _, err := handshake.ReadHello(tcp, magic[:])
	if err != nil {
		if !errors.Is(err, handshake.ErrInvalidHello) {
			return nil, "", fmt.Errorf("read the server's hello: %w", err)
		}
		if handshake.IsFallback(h) {
			return fallBack(fallbackf(ReasonPeerDeclined, "the server answered with a fallback hello"), nil, true)
		}
		return fallBack(fallbackf(ReasonInvalidHello, "server hello: %v", err), nil, true)
	}
	if fb := c.applyPeer(ctx, h); fb != nil {
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
func serverHandshake(ctx context.Context, e *engine, tcp net.Conn) (Conn, error) {
	start := time.Now()
	role := metrics.RoleServer
	hctx, stop := boundHandshake(ctx, tcp, e.s.handshakeTimeout)
	conn, result, err := serverExchange(hctx, e, tcp)
	stop()
	e.metrics.Handshake(result, role, time.Since(start).Seconds())
	if err != nil {
		_ = tcp.Close()
		return nil, fmt.Errorf("URMA handshake with %s: %w", tcp.RemoteAddr(), err)
	}
	if tc, ok := conn.(*tcpConn); ok {
		e.metrics.Fallback(string(tc.why.reason), role)
		e.log.V(1).Info("connection falls back to TCP", "remote", tcp.RemoteAddr().String(), "reason", tc.why.String())
	}
	return conn, nil
}

func serverExchange(ctx context.Context, e *engine, tcp net.Conn) (Conn, string, error) {
	role := metrics.RoleServer
	tcpMode := func(fb *fallback, prefix []byte, version int) (Conn, string, error) {
		return newTCPConn(tcp, role, *fb, prefix, version, e.bufSize, e.metrics), metrics.ResultFallback, nil
	}
	var magic [handshake.MagicLen]byte
	n, err := io.ReadFull(tcp, magic[:])
	switch {
	case err == nil:
	case isTimeout(err):
		// A client that waits for the server to speak first: serve it as
		// plain TCP with whatever it sent.
		return tcpMode(fallbackf(ReasonPeerSilent, "the client sent %d bytes within %s, not a hello", n, e.s.handshakeTimeout), magic[:n], 0)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		// It sent a few bytes (or none) and closed: the application sees
		// them and then EOF.
		return tcpMode(fallbackf(ReasonPeerNotURMA, "the client sent %d bytes and closed", n), magic[:n], 0)
	default:
		return nil, metrics.ResultError, fmt.Errorf("read the client's first bytes: %w", err)
	}
	version, ok := handshake.IsMagic(magic[:])
	if !ok {
		return tcpMode(fallbackf(ReasonPeerNotURMA, "the client's first bytes %q are not a hello", magic[:]), magic[:], 0)
	}
	h, _, err := handshake.ReadHello(tcp, magic[:])
	if err != nil && !errors.Is(err, handshake.ErrInvalidHello) {
		return nil, metrics.ResultError, fmt.Errorf("read the client's hello: %w", err)
	}
	// Decide: URMA, or why not.
	var fb *fallback
	var c *urmaConn
	switch {
	case err != nil:
		fb = fallbackf(ReasonInvalidHello, "client hello: %v", err)
	case e.unavailable() != nil:
		fb = e.unavailable()
	default:
		c, fb = newURMAConn(e, tcp, role)
		if fb == nil {
			if fb = c.applyPeer(ctx, h); fb != nil {
				c.release()
				c = nil
			}
		}
	}
	if fb != nil && fb.reason == ReasonBudgetExhausted && e.s.failOnBudget {
		return nil, metrics.ResultError, fmt.Errorf("%s (Config.FailWhenBudgetExhausted)", fb)
	}
	var reply []byte
	if c != nil {
		reply = appendHello(nil, version, c.localHello())
	} else {
		reply = appendFallbackHello(nil, version)
	}
	fail := func(err error) (Conn, string, error) {
		if c != nil {
			c.release()
		}
		return nil, metrics.ResultError, err
	}
	if _, err := tcp.Write(reply); err != nil {
		return fail(fmt.Errorf("send hello: %w", err))
	}
	// A foreign client (no extension in its hello: brpc) that we decline
	// may send no ACK at all: brpc's URMA client goes straight to TCP.
	// Its first bytes then cannot pass for an ACK (reserved bits set), or
	// it says nothing until the handshake timeout; either way it is served
	// as TCP with nothing lost. Our own clients always send the ACK.
	lenient := c == nil && !h.HasToken && h.SQSize == 0
	var ackBytes [handshake.AckLen]byte
	n, err = io.ReadFull(tcp, ackBytes[:])
	if err != nil {
		if lenient && isTimeout(err) {
			return tcpMode(fb, ackBytes[:n], int(version))
		}
		return fail(fmt.Errorf("read handshake ACK: %w", err))
	}
	flags := binary.BigEndian.Uint32(ackBytes[:])
	useURMA := flags&handshake.AckUseURMA != 0
	if lenient && flags&^handshake.AckUseURMA != 0 {
		return tcpMode(fb, ackBytes[:], int(version))
	}
	switch {
	case !useURMA && c != nil:
		c.release()
		return tcpMode(fallbackf(ReasonPeerDeclined, "the client's ACK (flags %#x) asks for TCP", flags), nil, int(version))
	case !useURMA:
		return tcpMode(fb, nil, int(version))
	case c == nil:
		return fail(fmt.Errorf("the client asks for URMA (ACK flags %#x) although the server fell back (%s)", flags, fb))
	}
	if err := c.establish(int(version)); err != nil {
		return fail(err)
	}
	return c, metrics.ResultURMA, nil
}
