// Package flags is the urma_* flag set that pkg/transport and brpc's
// UrmaTransport read: names, defaults, ranges, a gflags-style file format and
// its renderer. It is pure (no I/O beyond the io.Reader it is handed) so the
// operator's tuning code can use it to render the files it ships to pods.
package flags

import (
	"bufio"
	"fmt"
	"io"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Kind is a flag's value type.
type Kind int

// Flag kinds.
const (
	Bool Kind = iota
	Int
	String
	// Duration is a Go duration ("1s", "250ms"); Min and Max bound it in
	// nanoseconds. Only transport-only flags use it: brpc has no such kind.
	Duration
)

// Spec describes one flag.
type Spec struct {
	Name     string // full gflags name, with the urma_ prefix
	Kind     Kind
	Default  string
	Min, Max int64 // inclusive range for Int flags
	// PowerOfTwo requires an Int flag to be a power of two.
	PowerOfTwo bool
	// Values lists what a String flag may be; nil allows any one word
	// (checkString).
	Values []string
	// TransportOnly marks a flag only pkg/transport reads: brpc does not
	// know it, so Specs leaves it out (see TransportSpecs) and Render
	// writes it only when it differs from its default.
	TransportOnly bool
	Help          string
}

// JFCSpare is how many completion-queue entries a connection needs beyond
// urma_sq_size + urma_rq_size: pkg/transport gives each connection one
// completion queue for both its queues, and that queue must also hold the
// flush-done record (StatusWRFlushErrDone) the jetty posts when closing moves
// it to ERROR. A device whose max_jfc_depth is below
// urma_sq_size + urma_rq_size + JFCSpare is refused, and the connection falls
// back to TCP; internal/operator/tuning keeps the queues within it.
const JFCSpare = 1

// Range says what values are allowed, for error messages and docs.
func (s Spec) Range() string {
	switch s.Kind {
	case Bool:
		return "true or false"
	case String:
		if len(s.Values) > 0 {
			return "one of " + strings.Join(s.Values, ", ")
		}
		return "one word, no whitespace or control characters"
	case Duration:
		return fmt.Sprintf("a duration, %s..%s", time.Duration(s.Min), time.Duration(s.Max))
	}
	r := fmt.Sprintf("%d..%d", s.Min, s.Max)
	if s.PowerOfTwo {
		r += ", a power of two"
	}
	return r
}

// Flags is a complete, typed flag set.
type Flags struct {
	UsePolling             bool
	PollerNum              int
	PollerYield            bool
	DisableBthread         bool
	SQSize                 int
	RQSize                 int
	CQEPollOnce            int
	RecvZerocopy           bool
	ZerocopyMinSize        int
	Device                 string
	MaxSGE                 int
	BondingMode            int
	BondingLevel           int
	PreparedJettyCnt       int
	BufferSize             int
	BufferCount            int
	ClientHandshakeVersion int
	// Provider is urma_provider: "auto", "liburma" or "soft".
	Provider string
	// SoftFabric is urma_soft_fabric: "auto", "socket" or "shm".
	SoftFabric string
	// ShmRingSize is urma_shm_ring_size, in bytes.
	ShmRingSize int
	// SoftMaxConns is urma_soft_max_conns: how many peer devices (peer
	// processes) may connect to the software provider's device
	// (soft.Options.MaxConns). A server connects to its client's device
	// in the handshake, so it bounds the servers one Dialer reaches.
	SoftMaxConns int
	// RequireToken is urma_require_token: refuse URMA to peers that cannot
	// present a token (brpc), serving them on TCP.
	RequireToken bool
	// FirstBytesTimeout is urma_first_bytes_timeout: how long a server
	// waits for a client's first bytes before it serves a silent client as
	// plain TCP; 0 waits the whole handshake timeout.
	FirstBytesTimeout time.Duration
	// AckTimeout is urma_ack_timeout: how long a server that has set up a
	// jetty for a client waits for the client's ACK before it drops the
	// connection and gives the jetty back; 0 waits the whole handshake
	// timeout.
	AckTimeout time.Duration
	// EventSpin is urma_event_spin: how long, in event mode, a reader
	// with nothing to read polls the completion queue itself before it
	// sleeps until the completion event.
	EventSpin time.Duration
	// PoolRemoteRead is urma_pool_remote_read: register the buffer pool
	// with remote read access, so that a provider that can send by
	// reference (the shm fabric) copies each byte once, at the price of
	// every peer being able to read the whole pool.
	PoolRemoteRead bool
	// ShmSendBuffers is urma_shm_send_buffers: on the shm fabric, each
	// connection sends from buffers of its own, shared with its peer
	// alone, so that large SENDs cross by reference without showing the
	// peer anything sent to another.
	ShmSendBuffers bool
	// ReadDirect is urma_read_direct: a Read of urma_zerocopy_min_size
	// bytes or more that waits for a message offers its slice to the
	// provider, which copies the next message straight into it (software
	// provider only), so Read makes no copy of its own.
	ReadDirect bool
	// PoolHugePages is urma_pool_huge_pages: where no peer maps the buffer
	// pool (liburma, the socket fabric), map it as private memory that the
	// kernel may back with transparent huge pages.
	PoolHugePages bool

	// set marks the flags Set (a flags file, a command line) assigned, by
	// their place in table(): see Given.
	set uint64
}

// field binds a Spec to the Flags field it sets.
type field struct {
	spec Spec
	b    func(*Flags) *bool
	i    func(*Flags) *int
	s    func(*Flags) *string
	d    func(*Flags) *time.Duration
}

// table lists every flag once. Defaults and ranges follow brpc's
// src/brpc/urma/urma_helper.cpp and docs/cn/urma.md.
func table() []field {
	return []field{
		{spec: Spec{Name: "urma_use_polling", Kind: Bool, Default: "false", Help: "poll completion queues instead of waiting on completion events"}, b: func(f *Flags) *bool { return &f.UsePolling }},
		{spec: Spec{Name: "urma_poller_num", Kind: Int, Default: "1", Min: 1, Max: 64, Help: "number of poller goroutines in polling mode"}, i: func(f *Flags) *int { return &f.PollerNum }},
		{spec: Spec{Name: "urma_poller_yield", Kind: Bool, Default: "false", Help: "pollers yield the processor when a poll finds nothing, and their thread (sched_yield) after 50us of nothing"}, b: func(f *Flags) *bool { return &f.PollerYield }},
		{spec: Spec{Name: "urma_disable_bthread", Kind: Bool, Default: "false", Help: "brpc only: run pollers on pthreads; accepted and ignored by pkg/transport"}, b: func(f *Flags) *bool { return &f.DisableBthread }},
		{spec: Spec{Name: "urma_sq_size", Kind: Int, Default: "128", Min: 16, Max: 4096, Help: "send queue depth per connection; 3 entries are reserved for credit messages"}, i: func(f *Flags) *int { return &f.SQSize }},
		{spec: Spec{Name: "urma_rq_size", Kind: Int, Default: "128", Min: 16, Max: 4096, Help: "receive queue depth per connection; 3 entries are reserved for credit messages"}, i: func(f *Flags) *int { return &f.RQSize }},
		{spec: Spec{Name: "urma_cqe_poll_once", Kind: Int, Default: "32", Min: 1, Max: 64, Help: "completion records taken per poll call"}, i: func(f *Flags) *int { return &f.CQEPollOnce }},
		{spec: Spec{Name: "urma_recv_zerocopy", Kind: Bool, Default: "true", Help: "hand large receives to the reader without copying"}, b: func(f *Flags) *bool { return &f.RecvZerocopy }},
		{spec: Spec{Name: "urma_zerocopy_min_size", Kind: Int, Default: "512", Min: 0, Max: 1 << 30, Help: "receives smaller than this are copied even with recv_zerocopy"}, i: func(f *Flags) *int { return &f.ZerocopyMinSize }},
		{spec: Spec{Name: "urma_device", Kind: String, Default: "", Help: "device to open; empty picks the first usable one (URMA_DEVICE overrides)"}, s: func(f *Flags) *string { return &f.Device }},
		{spec: Spec{Name: "urma_max_sge", Kind: Int, Default: "0", Min: 0, Max: 64, Help: "scatter/gather entries per work request; 0 uses the device maximum"}, i: func(f *Flags) *int { return &f.MaxSGE }},
		{spec: Spec{Name: "urma_bonding_mode", Kind: Int, Default: "0", Min: 0, Max: 2, Help: "bonding device mode: 0 standalone, 1 active-backup, 2 balance"}, i: func(f *Flags) *int { return &f.BondingMode }},
		{spec: Spec{Name: "urma_bonding_level", Kind: Int, Default: "0", Min: 0, Max: 1, Help: "bonding level: 0 IODIE, 1 port"}, i: func(f *Flags) *int { return &f.BondingLevel }},
		{spec: Spec{Name: "urma_prepared_jetty_cnt", Kind: Int, Default: "8", Min: 0, Max: 1024, Help: "jetties created ahead of connections; capped by the jetty budget and RLIMIT_NOFILE"}, i: func(f *Flags) *int { return &f.PreparedJettyCnt }},
		{spec: Spec{Name: "urma_buffer_size", Kind: Int, Default: "8192", Min: 1024, Max: 64 << 20, PowerOfTwo: true, Help: "size of each registered buffer in bytes"}, i: func(f *Flags) *int { return &f.BufferSize }},
		{spec: Spec{Name: "urma_buffer_count", Kind: Int, Default: "65536", Min: 16, Max: 1 << 20, Help: "number of registered buffers in the pool"}, i: func(f *Flags) *int { return &f.BufferCount }},
		{spec: Spec{Name: "urma_client_handshake_version", Kind: Int, Default: "2", Min: 2, Max: 3, Help: "hello a client sends: 2 binary, 3 protobuf"}, i: func(f *Flags) *int { return &f.ClientHandshakeVersion }},
		{spec: Spec{
			Name: "urma_provider", Kind: String, Default: "auto", Values: []string{"auto", "liburma", "soft"}, TransportOnly: true,
			Help: "URMA implementation: liburma (UB hardware), soft (the software provider), or auto: liburma when the library loads and lists a UB device, else soft (URMA_PROVIDER overrides)",
		}, s: func(f *Flags) *string { return &f.Provider }},
		{spec: Spec{
			Name: "urma_soft_fabric", Kind: String, Default: "auto", Values: []string{"auto", "socket", "shm"}, TransportOnly: true,
			Help: "how the software provider reaches a peer: shm (shared memory, same host only, else plain TCP), socket (TCP, to emulate UB between hosts), or auto: shm on the same host, the socket fabric with a peer on another host that runs it too, else plain TCP (URMA_SOFT_FABRIC overrides)",
		}, s: func(f *Flags) *string { return &f.SoftFabric }},
		{spec: Spec{
			Name: "urma_shm_ring_size", Kind: Int, Default: "2097152", Min: 64 << 10, Max: 256 << 20, PowerOfTwo: true, TransportOnly: true,
			Help: "bytes of the shared-memory ring each side of a same-host connection writes into, one per peer process, charged to this pod's memory limit",
		}, i: func(f *Flags) *int { return &f.ShmRingSize }},
		{spec: Spec{
			// The default is soft.DefaultMaxConns (this package imports no
			// provider; pkg/transport's tests keep the two equal). Each
			// connection holds descriptors and goroutines, and on shm a
			// ring of urma_shm_ring_size, so the range stops at 65536.
			Name: "urma_soft_max_conns", Kind: Int, Default: "1024", Min: 1, Max: 65536, TransportOnly: true,
			Help: "software provider (shm and socket fabrics): how many peer processes may connect to this Dialer's or Listener's device; as a server connects to its client's device in the handshake, this is how many server processes one Dialer reaches over URMA: the next one serves it on TCP (import_failed there, peer_declined here) until one leaves",
		}, i: func(f *Flags) *int { return &f.SoftMaxConns }},
		{spec: Spec{
			Name: "urma_require_token", Kind: Bool, Default: "false", TransportOnly: true,
			Help: "serve peers that cannot present a token (brpc) on TCP instead of on a jetty and segment registered without a token (URMA_REQUIRE_TOKEN overrides)",
		}, b: func(f *Flags) *bool { return &f.RequireToken }},
		{spec: Spec{
			Name: "urma_first_bytes_timeout", Kind: Duration, Default: "1s", Min: 0, Max: int64(time.Minute), TransportOnly: true,
			Help: "how long a server waits for a client's first bytes before serving a client that waits for the server to speak first as plain TCP; 0 waits the whole handshake timeout",
		}, d: func(f *Flags) *time.Duration { return &f.FirstBytesTimeout }},
		{spec: Spec{
			Name: "urma_ack_timeout", Kind: Duration, Default: "3s", Min: 0, Max: int64(time.Minute), TransportOnly: true,
			Help: "how long a server that has set up a jetty for a client waits for the client's ACK before it drops the connection and gives the jetty back; 0 waits the whole handshake timeout",
		}, d: func(f *Flags) *time.Duration { return &f.AckTimeout }},
		{spec: Spec{
			Name: "urma_event_spin", Kind: Duration, Default: "200µs", Min: 0, Max: int64(10 * time.Millisecond), TransportOnly: true,
			Help: "event mode: how long a reader with nothing to read polls its completion queue itself before it sleeps until the completion event; 0 always sleeps",
		}, d: func(f *Flags) *time.Duration { return &f.EventSpin }},
		{spec: Spec{
			Name: "urma_pool_remote_read", Kind: Bool, Default: "false", TransportOnly: true,
			Help: "register the buffer pool with remote read access: on shared memory a SEND then crosses by reference, one copy instead of two, but every peer may read the whole pool (other connections' data included); only where all peers are trusted",
		}, b: func(f *Flags) *bool { return &f.PoolRemoteRead }},
		{spec: Spec{
			Name: "urma_shm_send_buffers", Kind: Bool, Default: "true", TransportOnly: true,
			Help: "shm fabric: each connection sends from urma_sq_size buffers of its own (urma_buffer_size each, touched as used), shared read-only with its peer alone, so a SEND of 4 KiB or more crosses by reference, one copy instead of two; false sends from the pool through the ring",
		}, b: func(f *Flags) *bool { return &f.ShmSendBuffers }},
		{spec: Spec{
			Name: "urma_read_direct", Kind: Bool, Default: "true", TransportOnly: true,
			Help: "a Read of urma_zerocopy_min_size bytes or more that waits for a message lets the software provider copy the next message straight into the reader's slice, not into a receive buffer for Read to copy out again; no effect on liburma",
		}, b: func(f *Flags) *bool { return &f.ReadDirect }},
		{spec: Spec{
			Name: "urma_pool_huge_pages", Kind: Bool, Default: "true", TransportOnly: true,
			Help: "where no peer maps the buffer pool (liburma, the socket fabric), map it as private memory advised for transparent huge pages, so that copying large messages walks few pages; the pod is then charged a huge page (2 MiB) at a time as the pool is touched; false keeps small pages (the shm fabric always does)",
		}, b: func(f *Flags) *bool { return &f.PoolHugePages }},
	}
}

// Specs lists the flags brpc and pkg/transport share, sorted by name: what a
// flags file for both may carry, and what the operator renders.
func Specs() []Spec { return specs(false) }

// TransportSpecs lists the flags only pkg/transport reads, sorted by name.
func TransportSpecs() []Spec { return specs(true) }

func specs(transportOnly bool) []Spec {
	var out []Spec
	for _, f := range table() {
		if f.spec.TransportOnly == transportOnly {
			out = append(out, f.spec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Lookup finds a flag's Spec by its full name.
func Lookup(name string) (Spec, bool) {
	for _, f := range table() {
		if f.spec.Name == name {
			return f.spec, true
		}
	}
	return Spec{}, false
}

// Defaults returns brpc's defaults.
func Defaults() Flags {
	var f Flags
	for _, fl := range table() {
		if err := fl.set(&f, fl.spec.Default); err != nil {
			panic(err) // the table itself is wrong: a programming error
		}
	}
	return f
}

func (fl field) set(f *Flags, value string) error {
	s := fl.spec
	switch s.Kind {
	case Bool:
		v, ok := parseBool(value)
		if !ok {
			return fmt.Errorf("flag %s: %q is not a boolean (want %s)", s.Name, value, s.Range())
		}
		*fl.b(f) = v
	case Int:
		v, err := parseInt(value)
		if err != nil {
			return fmt.Errorf("flag %s: %q is not an integer (want %s)", s.Name, value, s.Range())
		}
		if err := checkInt(s, v); err != nil {
			return err
		}
		*fl.i(f) = int(v)
	case String:
		if err := checkString(s, value); err != nil {
			return err
		}
		*fl.s(f) = value
	case Duration:
		v, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("flag %s: %q is not a duration such as 1s or 250ms (want %s)", s.Name, value, s.Range())
		}
		if err := checkDuration(s, v); err != nil {
			return err
		}
		*fl.d(f) = v
	}
	return nil
}

// parseBool reads a boolean as brpc's gflags does (FlagValue::ParseFrom):
// 1, t, true, y, yes or 0, f, false, n, no, in any case, so that a flags
// file brpc accepts is one this package accepts too.
func parseBool(v string) (value, ok bool) {
	switch strings.ToLower(v) {
	case "1", "t", "true", "y", "yes":
		return true, true
	case "0", "f", "false", "n", "no":
		return false, true
	}
	return false, false
}

// parseInt reads an integer as brpc's gflags does: decimal, or hexadecimal
// after a leading 0x or 0X (a leading 0 alone is still decimal).
func parseInt(v string) (int64, error) {
	if len(v) > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X') {
		if v[2] == '+' || v[2] == '-' {
			return 0, fmt.Errorf("sign after 0x in %q", v)
		}
		return strconv.ParseInt(v[2:], 16, 64)
	}
	return strconv.ParseInt(v, 10, 64)
}

func checkDuration(s Spec, v time.Duration) error {
	if int64(v) < s.Min || int64(v) > s.Max {
		return fmt.Errorf("flag %s: %s is out of range (want %s)", s.Name, v, s.Range())
	}
	return nil
}

// checkString refuses whitespace and control characters in any String
// value before its list of values: a flags file has one --name=value per
// line, so a newline in a value writes lines of its own (flags nothing
// range-checked) and other whitespace or control characters do not survive
// Parse, brpc's gflags or a shell unchanged.
func checkString(s Spec, v string) error {
	for i, r := range v {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Errorf("flag %s: value %q contains %s at byte %d (want %s)", s.Name, v, describeRune(r), i, s.Range())
		}
	}
	if len(s.Values) > 0 && !slices.Contains(s.Values, v) {
		return fmt.Errorf("flag %s: %q is not allowed (want %s)", s.Name, v, s.Range())
	}
	return nil
}

// describeRune names a character checkString refuses.
func describeRune(r rune) string {
	switch r {
	case '\n':
		return "a newline"
	case '\r':
		return "a carriage return"
	case '\t':
		return "a tab"
	case ' ':
		return "a space"
	case 0:
		return "a NUL byte"
	}
	if unicode.IsSpace(r) {
		return fmt.Sprintf("whitespace %U", r)
	}
	return fmt.Sprintf("control character %U", r)
}

func checkInt(s Spec, v int64) error {
	if v < s.Min || v > s.Max {
		return fmt.Errorf("flag %s: %d is out of range (want %s)", s.Name, v, s.Range())
	}
	if s.PowerOfTwo && bits.OnesCount64(uint64(v)) != 1 {
		return fmt.Errorf("flag %s: %d is not a power of two (want %s)", s.Name, v, s.Range())
	}
	return nil
}

func (fl field) get(f *Flags) string {
	switch fl.spec.Kind {
	case Bool:
		return strconv.FormatBool(*fl.b(f))
	case Int:
		return strconv.Itoa(*fl.i(f))
	case Duration:
		return fl.d(f).String()
	}
	return *fl.s(f)
}

// Set assigns one flag by name from its text value, checking its range.
// The flag counts as given from then on (Given).
func (f *Flags) Set(name, value string) error {
	for i, fl := range table() {
		if fl.spec.Name == name {
			if err := fl.set(f, value); err != nil {
				return err
			}
			f.set |= 1 << i
			return nil
		}
	}
	return fmt.Errorf("unknown flag %q", name)
}

// Given reports whether flag name was given: Set assigned it (a flags
// file names it, as the operator's always does; a command line sets it),
// or it holds another value than its default. pkg/transport sizes what no
// flag gives (its buffers) itself, and never overrides a flag that was
// given, whatever its value. An unknown name was not given.
func (f *Flags) Given(name string) bool {
	for i, fl := range table() {
		if fl.spec.Name == name {
			return f.set&(1<<i) != 0 || fl.get(f) != fl.spec.Default
		}
	}
	return false
}

// Get returns one flag's value as text.
func (f *Flags) Get(name string) (string, error) {
	for _, fl := range table() {
		if fl.spec.Name == name {
			return fl.get(f), nil
		}
	}
	return "", fmt.Errorf("unknown flag %q", name)
}

// Validate checks every value against its range and the rules between flags.
func (f Flags) Validate() error {
	for _, fl := range table() {
		switch fl.spec.Kind {
		case Int:
			if err := checkInt(fl.spec, int64(*fl.i(&f))); err != nil {
				return err
			}
		case String:
			if err := checkString(fl.spec, *fl.s(&f)); err != nil {
				return err
			}
		case Duration:
			if err := checkDuration(fl.spec, *fl.d(&f)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Parse reads a gflags-style flag file: one --urma_name=value per line, blank
// lines and lines starting with # ignored, a bare --urma_bool meaning true
// and --nourma_bool false. As in gflags, a dash in a name stands for an
// underscore (--urma-sq-size is --urma_sq_size).
// Flags absent from the file keep brpc's defaults. Every error names the line
// and the flag. Flags without the urma_ prefix are other programs' (brpc reads
// the same file) and are skipped.
func Parse(r io.Reader) (Flags, error) {
	f := Defaults()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		if !strings.HasPrefix(text, "-") {
			return Flags{}, fmt.Errorf("flags file line %d: %q does not start with --", line, text)
		}
		text = strings.TrimLeft(text, "-")
		written, value, hasValue := strings.Cut(text, "=")
		// brpc's gflags, reading the same file, takes a dash in a name for
		// an underscore and --noX for a boolean X set to false: read such
		// lines as it does, rather than skip them as another program's.
		name := strings.ReplaceAll(written, "-", "_")
		negated := false
		if n, ok := strings.CutPrefix(name, "no"); ok && strings.HasPrefix(n, "urma_") {
			name, negated = n, true
		}
		if !strings.HasPrefix(name, "urma_") {
			continue
		}
		spec, ok := Lookup(name)
		if !ok {
			return Flags{}, fmt.Errorf("flags file line %d: unknown flag --%s", line, written)
		}
		switch {
		case negated && spec.Kind != Bool:
			return Flags{}, fmt.Errorf("flags file line %d: flag --%s: %s is not a boolean, only a boolean is negated with no (want --%s=%s)", line, written, name, name, spec.Range())
		case negated && hasValue:
			return Flags{}, fmt.Errorf("flags file line %d: flag --%s takes no value: it sets %s to false", line, written, name)
		case negated:
			value = "false"
		case !hasValue && spec.Kind != Bool:
			return Flags{}, fmt.Errorf("flags file line %d: flag --%s needs a value (want %s)", line, written, spec.Range())
		case !hasValue:
			value = "true"
		}
		if err := f.Set(name, value); err != nil {
			return Flags{}, fmt.Errorf("flags file line %d: %w", line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return Flags{}, fmt.Errorf("read flags file: %w", err)
	}
	return f, nil
}

// Render writes every flag as one --name=value line, sorted by name, in the
// form Parse and brpc's gflags read back. A transport-only flag is written
// only when it differs from its default: brpc's gflags refuses flags it
// does not know.
func (f Flags) Render() string {
	t := table()
	sort.Slice(t, func(i, j int) bool { return t[i].spec.Name < t[j].spec.Name })
	var b strings.Builder
	for _, fl := range t {
		v := fl.get(&f)
		if fl.spec.TransportOnly && v == fl.spec.Default {
			continue
		}
		fmt.Fprintf(&b, "--%s=%s\n", fl.spec.Name, v)
	}
	return b.String()
}
