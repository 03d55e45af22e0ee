package transport

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/openeuler/urma-k8s/internal/podenv"
	"github.com/openeuler/urma-k8s/pkg/transport/flags"
	"github.com/openeuler/urma-k8s/pkg/transport/handshake"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/liburma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// Environment variables the transport reads. The node drivers (device
// plugin or DRA driver) set URMA_DEVICE, URMA_EID, URMA_DEVICES
// ("udma0:64,udma1:32"), URMA_JETTY_BUDGET and URMA_PROVIDER in the
// containers they give devices; the operator mounts the flags file named by
// URMA_FLAGS_FILE. Their names and formats have one home, internal/podenv,
// which writers and this reader share.
const (
	EnvFlagsFile   = podenv.FlagsFile
	EnvDevice      = podenv.Device
	EnvDevices     = podenv.Devices
	EnvEID         = podenv.EID
	EnvJettyBudget = podenv.JettyBudget
	EnvProvider    = podenv.Provider
	// EnvRequireToken overrides urma_require_token ("true" or "false").
	EnvRequireToken = "URMA_REQUIRE_TOKEN"
	EnvLibrary      = liburma.EnvLibrary
)

// Default timeouts.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultCloseTimeout     = 5 * time.Second
)

// DefaultAcceptBacklog is how many connections a Listener takes on without
// an Accept for them (Config.AcceptBacklog); MaxAcceptBacklog is the most
// it may be set to.
const (
	DefaultAcceptBacklog = 128
	MaxAcceptBacklog     = 65536
)

// Config configures a Listener or Dialer. The zero Config works: it reads
// the flags file and the environment, and without UB hardware uses the
// software provider over TCP sockets.
type Config struct {
	// Flags are the urma_* flags. Nil reads the file URMA_FLAGS_FILE names,
	// or takes brpc's defaults when it is unset.
	Flags *flags.Flags
	// Provider is the URMA implementation to use; the transport does not
	// close it. Nil creates the one ProviderName chooses.
	Provider urma.Provider
	// ProviderName chooses the provider when Provider is nil: "auto",
	// "liburma" or "soft" (see ProviderAuto and its siblings). "" takes
	// URMA_PROVIDER, then --urma_provider, whose default is auto. The
	// software provider listens on the host address of the listener, or
	// of the first dialed connection; liburma is loaded from URMA_LIBRARY,
	// or liburma.so.0.
	ProviderName string
	// SoftFabric is how the software provider reaches peers: "auto", "shm"
	// or "socket" (see FabricAuto and its siblings). "" takes
	// URMA_SOFT_FABRIC, then --urma_soft_fabric, whose default is auto:
	// shared memory with a peer on the same host, plain TCP with any other.
	SoftFabric string
	// Device names the device to open; "" takes URMA_DEVICE, then the first
	// of URMA_DEVICES, then --urma_device, then the first device with an
	// active port.
	Device string
	// EID selects the device's EID by value; "" takes URMA_EID, then the
	// first EID.
	EID string
	// JettyBudget caps the jetties (prepared plus connected) of this
	// Listener or Dialer; 0 takes URMA_JETTY_BUDGET; negative or an unset
	// variable means no cap beyond the device's. Budget overrides it.
	JettyBudget int
	// Budget is a jetty budget shared by several Listeners and Dialers of
	// one process; nil gives each its own of JettyBudget.
	Budget *JettyBudget
	// DisableURMA serves and dials TCP only. A server still answers hellos
	// (with a fallback hello), so URMA clients fall back cleanly.
	DisableURMA bool
	// FailWhenBudgetExhausted fails new connections when the jetty budget is
	// spent, instead of falling back to TCP.
	FailWhenBudgetExhausted bool
	// FailWhenPoolDry makes Write and AllocBuffer fail with ErrPoolExhausted
	// when every registered buffer is in use, instead of waiting (within the
	// write deadline) for one to come back.
	FailWhenPoolDry bool
	// NoToken registers jetties and segments without a token. A Dialer
	// needs it to use URMA with brpc servers, which cannot present a token;
	// a Listener serves brpc clients without it (see RequireToken). Anyone
	// who learns the ids of what is registered without a token can reach it.
	NoToken bool
	// RequireToken refuses URMA to peers that cannot present a token (brpc
	// clients, whose hello lacks our extension): they are served on TCP
	// (fallback reason token_mismatch) instead of on a jetty and segment
	// registered without a token for their connection. False takes
	// URMA_REQUIRE_TOKEN, then --urma_require_token (default false).
	RequireToken bool
	// FirstBytesTimeout is how long a server waits for a client's first
	// four bytes before it serves the client as plain TCP (one that waits
	// for the server to speak first); 0 takes --urma_first_bytes_timeout
	// (default 1s), negative waits the whole HandshakeTimeout.
	FirstBytesTimeout time.Duration
	// AckTimeout is how long a server that has set up a jetty for a client
	// (its receive buffers posted, counted against the jetty budget) waits
	// for the client's ACK before it drops the connection and gives them
	// back, so that clients which never ACK cannot hold the budget for the
	// whole HandshakeTimeout; 0 takes --urma_ack_timeout (default 3s),
	// negative waits the whole HandshakeTimeout.
	AckTimeout time.Duration
	// HandshakeTimeout bounds the TCP handshake; 0 means 10s. A server
	// serves a client that sends nothing within it as plain TCP.
	HandshakeTimeout time.Duration
	// CloseTimeout bounds how long Close waits, in all, for sends already
	// posted to complete and then for its close marker, so that the peer
	// reads every byte written before Close; 0 means 5s. The jetty's
	// flush after it takes at most 2s more (at once on a working provider).
	// It also bounds how long the close that releases the URMA resources
	// (of the Listener or Dialer, or of its last connection) waits for a
	// provider call still running; past it the resources are left until
	// the call returns, and an error is logged.
	CloseTimeout time.Duration
	// AcceptBacklog bounds, for a Listener, the connections that no Accept
	// has taken yet plus the handshakes that hold a jetty and its receive
	// buffers (URMA handshakes past the client's hello). A handshake waits
	// for a seat among them before it sets up a jetty, and falls back to
	// TCP if none frees within three quarters of HandshakeTimeout.
	// Handshakes in progress, which hold a TCP connection and goroutines,
	// are bounded by four times AcceptBacklog: at that bound the Listener
	// stops taking connections from the kernel, whose listen backlog holds
	// further clients. 0 means DefaultAcceptBacklog (128);
	// 1..MaxAcceptBacklog is allowed. A Dialer ignores it.
	AcceptBacklog int
	// Logger receives fallbacks, warnings and errors; zero discards.
	Logger logr.Logger
	// Registerer receives the transport's Prometheus collectors; nil
	// records nothing.
	Registerer prometheus.Registerer
	// LookupEnv reads the environment; nil uses os.LookupEnv (tests
	// replace it).
	LookupEnv func(string) (string, bool)

	openLiburma openLiburmaFunc // nil loads liburma; tests replace it
	// bootID reads the host's boot id; nil reads the kernel's. Tests
	// replace it to stand for a process on another host.
	bootID func() ([handshake.BootIDLen]byte, error)
}

// settings is a Config with everything looked up, checked and defaulted.
type settings struct {
	flags            flags.Flags
	provider         urma.Provider
	providerName     string // urma_provider: auto, liburma or soft
	providerSource   string // where providerName came from, for the log
	library          string // the liburma shared object
	fabric           fabricSettings
	openLiburma      openLiburmaFunc
	bootID           func() ([handshake.BootIDLen]byte, error)
	device           string
	eid              *urma.EID
	budget           *JettyBudget
	disable          bool
	failOnBudget     bool
	failWhenPoolDry  bool
	noToken          bool
	requireToken     bool
	firstBytes       time.Duration // 0: the whole handshake timeout
	ackTimeout       time.Duration // 0: the whole handshake timeout
	handshakeTimeout time.Duration
	closeTimeout     time.Duration
	acceptBacklog    int
	log              logr.Logger
}

// resolve applies the precedence Config field > environment > flags file >
// brpc default, and checks every value. Errors name the variable or flag.
func (c Config) resolve() (settings, error) {
	env := c.LookupEnv
	if env == nil {
		env = os.LookupEnv
	}
	s := settings{
		provider:         c.Provider,
		disable:          c.DisableURMA,
		failOnBudget:     c.FailWhenBudgetExhausted,
		failWhenPoolDry:  c.FailWhenPoolDry,
		noToken:          c.NoToken,
		handshakeTimeout: c.HandshakeTimeout,
		closeTimeout:     c.CloseTimeout,
		log:              c.Logger,
	}
	if s.log.GetSink() == nil {
		s.log = logr.Discard()
	}
	if s.handshakeTimeout <= 0 {
		s.handshakeTimeout = DefaultHandshakeTimeout
	}
	if s.closeTimeout <= 0 {
		s.closeTimeout = DefaultCloseTimeout
	}
	switch b := c.AcceptBacklog; {
	case b == 0:
		s.acceptBacklog = DefaultAcceptBacklog
	case b < 0 || b > MaxAcceptBacklog:
		return settings{}, fmt.Errorf("transport config: Config.AcceptBacklog=%d is out of range: want 1..%d, or 0 for the default (%d)", b, MaxAcceptBacklog, DefaultAcceptBacklog)
	default:
		s.acceptBacklog = b
	}

	switch {
	case c.Flags != nil:
		if err := c.Flags.Validate(); err != nil {
			return settings{}, fmt.Errorf("transport config: %w", err)
		}
		s.flags = *c.Flags
	default:
		f, err := loadFlagsFile(env)
		if err != nil {
			return settings{}, err
		}
		s.flags = f
	}

	s.device = c.Device
	if s.device == "" {
		if v, ok := env(EnvDevice); ok && strings.TrimSpace(v) != "" {
			s.device = strings.TrimSpace(v)
		}
	}
	if s.device == "" {
		if v, ok := env(EnvDevices); ok {
			list, err := podenv.ParseDevices(v)
			if err != nil {
				return settings{}, fmt.Errorf("transport config: %w", err)
			}
			if len(list) > 0 {
				s.device = list[0].Device
			}
		}
	}
	if s.device == "" {
		s.device = s.flags.Device
	}

	eidText := c.EID
	eidSource := "Config.EID"
	if eidText == "" {
		if v, ok := env(EnvEID); ok {
			eidText, eidSource = strings.TrimSpace(v), EnvEID
		}
	}
	if eidText != "" {
		e, err := urma.ParseEID(eidText)
		if err != nil {
			return settings{}, fmt.Errorf("transport config: %s: %w", eidSource, err)
		}
		s.eid = &e
	}

	switch {
	case c.Budget != nil:
		s.budget = c.Budget
	case c.JettyBudget > 0:
		s.budget = NewJettyBudget(c.JettyBudget)
	case c.JettyBudget < 0:
		s.budget = NewJettyBudget(0)
	default:
		n := 0
		if v, ok := env(EnvJettyBudget); ok && strings.TrimSpace(v) != "" {
			var err error
			n, err = strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 0 {
				return settings{}, fmt.Errorf("transport config: %s=%q is not a non-negative integer (0 means no budget)", EnvJettyBudget, v)
			}
		}
		s.budget = NewJettyBudget(n)
	}

	name, source := c.ProviderName, "Config.ProviderName"
	if name == "" {
		if v, ok := env(EnvProvider); ok && strings.TrimSpace(v) != "" {
			name, source = v, EnvProvider
		}
	}
	if name == "" {
		name, source = s.flags.Provider, "--urma_provider"
	}
	var err error
	if s.providerName, err = parseProviderName(name, source); err != nil {
		return settings{}, err
	}
	s.providerSource = source
	s.library = liburma.DefaultLibrary
	if v, ok := env(EnvLibrary); ok && strings.TrimSpace(v) != "" {
		s.library = strings.TrimSpace(v)
	}
	s.openLiburma = c.openLiburma
	if s.openLiburma == nil {
		s.openLiburma = openLiburma
	}
	s.bootID = c.bootID
	if s.bootID == nil {
		s.bootID = soft.BootID
		if v, ok := env(EnvHostID); ok && strings.TrimSpace(v) != "" {
			boot := hostIDBoot(strings.TrimSpace(v))
			s.bootID = func() ([handshake.BootIDLen]byte, error) { return boot, nil }
		}
	}
	if s.fabric, err = resolveFabric(c.SoftFabric, env, s.flags); err != nil {
		return settings{}, err
	}

	s.requireToken = c.RequireToken || s.flags.RequireToken
	if v, ok := env(EnvRequireToken); ok && strings.TrimSpace(v) != "" && !c.RequireToken {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return settings{}, fmt.Errorf("transport config: %s=%q is not true or false", EnvRequireToken, v)
		}
		s.requireToken = b
	}
	switch {
	case c.FirstBytesTimeout > 0:
		s.firstBytes = c.FirstBytesTimeout
	case c.FirstBytesTimeout == 0:
		s.firstBytes = s.flags.FirstBytesTimeout
	}
	switch {
	case c.AckTimeout > 0:
		s.ackTimeout = c.AckTimeout
	case c.AckTimeout == 0:
		s.ackTimeout = s.flags.AckTimeout
	}
	return s, nil
}

// loadFlagsFile parses the file URMA_FLAGS_FILE names, or returns brpc's
// defaults when the variable is unset or empty.
func loadFlagsFile(env func(string) (string, bool)) (flags.Flags, error) {
	path, ok := env(EnvFlagsFile)
	if !ok || strings.TrimSpace(path) == "" {
		return flags.Defaults(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return flags.Flags{}, fmt.Errorf("transport config: open flags file %s (%s): %w", path, EnvFlagsFile, err)
	}
	defer f.Close()
	fl, err := flags.Parse(f)
	if err != nil {
		return flags.Flags{}, fmt.Errorf("transport config: flags file %s (%s): %w", path, EnvFlagsFile, err)
	}
	return fl, nil
}

// LoadFlags returns the urma_* flags the zero Config would use: the file
// URMA_FLAGS_FILE names, or brpc's defaults. Programs that take flag
// overrides (urma-perf) start from it and put the result in Config.Flags.
func LoadFlags() (flags.Flags, error) {
	return loadFlagsFile(os.LookupEnv)
}
