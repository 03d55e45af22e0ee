package soft

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// Hard limits of the software provider. Device capabilities may ask for less,
// never for more.
const (
	// MaxSGE is the most scatter/gather elements a work request can carry.
	MaxSGE = urma.SoftMaxSGE
	// MaxMsgSizeLimit bounds DeviceCaps.MaxMsgSize, and with it the largest
	// frame the socket fabric accepts.
	MaxMsgSizeLimit = 1 << 30
	// DefaultDevice is the name of the device a Provider has when Options
	// lists none.
	DefaultDevice = "soft0"
	// Driver is the driver name soft devices report.
	Driver = urma.SoftDriver
	// MinShmRing and MaxShmRing bound Options.ShmRingSize.
	MinShmRing = shmring.MinSize
	MaxShmRing = shmring.MaxSize
	// DefaultShmRing is the ring each side of an shm connection writes
	// into. It is charged to the memory cgroup of the process that
	// creates it, once per peer device.
	DefaultShmRing = 2 << 20
	// DefaultShmSpin is how long an idle shm reader or writer polls
	// shared memory before it sleeps on its eventfd.
	DefaultShmSpin = 2 * time.Microsecond
	// DefaultMaxConns is Options.MaxConns when left zero.
	DefaultMaxConns = 1024
	// DefaultMaxConnsPerProcess is Options.MaxConnsPerProcess when left
	// zero: far more than the transport's one device per Listener or
	// Dialer makes one process dial a device.
	DefaultMaxConnsPerProcess = 64
)

// ErrConnLimit is under every error of a device refused for its
// connection limit (Options.MaxConns): a dial or import refused by a peer
// device that holds as many connections as it may, the peer's refusal
// arriving as a status code. errors.Is finds it, so that a caller can name
// the setting it exposes for the limit.
var ErrConnLimit = errors.New("the most Options.MaxConns allows")

// Resolver maps a peer's EID to the TCP address ("host:port") to dial. It
// returns "" and no error to fall back to decoding the address from the EID,
// which is how IPv6 or NAT'd peers are reached: give them an EID of your
// choice (DeviceSpec.EIDs) and resolve it here.
type Resolver func(ctx context.Context, eid urma.EID) (string, error)

// Options configures a Provider.
type Options struct {
	// Fabric selects the in-process fabric: the devices of every Provider
	// created with the same Fabric reach each other directly. Nil selects
	// the socket fabric, or the shm fabric when ShmDir is set.
	Fabric *Fabric
	// ShmDir selects the shm fabric: devices of processes on one host
	// reach each other through shared memory, meeting at unix sockets in
	// this directory (created 0700 if missing). In a pod it is
	// $URMA_SHM_DIR, which the device plugin mounts from the host. A
	// dialer finds a peer's socket there or one level down (see
	// ShmSocketCandidates).
	ShmDir string
	// ShmSocketDir is where this provider's shm devices create their
	// sockets (created 0700 if missing); "" means ShmDir. In a pod it is
	// $URMA_SHM_SOCKET_DIR, the pod's own subdirectory of ShmDir, the one
	// the pod may write to.
	ShmSocketDir string
	// ShmRingSize is the ring each side of an shm connection writes into,
	// a power of two in MinShmRing..MaxShmRing; 0 means DefaultShmRing.
	// Each connection (one per pair of devices) costs its creator this
	// much shared memory, charged to its memory cgroup.
	ShmRingSize int
	// ShmSpin is how long an idle shm reader or writer polls shared memory
	// before it sleeps on its eventfd: a peer that answers within it costs
	// no syscall. 0 means DefaultShmSpin; negative never spins.
	ShmSpin time.Duration
	// ShmAllowUID decides which users' processes may connect over shm
	// (checked with SO_PEERCRED on both sides); nil allows every user.
	// It is no defence: a peer proves its EID with its key whoever it
	// runs as (docs/software-provider.md#identity).
	ShmAllowUID func(uid uint32) bool
	// Listen is the socket fabric's TCP listen address for devices that do
	// not name their own; "" means "127.0.0.1:0". In a pod use the pod IP.
	Listen string
	// AlsoSocket, with ShmDir, makes each device reachable on both
	// fabrics, as a UB device reaches every host: peers on this host over
	// shared memory at its shm EID (index 0), peers on other hosts over
	// TCP at a second EID (index 1) encoding its socket fabric address
	// (Listen, or the device's own Listen and Advertise). Both EIDs name
	// the same device: a jetty or segment is reached through either, and
	// an import or send goes over the fabric of the EID it names. The
	// device's explicit EIDs, if any, name its shm EID only.
	AlsoSocket bool
	// Devices lists the virtual devices; nil means one device, soft0, with
	// DefaultCaps.
	Devices []DeviceSpec
	// Resolver maps EIDs to dial addresses (socket fabric); nil decodes them.
	Resolver Resolver
	// PeerTimeout: a socket peer from which nothing arrived for this long is
	// declared dead; its connection is closed and the sends outstanding on
	// it complete with ACK_TIMEOUT. Idle connections carry a heartbeat every
	// PeerTimeout/4. On the shm fabric, where the unix socket reports a
	// dead peer at once, it bounds how long a live peer may stop in the
	// middle of a frame it writes (and so how long a Poll reading that
	// frame can take), and how long it may stop reading or answering
	// while something of this side waits on it (a full ring, sends or
	// imports to answer); an idle shm peer is never timed out. On both
	// fabrics a peer may take over one frame, in all, no longer than
	// PeerTimeout plus PeerTimeout for every MiB of it that arrived: one
	// that trickles a frame fails as one that stops. Zero means 3s.
	PeerTimeout time.Duration
	// DialTimeout bounds connecting and handshaking with a peer device.
	// Zero means 3s.
	DialTimeout time.Duration
	// MaxConns bounds each device's connections (socket and shm fabrics),
	// one per peer device, since each holds goroutines, descriptors and,
	// on shm, a ring this side pays for. A peer device that dials in
	// while the device holds MaxConns, counting those being accepted, is
	// refused, and so is a dial in while MaxConns are in their handshake;
	// a peer replacing its connection, or answering one this side dials,
	// is not, and this side's own dials are never refused. A full device
	// first makes room by evicting the oldest connection dialed in that
	// it never used (no import or send of its own over it, and no send of
	// the peer's that passed a token check), so that peers with made-up
	// identities, which cost nothing, cannot keep a legitimate peer out;
	// only when every connection is in use is a peer refused. Zero or
	// negative means DefaultMaxConns.
	MaxConns int
	// MaxConnsPerProcess bounds the connections, and the handshakes under
	// way, that one process dialing in may hold at a device (shm fabric),
	// where the kernel names the process that connected: by its pidfs
	// inode (Linux 6.9 and later) in any pid namespace, else by its pid
	// when it is in this process's pid namespace or one below; a dialer
	// in another pod on an older kernel is bounded by MaxConns alone. A
	// dial past it is refused like one past MaxConns (ErrConnLimit at
	// the dialer), and the device logs the bound. Zero or negative means
	// DefaultMaxConnsPerProcess.
	MaxConnsPerProcess int
	// MaxPeerSegments bounds the segments one peer connection may make
	// this side map for one-copy SENDs (shm fabric); zero or negative
	// means DefaultMaxPeerSegments. A SEG_MAP past it is refused, and the
	// peer sends from that segment by copy.
	MaxPeerSegments int
	// MaxMappedPerConn bounds the bytes of peer segments one shm
	// connection may make this side map; 0 means DefaultMaxMappedPerConn.
	MaxMappedPerConn uint64
	// MaxMappedBytes bounds the bytes of peer segments all of this
	// provider's shm connections together may make it map (address
	// space, not memory: the memory is the peers'); 0 means
	// DefaultMaxMappedBytes.
	MaxMappedBytes uint64
	// Logger receives connection events and protocol errors; zero discards.
	Logger logr.Logger
}

// DeviceSpec describes one virtual device.
type DeviceSpec struct {
	// Name is the device name; "" means soft<N> by position.
	Name string
	// TransportType is what the device reports; zero is TransportUB, since
	// the provider implements UB semantics.
	TransportType urma.TransportType
	// Caps are the device's capabilities; each zero field takes its value
	// from DefaultCaps. MaxJFSSge and MaxJFRSge are at most MaxSGE and
	// MaxMsgSize at most MaxMsgSizeLimit; PortCount follows Ports;
	// OrderedRM follows UnorderedRM.
	Caps urma.DeviceCaps
	// UnorderedRM makes the device report OrderedRM false, to test callers
	// that must refuse such a device. Delivery itself stays in order.
	UnorderedRM bool
	// Ports are the device's ports; nil means one ACTIVE port. Port state is
	// informational: traffic flows whatever it says.
	Ports []urma.Port
	// EIDs are the device's EIDs. In-process: nil means one EID drawn from
	// the fabric; several are allowed, each unique in the fabric. Socket:
	// at most one; nil means the EID encoding the advertised address, and an
	// explicit EID needs a Resolver on the peers unless it is that encoding.
	// Shm: at most one, and only with ShmKey, whose EID it must be: an shm
	// EID is the hash of the device's key.
	EIDs []urma.EID
	// ShmKey is an shm device's ed25519 key, which its EID is the hash of
	// (ShmEIDOfKey) and which proves that EID to peers; nil draws a fresh
	// one. Give it to keep a device's EID across restarts; keep it as
	// secret as the traffic.
	ShmKey ed25519.PrivateKey
	// Listen overrides Options.Listen for this device (socket fabric).
	Listen string
	// Advertise is the "ip:port" peers dial and the EID encodes, when it
	// differs from the listener's address (for example a listener on
	// 0.0.0.0). It must be an IPv4 address unless EIDs is set.
	Advertise string
}

// DefaultCaps are the capabilities of a device whose DeviceSpec leaves them zero.
func DefaultCaps() urma.DeviceCaps { return urma.SoftDeviceCaps() }

const (
	defaultPeerTimeout = 3 * time.Second
	defaultDialTimeout = 3 * time.Second
)

// withDefaults fills a spec's zero fields and checks the result.
func (s DeviceSpec) withDefaults(pos int) (DeviceSpec, error) {
	if s.Name == "" {
		s.Name = fmt.Sprintf("soft%d", pos)
	}
	d := DefaultCaps()
	c := &s.Caps
	fill := func(v *uint32, def uint32) {
		if *v == 0 {
			*v = def
		}
	}
	fill(&c.MaxJFC, d.MaxJFC)
	fill(&c.MaxJFS, d.MaxJFS)
	fill(&c.MaxJFR, d.MaxJFR)
	fill(&c.MaxJetty, d.MaxJetty)
	fill(&c.MaxJFCDepth, d.MaxJFCDepth)
	fill(&c.MaxJFSDepth, d.MaxJFSDepth)
	fill(&c.MaxJFRDepth, d.MaxJFRDepth)
	fill(&c.MaxJFSInlineSize, d.MaxJFSInlineSize)
	fill(&c.MaxJFSSge, d.MaxJFSSge)
	fill(&c.MaxJFSRsge, d.MaxJFSRsge)
	fill(&c.MaxJFRSge, d.MaxJFRSge)
	fill(&c.MaxEIDCnt, d.MaxEIDCnt)
	if c.MaxMsgSize == 0 {
		c.MaxMsgSize = d.MaxMsgSize
	}
	if c.TransMode == 0 {
		c.TransMode = d.TransMode
	}
	// Delivery is always in order; the device says so unless told not to.
	c.OrderedRM = !s.UnorderedRM
	switch {
	case c.MaxJFSSge > MaxSGE || c.MaxJFRSge > MaxSGE:
		return s, fmt.Errorf("device %s: max SGE %d/%d above the provider limit %d", s.Name, c.MaxJFSSge, c.MaxJFRSge, MaxSGE)
	case c.MaxMsgSize > MaxMsgSizeLimit:
		return s, fmt.Errorf("device %s: max message size %d above the provider limit %d", s.Name, c.MaxMsgSize, MaxMsgSizeLimit)
	case c.TransMode&(urma.TransModeRC|urma.TransModeRM) == 0:
		return s, fmt.Errorf("device %s: transport modes %#x include neither RC nor RM", s.Name, c.TransMode)
	case c.MaxJetty > 1<<20 || c.MaxJFR > 1<<20:
		return s, fmt.Errorf("device %s: more than %d jetties or JFRs", s.Name, 1<<20)
	}
	if s.Ports == nil {
		s.Ports = []urma.Port{{Index: 0, State: urma.PortActive, MaxMTU: 4096, ActiveMTU: 4096}}
	}
	c.PortCount = uint32(len(s.Ports))
	if uint32(len(s.EIDs)) > c.MaxEIDCnt {
		return s, fmt.Errorf("device %s: %d EIDs, more than MaxEIDCnt %d", s.Name, len(s.EIDs), c.MaxEIDCnt)
	}
	for i, e := range s.EIDs {
		if e.IsZero() {
			return s, fmt.Errorf("device %s: EID %d is zero", s.Name, i)
		}
	}
	return s, nil
}
