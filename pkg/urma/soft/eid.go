package soft

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// EID layout of soft devices, 16 bytes in network order:
//
//	bytes 0-5    fd 75 72 6d 61 73  fixed prefix: "urmas" in the IPv6 ULA range
//	byte  6      kind: 1 socket device (IPv4 + port), 2 in-process device,
//	             3 shm device
//	bytes 7-9    zero
//	kind 1:      bytes 10-11 TCP port, bytes 12-15 IPv4 address
//	kind 2:      bytes 8-15 the device's number within its Fabric
//	kind 3:      byte 7 zero, bytes 8-15 random (ShmEID)
//
// In text, 127.0.0.1:4000 is fd75:726d:6173:100:0:fa0:7f00:1. The ULA range
// keeps these EIDs apart from the IPv4-mapped EIDs liburma derives from
// addresses, so a soft EID is never mistaken for a hardware one.
var eidPrefix = [6]byte{0xfd, 0x75, 0x72, 0x6d, 0x61, 0x73}

const (
	eidKindSocket = 1
	eidKindInproc = 2
	eidKindShm    = 3
)

// SocketEID encodes an IPv4 address and TCP port as a soft EID, so that a
// peer can dial the device from its EID alone.
func SocketEID(ap netip.AddrPort) (urma.EID, error) {
	a := ap.Addr().Unmap()
	if !a.Is4() {
		return urma.EID{}, fmt.Errorf("encode soft EID: %s is not an IPv4 address; give the device an explicit EID and its peers a Resolver", ap)
	}
	if a.IsUnspecified() || ap.Port() == 0 {
		return urma.EID{}, fmt.Errorf("encode soft EID: %s is not a dialable address", ap)
	}
	var e urma.EID
	copy(e[:6], eidPrefix[:])
	e[6] = eidKindSocket
	binary.BigEndian.PutUint16(e[10:12], ap.Port())
	v4 := a.As4()
	copy(e[12:], v4[:])
	return e, nil
}

// SocketAddr decodes the address a SocketEID encodes; ok is false for any
// other EID.
func SocketAddr(e urma.EID) (ap netip.AddrPort, ok bool) {
	if [6]byte(e[:6]) != eidPrefix || e[6] != eidKindSocket || e[7] != 0 || e[8] != 0 || e[9] != 0 {
		return netip.AddrPort{}, false
	}
	port := binary.BigEndian.Uint16(e[10:12])
	a := netip.AddrFrom4([4]byte(e[12:16]))
	if port == 0 || a.IsUnspecified() {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a, port), true
}

// checkSourceAddr refuses a socket-fabric dialer whose EID names an
// address (SocketEID) other than the one its connection comes from: a
// process that reaches a device's port could otherwise claim another
// device's EID and take its connection, and the messages meant for it. A
// connection over loopback comes from this network namespace, whose
// processes can listen on any of its addresses anyway: it passes when the
// EID names one of them. An explicit EID (DeviceSpec.EIDs, reached through
// a Resolver) names no address and is not checked.
func checkSourceAddr(remote net.Addr, eid urma.EID) error {
	ap, ok := SocketAddr(eid)
	ta, isTCP := remote.(*net.TCPAddr)
	if !ok || !isTCP {
		return nil
	}
	src, _ := netip.AddrFromSlice(ta.IP)
	src = src.Unmap()
	switch {
	case src == ap.Addr():
		return nil
	case src.IsLoopback() && isLocalAddr(ap.Addr()):
		return nil
	}
	return fmt.Errorf("the connection comes from %s, not from %s, the address its EID %s names", src, ap.Addr(), eid)
}

// isLocalAddr reports whether a is an address of this network namespace.
func isLocalAddr(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, x := range addrs {
		if n, ok := x.(*net.IPNet); ok {
			if b, ok := netip.AddrFromSlice(n.IP); ok && b.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// inprocEID is the default EID of the n-th device of an in-process fabric.
func inprocEID(n uint64) urma.EID {
	var e urma.EID
	copy(e[:6], eidPrefix[:])
	e[6] = eidKindInproc
	binary.BigEndian.PutUint64(e[8:], n)
	return e
}
