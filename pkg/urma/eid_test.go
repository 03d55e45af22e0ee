package urma

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

// eidOf builds an EID from IPv6 text, failing the test on bad input.
func eidOf(t *testing.T, s string) EID {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("bad test address %q: %v", s, err)
	}
	return EID(a.As16())
}

func TestParseEID(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string // IPv6 text of the expected EID
		wantErr string
	}{
		{name: "kernel full form", in: "0000:0000:0000:0000:0000:ffff:7f00:0001\n", want: "::ffff:127.0.0.1"},
		{name: "compressed IPv6", in: "fe80::1", want: "fe80::1"},
		{name: "all ones", in: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", want: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{name: "zero", in: "::", want: "::"},
		{name: "kernel zero slot", in: "0000:0000:0000:0000:0000:0000:0000:0000", want: "::"},
		{name: "IPv4 maps to ::ffff:0:0/96", in: "10.1.2.3", want: "::ffff:10.1.2.3"},
		{name: "IPv4-mapped text", in: "::ffff:10.1.2.3", want: "::ffff:10.1.2.3"},
		{name: "decimal number", in: "16909060", want: "::ffff:1.2.3.4"},
		{name: "hex number", in: "0x01020304", want: "::ffff:1.2.3.4"},
		{name: "number zero", in: "0", want: "::ffff:0.0.0.0"},
		{name: "max number", in: "4294967295", want: "::ffff:255.255.255.255"},
		{name: "surrounding whitespace", in: " \t10.0.0.1\n", want: "::ffff:10.0.0.1"},

		{name: "empty", in: "", wantErr: "empty"},
		{name: "blank", in: " \n", wantErr: "empty"},
		{name: "zone", in: "fe80::1%eth0", wantErr: "not an IPv6 address"},
		{name: "bad IPv6", in: "fe80:::1", wantErr: "not an IPv6 address"},
		{name: "short IPv4", in: "1.2.3", wantErr: "not an IPv4 address"},
		{name: "IPv4 leading zero", in: "01.2.3.4", wantErr: "not an IPv4 address"},
		{name: "number overflow", in: "4294967296", wantErr: "exceeds the 32-bit maximum"},
		{name: "negative", in: "-1", wantErr: "negative"},
		{name: "binary prefix", in: "0b101", wantErr: "not IPv6, IPv4 or a 32-bit number"},
		{name: "digit separator", in: "1_000", wantErr: "not IPv6, IPv4 or a 32-bit number"},
		{name: "octal-looking", in: "017", wantErr: "leading zero"},
		{name: "word", in: "udma0", wantErr: "not IPv6, IPv4 or a 32-bit number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEID(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseEID(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseEID(%q): %v", tc.in, err)
			}
			if want := eidOf(t, tc.want); got != want {
				t.Fatalf("ParseEID(%q) = %v, want %v", tc.in, got, want)
			}
		})
	}
}

func TestEIDIsZero(t *testing.T) {
	tests := []struct {
		eid  string
		zero bool
	}{
		{"::", true},
		{"::1", false},                // lower half set
		{"1::", false},                // upper half set
		{"::ffff:0.0.0.0", false},     // the number 0 is a real IPv4-mapped EID
		{"0:0:0:1::", false},          // last byte of the upper half
		{"::1:0:0:0", false},          // first byte of the lower half
		{"8000::", false},             // top bit
		{"0:0:0:0:0:0:0:8000", false}, // a high bit of the lower half
	}
	for _, tc := range tests {
		if got := eidOf(t, tc.eid).IsZero(); got != tc.zero {
			t.Errorf("EID(%s).IsZero() = %v, want %v", tc.eid, got, tc.zero)
		}
	}
}

func TestEIDTextRoundTrip(t *testing.T) {
	for _, s := range []string{"::", "fe80::1", "::ffff:1.2.3.4", "2001:db8:0:1:2:3:4:5"} {
		e := eidOf(t, s)
		if e.String() != s {
			t.Errorf("String() = %q, want %q", e.String(), s)
		}
		b, err := json.Marshal(struct{ E EID }{e})
		if err != nil {
			t.Fatalf("marshal %s: %v", s, err)
		}
		if want := `{"E":"` + s + `"}`; string(b) != want {
			t.Errorf("json = %s, want %s", b, want)
		}
		var back struct{ E EID }
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("unmarshal %s: %v", b, err)
		}
		if back.E != e {
			t.Errorf("round trip of %s gave %s", s, back.E)
		}
	}
}

func TestEIDUnmarshalTextRejectsGarbage(t *testing.T) {
	var e EID
	e[0] = 0xaa // must be left untouched on error
	err := json.Unmarshal([]byte(`"not-an-eid"`), &e)
	if err == nil || !strings.Contains(err.Error(), "parse EID") {
		t.Fatalf("Unmarshal garbage: %v, want a parse EID error", err)
	}
	if e[0] != 0xaa {
		t.Fatalf("EID changed on a failed unmarshal: %v", e)
	}
}

func FuzzParseEID(f *testing.F) {
	for _, s := range []string{
		"0000:0000:0000:0000:0000:ffff:7f00:0001\n", "::", "fe80::1", "fe80::1%eth0", "10.1.2.3",
		"1.2.3", "16909060", "0x01020304", "4294967296", "-1", "017", "0b1", "", "::ffff:1.2.3.4",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEID(s)
		if err != nil {
			if e != (EID{}) || !strings.HasPrefix(err.Error(), "parse EID") {
				t.Fatalf("ParseEID(%q) = %v, %q: want the zero EID and a \"parse EID\" error", s, e, err)
			}
			return
		}
		// Whatever was accepted prints as text that parses back to itself.
		back, err := ParseEID(e.String())
		if err != nil || back != e {
			t.Fatalf("ParseEID(%q) = %v; its text %q parses to %v, %v", s, e, e.String(), back, err)
		}
		trimmed := strings.Trim(s, " \t\n\r\v\f")
		switch {
		case strings.Contains(trimmed, ":"):
			a, perr := netip.ParseAddr(trimmed)
			if perr != nil || EID(a.As16()) != e {
				t.Fatalf("ParseEID(%q) = %v, netip says %v, %v", s, e, a, perr)
			}
		default:
			// IPv4 and numbers always land in ::ffff:0:0/96.
			if !netip.AddrFrom16(e).Is4In6() {
				t.Fatalf("ParseEID(%q) = %v, want an IPv4-mapped EID", s, e)
			}
			if !strings.Contains(trimmed, ".") {
				n, nerr := ParseUint(trimmed, 32)
				if nerr != nil || netip.AddrFrom16(e).Unmap().As4() != [4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} {
					t.Fatalf("ParseEID(%q) = %v, number %d, %v", s, e, n, nerr)
				}
			}
		}
	})
}
