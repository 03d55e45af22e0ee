package liburmasoft

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/openeuler/urma-k8s/internal/podenv"
)

// Environment variables the library reads at urma_init: those the device
// plugin and the DRA driver set in a container given a software device
// (package podenv), and pkg/transport's, with the same meaning.
const (
	EnvDevice       = podenv.Device
	EnvDevices      = podenv.Devices
	EnvShmDir       = podenv.ShmDir
	EnvShmSocketDir = podenv.ShmSocketDir
	EnvSoftFabric   = "URMA_SOFT_FABRIC"
	EnvPodIP        = "POD_IP"
	// EnvLogLevel is liburma's own: error (the default), warning, info or
	// debug.
	EnvLogLevel = "URMA_LOG_LEVEL"
)

// Fabrics the library can run on, as pkg/transport's urma_soft_fabric
// names them.
const (
	// FabricAuto puts each device on both fabrics: shared memory at EID
	// index 0 for processes on this host, TCP at index 1 for other hosts.
	FabricAuto = "auto"
	// FabricShm is shared memory only.
	FabricShm = "shm"
	// FabricSocket is TCP only.
	FabricSocket = "socket"
)

// Bounds of what the environment may name.
const (
	// MaxDevices is the most devices URMA_DEVICE and URMA_DEVICES name.
	MaxDevices = 16
	// MaxNameLen is the longest device name: urma_device_t.name holds 64
	// bytes with the terminating NUL.
	MaxNameLen = podenv.MaxDeviceName
)

// Log levels of URMA_LOG_LEVEL, as liburma names them.
const (
	LevelError = iota
	LevelWarning
	LevelInfo
	LevelDebug
)

// Config is what urma_init sets the software provider up with.
type Config struct {
	// Fabric is FabricAuto, FabricShm or FabricSocket.
	Fabric string
	// ShmDir is where shm devices meet.
	ShmDir string
	// ShmSocketDir is where this process's shm devices create their
	// sockets; "" means ShmDir.
	ShmSocketDir string
	// Devices are the device names, each a soft device of its own.
	Devices []string
	// ListenIP is the address socket devices listen on and their EIDs
	// encode.
	ListenIP netip.Addr
	// LogLevel is one of the Level constants.
	LogLevel int
}

// ConfigFromEnv reads the configuration from the environment: the devices
// in URMA_DEVICE then URMA_DEVICES (soft0 when neither names one), the
// fabric in URMA_SOFT_FABRIC (auto when unset), the shm directory in
// URMA_SHM_DIR (urma-k8s-shm-<uid> in the temporary directory when unset,
// as pkg/transport does) and the socket directory in
// URMA_SHM_SOCKET_DIR, the socket fabric's address in POD_IP (else the
// host's first non-loopback IPv4 address, else 127.0.0.1). An error
// names the variable and what it should hold.
func ConfigFromEnv(env func(string) (string, bool)) (Config, error) {
	var c Config
	get := func(name string) string {
		v, _ := env(name)
		return strings.TrimSpace(v)
	}
	devices, err := deviceNames(get(EnvDevice), get(EnvDevices))
	if err != nil {
		return Config{}, err
	}
	c.Devices = devices
	switch f := strings.ToLower(get(EnvSoftFabric)); f {
	case "", FabricAuto:
		c.Fabric = FabricAuto
	case FabricShm, FabricSocket:
		c.Fabric = f
	default:
		return Config{}, fmt.Errorf("%s=%q: want auto, shm or socket", EnvSoftFabric, f)
	}
	c.ShmDir = get(EnvShmDir)
	if c.ShmDir == "" {
		c.ShmDir = filepath.Join(os.TempDir(), fmt.Sprintf("urma-k8s-shm-%d", os.Geteuid()))
	}
	c.ShmSocketDir = get(EnvShmSocketDir)
	c.ListenIP = listenIP(get(EnvPodIP))
	switch l := strings.ToLower(get(EnvLogLevel)); l {
	case "", "error", "fatal":
		c.LogLevel = LevelError
	case "warning":
		c.LogLevel = LevelWarning
	case "info":
		c.LogLevel = LevelInfo
	case "debug":
		c.LogLevel = LevelDebug
	default:
		return Config{}, fmt.Errorf("%s=%q: want error, warning, info or debug", EnvLogLevel, l)
	}
	return c, nil
}

// deviceNames lists the device of URMA_DEVICE, then those of URMA_DEVICES
// ("name:jetties,..."), each once.
func deviceNames(primary, list string) ([]string, error) {
	var names []string
	add := func(source, name string) error {
		switch {
		case name == "":
			return nil
		case len(name) > MaxNameLen:
			return fmt.Errorf("%s: device name %q is %d bytes, longer than %d", source, name, len(name), MaxNameLen)
		case !printable(name):
			return fmt.Errorf("%s: device name %q holds a character other than a printable ASCII one", source, name)
		}
		for _, n := range names {
			if n == name {
				return nil
			}
		}
		if len(names) == MaxDevices {
			return fmt.Errorf("%s: more than %d devices", source, MaxDevices)
		}
		names = append(names, name)
		return nil
	}
	if err := add(EnvDevice, primary); err != nil {
		return nil, err
	}
	devs, err := podenv.ParseDevices(list)
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		if err := add(EnvDevices, d.Device); err != nil {
			return nil, err
		}
	}
	if len(names) == 0 {
		names = []string{"soft0"}
	}
	return names, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// listenIP is POD_IP when it is an IPv4 address, else the host's first
// non-loopback IPv4 address, else 127.0.0.1: a socket device's EID encodes
// the IPv4 address peers dial.
func listenIP(podIP string) netip.Addr {
	if a, err := netip.ParseAddr(podIP); err == nil && a.Unmap().Is4() {
		return a.Unmap()
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				if ip := p.Addr(); ip.Is4() && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
					return ip
				}
			}
		}
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}
