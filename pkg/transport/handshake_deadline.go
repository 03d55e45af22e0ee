package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
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
