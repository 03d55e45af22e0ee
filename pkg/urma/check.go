package urma

// The checks every provider makes before creating a queue: hardware refuses
// these configurations, and a provider that let them through would behave
// unlike it.

// Check validates a JFC configuration against a device's capabilities.
func (c JFCConfig) Check(caps DeviceCaps) error {
	if c.Depth == 0 || c.Depth > caps.MaxJFCDepth {
		return Errorf("create_jfc", CodeInval, "depth %d outside 1..%d (device max_jfc_depth)", c.Depth, caps.MaxJFCDepth)
	}
	return nil
}

// Check validates a JFR configuration against a device's capabilities.
func (c JFRConfig) Check(caps DeviceCaps) error {
	const op = "create_jfr"
	if err := checkMode(op, c.Mode, caps, "the JFR's jetties must use the same"); err != nil {
		return err
	}
	switch {
	case c.Depth == 0 || c.Depth > caps.MaxJFRDepth:
		return Errorf(op, CodeInval, "depth %d outside 1..%d (device max_jfr_depth)", c.Depth, caps.MaxJFRDepth)
	case max(c.MaxSGE, 1) > caps.MaxJFRSge:
		return Errorf(op, CodeInval, "max SGE %d above the device's %d", c.MaxSGE, caps.MaxJFRSge)
	case c.MinRNRTimer > 31:
		return Errorf(op, CodeInval, "min RNR timer %d outside 0..31", c.MinRNRTimer)
	case c.TokenPolicy > TokenAllEncrypted:
		return Errorf(op, CodeInval, "token policy %d unknown", c.TokenPolicy)
	}
	return nil
}

// Check validates a jetty configuration against a device's capabilities
// and the mode of its JFR, jfrMode: the send and receive sides of a jetty
// must use one transport mode (hw/udma/udma_u_jetty.c:105-118 fails it with
// EINVAL).
func (c JettyConfig) Check(caps DeviceCaps, jfrMode TransportMode) error {
	const op = "create_jetty"
	if err := checkMode(op, c.Mode, caps, "it must equal its JFR's"); err != nil {
		return err
	}
	switch {
	case c.Mode != jfrMode:
		return Errorf(op, CodeInval, "jetty mode %s differs from its JFR's mode %s", c.Mode, jfrMode)
	case c.SQDepth == 0 || c.SQDepth > caps.MaxJFSDepth:
		return Errorf(op, CodeInval, "SQ depth %d outside 1..%d (device max_jfs_depth)", c.SQDepth, caps.MaxJFSDepth)
	case c.MaxSGE > caps.MaxJFSSge:
		return Errorf(op, CodeInval, "max SGE %d above the device's %d", c.MaxSGE, caps.MaxJFSSge)
	case c.MaxInline > caps.MaxJFSInlineSize:
		return Errorf(op, CodeInval, "max inline %d above the device's %d", c.MaxInline, caps.MaxJFSInlineSize)
	case c.RNRRetry > RNRRetryForever:
		return Errorf(op, CodeInval, "RNR retry %d outside 0..7", c.RNRRetry)
	case c.ErrTimeout > 31:
		return Errorf(op, CodeInval, "error timeout %d outside 0..31", c.ErrTimeout)
	case c.Priority > 15:
		return Errorf(op, CodeInval, "priority %d outside 0..15", c.Priority)
	}
	return nil
}

// RNRRetryForever is the RNRRetry value that retries without end
// (urma_jfs_cfg_t.rnr_retry).
const RNRRetryForever = 7

func checkMode(op string, m TransportMode, caps DeviceCaps, rule string) error {
	switch {
	case m == 0:
		return Errorf(op, CodeInval, "transport mode not set (RC or RM); %s", rule)
	case m == RC && caps.TransMode&TransModeRC == 0,
		m == RM && caps.TransMode&TransModeRM == 0,
		m != RC && m != RM:
		return Errorf(op, CodeInval, "transport mode %s not supported by the device", m)
	}
	return nil
}

// The checks every provider makes before posting a work request: the
// hardware would reject it, or (SGEs past the queue's limit) read past
// the request it was given.

// CheckPost validates a send work request for a jetty that takes at most
// maxSGE SGEs; the error says op (post_jetty_send_wr).
func (wr *SendWR) CheckPost(maxSGE uint32) error {
	const op = "post_jetty_send_wr"
	switch {
	case wr == nil:
		return Errorf(op, CodeInval, "work request is nil")
	case wr.Opcode != OpSend && wr.Opcode != OpSendWithImm:
		return Errorf(op, CodeInval, "opcode %#x is not SEND or SEND_WITH_IMM", uint8(wr.Opcode))
	case uint32(len(wr.SGEs)) > maxSGE:
		return Errorf(op, CodeInval, "%d SGEs, the jetty takes at most %d", len(wr.SGEs), maxSGE)
	}
	return nil
}

// CheckPost validates a receive work request for a JFR that takes at most
// maxSGE SGEs.
func (wr *RecvWR) CheckPost(maxSGE uint32) error {
	const op = "post_jfr_wr"
	switch {
	case wr == nil:
		return Errorf(op, CodeInval, "work request is nil")
	case uint32(len(wr.SGEs)) > maxSGE:
		return Errorf(op, CodeInval, "%d SGEs, the JFR takes at most %d", len(wr.SGEs), maxSGE)
	}
	return nil
}
