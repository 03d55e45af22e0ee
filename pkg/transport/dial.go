package transport

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
)

// Dialer dials connections that run on URMA when the server can, and on TCP
// otherwise. It owns a provider context, a registered pool and a jetty pool
// shared by its connections; create one per process (or per peer class)
// and Close it when done. DialContext plugs into grpc.WithContextDialer.
type Dialer struct {
	e  *engine
	nd net.Dialer
	// routeSource finds the host address a connection would leave from
	// (the package's routeSource); tests replace it to take the path where
	// it cannot tell.
	routeSource func(ctx context.Context, network, address string) (netip.Addr, bool)

	mu     sync.Mutex
	closed bool
}

// NewDialer checks cfg and prepares a dialer. URMA is brought up on the
// first dial, before it connects, on the host address that connection
// will use.
func NewDialer(cfg Config) (*Dialer, error) {
	s, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg)
	if err != nil {
		return nil, err
	}
	return &Dialer{
		e:           newEngine(s, metrics.RoleClient, m),
		nd:          net.Dialer{KeepAliveConfig: keepAlive},
		routeSource: routeSource,
	}, nil
}

// Dial connects to address on network (tcp, tcp4 or tcp6).
func (d *Dialer) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	if err := checkNetwork(network); err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	d.mu.Lock()
	closed := d.closed
	if !closed && !d.e.ref() {
		closed = true
	}
	d.mu.Unlock()
	if closed {
		return nil, &net.OpError{Op: "dial", Net: "urma", Err: net.ErrClosed}
	}
	defer d.e.unref() // a URMA connection holds its own reference
	if !d.e.isUp() {
		// Bring URMA up before connecting: a server serves a client that
		// says nothing within urma_first_bytes_timeout (1 s) as plain TCP,
		// so a bring-up that outlasts it (a large pool to register) on an
		// open connection would turn our hello into application bytes.
		if local, ok := d.routeSource(ctx, network, address); ok {
			if err := d.e.startBy(ctx, local); err != nil {
				return nil, bringUpErr(network, address, err)
			}
		}
	}
	tcp, connected, err := d.connect(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if !d.e.isUp() {
		// routeSource could not tell: bring URMA up on the address the
		// connection has, while it is open and silent. If that took so
		// long that our hello could reach the server after it has taken
		// us for a plain TCP client (clientSetupDeadline's bound), a hello
		// on this connection would be read as application bytes: close it
		// unused and connect again, once, with URMA up now. (Falling back
		// to TCP on it instead would keep a long-lived first connection
		// off URMA for good.)
		var local netip.Addr
		if ta, ok := tcp.LocalAddr().(*net.TCPAddr); ok {
			local, _ = netip.AddrFromSlice(ta.IP)
		}
		if err := d.e.startBy(ctx, local); err != nil {
			_ = tcp.Close()
			return nil, bringUpErr(network, address, err)
		}
		if d.e.unavailable() == nil && time.Now().After(d.e.helloBy(connected)) {
			d.e.log.V(1).Info("URMA bring-up outlasted the server's wait for our hello on the first connection; connecting again",
				"remote", tcp.RemoteAddr().String(), "took", time.Since(connected).Round(time.Millisecond))
			_ = tcp.Close()
			if tcp, connected, err = d.connect(ctx, network, address); err != nil {
				return nil, err
			}
		}
	}
	return clientHandshake(ctx, d.e, tcp, connected)
}

// connect opens the TCP connection and says when it came up, where the
// server's clocks for our hello begin.
func (d *Dialer) connect(ctx context.Context, network, address string) (net.Conn, time.Time, error) {
	tcp, err := d.nd.DialContext(ctx, network, address)
	return tcp, time.Now(), err
}

// bringUpErr is the error of a dial whose context ended (err) while it
// waited for URMA's bring-up.
func bringUpErr(network, address string, err error) error {
	return &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf(
		"bring URMA up (open the provider, register the buffer pool) before the handshake with %s; the bring-up goes on for later dials: %w", address, err)}
}

// routeSource is the host address a connection to address would leave
// from: connecting a UDP socket resolves the name and picks the route
// without sending anything.
func routeSource(ctx context.Context, network, address string) (netip.Addr, bool) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "udp"+strings.TrimPrefix(network, "tcp"), address)
	if err != nil {
		return netip.Addr{}, false
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	return netip.AddrFromSlice(ua.IP)
}

// DialContext connects to a TCP address; its signature is the one
// grpc.WithContextDialer takes.
func (d *Dialer) DialContext(ctx context.Context, address string) (net.Conn, error) {
	return d.Dial(ctx, "tcp", address)
}

// FallbackReason says why every connection of this dialer uses TCP, "" when
// URMA is available or not yet brought up (before the first dial).
func (d *Dialer) FallbackReason() string {
	if fb := d.e.unavailable(); fb != nil {
		return fb.String()
	}
	return ""
}

// Close releases the dialer; connections already dialed stay open, and the
// URMA resources go when the last of them closes.
func (d *Dialer) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.e.unref()
	return nil
}

// Dial connects once with a Dialer of its own, released when the
// connection closes.
func Dial(ctx context.Context, network, address string, cfg Config) (net.Conn, error) {
	d, err := NewDialer(cfg)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Dial(ctx, network, address)
}
