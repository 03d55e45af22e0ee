// Package transport is a net.Conn whose bytes move over URMA (the Unified
// Bus's remote memory access) and that falls back to plain TCP whenever
// URMA cannot be used. It speaks brpc's UrmaTransport protocol byte for
// byte, so Go and brpc peers interoperate.
//
// A Listener (Listen, ListenTransport) accepts and a Dialer (NewDialer,
// Dial) dials. Each owns a provider context, a registered buffer pool and
// a pool of prepared jetties that its connections share; both are
// configured by a Config, whose zero value reads the urma_* flags file and
// the environment the device plugin sets and, without UB hardware, uses
// the software provider. JettyBudget shares one jetty budget between
// several of them.
//
// Every connection is a Conn: a TCP handshake (hello, hello, ACK) decides
// whether its bytes go over URMA, as SENDs into the peer's posted receive
// buffers with credit flow control, or over the TCP connection itself. A
// connection that cannot use URMA (no device, a spent jetty budget, a
// plain TCP peer, a failed import) runs on TCP and says why
// (Conn.FallbackReason, one of the Reason values). Every connection is
// also a ZeroCopyConn, which writes from and reads into the registered
// buffers themselves.
//
// Closing a Listener or Dialer leaves its connections open; the URMA
// resources go when the last of them closes.
package transport

import (
	"fmt"
	"net"
	"strings"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Conn is what every connection of this package implements: a net.Conn
// that says which data plane it runs on.
type Conn interface {
	net.Conn
	// Mode says whether the bytes move over URMA or TCP.
	Mode() Mode
	// FallbackReason says why the connection runs on TCP ("reason: detail"),
	// "" when it runs on URMA.
	FallbackReason() string
	// Debug is a snapshot of the connection's state for people.
	Debug() DebugInfo
}

// ModeOf reports the mode of a connection made by this package, or of
// anything wrapping one that exposes Mode(); ok is false otherwise.
func ModeOf(c net.Conn) (m Mode, ok bool) {
	mc, ok := c.(interface{ Mode() Mode })
	if !ok {
		return 0, false
	}
	return mc.Mode(), true
}

// Mode is the data plane a connection runs on.
type Mode int

// Modes.
const (
	ModeTCP  Mode = iota + 1 // the bytes go over the TCP connection
	ModeURMA                 // the bytes go over URMA; TCP carries only the handshake and EOF
)

func (m Mode) String() string {
	switch m {
	case ModeTCP:
		return "tcp"
	case ModeURMA:
		return "urma"
	}
	return "unknown"
}

// Reason says why a connection fell back to TCP. The values are a fixed set
// so they can label metrics; FallbackReason adds the details.
type Reason string

// Fallback reasons.
const (
	// ReasonDisabled: Config.DisableURMA is set (TCP-only mode).
	ReasonDisabled Reason = "urma_disabled"
	// ReasonProviderUnavailable: no URMA provider could be created (e.g.
	// URMA_PROVIDER names one that is not built in, or the software
	// provider's fabric could not listen).
	ReasonProviderUnavailable Reason = "provider_unavailable"
	// ReasonDeviceMissing: the configured device (Config.Device,
	// URMA_DEVICE, --urma_device) does not exist, or no device does.
	ReasonDeviceMissing Reason = "device_missing"
	// ReasonDeviceUnsuitable: the device cannot carry an ordered byte
	// stream (no RM mode with in-order delivery).
	ReasonDeviceUnsuitable Reason = "device_unsuitable"
	// ReasonBudgetExhausted: the jetty budget (URMA_JETTY_BUDGET) is spent.
	ReasonBudgetExhausted Reason = "jetty_budget_exhausted"
	// ReasonResources: creating queues, registering or taking buffers failed.
	ReasonResources Reason = "resource_allocation_failed"
	// ReasonPeerNotURMA: the peer does not speak the handshake at all (a
	// plain TCP client or server).
	ReasonPeerNotURMA Reason = "peer_not_urma"
	// ReasonPeerSilent: a client sent fewer than four bytes within the
	// handshake timeout; served as plain TCP with those bytes kept.
	ReasonPeerSilent Reason = "peer_silent"
	// ReasonPeerDeclined: the peer speaks the handshake but chose TCP (its
	// fallback hello, or an ACK without the URMA bit).
	ReasonPeerDeclined Reason = "peer_declined"
	// ReasonInvalidHello: the peer's hello broke a validity rule.
	ReasonInvalidHello Reason = "invalid_hello"
	// ReasonImportFailed: importing the peer's segment or jetty failed
	// (unreachable device, different transport mode).
	ReasonImportFailed Reason = "import_failed"
	// ReasonNoFastPath: the software provider cannot reach the peer over
	// shared memory (another host, another shm directory, a peer on the
	// socket fabric), and its socket fabric would be slower than plain TCP
	// (urma_soft_fabric=auto or shm).
	ReasonNoFastPath Reason = "no_fast_path"
	// ReasonPeerAddress: on the socket fabric, the client's hello names a
	// device (its EID encodes an IPv4 address and port) at another address
	// than the one its connection comes from; the server connects only to
	// a client's own address.
	ReasonPeerAddress Reason = "peer_address_mismatch"
	// ReasonTokenMismatch: the two ends disagree on tokens, so the first
	// SEND would be refused: a brpc server (no token, no extension) dialed
	// with a token (dial with Config.NoToken), or a brpc client refused by
	// urma_require_token.
	ReasonTokenMismatch Reason = "token_mismatch"
	// ReasonWindowTooSmall: the peer is a brpc peer, which returns credits
	// only past half its receive queue, and our send window cannot exceed
	// that (raise urma_sq_size): URMA would stall.
	ReasonWindowTooSmall Reason = "window_too_small"
)

// DebugInfo is a connection's state, for logs and debug endpoints.
type DebugInfo struct {
	Mode             Mode
	Role             string // "client" or "server"
	State            string
	FallbackReason   string `json:",omitempty"`
	HandshakeVersion int    `json:",omitempty"` // 2 or 3; 0 when no hello was exchanged
	LocalAddr        string
	RemoteAddr       string

	// URMA only.
	Provider string `json:",omitempty"` // urma.Provider.Name(): "liburma" is UB hardware
	Device   string `json:",omitempty"`
	// Fabric is what carries the bytes: "shm" or "socket" for the
	// software provider's fabrics, else the provider's name.
	Fabric           string       `json:",omitempty"`
	LocalJetty       urma.JettyID `json:",omitempty"`
	RemoteJetty      urma.JettyID `json:",omitempty"`
	SQWindow         int          `json:",omitempty"` // send WRs we may still post
	RemoteRQWindow   int          `json:",omitempty"` // receives the peer has posted for us
	WindowCapacity   int          `json:",omitempty"` // both windows' size: min(sq, peer rq) - 3
	CreditThreshold  int          `json:",omitempty"` // credits we hold back before returning them
	PendingCredits   int          `json:",omitempty"` // receives reposted but not yet returned
	CreditWRsFree    int          `json:",omitempty"` // of the 3 reserved credit WRs
	BufferedMessages int          `json:",omitempty"` // received, not yet read
	RemoteBufferSize int          `json:",omitempty"`
	// BufferSize and Receives are this side's receive buffers, as its
	// hello announced them: urma_buffer_size and urma_rq_size, or the
	// transport's own sizes (docs/transport.md, "Buffer sizes").
	BufferSize int `json:",omitempty"`
	Receives   int `json:",omitempty"`
	// OwnSendBuffers is how many send buffers the connection has of its
	// own (shm fabric, or buffers the transport sizes); 0 when it sends
	// from the pool.
	OwnSendBuffers int `json:",omitempty"`
	// MaxMessage is the most bytes one SEND carries: the smaller of the
	// peer's receive buffer and what this side sends from.
	MaxMessage int `json:",omitempty"`

	BytesSent, BytesReceived       uint64
	MessagesSent, MessagesReceived uint64 `json:",omitempty"`
	WindowStalls                   uint64 `json:",omitempty"`
	// SpinReads counts reads that found nothing and polled for it
	// themselves (event mode, urma_event_spin); SpinMisses those of them
	// that gave up and slept until the completion event.
	SpinReads  uint64 `json:",omitempty"`
	SpinMisses uint64 `json:",omitempty"`
	// DirectReads counts the Reads a message was placed in directly
	// (urma_read_direct), with no copy of their own.
	DirectReads uint64 `json:",omitempty"`
}

// String formats the snapshot on one line, key=value.
func (d DebugInfo) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mode=%s role=%s state=%s local=%s remote=%s", d.Mode, d.Role, d.State, d.LocalAddr, d.RemoteAddr)
	if d.FallbackReason != "" {
		fmt.Fprintf(&b, " fallback=%q", d.FallbackReason)
	}
	if d.HandshakeVersion != 0 {
		fmt.Fprintf(&b, " hello=v%d", d.HandshakeVersion)
	}
	if d.Mode == ModeURMA {
		fmt.Fprintf(&b, " provider=%s device=%s fabric=%s jetty=%d remote_jetty=%s/%d sq_window=%d remote_rq_window=%d capacity=%d credit_threshold=%d pending_credits=%d credit_wrs=%d buffered=%d buffer=%d receives=%d remote_buffer=%d own_send_buffers=%d max_message=%d",
			d.Provider, d.Device, d.Fabric, d.LocalJetty.ID, d.RemoteJetty.EID, d.RemoteJetty.ID, d.SQWindow, d.RemoteRQWindow, d.WindowCapacity,
			d.CreditThreshold, d.PendingCredits, d.CreditWRsFree, d.BufferedMessages, d.BufferSize, d.Receives, d.RemoteBufferSize, d.OwnSendBuffers, d.MaxMessage)
	}
	fmt.Fprintf(&b, " bytes_sent=%d bytes_received=%d", d.BytesSent, d.BytesReceived)
	if d.Mode == ModeURMA {
		fmt.Fprintf(&b, " msgs_sent=%d msgs_received=%d window_stalls=%d spin_reads=%d spin_misses=%d direct_reads=%d", d.MessagesSent, d.MessagesReceived, d.WindowStalls, d.SpinReads, d.SpinMisses, d.DirectReads)
	}
	return b.String()
}
