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
