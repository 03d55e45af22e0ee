package transport

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/openeuler/urma-k8s/internal/podenv"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/transport/metrics"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// The values of urma_soft_fabric (Config.SoftFabric, URMA_SOFT_FABRIC,
// --urma_soft_fabric): how the software provider reaches a peer. They do
// not apply to liburma, nor to a provider given in Config.Provider.
const (
	// FabricAuto uses shared memory with a peer on the same host, the
	// socket fabric with a peer on another host that runs it too (the
	// software provider's stand-in for UB between hosts), and serves any
	// other connection as plain TCP (ReasonNoFastPath).
	FabricAuto = "auto"
	// FabricShm uses shared memory with a peer on the same host and
	// serves any other connection as plain TCP: auto without the socket
	// fabric (no listener of its own on the host's network).
	FabricShm = "shm"
	// FabricSocket uses the socket fabric with every peer: URMA semantics
	// over TCP, to emulate UB hosts (tests, demos).
	FabricSocket = "socket"
)

var fabricNames = []string{FabricAuto, FabricShm, FabricSocket}

// Environment variables of the software provider's fabrics.
const (
	EnvSoftFabric = "URMA_SOFT_FABRIC"
	// EnvShmDir is the directory where same-host processes meet (the
	// device plugin mounts the host's /var/run/urma-k8s/shm there). Unset,
	// it is urma-k8s-shm-<uid> in the temporary directory.
	EnvShmDir = podenv.ShmDir
	// EnvShmSocketDir is where this process's shm device creates its
	// socket: the pod's own subdirectory of EnvShmDir, the one it may
	// write to. Unset, it is EnvShmDir itself.
	EnvShmSocketDir = podenv.ShmSocketDir
	// EnvPodIP is the pod's address (the downward API's status.podIP): the
	// socket fabric listens there when a connection's own address is
	// unspecified.
	EnvPodIP = "POD_IP"
	// EnvHostID names the host the process runs on, for the choice of
	// fabric, where several nodes share one kernel (kind-like clusters,
	// make e2e's two nodes) and so one boot id: set it from the downward
	// API's spec.nodeName. Unset, the kernel's boot id names the host.
	EnvHostID = "URMA_HOST_ID"
)

// hostIDBoot is the boot id a process with URMA_HOST_ID=id sends in its
// hellos: a digest of id, so that any text names a host and two processes
// with the same id meet as one host.
func hostIDBoot(id string) [handshake.BootIDLen]byte {
	sum := sha256.Sum256([]byte("urma-k8s host id\x00" + id))
	return [handshake.BootIDLen]byte(sum[:handshake.BootIDLen])
}

// fabricSettings is urma_soft_fabric resolved.
type fabricSettings struct {
	choice   string // auto, shm or socket
	shmDir   string
	sockDir  string // EnvShmSocketDir, "" when unset
	ringSize int
	podIP    string // EnvPodIP, "" when unset
}

// resolveFabric applies Config > URMA_SOFT_FABRIC > --urma_soft_fabric.
func resolveFabric(cfg string, env func(string) (string, bool), f flags.Flags) (fabricSettings, error) {
	name, source := cfg, "Config.SoftFabric"
	if name == "" {
		if v, ok := env(EnvSoftFabric); ok && strings.TrimSpace(v) != "" {
			name, source = v, EnvSoftFabric
		}
	}
	if name == "" {
		name, source = f.SoftFabric, "--urma_soft_fabric"
	}
	fs := fabricSettings{choice: strings.ToLower(strings.TrimSpace(name)), ringSize: f.ShmRingSize}
	if v, ok := env(EnvPodIP); ok {
		fs.podIP = strings.TrimSpace(v)
	}
	switch fs.choice {
	case FabricAuto, FabricShm, FabricSocket:
	case "":
		fs.choice = FabricAuto
	default:
		return fabricSettings{}, fmt.Errorf("transport config: %s=%q: want one of %s", source, name, strings.Join(fabricNames, ", "))
	}
	if v, ok := env(EnvShmDir); ok && strings.TrimSpace(v) != "" {
		fs.shmDir = strings.TrimSpace(v)
	} else {
		fs.shmDir = filepath.Join(os.TempDir(), fmt.Sprintf("urma-k8s-shm-%d", os.Geteuid()))
	}
	if v, ok := env(EnvShmSocketDir); ok {
		fs.sockDir = strings.TrimSpace(v)
	}
	return fs, nil
}

// fabricState is which fabric the engine's software provider uses.
type fabricState struct {
	name   string // shm or socket; "" for liburma or a given provider
	bootID [handshake.BootIDLen]byte
	// socketEID is where the device is also reached over the socket
	// fabric, from other hosts (urma_soft_fabric=auto on shm); zero when
	// the device has no socket side.
	socketEID urma.EID
}

// newSoftProvider creates the software provider on the fabric
// urma_soft_fabric chooses, with one device named as configured (or
// soft0). The socket fabric listens on the host address connections use;
// the shm fabric in the shm directory.
func (e *engine) newSoftProvider(local netip.Addr) (*soft.Provider, error) {
	name := e.s.device
	if name == "" {
		name = soft.DefaultDevice
	}
	opts := soft.Options{
		Devices: []soft.DeviceSpec{{Name: name}},
		// Both fabrics. The handshake's server dials its client's device,
		// so this bounds how many server processes a client reaches.
		MaxConns: e.s.flags.SoftMaxConns,
		Logger:   e.log.WithName("soft").V(1), // its connection events are detail; errors still show
	}
	// A peer that shares its whole pool (urma_pool_remote_read) makes
	// this side map that much of it: room for a pool as large as this
	// side's, the peers' flags being this side's.
	if pool := uint64(e.s.flags.BufferSize) * uint64(e.s.flags.BufferCount); pool > soft.DefaultMaxMappedPerConn {
		opts.MaxMappedPerConn, opts.MaxMappedBytes = pool, max(soft.DefaultMaxMappedBytes, 16*pool)
	}
	fs := e.s.fabric
	opts.Listen = net.JoinHostPort(advertiseAddr(local, fs.podIP).String(), "0")
	if fs.choice == FabricSocket {
		// The boot id still goes into hellos, so that a peer on shared
		// memory can say why it declines.
		boot, _ := e.s.bootID()
		e.fabric = fabricState{name: FabricSocket, bootID: boot}
		p, err := soft.New(opts)
		if err != nil {
			e.fabric = fabricState{}
			return nil, err
		}
		return p, nil
	}
	boot, err := e.s.bootID()
	if err != nil {
		return nil, fmt.Errorf("urma_soft_fabric=%s: %w", fs.choice, err)
	}
	opts.ShmDir, opts.ShmSocketDir, opts.ShmRingSize = fs.shmDir, fs.sockDir, fs.ringSize
	e.fabric = fabricState{name: FabricShm, bootID: boot}
	if fs.choice == FabricAuto {
		// The device's socket side, for peers on other hosts.
		both := opts
		both.AlsoSocket = true
		p, err := soft.New(both)
		if err == nil {
			devs, derr := p.Devices()
			if derr == nil && len(devs) > 0 && len(devs[0].EIDs) > 1 {
				e.fabric.socketEID = devs[0].EIDs[1].EID
			}
			return p, nil
		}
		// Shared memory alone still serves this host.
		e.log.Info("the socket fabric cannot start: connections to other hosts will use TCP", "listen", opts.Listen, "error", err.Error())
	}
	p, err := soft.New(opts)
	if err != nil {
		e.fabric = fabricState{}
		return nil, fmt.Errorf("urma_soft_fabric=%s: the shm fabric cannot start in %s=%s: %w", fs.choice, EnvShmDir, fs.shmDir, err)
	}
	return p, nil
}

// peerRoute is how a connection reaches its peer's device: over which
// fabric, and at which of the device's EIDs (zero: the ones its hello
// names).
type peerRoute struct {
	fabric string
	eid    urma.EID
}

// routeTo chooses how the software provider the engine made reaches the
// peer of hello h: shared memory with a peer on this host in the same shm
// directory; the socket fabric with a peer on another host when both
// sides run it (the peer's hello names a socket EID, as its main EID or
// as the one its device is also reached at); else a fallback that says
// why not. The zero route, with no fallback, leaves the hello's EIDs and
// the engine's fabric name as they are (liburma, Config.Provider).
func (e *engine) routeTo(h handshake.Hello) (peerRoute, *fallback) {
	otherHost := h.HasBootID() && h.BootID != e.fabric.bootID
	switch e.fabric.name {
	case FabricSocket:
		if !soft.IsShmEID(h.EID) {
			return peerRoute{fabric: FabricSocket}, nil
		}
		if otherHost && h.HasSocketEID() {
			return peerRoute{fabric: FabricSocket, eid: h.SocketEID}, nil
		}
		return peerRoute{}, fallbackf(ReasonNoFastPath, "the peer's software provider uses shared memory and this side forces the socket fabric (urma_soft_fabric=socket)")
	case FabricShm:
	default:
		return peerRoute{}, nil
	}
	fb := e.shmPath(h)
	if fb == nil {
		return peerRoute{fabric: FabricShm}, nil
	}
	if !otherHost {
		return peerRoute{}, fb
	}
	if e.fabric.socketEID.IsZero() {
		if e.s.fabric.choice == FabricShm {
			fb.detail += "; this side uses shared memory only (urma_soft_fabric=shm; auto also reaches other hosts over the socket fabric)"
		} else {
			fb.detail += "; this side's socket fabric did not start (its log says why)"
		}
		return peerRoute{}, fb
	}
	switch {
	case h.HasSocketEID():
		return peerRoute{fabric: FabricSocket, eid: h.SocketEID}, nil
	case isSocketEID(h.EID):
		return peerRoute{fabric: FabricSocket}, nil
	}
	fb.detail += "; the peer offers no socket fabric (urma_soft_fabric=shm there, or an older urma-k8s)"
	return peerRoute{}, fb
}

// isSocketEID reports whether eid is a soft device's on the socket fabric.
func isSocketEID(eid urma.EID) bool {
	_, ok := soft.SocketAddr(eid)
	return ok
}

// shmPath says why the shm fabric cannot reach the peer of hello h; nil
// when it can.
func (e *engine) shmPath(h handshake.Hello) *fallback {
	why := "; the software provider would carry it over TCP, slower than TCP itself (urma_soft_fabric=socket forces that)"
	switch {
	case !h.HasBootID():
		return fallbackf(ReasonNoFastPath, "the peer does not say which host it runs on (brpc, or an older urma-k8s)%s", why)
	case h.BootID != e.fabric.bootID:
		// routeTo says why the socket fabric does not carry it either.
		return fallbackf(ReasonNoFastPath, "the peer runs on another host (another boot id)")
	case !soft.IsShmEID(h.EID):
		return fallbackf(ReasonNoFastPath, "the peer is on this host but its software provider does not use shared memory (urma_soft_fabric=socket there)")
	}
	paths, err := soft.ShmSocketCandidates(e.s.fabric.shmDir, h.EID)
	switch {
	case err != nil:
		return fallbackf(ReasonNoFastPath, "the peer's shm socket: %v", err)
	case len(paths) == 0:
		return fallbackf(ReasonNoFastPath, "the peer is on this host but meets its peers in another shm directory than %s=%s", EnvShmDir, e.s.fabric.shmDir)
	}
	return nil
}

// checkClientAddress says why a server will not import, over the socket
// fabric, the device a client's hello names; nil when it may, and when the
// connection does not go over the socket fabric (routeTo). A socket-fabric
// EID encodes the IPv4 address and port its device listens on, and
// importing the segment and jetty connects there: a client that could name
// any address would make the server connect wherever it likes. So the EIDs
// the server would import (the hello's, or the socket EID it offers for
// other hosts) must name the address the client's connection comes from
// (remote); the port cannot be checked.
func (e *engine) checkClientAddress(h handshake.Hello, remote net.Addr) *fallback {
	route, fb := e.routeTo(h)
	if fb != nil || route.fabric != FabricSocket {
		return nil // routeTo's fallback, if any, comes when the peer is applied
	}
	named := []struct {
		what string
		eid  urma.EID
	}{{"jetty", h.EID}, {"segment", h.SegEID}}
	if !route.eid.IsZero() {
		named = named[:1]
		named[0].what, named[0].eid = "device's socket side", route.eid
	}
	from, err := netip.ParseAddrPort(remote.String())
	if err != nil {
		return fallbackf(ReasonPeerAddress, "cannot tell the address of the client's connection (%s), which is the only one the server connects to on the socket fabric: %v", remote, err)
	}
	for _, n := range named {
		ap, ok := soft.SocketAddr(n.eid)
		if ok && ap.Addr() != from.Addr().Unmap() {
			return fallbackf(ReasonPeerAddress,
				"the client's hello names its %s on a socket-fabric device at %s, but the client connects from %s: the server connects only to the address a client connects from",
				n.what, ap, from.Addr().Unmap())
		}
	}
	return nil
}

// fabricName names the fabric a connection of this engine runs on by
// default, for Debug and metrics: shm or socket for the software provider
// the engine made, else the provider's name. A connection's own route
// (urmaConn.fabricName) may differ.
func (e *engine) fabricName() string {
	if e.fabric.name != "" {
		return e.fabric.name
	}
	return e.provName
}

// readerSpin is how long a reader with nothing to read polls for its
// message itself (spinRead): urma_event_spin in event mode, except on the
// socket fabric. There the poll cannot deliver anything: a message arrives
// through the provider's reader goroutine, back from a read system call,
// and that goroutine needs a processor the spinner holds. On this 2-core
// VM the spin doubled the socket fabric's 64 B round trip (270-290 µs
// against 115-135 µs) and cost its 1 MiB stream about a tenth
// (docs/benchmarks.md). On shm the poll takes the message from the peer's
// ring, and hardware writes its completion queue itself.
func (e *engine) readerSpin(fabric string) time.Duration {
	if e.s.flags.UsePolling || fabric == FabricSocket {
		return 0
	}
	return e.s.flags.EventSpin
}

// The software provider refuses a peer device past its connection limit
// with soft.ErrConnLimit, which names soft.Options.MaxConns: the hints
// below name the flag that sets it here.

// importFailed is ReasonImportFailed for the failed import err. When the
// peer's software device refused this one for its connection limit, the
// detail says which flag, on which side, raises it.
func (c *urmaConn) importFailed(err error) *fallback {
	if errors.Is(err, soft.ErrConnLimit) {
		return fallbackf(ReasonImportFailed, "%v; raise --urma_soft_max_conns on the %s, which sets that limit", err, peerRole(c.role))
	}
	return fallbackf(ReasonImportFailed, "%v", err)
}

// peerDeclined is ReasonPeerDeclined. The peer does not say why it
// declined; when this process's software device refused peer devices for
// its connection limit while the handshake ran, the peer's import may
// have been one, so the detail names the flag that raises the limit.
func (c *urmaConn) peerDeclined(format string, args ...any) *fallback {
	fb := fallbackf(ReasonPeerDeclined, format, args...)
	if n := c.e.connLimitRefusals() - c.limitMark; n > 0 {
		fb.detail += fmt.Sprintf(" (meanwhile this process's software device refused %d peer device(s) at its connection limit: if the %s's was one, raise --urma_soft_max_conns here)", n, peerRole(c.role))
	}
	return fb
}

// connLimitRefusals is how many peer devices the engine's provider has
// refused for its connection limit: always 0 but for the software one.
func (e *engine) connLimitRefusals() uint64 {
	if sp, ok := e.prov.(*soft.Provider); ok {
		return sp.ConnLimitRefusals()
	}
	return 0
}

func peerRole(role string) string {
	if role == metrics.RoleClient {
		return metrics.RoleServer
	}
	return metrics.RoleClient
}
