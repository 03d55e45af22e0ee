package transport

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/podenv"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/liburma"
)

// The values of urma_provider (Config.ProviderName, URMA_PROVIDER,
// --urma_provider): which URMA implementation carries the connections.
const (
	// ProviderAuto uses liburma when the library loads and lists a UB
	// device with an active port (the named one, when a device is
	// configured), and the software provider otherwise.
	ProviderAuto = "auto"
	// ProviderLiburma uses UB hardware through liburma; when that fails,
	// connections fall back to TCP (provider_unavailable).
	ProviderLiburma = "liburma"
	// ProviderSoft uses the software provider on its socket fabric; the
	// node drivers set URMA_PROVIDER to it for software devices.
	ProviderSoft = podenv.ProviderSoft
)

// providerNames are the accepted urma_provider values, for error messages.
var providerNames = []string{ProviderAuto, ProviderLiburma, ProviderSoft}

// openLiburmaFunc loads liburma; tests replace it.
type openLiburmaFunc func(library string, log logr.Logger) (urma.Provider, error)

func openLiburma(library string, log logr.Logger) (urma.Provider, error) {
	return liburma.New(liburma.Options{Library: library, Logger: log})
}

// parseProviderName checks an urma_provider value from source.
func parseProviderName(v, source string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(v))
	for _, ok := range providerNames {
		if n == ok {
			return n, nil
		}
	}
	return "", fmt.Errorf("transport config: %s=%q: want one of %s", source, v, strings.Join(providerNames, ", "))
}

// openProvider sets e.prov: the Config's provider, or the one urma_provider
// chooses, which the engine then owns. It logs which and why, at the default
// level: an operator must be able to tell whether bytes move through
// hardware or through the software provider.
func (e *engine) openProvider(local netip.Addr) *fallback {
	if e.s.provider != nil {
		e.prov = e.s.provider
		e.log.Info("URMA provider chosen", "provider", e.prov.Name(), "why", "given by Config.Provider")
		return nil
	}
	var why string
	switch e.s.providerName {
	case ProviderLiburma:
		p, err := e.s.openLiburma(e.s.library, e.log.WithName("liburma"))
		if err != nil {
			return fallbackf(ReasonProviderUnavailable, "urma_provider=%s: %v", ProviderLiburma, err)
		}
		e.prov, why = p, "urma_provider=liburma"
	case ProviderAuto:
		var p urma.Provider
		p, why = e.probeLiburma()
		if p != nil {
			e.prov = p
			break
		}
		if fb := e.openSoft(local); fb != nil {
			return fb
		}
	default:
		if fb := e.openSoft(local); fb != nil {
			return fb
		}
		why = "urma_provider=soft"
	}
	e.ownsProv = true
	e.log.Info("URMA provider chosen", "provider", e.prov.Name(), "choice", e.s.providerName, "from", e.s.providerSource, "why", why)
	return nil
}

// openSoft creates the software provider.
func (e *engine) openSoft(local netip.Addr) *fallback {
	p, err := e.newSoftProvider(local)
	if err != nil {
		if e.s.fabric.choice != FabricSocket {
			return fallbackf(ReasonNoFastPath, "create software provider: %v", err)
		}
		return fallbackf(ReasonProviderUnavailable, "create software provider: %v", err)
	}
	e.prov, e.softProv = p, true
	return nil
}

// probeLiburma returns liburma when it loads and lists a usable UB device,
// and otherwise nil and why not (which is also why auto picked soft).
func (e *engine) probeLiburma() (urma.Provider, string) {
	p, err := e.s.openLiburma(e.s.library, e.log.WithName("liburma"))
	if err != nil {
		return nil, fmt.Sprintf("auto: liburma is not usable, so the software provider: %v", err)
	}
	devs, err := p.Devices()
	if err == nil {
		for _, d := range devs {
			ub := d.TransportType == urma.TransportUB || d.TransportType == urma.TransportHNSUB
			if ub && d.HasUsablePort() && (e.s.device == "" || d.Name == e.s.device) {
				return p, fmt.Sprintf("auto: liburma (%s) lists UB device %s with an active port", e.s.library, d.Name)
			}
		}
		err = fmt.Errorf("no UB device with an active port%s among %d", deviceClause(e.s.device), len(devs))
	}
	if cerr := p.Close(); cerr != nil {
		e.log.Error(cerr, "closing liburma after probing it")
	}
	return nil, fmt.Sprintf("auto: liburma loaded but lists %v, so the software provider", err)
}

func deviceClause(name string) string {
	if name == "" {
		return ""
	}
	return " named " + name
}

// advertiseAddr picks the address the software fabric listens on: the
// connection's own host address, or for an unspecified one podIP (POD_IP,
// read through Config.LookupEnv), the first non-loopback IPv4 address of the
// host, or 127.0.0.1.
func advertiseAddr(local netip.Addr, podIP string) netip.Addr {
	local = local.Unmap()
	if local.IsValid() && !local.IsUnspecified() && local.Is4() {
		return local
	}
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
