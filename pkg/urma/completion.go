package urma

// Status is a completion record's status (urma_cr_status_t).
type Status uint8

// Completion statuses.
const (
	StatusSuccess           Status = 0
	StatusUnsupportedOpcode Status = 1
	StatusLocLen            Status = 2 // receive buffer too small
	StatusLocOperation      Status = 3
	StatusLocAccess         Status = 4
	StatusRemRespLen        Status = 5
	StatusRemUnsupportedReq Status = 6
	StatusRemOperation      Status = 7
	StatusRemAccessAbort    Status = 8 // wrong token on access
	StatusAckTimeout        Status = 9 // peer went away
	StatusRNRRetryCntExc    Status = 10
	StatusWRFlushErr        Status = 11 // flushed because the jetty is in ERROR
	StatusWRSuspendDone     Status = 12
	StatusWRFlushErrDone    Status = 13 // last record of a flush
	StatusWRUnhandled       Status = 14
	StatusLocDataPoison     Status = 15
	StatusRemDataPoison     Status = 16
)

var statusNames = [...]string{
	"SUCCESS", "UNSUPPORTED_OPCODE", "LOC_LEN", "LOC_OPERATION", "LOC_ACCESS",
	"REM_RESP_LEN", "REM_UNSUPPORTED_REQ", "REM_OPERATION", "REM_ACCESS_ABORT",
	"ACK_TIMEOUT", "RNR_RETRY_CNT_EXC", "WR_FLUSH_ERR", "WR_SUSPEND_DONE",
	"WR_FLUSH_ERR_DONE", "WR_UNHANDLED", "LOC_DATA_POISON", "REM_DATA_POISON",
}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "UNKNOWN_STATUS"
}

// Opcode is a work request or completion opcode.
type Opcode uint8

// Send opcodes (urma_opcode_t).
const (
	OpSend        Opcode = 0x40
	OpSendWithImm Opcode = 0x41
)

// Receive completion opcodes (urma_cr_opcode_t).
const (
	CROpSend         Opcode = 0
	CROpSendWithImm  Opcode = 1
	CROpWriteWithImm Opcode = 3
)

// Completion is one completion record (urma_cr_t).
type Completion struct {
	Status Status
	// Opcode is a CROp* value for receive completions. Send completions
	// carry none (liburma fills it only for receives) and leave it zero.
	Opcode        Opcode
	Recv          bool   // the s_r flag: false for a send, true for a receive
	UserCtx       uint64 // the user_ctx of the work request it completes
	CompletionLen uint32 // bytes received (receives) or sent
	LocalID       uint32 // id of the local jetty or JFR
	RemoteID      JettyID
	Imm           uint64 // immediate data of SEND_WITH_IMM
}
