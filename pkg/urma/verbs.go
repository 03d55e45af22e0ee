package urma

import (
	"context"
	"io"
	"time"
)

// TransportMode selects a jetty's transport service.
type TransportMode uint8

// Transport modes a two-sided byte stream can use.
const (
	RC TransportMode = iota + 1 // reliable connection: ordered, one peer
	RM                          // reliable message: connectionless; ordered only if the device says so
)

func (m TransportMode) String() string {
	switch m {
	case RC:
		return "RC"
	case RM:
		return "RM"
	}
	return "UNKNOWN"
}

// Token is the 32-bit value that guards a segment or receive queue.
type Token uint32

// TokenPolicy says how a token travels (urma_token_policy_t).
type TokenPolicy uint8

// Token policies.
const (
	TokenNone TokenPolicy = iota
	TokenPlainText
	TokenSigned
	TokenAllEncrypted
)

// Access is a segment's access flag set.
type Access uint32

// Access flags. LocalOnly stands alone; Write needs Read; Atomic needs Read and Write.
const (
	AccessLocalOnly Access = 1 << 0
	AccessRead      Access = 1 << 1
	AccessWrite     Access = 1 << 2
	AccessAtomic    Access = 1 << 3
)

// Validate checks the combination rules liburma enforces.
func (a Access) Validate() error {
	switch {
	case a == 0:
		return Errorf("register_seg", CodeInval, "no access flag set")
	case a&AccessLocalOnly != 0 && a != AccessLocalOnly:
		return Errorf("register_seg", CodeInval, "LOCAL_ONLY cannot be combined with other access flags")
	case a&AccessWrite != 0 && a&AccessRead == 0:
		return Errorf("register_seg", CodeInval, "WRITE needs READ")
	case a&AccessAtomic != 0 && a&(AccessRead|AccessWrite) != AccessRead|AccessWrite:
		return Errorf("register_seg", CodeInval, "ATOMIC needs READ and WRITE")
	}
	return nil
}

// JettyID names a jetty or JFR across the fabric (urma_jetty_id_t).
type JettyID struct {
	EID   EID
	UASID uint32
	ID    uint32
}

// SegmentID names a registered segment across the fabric; it is what a hello
// carries so that the peer can import it.
type SegmentID struct {
	EID     EID
	UASID   uint32
	VA      uint64
	Len     uint64
	TokenID uint32
}

// Provider is an implementation of URMA: liburma on UB hardware, or the
// software provider. A Provider is safe for concurrent use.
type Provider interface {
	// Name says which implementation this is, e.g. "soft-socket".
	Name() string
	// Devices lists the devices the provider can open.
	Devices() ([]DeviceInfo, error)
	// Open creates a context on a device bound to one of its EIDs.
	Open(device string, eidIndex int) (Context, error)
	io.Closer
}

// Context is an open device (urma_context_t). Every object created from it
// must be destroyed before it is closed; Close fails with ErrBusy otherwise.
type Context interface {
	Device() DeviceInfo
	EID() EID
	UASID() uint32

	CreateJFCE() (JFCE, error)
	CreateJFC(JFCConfig) (JFC, error)
	CreateJFR(JFRConfig) (JFR, error)
	CreateJetty(JettyConfig) (Jetty, error)

	// RegisterSegment registers mmap'd memory from AllocMemory.
	RegisterSegment(mem *Memory, cfg SegmentConfig) (Segment, error)
	// ImportSegment makes a peer's segment reachable. It does not check
	// the token: as on UB hardware, the token is stored with the import and
	// the segment's owner checks it on every access.
	ImportSegment(id SegmentID, token Token) (RemoteSegment, error)
	// ImportJetty makes a peer's jetty a send target; an unreachable peer
	// fails with ErrUnreachable. It does not check the token: the target
	// checks it on every message, and a SEND carrying a wrong token
	// completes at the sender with StatusRemAccessAbort.
	ImportJetty(ctx context.Context, id JettyID, mode TransportMode, token Token) (RemoteJetty, error)

	io.Closer
}

// JFCE is a completion event channel. Its fd becomes readable when, and only
// when, an armed JFC attached to it receives a completion.
type JFCE interface {
	// Fd is a non-blocking file descriptor for epoll or Go's poller.
	Fd() int
	// Wait returns the JFCs that fired, at most len(out); timeout 0 does not
	// block, a negative timeout blocks until an event or Close.
	Wait(out []JFC, timeout time.Duration) (int, error)
	io.Closer
}

// JFCConfig configures a completion queue.
type JFCConfig struct {
	Depth   uint32
	JFCE    JFCE   // nil: polling only
	UserCtx uint64 // returned with events
}

// JFC is a completion queue.
type JFC interface {
	ID() uint32
	// Poll fills out with up to len(out) completions and returns how many; 0 when empty.
	Poll(out []Completion) (int, error)
	// Rearm asks for one event on the next completion (only solicited ones if solicitedOnly).
	Rearm(solicitedOnly bool) error
	// Ack acknowledges n events returned by JFCE.Wait for this JFC.
	Ack(n uint32)
	// Close destroys the JFC. It fails with ErrBusy while JFRs or jetties
	// use it, and otherwise blocks until every event JFCE.Wait returned for
	// it has been acknowledged with Ack, as urma_delete_jfc does.
	io.Closer
}

// JFRConfig configures a receive queue.
type JFRConfig struct {
	// Mode is required: every jetty sharing the JFR must have the same mode.
	Mode        TransportMode
	Depth       uint32
	MaxSGE      uint32
	JFC         JFC
	MinRNRTimer uint8
	// TokenPolicy and Token guard every jetty that shares the JFR: each
	// message must carry Token, unless the policy is TokenNone, which
	// checks nothing.
	TokenPolicy TokenPolicy
	Token       Token
}

// SGE is one scatter/gather element: Len bytes at Offset within a local segment.
type SGE struct {
	Segment Segment
	Offset  uint64
	Len     uint32
}

// RecvWR is a receive work request.
type RecvWR struct {
	UserCtx uint64
	SGEs    []SGE
}

// JFR is a receive queue.
type JFR interface {
	ID() JettyID
	// PostRecv posts one receive; past the depth it fails with ErrAgain.
	PostRecv(wr *RecvWR) error
	io.Closer
}

// SendFlags are a send work request's flags.
type SendFlags uint8

// Send flags.
const (
	SendCompleteEnable  SendFlags = 1 << 0 // generate a send completion
	SendSolicitedEnable SendFlags = 1 << 1 // the receiver's solicited-only arm fires
	SendInline          SendFlags = 1 << 2
)

// SendWR is a send work request. The provider does not keep the struct or its
// SGE slice after PostSend returns, so callers may reuse them; the memory the
// SGEs point at must stay untouched until the send completes.
type SendWR struct {
	Opcode Opcode // OpSend or OpSendWithImm
	Flags  SendFlags
	// Target is where an RM send goes. An RC jetty is bound to the Target
	// of its first PostSend; later posts go to that target whatever Target
	// says, and may leave it nil.
	Target  RemoteJetty
	UserCtx uint64
	SGEs    []SGE
	Imm     uint64
}

// JettyConfig configures a jetty: a send queue sharing a receive queue. A
// jetty has no token of its own: its receive side is guarded by its JFR's.
type JettyConfig struct {
	Mode       TransportMode // must equal the JFR's mode
	SQDepth    uint32
	MaxSGE     uint32
	MaxInline  uint32
	SendJFC    JFC
	JFR        JFR   // shared receive queue
	RNRRetry   uint8 // 0..7; 7 retries forever
	ErrTimeout uint8 // 0..31
	Priority   uint8 // 0..15
}

// JettyState is a jetty's state.
type JettyState uint8

// Jetty states.
const (
	JettyReady JettyState = iota
	JettyError
)

// Jetty is a send queue plus a shared receive queue.
type Jetty interface {
	ID() JettyID
	// PostSend posts one send; past the depth it fails with ErrAgain, and on
	// a jetty in ERROR with ErrInval.
	PostSend(wr *SendWR) error
	// SetError moves the jetty to ERROR: outstanding sends complete with
	// WR_FLUSH_ERR, in posting order, then one WR_FLUSH_ERR_DONE record
	// follows. A send error moves the jetty to ERROR by itself and flushes
	// the rest the same way; SetError then only adds the WR_FLUSH_ERR_DONE.
	// (Hardware reports the flush in two phases, FLUSH_ERR_DONE first and
	// the unhandled requests after it; providers present this order.)
	SetError() error
	State() JettyState
	io.Closer
}

// RemoteJetty is an imported peer jetty.
type RemoteJetty interface {
	ID() JettyID
	// Close unimports the jetty. An RC target bound to a jetty cannot be
	// unimported (ErrBusy) until that jetty is closed.
	io.Closer
}

// SegmentConfig configures a registration.
type SegmentConfig struct {
	Access      Access
	TokenPolicy TokenPolicy
	Token       Token
}

// Segment is registered local memory.
type Segment interface {
	ID() SegmentID
	// Bytes is the registered memory itself.
	Bytes() []byte
	io.Closer
}

// RemoteSegment is an imported peer segment.
type RemoteSegment interface {
	ID() SegmentID
	io.Closer
}
