package tuning

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// roomy is a device that limits nothing the base profile asks for: its
// completion queues hold the largest queues and the transport's spare.
func roomy() Limits {
	return Limits{MaxJFSDepth: 4096, MaxJFRDepth: 4096, MaxJFCDepth: 2*4096 + flags.JFCSpare, MaxMsgSize: 1 << 31, JettiesPerDevice: 1024, DeviceCount: 2}
}

func base() Profile {
	return Profile{MessageSize: 4096, ConnectionsPerPod: 4, InflightPerConnection: 32, Objective: Balanced, JettyBudget: 8}
}

func TestFlagNamesExist(t *testing.T) {
	for _, name := range []string{
		FlagUsePolling, FlagPollerNum, FlagPollerYield, FlagSQSize, FlagRQSize, FlagCQEPollOnce,
		FlagRecvZerocopy, FlagZerocopyMinSize, FlagBondingMode, FlagBondingLevel,
		FlagPreparedJettyCnt, FlagBufferSize, FlagBufferCount, FlagHandshake,
	} {
		if _, ok := flags.Lookup(name); !ok {
			t.Errorf("flag %s is not in pkg/transport/flags", name)
		}
	}
}

// want is a partial expectation: nil fields are not checked.
type want struct {
	bufferSize, bufferCount, sq, rq, prepared, pollers, batch, zcMin, handshake *int
	polling, yield, zerocopy                                                    *bool
	device                                                                      *string
	clamps                                                                      []Clamp
	warnings                                                                    []string // substrings, in order
	registered                                                                  *int64
}

func i(v int) *int       { return &v }
func b(v bool) *bool     { return &v }
func s(v string) *string { return &v }
func i64(v int64) *int64 { return &v }
func (w want) check(t *testing.T, r Result) {
	t.Helper()
	f := r.Flags
	ints := []struct {
		name string
		got  int
		want *int
	}{
		{FlagBufferSize, f.BufferSize, w.bufferSize}, {FlagBufferCount, f.BufferCount, w.bufferCount},
		{FlagSQSize, f.SQSize, w.sq}, {FlagRQSize, f.RQSize, w.rq},
		{FlagPreparedJettyCnt, f.PreparedJettyCnt, w.prepared}, {FlagPollerNum, f.PollerNum, w.pollers},
		{FlagCQEPollOnce, f.CQEPollOnce, w.batch}, {FlagZerocopyMinSize, f.ZerocopyMinSize, w.zcMin},
		{FlagHandshake, f.ClientHandshakeVersion, w.handshake},
	}
	for _, c := range ints {
		if c.want != nil && c.got != *c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, *c.want)
		}
	}
	bools := []struct {
		name string
		got  bool
		want *bool
	}{{FlagUsePolling, f.UsePolling, w.polling}, {FlagPollerYield, f.PollerYield, w.yield}, {FlagRecvZerocopy, f.RecvZerocopy, w.zerocopy}}
	for _, c := range bools {
		if c.want != nil && c.got != *c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, *c.want)
		}
	}
	if w.device != nil && f.Device != *w.device {
		t.Errorf("urma_device = %q, want %q", f.Device, *w.device)
	}
	if !reflect.DeepEqual(r.Clamps, w.clamps) {
		t.Errorf("clamps:\n got  %v\n want %v", r.Clamps, w.clamps)
	}
	if len(r.Warnings) != len(w.warnings) {
		t.Errorf("warnings: got %q, want %d matching %q", r.Warnings, len(w.warnings), w.warnings)
	} else {
		for k, sub := range w.warnings {
			if !strings.Contains(r.Warnings[k], sub) {
				t.Errorf("warning %d = %q, want it to contain %q", k, r.Warnings[k], sub)
			}
		}
	}
	if w.registered != nil && r.RegisteredBytes != *w.registered {
		t.Errorf("RegisteredBytes = %d, want %d", r.RegisteredBytes, *w.registered)
	}
	if err := f.Validate(); err != nil {
		t.Errorf("derived flags do not validate: %v", err)
	}
}

func TestDeriveRules(t *testing.T) {
	type tc struct {
		name      string
		profile   func(*Profile)
		overrides map[string]string
		limits    func(*Limits)
		want      want
	}
	cases := []tc{
		// Objectives: buffer floor, completion mode, batch, zero-copy threshold.
		{name: "balanced", want: want{
			bufferSize: i(8192), sq: i(35), rq: i(35), bufferCount: i(4 * 70), prepared: i(4),
			polling: b(false), pollers: i(1), yield: b(false), batch: i(32), zerocopy: b(true), zcMin: i(512),
			handshake: i(2), registered: i64(8192 * 280),
		}},
		{name: "latency polls, small batches, copies small receives", profile: func(p *Profile) { p.Objective = Latency }, want: want{
			bufferSize: i(4096), sq: i(35), polling: b(true), pollers: i(1), yield: b(false), batch: i(16), zcMin: i(4096),
		}},
		{name: "throughput batches into 64KiB buffers, event mode", profile: func(p *Profile) { p.Objective = Throughput }, want: want{
			bufferSize: i(65536), sq: i(35), polling: b(false), batch: i(64), zcMin: i(512),
		}},
		{name: "empty objective means balanced", profile: func(p *Profile) { p.Objective = "" }, want: want{bufferSize: i(8192), batch: i(32)}},
		{name: "latency zero-copy threshold never above the buffer", profile: func(p *Profile) { p.Objective = Latency; p.MessageSize = 100 }, want: want{
			bufferSize: i(1024), zcMin: i(1024),
		}},
		// Buffer size: one typical message per buffer.
		{name: "buffer rounds message up to a power of two", profile: func(p *Profile) { p.MessageSize = 100000 }, want: want{bufferSize: i(131072), sq: i(35)}},
		// Queue depth: work requests in flight plus the credit reserve.
		{name: "depth follows inflight", profile: func(p *Profile) { p.InflightPerConnection = 200 }, want: want{sq: i(203), rq: i(203), bufferCount: i(4 * 406)}},
		{name: "depth has the flag minimum without a clamp", profile: func(p *Profile) { p.InflightPerConnection = 1 }, want: want{sq: i(16), rq: i(16), bufferCount: i(4 * 32)}},
		{name: "max message fills the queue once", profile: func(p *Profile) { p.InflightPerConnection = 2; p.MaxMessageSize = 1 << 20 }, want: want{
			bufferSize: i(8192), sq: i(128 + 3), rq: i(131),
		}},
		// Buffer count: every queue slot of every connection.
		{name: "count covers all queues", profile: func(p *Profile) { p.ConnectionsPerPod = 10; p.JettyBudget = 10 }, want: want{bufferCount: i(10 * 70), prepared: i(10)}},
		{name: "count has the flag minimum", profile: func(p *Profile) { p.ConnectionsPerPod = 1; p.InflightPerConnection = 1; p.JettyBudget = 1 }, want: want{bufferCount: i(32)}},
		// Pollers.
		{name: "one poller per 8 connections", profile: func(p *Profile) { p.Objective = Latency; p.ConnectionsPerPod = 20; p.JettyBudget = 20 }, want: want{pollers: i(3), polling: b(true)}},
		{name: "pollers capped at 4", profile: func(p *Profile) { p.Objective = Latency; p.ConnectionsPerPod = 100; p.JettyBudget = 100 }, want: want{pollers: i(4)}},
		// Completion mode set explicitly.
		{name: "explicit polling on balanced yields", profile: func(p *Profile) { p.Completion = CompletionPolling }, want: want{polling: b(true), yield: b(true), pollers: i(1)}},
		{name: "explicit event on latency", profile: func(p *Profile) { p.Objective = Latency; p.Completion = CompletionEvent }, want: want{polling: b(false), pollers: i(1), batch: i(16)}},
		{name: "explicit polling on throughput keeps the core", profile: func(p *Profile) { p.Objective = Throughput; p.Completion = CompletionPolling }, want: want{polling: b(true), yield: b(false)}},
		// Pass-through.
		{name: "handshake and bonding pass through", profile: func(p *Profile) { p.HandshakeVersion = 3; p.BondingMode = 2; p.BondingLevel = 1 }, want: want{handshake: i(3)}},

		// Clamps.
		{name: "buffer clamped by device maxMsgSize", profile: func(p *Profile) { p.MessageSize = 4 << 20 }, limits: func(l *Limits) { l.MaxMsgSize = 1 << 20 }, want: want{
			bufferSize: i(1 << 20), sq: i(32*4 + 3),
			clamps:   []Clamp{{Flag: FlagBufferSize, Wanted: 4 << 20, Got: 1 << 20, Reason: "device maxMsgSize 1048576"}},
			warnings: []string{"each pod registers 1098907648 bytes and no memoryBudget caps it"},
		}},
		{name: "buffer clamped to the power of two below maxMsgSize", limits: func(l *Limits) { l.MaxMsgSize = 3000 }, want: want{
			bufferSize: i(2048), sq: i(2*32 + 3),
			clamps: []Clamp{{Flag: FlagBufferSize, Wanted: 8192, Got: 2048, Reason: "device maxMsgSize 3000"}},
		}},
		{name: "maxMsgSize of exactly the minimum buffer is no warning", limits: func(l *Limits) { l.MaxMsgSize = 1024 }, want: want{
			bufferSize: i(1024),
			clamps:     []Clamp{{Flag: FlagBufferSize, Wanted: 8192, Got: 1024, Reason: "device maxMsgSize 1024"}},
		}},
		{name: "buffer at the 1KiB minimum when maxMsgSize is tiny", limits: func(l *Limits) { l.MaxMsgSize = 512 }, want: want{
			bufferSize: i(1024),
			clamps:     []Clamp{{Flag: FlagBufferSize, Wanted: 8192, Got: 1024, Reason: "device maxMsgSize 512 is below the 1024-byte minimum buffer"}},
			warnings:   []string{"maxMsgSize 512 is below brpc's minimum buffer size"},
		}},
		{name: "buffer clamped by the flag maximum", profile: func(p *Profile) { p.MessageSize = 1 << 30; p.InflightPerConnection = 1 }, want: want{
			bufferSize: i(64 << 20), sq: i(16 + 3),
			clamps:   []Clamp{{Flag: FlagBufferSize, Wanted: 1 << 30, Got: 64 << 20, Reason: "flag maximum 67108864"}},
			warnings: []string{"RLIMIT_MEMLOCK"},
		}},
		{name: "buffer and count clamped by memoryBudget", profile: func(p *Profile) { p.MemoryBudget = 64 << 10 }, want: want{
			bufferSize: i(4096), bufferCount: i(16), registered: i64(64 << 10),
			clamps: []Clamp{
				{Flag: FlagBufferSize, Wanted: 8192, Got: 4096, Reason: "memoryBudget 65536 must hold 16 buffers"},
				{Flag: FlagBufferCount, Wanted: 280, Got: 16, Reason: "memoryBudget 65536 holds 16 buffers of 4096 bytes"},
			},
			warnings: []string{"the pool (16 buffers) cannot hold one connection's minimum queues (16 + 16)", "the pool (16 buffers) is smaller than the queues need (280)"},
		}},
		// A connection takes urma_rq_size buffers when it is set up (or
		// falls back to TCP) and its sends take more: a pool capped below
		// one connection's queues shrinks them, else no connection could
		// ever use URMA.
		{name: "queues shrink to fit a pool capped by memoryBudget", profile: func(p *Profile) { p.MemoryBudget = 256 << 10 }, want: want{
			bufferSize: i(8192), bufferCount: i(32), sq: i(16), rq: i(16), registered: i64(256 << 10),
			clamps: []Clamp{
				{Flag: FlagBufferCount, Wanted: 280, Got: 32, Reason: "memoryBudget 262144 holds 32 buffers of 8192 bytes"},
				{Flag: FlagSQSize, Wanted: 35, Got: 16, Reason: "a pool of 32 buffers must hold one connection's sq + rq"},
				{Flag: FlagRQSize, Wanted: 35, Got: 16, Reason: "a pool of 32 buffers must hold one connection's sq + rq"},
			},
			warnings: []string{"the pool (32 buffers) is smaller than the queues need (128)"},
		}},
		{name: "queues shrink to fit an overridden pool", overrides: map[string]string{FlagBufferCount: "50"}, want: want{
			bufferCount: i(50), sq: i(25), rq: i(25),
			clamps: []Clamp{
				{Flag: FlagSQSize, Wanted: 35, Got: 25, Reason: "a pool of 50 buffers must hold one connection's sq + rq"},
				{Flag: FlagRQSize, Wanted: 35, Got: 25, Reason: "a pool of 50 buffers must hold one connection's sq + rq"},
			},
		}},
		{name: "memoryBudget large enough clamps nothing", profile: func(p *Profile) { p.MemoryBudget = 1 << 30 }, want: want{bufferSize: i(8192), bufferCount: i(280)}},
		{name: "depth clamped by the flag maximum", profile: func(p *Profile) { p.MessageSize = 4 << 20; p.InflightPerConnection = 1024 }, limits: func(l *Limits) { l.MaxMsgSize = 1 << 20 }, want: want{
			bufferSize: i(1 << 20), sq: i(4096), rq: i(4096),
			clamps: []Clamp{
				{Flag: FlagBufferSize, Wanted: 4 << 20, Got: 1 << 20, Reason: "device maxMsgSize 1048576"},
				{Flag: FlagSQSize, Wanted: 4099, Got: 4096, Reason: "flag maximum 4096"},
				{Flag: FlagRQSize, Wanted: 4099, Got: 4096, Reason: "flag maximum 4096"},
			},
			warnings: []string{"RLIMIT_MEMLOCK"},
		}},
		{name: "depths clamped by device jfs and jfr", profile: func(p *Profile) { p.InflightPerConnection = 1000 }, limits: func(l *Limits) { l.MaxJFSDepth = 256; l.MaxJFRDepth = 512 }, want: want{
			sq: i(256), rq: i(512), bufferCount: i(4 * 768),
			clamps: []Clamp{
				{Flag: FlagSQSize, Wanted: 1003, Got: 256, Reason: "device maxJfsDepth 256"},
				{Flag: FlagRQSize, Wanted: 1003, Got: 512, Reason: "device maxJfrDepth 512"},
			},
		}},
		// The completion queue holds sq + rq + flags.JFCSpare (the
		// transport's flush-done record): the queues share maxJfcDepth - 1.
		{name: "depths share the completion queue", profile: func(p *Profile) { p.InflightPerConnection = 1000 }, limits: func(l *Limits) { l.MaxJFCDepth = 1024 }, want: want{
			sq: i(511), rq: i(512),
			clamps: []Clamp{
				{Flag: FlagSQSize, Wanted: 1003, Got: 511, Reason: "device maxJfcDepth 1024 must hold sq + rq + 1"},
				{Flag: FlagRQSize, Wanted: 1003, Got: 512, Reason: "device maxJfcDepth 1024 must hold sq + rq + 1"},
			},
		}},
		// sq != rq: the completion queue is shared in proportion, sq first.
		{name: "unequal depths share the completion queue in proportion", profile: func(p *Profile) { p.InflightPerConnection = 1000 }, limits: func(l *Limits) { l.MaxJFSDepth = 256; l.MaxJFCDepth = 1024 }, want: want{
			sq: i(1023 * 256 / (256 + 1003)), rq: i(1023 - 1023*256/(256+1003)), bufferCount: i(4 * 1023),
			clamps: []Clamp{
				{Flag: FlagSQSize, Wanted: 1003, Got: 256, Reason: "device maxJfsDepth 256"},
				{Flag: FlagSQSize, Wanted: 256, Got: 208, Reason: "device maxJfcDepth 1024 must hold sq + rq + 1"},
				{Flag: FlagRQSize, Wanted: 1003, Got: 815, Reason: "device maxJfcDepth 1024 must hold sq + rq + 1"},
			},
		}},
		{name: "unequal overridden depths share the completion queue in proportion", overrides: map[string]string{FlagSQSize: "64", FlagRQSize: "192"}, limits: func(l *Limits) { l.MaxJFCDepth = 128 }, want: want{
			sq: i(31), rq: i(96),
			clamps: []Clamp{
				{Flag: FlagSQSize, Wanted: 64, Got: 31, Override: true, Reason: "device maxJfcDepth 128 must hold sq + rq + 1"},
				{Flag: FlagRQSize, Wanted: 192, Got: 96, Override: true, Reason: "device maxJfcDepth 128 must hold sq + rq + 1"},
			},
		}},
		{name: "the smaller share keeps the flag minimum", overrides: map[string]string{FlagSQSize: "16", FlagRQSize: "4096"}, limits: func(l *Limits) { l.MaxJFCDepth = 1024 }, want: want{
			sq: i(16), rq: i(1023 - 16),
			clamps: []Clamp{{Flag: FlagRQSize, Wanted: 4096, Got: 1007, Override: true, Reason: "device maxJfcDepth 1024 must hold sq + rq + 1"}},
		}},
		// rq's share (2047*16/4112 = 7) is raised to the minimum 16; sq
		// gives up the difference.
		{name: "rq raised to the flag minimum takes its room from sq", overrides: map[string]string{FlagSQSize: "4096", FlagRQSize: "16"}, limits: func(l *Limits) { l.MaxJFCDepth = 2048 }, want: want{
			sq: i(2047 - 16), rq: i(16),
			clamps: []Clamp{{Flag: FlagSQSize, Wanted: 4096, Got: 2031, Override: true, Reason: "device maxJfcDepth 2048 must hold sq + rq + 1"}},
		}},
		{name: "queues one short of the completion queue are left alone", limits: func(l *Limits) { l.MaxJFCDepth = 71 }, want: want{sq: i(35), rq: i(35)}},
		{name: "queues exactly filling the completion queue leave no room for the flush-done record", limits: func(l *Limits) { l.MaxJFCDepth = 70 }, want: want{
			sq: i(34), rq: i(35),
			clamps: []Clamp{{Flag: FlagSQSize, Wanted: 35, Got: 34, Reason: "device maxJfcDepth 70 must hold sq + rq + 1"}},
		}},
		{name: "completion queue exactly holding the minimum queues", limits: func(l *Limits) { l.MaxJFCDepth = 33 }, want: want{
			sq: i(16), rq: i(16),
			clamps: []Clamp{
				{Flag: FlagSQSize, Wanted: 35, Got: 16, Reason: "device maxJfcDepth 33 must hold sq + rq + 1"},
				{Flag: FlagRQSize, Wanted: 35, Got: 16, Reason: "device maxJfcDepth 33 must hold sq + rq + 1"},
			},
		}},
		{name: "completion queue holding the minimum queues but not the flush-done record", limits: func(l *Limits) { l.MaxJFCDepth = 32 }, want: want{
			sq: i(35), rq: i(35), warnings: []string{"maxJfcDepth 32 cannot hold the minimum queues (16 + 16) and the transport's 1 spare completion"},
		}},
		{name: "completion queue too small for the minimum queues", limits: func(l *Limits) { l.MaxJFCDepth = 20 }, want: want{
			sq: i(35), rq: i(35), warnings: []string{"maxJfcDepth 20 cannot hold the minimum queues"},
		}},
		{name: "device depth at the flag minimum clamps", limits: func(l *Limits) { l.MaxJFSDepth = 16 }, want: want{
			sq: i(16), clamps: []Clamp{{Flag: FlagSQSize, Wanted: 35, Got: 16, Reason: "device maxJfsDepth 16"}},
		}},
		{name: "device depth below the flag minimum", limits: func(l *Limits) { l.MaxJFSDepth = 8 }, want: want{
			sq: i(35), warnings: []string{"device maxJfsDepth 8 is below the flag minimum 16"},
		}},
		{name: "count clamped by the flag maximum", profile: func(p *Profile) {
			p.ConnectionsPerPod = 1000
			p.JettyBudget = 1000
			p.InflightPerConnection = 1000
			p.MemoryBudget = 1 << 40
		}, want: want{
			bufferCount: i(1 << 20),
			clamps:      []Clamp{{Flag: FlagBufferCount, Wanted: 1000 * 2006, Got: 1 << 20, Reason: "flag maximum 1048576"}},
			warnings:    []string{"the pool (1048576 buffers) is smaller than the queues need (2006000)"},
		}},
		{name: "prepared jetties clamped by the budget", profile: func(p *Profile) { p.ConnectionsPerPod = 20 }, want: want{
			prepared: i(8),
			clamps:   []Clamp{{Flag: FlagPreparedJettyCnt, Wanted: 20, Got: 8, Reason: "jettyBudget 8"}},
			warnings: []string{"connectionsPerPod 20 exceeds jettyBudget 8"},
		}},
		{name: "prepared jetties clamped by the flag maximum", profile: func(p *Profile) { p.ConnectionsPerPod = 2000; p.JettyBudget = 2000; p.InflightPerConnection = 1 }, want: want{
			prepared: i(1024),
			clamps:   []Clamp{{Flag: FlagPreparedJettyCnt, Wanted: 2000, Got: 1024, Reason: "flag maximum 1024"}},
		}},

		// Overrides replace a rule's value, downstream rules use them, and
		// device clamps still apply (reported as override clamps).
		{name: "override sq clamped by the device", overrides: map[string]string{FlagSQSize: "2048"}, limits: func(l *Limits) { l.MaxJFSDepth = 1024 }, want: want{
			sq: i(1024), rq: i(35),
			clamps: []Clamp{{Flag: FlagSQSize, Wanted: 2048, Got: 1024, Override: true, Reason: "device maxJfsDepth 1024"}},
		}},
		{name: "override buffer size feeds the count", overrides: map[string]string{FlagBufferSize: "65536"}, profile: func(p *Profile) { p.MemoryBudget = 1 << 20 }, want: want{
			bufferSize: i(65536), bufferCount: i(16),
			clamps:   []Clamp{{Flag: FlagBufferCount, Wanted: 280, Got: 16, Reason: "memoryBudget 1048576 holds 16 buffers of 65536 bytes"}},
			warnings: []string{"cannot hold one connection's minimum queues", "smaller than the queues need"},
		}},
		{name: "override buffer size above maxMsgSize", overrides: map[string]string{FlagBufferSize: "65536"}, limits: func(l *Limits) { l.MaxMsgSize = 16384 }, want: want{
			bufferSize: i(16384),
			clamps:     []Clamp{{Flag: FlagBufferSize, Wanted: 65536, Got: 16384, Override: true, Reason: "device maxMsgSize 16384"}},
		}},
		{name: "override count within budget wins silently", overrides: map[string]string{FlagBufferCount: "128"}, want: want{bufferCount: i(128)}},
		// Overrides in the other forms gflags (and so pkg/transport/flags)
		// reads mean what they say.
		{name: "override in gflags forms", overrides: map[string]string{FlagUsePolling: "yes", FlagPollerYield: "N", FlagSQSize: "0x40", FlagBufferCount: "0X1000"}, want: want{
			polling: b(true), yield: b(false), sq: i(64), bufferCount: i(4096),
		}},
		{name: "override polling off on latency", overrides: map[string]string{FlagUsePolling: "false"}, profile: func(p *Profile) { p.Objective = Latency }, want: want{polling: b(false), pollers: i(1)}},
		{name: "override prepared above budget", overrides: map[string]string{FlagPreparedJettyCnt: "16"}, want: want{
			prepared: i(8),
			clamps:   []Clamp{{Flag: FlagPreparedJettyCnt, Wanted: 16, Got: 8, Override: true, Reason: "jettyBudget 8"}},
		}},
		{name: "override of flags no rule derives", overrides: map[string]string{"urma_device": "udma1", "urma_max_sge": "4", FlagRecvZerocopy: "false", FlagZerocopyMinSize: "0", FlagCQEPollOnce: "8", FlagPollerNum: "2", FlagPollerYield: "true", FlagHandshake: "3"}, want: want{
			device: s("udma1"), zerocopy: b(false), zcMin: i(0), batch: i(8), pollers: i(2), yield: b(true), handshake: i(3),
		}},

		// Warnings about hardware that no flag can fix.
		{name: "budget above a nodes jetties", profile: func(p *Profile) { p.JettyBudget = 3000 }, want: want{
			warnings: []string{"jettyBudget 3000 exceeds a node's jetties (2 devices x 1024)"},
		}},
		{name: "unknown jetties give no budget warning", profile: func(p *Profile) { p.JettyBudget = 3000 }, limits: func(l *Limits) { l.JettiesPerDevice = 0 }, want: want{}},
		{name: "unknown device count gives no budget warning", profile: func(p *Profile) { p.JettyBudget = 3000 }, limits: func(l *Limits) { l.DeviceCount = 0 }, want: want{}},
		{name: "budget of exactly a nodes jetties", profile: func(p *Profile) { p.JettyBudget = 2048 }, want: want{}},
		{name: "registering exactly the large-registration size is no warning", overrides: map[string]string{FlagBufferSize: "65536", FlagBufferCount: "16384"}, want: want{
			registered: i64(LargeRegistrationBytes),
		}},
		{name: "registering above the large-registration size warns", overrides: map[string]string{FlagBufferSize: "65536", FlagBufferCount: "16385"}, want: want{
			warnings: []string{"each pod registers 1073807360 bytes and no memoryBudget caps it"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := base()
			if c.profile != nil {
				c.profile(&p)
			}
			l := roomy()
			if c.limits != nil {
				c.limits(&l)
			}
			r, err := Derive(p, c.overrides, l)
			if err != nil {
				t.Fatalf("Derive: %v", err)
			}
			c.want.check(t, r)
			checkJFC(t, r, l)
		})
	}
}

// checkJFC: unless Derive warned that the device's completion queue is too
// small, the transport can build a completion queue for the derived queues
// (pkg/transport refuses the device otherwise).
func checkJFC(t *testing.T, r Result, l Limits) {
	t.Helper()
	for _, w := range r.Warnings {
		if strings.Contains(w, "maxJfcDepth") {
			return
		}
	}
	if need := int64(r.Flags.SQSize+r.Flags.RQSize) + flags.JFCSpare; need > l.MaxJFCDepth {
		t.Errorf("sq %d + rq %d + %d = %d exceeds device maxJfcDepth %d without a warning",
			r.Flags.SQSize, r.Flags.RQSize, flags.JFCSpare, need, l.MaxJFCDepth)
	}
}

func TestDeriveBonding(t *testing.T) {
	p := base()
	p.BondingMode, p.BondingLevel = 1, 1
	r, err := Derive(p, nil, roomy())
	if err != nil {
		t.Fatal(err)
	}
	if r.Flags.BondingMode != 1 || r.Flags.BondingLevel != 1 {
		t.Errorf("bonding = %d/%d, want 1/1", r.Flags.BondingMode, r.Flags.BondingLevel)
	}
}

func TestDeriveRejectsBadInput(t *testing.T) {
	cases := []struct {
		name      string
		profile   func(*Profile)
		overrides map[string]string
		limits    func(*Limits)
		wantErr   string
	}{
		{name: "zero message", profile: func(p *Profile) { p.MessageSize = 0 }, wantErr: "messageSize must be positive"},
		{name: "message above max", profile: func(p *Profile) { p.MaxMessageSize = 100 }, wantErr: "messageSize 4096 is above maxMessageSize 100"},
		{name: "message too large", profile: func(p *Profile) { p.MessageSize = 1 << 41 }, wantErr: "at most 1099511627776"},
		{name: "no connections", profile: func(p *Profile) { p.ConnectionsPerPod = 0 }, wantErr: "connectionsPerPod must be in 1..65536"},
		{name: "inflight beyond any queue", profile: func(p *Profile) { p.InflightPerConnection = 4094 }, wantErr: "inflightPerConnection must be in 1..4093"},
		{name: "no budget", profile: func(p *Profile) { p.JettyBudget = 0 }, wantErr: "jettyBudget must be in 1..1048576"},
		{name: "tiny memory", profile: func(p *Profile) { p.MemoryBudget = 1000 }, wantErr: "memoryBudget 1000 is below 16384"},
		{name: "negative memory", profile: func(p *Profile) { p.MemoryBudget = -1 }, wantErr: "memoryBudget must not be negative"},
		{name: "memory above 1Ei", profile: func(p *Profile) { p.MemoryBudget = MaxMemoryBudget + 1 }, wantErr: "memoryBudget 1152921504606846977 is above 1152921504606846976 bytes (1Ei)"},
		{name: "bad objective", profile: func(p *Profile) { p.Objective = "Fast" }, wantErr: `objective "Fast" is not one of`},
		{name: "bad completion", profile: func(p *Profile) { p.Completion = "Busy" }, wantErr: `completion "Busy" is not one of`},
		// Passed-through fields are inputs too: out of range they are the
		// caller's mistake (ErrInvalid), not "a tuning bug".
		{name: "bad handshake version", profile: func(p *Profile) { p.HandshakeVersion = 4 }, wantErr: "handshakeVersion must be 2 or 3, got 4"},
		{name: "bad bonding mode", profile: func(p *Profile) { p.BondingMode = 3 }, wantErr: "bondingMode must be in 0..2, got 3"},
		{name: "bad bonding level", profile: func(p *Profile) { p.BondingLevel = -1 }, wantErr: "bondingLevel must be in 0..1, got -1"},
		{name: "unknown override", overrides: map[string]string{"urma_bogus": "1"}, wantErr: `unknown flag "urma_bogus"`},
		{name: "override out of range", overrides: map[string]string{FlagSQSize: "8"}, wantErr: "flag urma_sq_size: 8 is out of range (want 16..4096)"},
		{name: "override not power of two", overrides: map[string]string{FlagBufferSize: "3000"}, wantErr: "urma_buffer_size: 3000 is not a power of two"},
		{name: "override not a bool", overrides: map[string]string{FlagUsePolling: "maybe"}, wantErr: `urma_use_polling: "maybe" is not a boolean`},
		{name: "override injecting a line into the flags file", overrides: map[string]string{"urma_device": "udma0\n--urma_sq_size=99999"},
			wantErr: `overrides: flag urma_device: value "udma0\n--urma_sq_size=99999" contains a newline at byte 5`},
		{name: "override with a space", overrides: map[string]string{"urma_device": "udma 0"}, wantErr: `flag urma_device: value "udma 0" contains a space`},
		{name: "bad limits", limits: func(l *Limits) { l.MaxJFCDepth = 0 }, wantErr: "maxJfcDepth must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := base()
			if c.profile != nil {
				c.profile(&p)
			}
			l := roomy()
			if c.limits != nil {
				c.limits(&l)
			}
			_, err := Derive(p, c.overrides, l)
			if err == nil {
				t.Fatalf("Derive accepted it, want error containing %q", c.wantErr)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %q does not contain %q", err, c.wantErr)
			}
		})
	}
}

// Every limit of a profile is inclusive: the value at the limit is valid.
func TestValidateProfileAcceptsItsLimits(t *testing.T) {
	cases := []struct {
		name    string
		profile func(*Profile)
	}{
		{"message at the maximum", func(p *Profile) { p.MessageSize = MaxMessageBytes }},
		{"max message at the maximum", func(p *Profile) { p.MaxMessageSize = MaxMessageBytes }},
		{"max message equal to the message", func(p *Profile) { p.MaxMessageSize = p.MessageSize }},
		{"connections at the maximum", func(p *Profile) { p.ConnectionsPerPod = MaxConnections }},
		{"inflight at the maximum", func(p *Profile) { p.InflightPerConnection = MaxInflight }},
		{"jetty budget at the maximum", func(p *Profile) { p.JettyBudget = MaxJettyBudget }},
		{"memory budget at the minimum", func(p *Profile) { p.MemoryBudget = MinBufferCount * MinBufferSize }},
		{"memory budget at the maximum", func(p *Profile) { p.MemoryBudget = MaxMemoryBudget }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := base()
			c.profile(&p)
			if err := ValidateProfile(p); err != nil {
				t.Fatalf("ValidateProfile: %v", err)
			}
		})
	}
}

func TestValidateOverridesNamesEveryProblem(t *testing.T) {
	err := ValidateOverrides(map[string]string{"urma_zzz": "1", FlagRQSize: "99999", FlagSQSize: "64"})
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	if !strings.Contains(msg, `unknown flag "urma_zzz"`) || !strings.Contains(msg, "urma_rq_size: 99999 is out of range") {
		t.Errorf("error %q does not name both problems", msg)
	}
	if strings.Index(msg, "urma_rq_size") > strings.Index(msg, "urma_zzz") {
		t.Errorf("problems not sorted by flag name: %q", msg)
	}
	if err := ValidateOverrides(map[string]string{FlagSQSize: "64"}); err != nil {
		t.Errorf("valid override rejected: %v", err)
	}
}

func TestLimits(t *testing.T) {
	if err := SoftwareLimits().Validate(); err != nil {
		t.Fatalf("SoftwareLimits invalid: %v", err)
	}
	a := Limits{MaxJFSDepth: 100, MaxJFRDepth: 2000, MaxJFCDepth: 300, MaxMsgSize: 5000, JettiesPerDevice: 0, DeviceCount: 3}
	c := Limits{MaxJFSDepth: 200, MaxJFRDepth: 1000, MaxJFCDepth: 400, MaxMsgSize: 4000, JettiesPerDevice: 64, DeviceCount: 1}
	want := Limits{MaxJFSDepth: 100, MaxJFRDepth: 1000, MaxJFCDepth: 300, MaxMsgSize: 4000, JettiesPerDevice: 64, DeviceCount: 1}
	if got := a.Min(c); got != want {
		t.Errorf("Min = %+v, want %+v", got, want)
	}
	if got := c.Min(a); got != want {
		t.Errorf("Min is not symmetric: %+v", got)
	}
	for _, bad := range []Limits{
		{MaxJFSDepth: 1, MaxJFRDepth: 1, MaxJFCDepth: 1, MaxMsgSize: 1, DeviceCount: -1},
		{MaxJFSDepth: 1, MaxJFRDepth: 1, MaxJFCDepth: 1, MaxMsgSize: 1, JettiesPerDevice: -1},
	} {
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "must not be negative") {
			t.Errorf("%v: Validate() = %v, want negative counts rejected", bad, err)
		}
	}
	// The jetty counts are optional: 0 means unknown.
	if err := (Limits{MaxJFSDepth: 1, MaxJFRDepth: 1, MaxJFCDepth: 1, MaxMsgSize: 1}).Validate(); err != nil {
		t.Errorf("unknown jetty counts rejected: %v", err)
	}
	if s := a.String(); !strings.Contains(s, "maxJfsDepth=100") || !strings.Contains(s, "deviceCount=3") {
		t.Errorf("String() = %q", s)
	}
}

func TestClampString(t *testing.T) {
	cases := []struct {
		c    Clamp
		want string
	}{
		{Clamp{Flag: FlagSQSize, Wanted: 8195, Got: 4096, Reason: "flag maximum 4096"}, "urma_sq_size 8195 -> 4096 (flag maximum 4096)"},
		{Clamp{Flag: FlagSQSize, Wanted: 2048, Got: 1024, Override: true, Reason: "device maxJfsDepth 1024"}, "urma_sq_size override 2048 -> 1024 (device maxJfsDepth 1024)"},
	}
	for _, c := range cases {
		if got := c.c.String(); got != c.want {
			t.Errorf("String() = %q, want %q", got, c.want)
		}
	}
}

func TestRenderedFlagsParseBack(t *testing.T) {
	for _, obj := range []Objective{Latency, Throughput, Balanced} {
		p := base()
		p.Objective = obj
		r, err := Derive(p, map[string]string{"urma_device": "udma0"}, SoftwareLimits())
		if err != nil {
			t.Fatal(err)
		}
		back, err := flags.Parse(strings.NewReader(r.Flags.Render()))
		if err != nil {
			t.Fatalf("%s: rendered flags do not parse: %v", obj, err)
		}
		// Render writes every value; the file read back also names every
		// flag as given, which Derive's own Flags need not.
		if back.Render() != r.Flags.Render() {
			t.Errorf("%s: round trip changed flags:\n got  %+v\n want %+v", obj, back, r.Flags)
		}
	}
}

func TestPow2(t *testing.T) {
	for _, c := range []struct{ v, next, prev int64 }{
		{0, 1, 0}, {1, 1, 1}, {2, 2, 2}, {3, 4, 2}, {1024, 1024, 1024}, {1025, 2048, 1024}, {1 << 62, 1 << 62, 1 << 62}, {1<<62 + 1, 1 << 62, 1 << 62},
	} {
		if got := nextPow2(c.v); got != c.next {
			t.Errorf("nextPow2(%d) = %d, want %d", c.v, got, c.next)
		}
		if got := prevPow2(c.v); got != c.prev {
			t.Errorf("prevPow2(%d) = %d, want %d", c.v, got, c.prev)
		}
	}
}

// FuzzDerive checks that any input either fails validation or yields flags
// in range that respect the device limits unless a warning says otherwise.
func FuzzDerive(f *testing.F) {
	f.Add(int64(4096), int64(0), int64(4), int64(32), "Balanced", int64(0), int64(8), "Auto", int64(4096), int64(4096), int64(8192), int64(1<<20), "")
	f.Add(int64(1<<30), int64(1<<31), int64(1000), int64(4093), "Throughput", int64(1<<20), int64(1), "Polling", int64(16), int64(16), int64(32), int64(1024), "256")
	f.Add(int64(1), int64(1), int64(1), int64(1), "Latency", int64(16384), int64(1), "Event", int64(1), int64(1), int64(1), int64(1), "x")
	// Queues exactly filling the completion queue: no room for the transport's flush-done record.
	f.Add(int64(4096), int64(0), int64(4), int64(32), "Balanced", int64(0), int64(8), "Auto", int64(4096), int64(4096), int64(70), int64(1<<20), "")
	// A receive queue held at its minimum (maxJfrDepth 16) beside a deep send queue.
	f.Add(int64(4096), int64(0), int64(1), int64(32), "Balanced", int64(0), int64(8), "Auto", int64(4096), int64(16), int64(2048), int64(1<<20), "4096")
	f.Fuzz(func(t *testing.T, msg, maxMsg, conns, inflight int64, obj string, mem, budget int64, comp string, jfs, jfr, jfc, maxMsgSize int64, sqOverride string) {
		p := Profile{MessageSize: msg, MaxMessageSize: maxMsg, ConnectionsPerPod: conns, InflightPerConnection: inflight,
			Objective: Objective(obj), MemoryBudget: mem, JettyBudget: budget, Completion: Completion(comp)}
		l := Limits{MaxJFSDepth: jfs, MaxJFRDepth: jfr, MaxJFCDepth: jfc, MaxMsgSize: maxMsgSize}
		var o map[string]string
		if sqOverride != "" {
			o = map[string]string{FlagSQSize: sqOverride}
		}
		r, err := Derive(p, o, l)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not marked invalid input: %v", err)
			}
			return
		}
		if err := r.Flags.Validate(); err != nil {
			t.Fatalf("flags out of range: %v", err)
		}
		if len(r.Warnings) == 0 {
			if int64(r.Flags.SQSize) > jfs || int64(r.Flags.RQSize) > jfr || int64(r.Flags.SQSize+r.Flags.RQSize)+flags.JFCSpare > jfc {
				t.Fatalf("queues %d/%d (+%d spare completion) exceed device %d/%d/%d without a warning", r.Flags.SQSize, r.Flags.RQSize, flags.JFCSpare, jfs, jfr, jfc)
			}
			if int64(r.Flags.BufferSize) > maxMsgSize {
				t.Fatalf("buffer %d exceeds maxMsgSize %d without a warning", r.Flags.BufferSize, maxMsgSize)
			}
			if r.Flags.BufferCount < r.Flags.SQSize+r.Flags.RQSize {
				t.Fatalf("pool of %d buffers cannot hold one connection's queues %d/%d without a warning", r.Flags.BufferCount, r.Flags.SQSize, r.Flags.RQSize)
			}
		}
		if mem > 0 && r.RegisteredBytes > mem {
			t.Fatalf("registered %d bytes beyond memoryBudget %d", r.RegisteredBytes, mem)
		}
	})
}
