package soft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// listenTCP opens the socket fabric's TCP listener.
func listenTCP(sd *fabricSide, spec DeviceSpec, opts Options) error {
	addr := spec.Listen
	if addr == "" {
		addr = opts.Listen
	}
	if len(spec.EIDs) > 1 {
		return fmt.Errorf("device %s: a socket device has one EID, got %d", spec.Name, len(spec.EIDs))
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("device %s: listen on %s: %w", spec.Name, addr, err)
	}
	if len(spec.EIDs) == 1 {
		sd.eid = spec.EIDs[0]
	} else {
		adv := spec.Advertise
		if adv == "" {
			adv = ln.Addr().String()
		}
		ap, err := netip.ParseAddrPort(adv)
		if err == nil {
			sd.eid, err = SocketEID(ap)
		}
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("device %s: advertise address %q (set DeviceSpec.Advertise when listening on an unspecified address): %w", spec.Name, adv, err)
		}
	}
	sd.ln = ln
	return nil
}

// resolve finds the address to dial for eid.
func (sd *fabricSide) resolve(ctx context.Context, eid urma.EID) (string, error) {
	if sd.resolver != nil {
		addr, err := sd.resolver(ctx, eid)
		if err != nil {
			return "", fmt.Errorf("resolve EID %s: %w", eid, err)
		}
		if addr != "" {
			return addr, nil
		}
	}
	if ap, ok := SocketAddr(eid); ok {
		return ap.String(), nil
	}
	return "", fmt.Errorf("EID %s does not encode an address and no resolver knows it", eid)
}

// handshakeIn answers a dialer's HELLO and, unless a connection dialed the
// other way wins, adopts the connection.
//
// Exactly one connection per pair of devices: when both dial at once, the
// connection dialed by the device with the smaller EID wins; the acceptor
// with the smaller EID turns the other dial down (DUPLICATE) while its own
// dial or dialed connection stands, and the dialer then waits for that one.
func (sd *fabricSide) handshakeIn(nc net.Conn) {
	defer sd.endHandshake(nc)
	_ = nc.SetDeadline(time.Now().Add(sd.dialTO))
	var buf [4 + helloLen]byte
	var h hello
	_, err := io.ReadFull(nc, buf[:]) // exactly the HELLO: nothing of what follows is read here
	if err == nil {
		h, err = decodeHello(buf[:])
	}
	if err != nil {
		sd.log().Info("refusing connection: bad HELLO", "remote", nc.RemoteAddr().String(), "reason", err.Error())
		_ = nc.Close()
		return
	}
	var ackBuf [4 + helloAckLen]byte
	ack := helloAck{session: sd.session, eid: sd.eid, maxMsg: sd.dev.caps.MaxMsgSize}
	if h.dst != sd.eid || h.src == sd.eid {
		ack.status = helloWrongEID
		_, _ = nc.Write(encodeHelloAck(ackBuf[:], &ack))
		sd.log().Info("refusing connection: wrong EID", "remote", nc.RemoteAddr().String(), "asked", h.dst.String(), "from", h.src.String())
		_ = nc.Close()
		return
	}
	if err := checkSourceAddr(nc.RemoteAddr(), h.src); err != nil {
		ack.status = helloRefused
		_, _ = nc.Write(encodeHelloAck(ackBuf[:], &ack))
		sd.log().Info("refusing connection", "remote", nc.RemoteAddr().String(), "from", h.src.String(), "reason", err.Error())
		_ = nc.Close()
		return
	}
	p, err := sd.peer(h.src)
	if err != nil {
		_ = nc.Close()
		return
	}
	reserved, err := sd.admit(p, procKey{})
	if err != nil {
		ack.status = helloConnLimit
		_, _ = nc.Write(encodeHelloAck(ackBuf[:], &ack))
		sd.log().Info("refusing connection", "remote", nc.RemoteAddr().String(), "from", h.src.String(), "reason", err.Error())
		_ = nc.Close()
		return
	}
	defer func() {
		if reserved {
			sd.unreserve(procKey{})
		}
	}()
	fd, local, remote, err := detachFD(nc)
	if err != nil {
		sd.log().Error(err, "refusing connection")
		return
	}
	c := newConn(sd, p, newSockIO(fd, nil), h, false, local, remote)
	p.mu.Lock()
	peerWins := bytes.Compare(h.src[:], sd.eid[:]) < 0
	mineStands := p.dialing || (p.conn != nil && p.conn.dialedByMe)
	if !peerWins && mineStands {
		p.mu.Unlock()
		ack.status = helloDuplicate
		_, _ = unix.Write(fd, encodeHelloAck(ackBuf[:], &ack)) // 44 bytes into an empty send buffer: does not block
		_ = unix.Close(fd)
		return
	}
	// The HELLO_ACK is the connection's first frame: queue it before
	// anything else can be.
	var it txItem
	it.n = uint8(len(encodeHelloAck(it.ctl[:], &ack)))
	c.q = append(c.q, it)
	old := sd.adoptLocked(p, c, reserved)
	reserved = false
	p.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection from the peer"))
	}
}

// dialOnceTCP dials the peer over TCP and handshakes once.
func (p *peer) dialOnceTCP(ctx context.Context) error {
	sd := p.sd
	addr, err := sd.resolve(ctx, p.eid)
	if err != nil {
		return err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() }) // device closing: do not wait for the deadline
	defer stop()
	var buf [4 + helloLen]byte
	h := hello{session: sd.session, src: sd.eid, dst: p.eid, maxMsg: sd.dev.caps.MaxMsgSize}
	if _, err := nc.Write(encodeHello(buf[:], &h)); err != nil {
		_ = nc.Close()
		return fmt.Errorf("send HELLO to %s: %w", addr, err)
	}
	var abuf [4 + helloAckLen]byte
	var a helloAck
	if _, err = io.ReadFull(nc, abuf[:]); err == nil {
		a, err = decodeHelloAck(abuf[:])
	}
	if err != nil {
		_ = nc.Close()
		return fmt.Errorf("handshake with %s: %w", addr, err)
	}
	switch {
	case a.status == helloDuplicate:
		_ = nc.Close()
		return errDuplicate
	case a.status == helloRefused:
		_ = nc.Close()
		return fmt.Errorf("%s refused this device: its connection does not come from the address its EID %s names", addr, sd.eid)
	case a.status == helloConnLimit:
		_ = nc.Close()
		return fmt.Errorf("%s refused the connection: device %s holds as many connections as it may, %w", addr, p.eid, ErrConnLimit)
	case a.status == helloWrongEID || a.eid != p.eid:
		_ = nc.Close()
		return fmt.Errorf("%s is device %s, not %s", addr, a.eid, p.eid)
	}
	fd, local, remote, err := detachFD(nc)
	if err != nil {
		return err
	}
	c := newConn(sd, p, newSockIO(fd, nil), hello{session: a.session, src: a.eid, maxMsg: a.maxMsg}, true, local, remote)
	p.mu.Lock()
	old := sd.adoptLocked(p, c, false)
	p.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection"))
	}
	return nil
}
