package flags

import (
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// brpcDefaults are the defaults of brpc's urma_* gflags
// (src/brpc/urma/urma_helper.cpp, urma_handshake.cpp), written out here
// independently of the table so that a wrong table entry fails.
var brpcDefaults = map[string]string{
	"urma_use_polling":              "false",
	"urma_poller_num":               "1",
	"urma_poller_yield":             "false",
	"urma_disable_bthread":          "false",
	"urma_sq_size":                  "128",
	"urma_rq_size":                  "128",
	"urma_cqe_poll_once":            "32",
	"urma_recv_zerocopy":            "true",
	"urma_zerocopy_min_size":        "512",
	"urma_device":                   "",
	"urma_max_sge":                  "0",
	"urma_bonding_mode":             "0",
	"urma_bonding_level":            "0",
	"urma_prepared_jetty_cnt":       "8",
	"urma_buffer_size":              "8192",
	"urma_buffer_count":             "65536",
	"urma_client_handshake_version": "2",
}

func TestDefaultsMatchBrpc(t *testing.T) {
	d := Defaults()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	specs := Specs()
	if len(specs) != len(brpcDefaults) {
		t.Fatalf("table has %d flags, brpc has %d", len(specs), len(brpcDefaults))
	}
	for name, want := range brpcDefaults {
		got, err := d.Get(name)
		if err != nil {
			t.Fatalf("Get(%s): %v", name, err)
		}
		if got != want {
			t.Errorf("%s default = %q, want brpc's %q", name, got, want)
		}
		spec, ok := Lookup(name)
		if !ok || spec.Default != want {
			t.Errorf("Lookup(%s) = %+v, %v", name, spec, ok)
		}
	}
	// Typed fields agree with the text defaults.
	if d.SQSize != 128 || d.RQSize != 128 || d.BufferSize != 8192 || d.BufferCount != 65536 ||
		!d.RecvZerocopy || d.UsePolling || d.ClientHandshakeVersion != 2 || d.PreparedJettyCnt != 8 {
		t.Errorf("typed defaults wrong: %+v", d)
	}
}

func TestSpecsSortedAndDocumented(t *testing.T) {
	for _, specs := range [][]Spec{Specs(), TransportSpecs()} {
		if !sort.SliceIsSorted(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name }) {
			t.Errorf("%v is not sorted by name", specs)
		}
	}
	for _, s := range append(Specs(), TransportSpecs()...) {
		if !strings.HasPrefix(s.Name, "urma_") {
			t.Errorf("%s lacks the urma_ prefix", s.Name)
		}
		if s.Help == "" {
			t.Errorf("%s has no help text", s.Name)
		}
		if s.Kind == Int && s.Min > s.Max {
			t.Errorf("%s: empty range %s", s.Name, s.Range())
		}
	}
}

func TestRange(t *testing.T) {
	tests := []struct {
		name string
		want string
	}{
		{"urma_use_polling", "true or false"},
		{"urma_device", "one word, no whitespace or control characters"},
		{"urma_sq_size", "16..4096"},
		{"urma_buffer_size", "1024..67108864, a power of two"},
		{"urma_provider", "one of auto, liburma, soft"},
	}
	for _, tc := range tests {
		s, _ := Lookup(tc.name)
		if got := s.Range(); got != tc.want {
			t.Errorf("%s Range() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		check   func(Flags) bool
		wantErr string // substring; "" = success
	}{
		{name: "empty file keeps defaults", file: "", check: func(f Flags) bool { return f == Defaults() }},
		{name: "one int", file: "--urma_sq_size=256\n", check: func(f Flags) bool { return f.SQSize == 256 }},
		{name: "single dash", file: "-urma_rq_size=64", check: func(f Flags) bool { return f.RQSize == 64 }},
		{name: "comments and blanks", file: "# tuned by the operator\n\n  --urma_buffer_count=1024  \n", check: func(f Flags) bool { return f.BufferCount == 1024 }},
		{name: "bare bool is true", file: "--urma_use_polling", check: func(f Flags) bool { return f.UsePolling }},
		{name: "bool false", file: "--urma_recv_zerocopy=false", check: func(f Flags) bool { return !f.RecvZerocopy }},
		{name: "string", file: "--urma_device=udma0", check: func(f Flags) bool { return f.Device == "udma0" }},
		{name: "empty string", file: "--urma_device=", check: func(f Flags) bool { return f.Device == "" }},
		{name: "other programs flags skipped", file: "--max_body_size=1000\n--urma_poller_num=4", check: func(f Flags) bool { return f.PollerNum == 4 }},
		{name: "last one wins", file: "--urma_sq_size=32\n--urma_sq_size=64", check: func(f Flags) bool { return f.SQSize == 64 }},
		{name: "range minimum", file: "--urma_sq_size=16", check: func(f Flags) bool { return f.SQSize == 16 }},
		{name: "range maximum", file: "--urma_sq_size=4096", check: func(f Flags) bool { return f.SQSize == 4096 }},
		{name: "below range", file: "--urma_sq_size=15", wantErr: "line 1: flag urma_sq_size: 15 is out of range (want 16..4096)"},
		{name: "above range", file: "\n--urma_rq_size=4097", wantErr: "line 2: flag urma_rq_size: 4097 is out of range (want 16..4096)"},
		{name: "not a power of two", file: "--urma_buffer_size=3000", wantErr: "urma_buffer_size: 3000 is not a power of two (want 1024..67108864, a power of two)"},
		{name: "not an integer", file: "--urma_sq_size=big", wantErr: `urma_sq_size: "big" is not an integer (want 16..4096)`},
		{name: "not a boolean", file: "--urma_use_polling=maybe", wantErr: `urma_use_polling: "maybe" is not a boolean`},
		{name: "int needs value", file: "--urma_sq_size", wantErr: "flag --urma_sq_size needs a value (want 16..4096)"},
		{name: "unknown urma flag", file: "--urma_sq_depth=3", wantErr: "line 1: unknown flag --urma_sq_depth"},
		{name: "no dashes", file: "urma_sq_size=32", wantErr: `line 1: "urma_sq_size=32" does not start with --`},
		{name: "handshake version out of range", file: "--urma_client_handshake_version=4", wantErr: "urma_client_handshake_version: 4 is out of range (want 2..3)"},
		{name: "transport-only flag", file: "--urma_provider=liburma", check: func(f Flags) bool { return f.Provider == "liburma" }},
		// urma_soft_max_conns: soft.Options.MaxConns takes 0 or less for
		// its default, so the flag refuses them rather than pass them on.
		{name: "soft max conns default", file: "", check: func(f Flags) bool { return f.SoftMaxConns == 1024 }},
		{name: "soft max conns set", file: "--urma_soft_max_conns=4096", check: func(f Flags) bool { return f.SoftMaxConns == 4096 }},
		{name: "soft max conns minimum", file: "--urma_soft_max_conns=1", check: func(f Flags) bool { return f.SoftMaxConns == 1 }},
		{name: "soft max conns maximum", file: "--urma_soft_max_conns=65536", check: func(f Flags) bool { return f.SoftMaxConns == 65536 }},
		{name: "soft max conns zero", file: "--urma_soft_max_conns=0", wantErr: "line 1: flag urma_soft_max_conns: 0 is out of range (want 1..65536)"},
		{name: "soft max conns negative", file: "--urma_soft_max_conns=-5", wantErr: "line 1: flag urma_soft_max_conns: -5 is out of range (want 1..65536)"},
		{name: "soft max conns too large", file: "--urma_soft_max_conns=65537", wantErr: "line 1: flag urma_soft_max_conns: 65537 is out of range (want 1..65536)"},
		{name: "soft max conns not an integer", file: "--urma_soft_max_conns=many", wantErr: `line 1: flag urma_soft_max_conns: "many" is not an integer (want 1..65536)`},
		{name: "value not in the list", file: "--urma_provider=hardware", wantErr: `line 1: flag urma_provider: "hardware" is not allowed (want one of auto, liburma, soft)`},
		{name: "string with a space", file: "--urma_device=udma 0", wantErr: `line 1: flag urma_device: value "udma 0" contains a space at byte 4`},
		{name: "string with a tab inside", file: "--urma_device=udma\t0\n", wantErr: `line 1: flag urma_device: value "udma\t0" contains a tab at byte 4`},
		{name: "surrounding whitespace not in the value", file: "  --urma_device=udma0 \t", check: func(f Flags) bool { return f.Device == "udma0" }},
		// brpc's gflags reads the same file: dashes stand for underscores
		// and --noX sets a boolean X false. Such a line is a urma_ flag,
		// never another program's to skip.
		{name: "dashes for underscores", file: "--urma-sq-size=256\n", check: func(f Flags) bool { return f.SQSize == 256 }},
		{name: "negated boolean", file: "--nourma_recv_zerocopy\n", check: func(f Flags) bool { return !f.RecvZerocopy }},
		{name: "negated boolean with dashes", file: "--nourma-shm-send-buffers", check: func(f Flags) bool { return !f.ShmSendBuffers }},
		{name: "dashed value range-checked", file: "--urma-rq-size=8", wantErr: "line 1: flag urma_rq_size: 8 is out of range (want 16..4096)"},
		{name: "unknown flag with dashes", file: "--urma-turbo=1", wantErr: "line 1: unknown flag --urma-turbo"},
		{name: "negated non-boolean", file: "--nourma_sq_size", wantErr: "line 1: flag --nourma_sq_size: urma_sq_size is not a boolean"},
		{name: "negated with a value", file: "--nourma_use_polling=true", wantErr: "line 1: flag --nourma_use_polling takes no value"},
		{name: "unknown negated flag", file: "--nourma_turbo", wantErr: "line 1: unknown flag --nourma_turbo"},
		{name: "other programs dashed flags skipped", file: "--max-body-size=1000\n--nosome_bool\n--urma_poller_num=2", check: func(f Flags) bool { return f.PollerNum == 2 }},
		// brpc's gflags reads booleans as 1/t/true/y/yes and 0/f/false/n/no
		// in any case, and integers after 0x as hexadecimal: a file it
		// accepts must not make every Go workload's Listen fail.
		{name: "gflags yes", file: "--urma_use_polling=yes", check: func(f Flags) bool { return f.UsePolling }},
		{name: "gflags Y", file: "--urma_use_polling=Y", check: func(f Flags) bool { return f.UsePolling }},
		{name: "gflags No", file: "--urma_recv_zerocopy=No", check: func(f Flags) bool { return !f.RecvZerocopy }},
		{name: "gflags n", file: "--urma_recv_zerocopy=n", check: func(f Flags) bool { return !f.RecvZerocopy }},
		{name: "gflags mixed-case true", file: "--urma_use_polling=tRuE", check: func(f Flags) bool { return f.UsePolling }},
		{name: "gflags hex int", file: "--urma_sq_size=0x100", check: func(f Flags) bool { return f.SQSize == 256 }},
		{name: "gflags upper hex int", file: "--urma_buffer_size=0X4000", check: func(f Flags) bool { return f.BufferSize == 16384 }},
		{name: "leading zero is decimal", file: "--urma_sq_size=010", wantErr: "urma_sq_size: 10 is out of range"},
		{name: "hex range-checked", file: "--urma_sq_size=0x1001", wantErr: "urma_sq_size: 4097 is out of range"},
		{name: "sign after 0x", file: "--urma_sq_size=0x+100", wantErr: `urma_sq_size: "0x+100" is not an integer`},
		{name: "bare 0x", file: "--urma_sq_size=0x", wantErr: `urma_sq_size: "0x" is not an integer`},
		{name: "yesno is no boolean", file: "--urma_use_polling=yesno", wantErr: `urma_use_polling: "yesno" is not a boolean`},
		{name: "line too long", file: "--urma_device=" + strings.Repeat("x", 2<<20), wantErr: "read flags file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse(strings.NewReader(tc.file))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !tc.check(f) {
				t.Fatalf("Parse result wrong: %+v", f)
			}
		})
	}
}

func TestSetGetValidate(t *testing.T) {
	f := Defaults()
	if err := f.Set("urma_poller_num", "8"); err != nil || f.PollerNum != 8 {
		t.Fatalf("Set poller_num: %v, %d", err, f.PollerNum)
	}
	if err := f.Set("urma_nope", "1"); err == nil || !strings.Contains(err.Error(), `unknown flag "urma_nope"`) {
		t.Fatalf("Set unknown = %v", err)
	}
	if _, err := f.Get("urma_nope"); err == nil {
		t.Fatal("Get unknown flag succeeded")
	}
	if err := f.Set("urma_poller_num", "65"); err == nil {
		t.Fatal("Set out of range succeeded")
	}
	if f.PollerNum != 8 {
		t.Fatalf("failed Set changed the value to %d", f.PollerNum)
	}
	f.CQEPollOnce = 0 // set directly: only Validate can catch it
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), "urma_cqe_poll_once: 0 is out of range (want 1..64)") {
		t.Fatalf("Validate = %v", err)
	}
	f = Defaults()
	f.Provider = "Soft"
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), `urma_provider: "Soft" is not allowed`) {
		t.Fatalf("Validate of a string outside its values = %v", err)
	}
}

// TestStringValues: a String flag's value is one word. A newline would
// write lines of its own into a rendered flags file (flags no range check
// saw); other whitespace and control characters do not survive the file,
// brpc's gflags or a shell.
func TestStringValues(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		wantErr     string // "" = accepted
	}{
		{"device name", "udma0", ""},
		{"bonding device", "bonding_dev_0", ""},
		{"punctuation", "ub-dev.0:1/2", ""},
		{"empty, the first usable device", "", ""},
		{"non-ASCII letters", "设备0", ""},
		{"newline injecting a flag", "udma0\n--urma_sq_size=99999", `flag urma_device: value "udma0\n--urma_sq_size=99999" contains a newline at byte 5 (want one word, no whitespace or control characters)`},
		{"trailing newline", "udma0\n", "contains a newline at byte 5"},
		{"carriage return", "udma0\r--urma_sq_size=99999", "contains a carriage return at byte 5"},
		{"tab", "udma\t0", "contains a tab at byte 4"},
		{"space", "udma 0", "contains a space at byte 4"},
		{"leading space", " udma0", "contains a space at byte 0"},
		{"NUL", "udma0\x00", "contains a NUL byte at byte 5"},
		{"escape", "\x1b[2Judma0", "contains control character U+001B at byte 0"},
		{"delete", "udma\x7f0", "contains control character U+007F at byte 4"},
		{"vertical tab", "udma\v0", "contains whitespace U+000B at byte 4"},
		{"next line C1", "udma\u00850", "contains whitespace U+0085 at byte 4"},
		{"no-break space", "udma\u00a00", "contains whitespace U+00A0 at byte 4"},
		{"line separator", "udma0\u2028", "contains whitespace U+2028 at byte 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Defaults()
			err := f.Set("urma_device", tc.value)
			direct := Defaults()
			direct.Device = tc.value // set directly: only Validate can catch it
			verr := direct.Validate()
			if tc.wantErr == "" {
				if err != nil || f.Device != tc.value || verr != nil {
					t.Fatalf("Set: %v (device %q), Validate: %v; want %q accepted", err, f.Device, verr, tc.value)
				}
				return
			}
			for what, e := range map[string]error{"Set": err, "Validate": verr} {
				if e == nil || !strings.Contains(e.Error(), tc.wantErr) {
					t.Errorf("%s error = %v, want one containing %q", what, e, tc.wantErr)
				}
			}
			if f.Device != "" {
				t.Errorf("failed Set changed the device to %q", f.Device)
			}
		})
	}
}

// TestDurationFlag: urma_first_bytes_timeout takes Go durations within its
// range, and says what it wants otherwise.
func TestDurationFlag(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    time.Duration
		wantErr string
	}{
		{"1s", time.Second, ""},
		{"250ms", 250 * time.Millisecond, ""},
		{"0s", 0, ""},
		{"1m", time.Minute, ""},
		{"61s", 0, "urma_first_bytes_timeout: 1m1s is out of range (want a duration, 0s..1m0s)"},
		{"-1s", 0, "out of range"},
		{"1000", 0, `"1000" is not a duration`},
	} {
		f := Defaults()
		err := f.Set("urma_first_bytes_timeout", tc.value)
		switch {
		case tc.wantErr == "" && (err != nil || f.FirstBytesTimeout != tc.want):
			t.Errorf("Set %q: %v, %s; want %s", tc.value, err, f.FirstBytesTimeout, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("Set %q: %v; want an error containing %q", tc.value, err, tc.wantErr)
		}
	}
	f := Defaults()
	if f.FirstBytesTimeout != time.Second {
		t.Errorf("default %s, want 1s", f.FirstBytesTimeout)
	}
	f.FirstBytesTimeout = 2 * time.Minute // set directly: only Validate can catch it
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), "urma_first_bytes_timeout") {
		t.Errorf("Validate = %v", err)
	}
	d := Defaults()
	if got, _ := d.Get("urma_first_bytes_timeout"); got != "1s" {
		t.Errorf("Get = %q, want 1s", got)
	}
}

// Flags brpc does not know stay out of what brpc reads: Specs leaves them
// out, and Render writes one only when it differs from its default.
func TestTransportOnlyFlags(t *testing.T) {
	for _, s := range Specs() {
		if s.TransportOnly {
			t.Errorf("Specs lists the transport-only flag %s", s.Name)
		}
	}
	var names []string
	for _, s := range TransportSpecs() {
		if !s.TransportOnly {
			t.Errorf("TransportSpecs lists the shared flag %s", s.Name)
		}
		names = append(names, s.Name)
	}
	if want := []string{"urma_ack_timeout", "urma_event_spin", "urma_first_bytes_timeout", "urma_pool_huge_pages", "urma_pool_remote_read", "urma_provider", "urma_read_direct", "urma_require_token", "urma_shm_ring_size", "urma_shm_send_buffers", "urma_soft_fabric", "urma_soft_max_conns"}; !slices.Equal(names, want) {
		t.Fatalf("TransportSpecs() = %v, want %v", names, want)
	}
	for _, n := range names {
		if strings.Contains(Defaults().Render(), n) {
			t.Errorf("Render wrote %s at its default", n)
		}
	}
	f := Defaults()
	f.Provider = "soft"
	if !strings.Contains(f.Render(), "--urma_provider=soft\n") {
		t.Errorf("Render omitted urma_provider=soft:\n%s", f.Render())
	}
}

func TestRenderRoundTrip(t *testing.T) {
	f := Defaults()
	f.UsePolling = true
	f.SQSize = 512
	f.Device = "bonding_dev_0"
	f.ClientHandshakeVersion = 3
	f.Provider = "liburma"
	f.RequireToken = true
	f.FirstBytesTimeout = 1500 * time.Millisecond
	text := f.Render()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) != len(Specs())+3 {
		t.Fatalf("Render wrote %d lines, want one per flag (%d) and the three transport-only ones set", len(lines), len(Specs()))
	}
	if !sort.StringsAreSorted(lines) {
		t.Error("Render output is not sorted")
	}
	back, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatalf("Parse(Render()): %v", err)
	}
	if !sameValues(back, f) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, f)
	}
}

// FuzzParse: no input panics; every error names a line or the read; what
// parses validates and survives Render -> Parse unchanged.
func FuzzParse(f *testing.F) {
	f.Add("--urma_sq_size=256\n")
	f.Add("# comment\n--urma_use_polling\n--urma_device=udma0\n")
	f.Add("--urma_buffer_size=3000")
	f.Add("--urma_sq_size")
	f.Add("--other=1\n-urma_rq_size=4096\r\n")
	f.Add(Defaults().Render())
	f.Add("--urma_provider=soft\n--urma_provider=auto")
	f.Fuzz(func(t *testing.T, file string) {
		got, err := Parse(strings.NewReader(file))
		if err != nil {
			if !strings.Contains(err.Error(), "line ") && !strings.Contains(err.Error(), "read flags file") {
				t.Fatalf("error does not say where: %v", err)
			}
			return
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("Parse accepted invalid flags: %v", err)
		}
		back, err := Parse(strings.NewReader(got.Render()))
		if err != nil {
			t.Fatalf("Parse(Render()) of %+v: %v", got, err)
		}
		if !sameValues(back, got) {
			t.Fatalf("round trip changed flags:\n got %+v\nwant %+v", back, got)
		}
	})
}

// FuzzStringRoundTrip: any value Set accepts for a String flag renders into
// a flags file that Parse reads back as the same flags, and nothing else: a
// value cannot add lines of its own.
func FuzzStringRoundTrip(f *testing.F) {
	f.Add("urma_device", "udma0")
	f.Add("urma_device", "udma0\n--urma_sq_size=99999")
	f.Add("urma_device", "udma0\r\n--urma_buffer_count=1")
	f.Add("urma_device", " udma0\t")
	f.Add("urma_device", "#")
	f.Add("urma_provider", "soft")
	f.Add("urma_soft_fabric", "shm\n")
	f.Fuzz(func(t *testing.T, name, value string) {
		spec, ok := Lookup(name)
		if !ok || spec.Kind != String {
			return
		}
		want := Defaults()
		if err := want.Set(name, value); err != nil {
			return
		}
		got, err := Parse(strings.NewReader(want.Render()))
		if err != nil {
			t.Fatalf("%s=%q accepted, but its rendered file does not parse: %v", name, value, err)
		}
		if !sameValues(got, want) {
			t.Fatalf("%s=%q accepted, but its rendered file parses differently:\n got %+v\nwant %+v", name, value, got, want)
		}
	})
}

// sameValues reports whether a and b hold the same values, whichever flags
// of them were given (Render writes every flag, so a file read back names
// more than the one rendered).
func sameValues(a, b Flags) bool {
	a.set, b.set = 0, 0
	return a == b
}

// TestGiven: a flag is given once Set assigns it, even to its default
// value (the operator's file names every flag), or when it holds another
// value than its default; otherwise, and for unknown names, it is not.
func TestGiven(t *testing.T) {
	if n := len(table()); n > 64 {
		t.Fatalf("%d flags: Flags.set has one bit for each of at most 64", n)
	}
	d := Defaults()
	for _, s := range append(Specs(), TransportSpecs()...) {
		if d.Given(s.Name) {
			t.Errorf("%s is given in the defaults", s.Name)
		}
		f := Defaults()
		if err := f.Set(s.Name, s.Default); err != nil {
			t.Fatal(err)
		}
		if !f.Given(s.Name) {
			t.Errorf("%s set to its default is not given", s.Name)
		}
		for _, o := range append(Specs(), TransportSpecs()...) {
			if o.Name != s.Name && f.Given(o.Name) {
				t.Errorf("setting %s gives %s too", s.Name, o.Name)
			}
		}
	}
	f := Defaults()
	f.BufferSize = 65536 // a program's own Flags, never Set
	if !f.Given("urma_buffer_size") || f.Given("urma_buffer_count") {
		t.Errorf("a changed field: Given(urma_buffer_size)=%v Given(urma_buffer_count)=%v, want true, false", f.Given("urma_buffer_size"), f.Given("urma_buffer_count"))
	}
	if f.Given("urma_no_such_flag") {
		t.Error("an unknown flag is given")
	}
	if err := f.Set("urma_sq_size", "1"); err == nil || f.Given("urma_sq_size") {
		t.Errorf("a refused Set (%v) gives the flag: %v", err, f.Given("urma_sq_size"))
	}
	parsed, err := Parse(strings.NewReader("--urma_rq_size=128\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !parsed.Given("urma_rq_size") || parsed.Given("urma_sq_size") {
		t.Errorf("a file naming only urma_rq_size: Given(urma_rq_size)=%v Given(urma_sq_size)=%v, want true, false", parsed.Given("urma_rq_size"), parsed.Given("urma_sq_size"))
	}
}
