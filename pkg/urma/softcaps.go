package urma

// The limits of the software provider's devices (pkg/urma/soft). They live
// here, not in the provider, so that the cluster side knows them without
// linking the provider: the device plugin advertises software devices with
// them, and the operator tunes nodes that publish no facts against them.
const (
	// SoftDriver is the driver name software devices report.
	SoftDriver = "soft"
	// SoftMaxJetty is a software device's jetties (and its JFCs, JFSs and
	// JFRs).
	SoftMaxJetty = 1024
	// SoftMaxJFSDepth, SoftMaxJFRDepth and SoftMaxJFCDepth are its queue
	// depth limits (send, receive, completion).
	SoftMaxJFSDepth = 1 << 14
	SoftMaxJFRDepth = 1 << 16
	SoftMaxJFCDepth = 1 << 20
	// SoftMaxMsgSize is the largest message a software device takes by
	// default (a device spec may raise it, up to the provider's own bound).
	SoftMaxMsgSize = 16 << 20
	// SoftMaxSGE is the most scatter/gather elements a work request on a
	// software device can carry.
	SoftMaxSGE = 16
	// SoftMaxInlineSize is a software device's inline data limit.
	SoftMaxInlineSize = 256
	// SoftMaxEIDCnt is how many EIDs a software device may have.
	SoftMaxEIDCnt = 16
)

// SoftDeviceCaps are the capabilities of a software device whose spec asks
// for no others.
func SoftDeviceCaps() DeviceCaps {
	return DeviceCaps{
		MaxJFC:           SoftMaxJetty,
		MaxJFS:           SoftMaxJetty,
		MaxJFR:           SoftMaxJetty,
		MaxJetty:         SoftMaxJetty,
		MaxJFCDepth:      SoftMaxJFCDepth,
		MaxJFSDepth:      SoftMaxJFSDepth,
		MaxJFRDepth:      SoftMaxJFRDepth,
		MaxJFSInlineSize: SoftMaxInlineSize,
		MaxJFSSge:        SoftMaxSGE,
		MaxJFSRsge:       SoftMaxSGE,
		MaxJFRSge:        SoftMaxSGE,
		MaxMsgSize:       SoftMaxMsgSize,
		TransMode:        TransModeRC | TransModeRM,
		MaxEIDCnt:        SoftMaxEIDCnt,
		OrderedRM:        true,
	}
}
