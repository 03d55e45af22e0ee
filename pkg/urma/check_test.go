package urma

import (
	"errors"
	"strings"
	"testing"
)

// Every limit of a queue configuration or a work request is refused past
// its edge, with an error that names it, and accepted at the edge.
func TestConfigChecks(t *testing.T) {
	caps := DeviceCaps{
		MaxJFCDepth: 64, MaxJFRDepth: 32, MaxJFSDepth: 16, MaxJFRSge: 4, MaxJFSSge: 2, MaxJFSInlineSize: 8,
		TransMode: TransModeRM,
	}
	jetty := func(f func(*JettyConfig)) error {
		c := JettyConfig{Mode: RM, SQDepth: 16, MaxSGE: 2, MaxInline: 8, RNRRetry: 7, ErrTimeout: 31, Priority: 15}
		f(&c)
		return c.Check(caps, RM)
	}
	jfr := func(f func(*JFRConfig)) error {
		c := JFRConfig{Mode: RM, Depth: 32, MaxSGE: 4, MinRNRTimer: 31, TokenPolicy: TokenAllEncrypted}
		f(&c)
		return c.Check(caps)
	}
	tests := []struct {
		name string
		err  error
		want string // "" means valid
	}{
		{"JFC at its limits", JFCConfig{Depth: 64}.Check(caps), ""},
		{"JFC depth 0", JFCConfig{}.Check(caps), "depth 0 outside 1..64"},
		{"JFC too deep", JFCConfig{Depth: 65}.Check(caps), "depth 65 outside 1..64"},
		{"JFR at its limits", jfr(func(*JFRConfig) {}), ""},
		{"JFR without mode", jfr(func(c *JFRConfig) { c.Mode = 0 }), "transport mode not set"},
		{"JFR mode the device lacks", jfr(func(c *JFRConfig) { c.Mode = RC }), "transport mode RC not supported"},
		{"JFR unknown mode", jfr(func(c *JFRConfig) { c.Mode = 9 }), "not supported"},
		{"JFR depth 0", jfr(func(c *JFRConfig) { c.Depth = 0 }), "depth 0 outside 1..32"},
		{"JFR too deep", jfr(func(c *JFRConfig) { c.Depth = 33 }), "depth 33 outside 1..32"},
		{"JFR SGEs", jfr(func(c *JFRConfig) { c.MaxSGE = 5 }), "max SGE 5 above the device's 4"},
		{"JFR RNR timer", jfr(func(c *JFRConfig) { c.MinRNRTimer = 32 }), "min RNR timer 32 outside 0..31"},
		{"JFR token policy", jfr(func(c *JFRConfig) { c.TokenPolicy = TokenAllEncrypted + 1 }), "token policy 4 unknown"},
		{"jetty at its limits", jetty(func(*JettyConfig) {}), ""},
		{"jetty mode other than its JFR's", (&JettyConfig{Mode: RM, SQDepth: 1}).Check(DeviceCaps{MaxJFSDepth: 1, TransMode: TransModeRM | TransModeRC}, RC), "jetty mode RM differs from its JFR's mode RC"},
		{"jetty without mode", jetty(func(c *JettyConfig) { c.Mode = 0 }), "transport mode not set"},
		{"jetty depth 0", jetty(func(c *JettyConfig) { c.SQDepth = 0 }), "SQ depth 0 outside 1..16"},
		{"jetty too deep", jetty(func(c *JettyConfig) { c.SQDepth = 17 }), "SQ depth 17 outside 1..16"},
		{"jetty SGEs", jetty(func(c *JettyConfig) { c.MaxSGE = 3 }), "max SGE 3 above the device's 2"},
		{"jetty inline", jetty(func(c *JettyConfig) { c.MaxInline = 9 }), "max inline 9 above the device's 8"},
		{"jetty RNR retry", jetty(func(c *JettyConfig) { c.RNRRetry = 8 }), "RNR retry 8 outside 0..7"},
		{"jetty error timeout", jetty(func(c *JettyConfig) { c.ErrTimeout = 32 }), "error timeout 32 outside 0..31"},
		{"jetty priority", jetty(func(c *JettyConfig) { c.Priority = 16 }), "priority 16 outside 0..15"},
		{"send at its limits", (&SendWR{Opcode: OpSendWithImm, SGEs: make([]SGE, 2)}).CheckPost(2), ""},
		{"send without SGEs", (&SendWR{Opcode: OpSend}).CheckPost(2), ""},
		{"send nil", (*SendWR)(nil).CheckPost(2), "work request is nil"},
		{"send opcode", (&SendWR{Opcode: OpSendWithImm + 1}).CheckPost(2), "opcode 0x42 is not SEND or SEND_WITH_IMM"},
		{"send SGEs", (&SendWR{Opcode: OpSend, SGEs: make([]SGE, 3)}).CheckPost(2), "3 SGEs, the jetty takes at most 2"},
		{"receive at its limits", (&RecvWR{SGEs: make([]SGE, 4)}).CheckPost(4), ""},
		{"receive nil", (*RecvWR)(nil).CheckPost(4), "work request is nil"},
		{"receive SGEs", (&RecvWR{SGEs: make([]SGE, 5)}).CheckPost(4), "5 SGEs, the JFR takes at most 4"},
	}
	for _, tc := range tests {
		switch {
		case tc.want == "" && tc.err != nil:
			t.Errorf("%s: %v, want valid", tc.name, tc.err)
		case tc.want != "" && (!errors.Is(tc.err, ErrInval) || !strings.Contains(tc.err.Error(), tc.want)):
			t.Errorf("%s: %v, want ErrInval saying %q", tc.name, tc.err, tc.want)
		}
	}
}
