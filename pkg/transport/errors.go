package transport

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// ErrProtocol marks a connection closed because the peer broke the data-plane
// protocol: a credit above the window, a zero-length message without a
// credit, a message larger than a receive buffer, data on the TCP
// connection after URMA took over.
var ErrProtocol = errors.New("URMA transport protocol error")

func protocolErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, args...))
}

// errConnClosed is what operations on a closed connection return, wrapped
// in *net.OpError like the net package does.
var errConnClosed = net.ErrClosed

// errPeerClosed is what Write returns once the peer has closed: EPIPE, as a
// TCP socket would say.
var errPeerClosed = fmt.Errorf("peer closed the connection: %w", syscall.EPIPE)

// errPeerAborted is why a connection fails when its TCP connection breaks
// (a reset, a keepalive timeout): the peer failed the connection, or the
// network is gone. Never io.EOF: the stream may be truncated.
var errPeerAborted = errors.New("the peer aborted the connection, or the network failed")

// errPeerVanished is why a connection fails when a peer that ends with a
// close marker closes its TCP connection without one: its process died or
// lost its device mid-stream. It wraps ECONNRESET, as a reset would.
var errPeerVanished = fmt.Errorf("the peer's TCP connection ended without its close marker (the peer died mid-stream): %w", syscall.ECONNRESET)
