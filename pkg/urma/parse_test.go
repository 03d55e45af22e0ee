package urma

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestParseUint(t *testing.T) {
	tests := []struct {
		in      string
		bits    int
		want    uint64
		wantErr string // substring of the error; "" means success
	}{
		{in: "0", bits: 32, want: 0},
		{in: "1024\n", bits: 32, want: 1024},
		{in: "  7 \t\r\n", bits: 8, want: 7},
		{in: "0x3", bits: 32, want: 3},
		{in: "0X1F\n", bits: 32, want: 31},
		{in: "0xdeadBEEF", bits: 32, want: 0xdeadbeef},
		{in: "0x0001", bits: 16, want: 1},
		{in: "255", bits: 8, want: 255},
		{in: "65535", bits: 16, want: 65535},
		{in: "4294967295", bits: 32, want: 4294967295},
		{in: "18446744073709551615", bits: 64, want: 18446744073709551615},
		{in: "0xffffffffffffffff", bits: 64, want: 18446744073709551615},

		{in: "", bits: 32, wantErr: "empty"},
		{in: " \n", bits: 32, wantErr: "empty"},
		{in: "-1", bits: 32, wantErr: "negative"},
		{in: "+1", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "256", bits: 8, wantErr: "exceeds the 8-bit maximum 255"},
		{in: "65536", bits: 16, wantErr: "exceeds the 16-bit maximum 65535"},
		{in: "4294967296", bits: 32, wantErr: "exceeds the 32-bit maximum 4294967295"},
		{in: "18446744073709551616", bits: 64, wantErr: "exceeds the 64-bit maximum 18446744073709551615"},
		{in: "0x100000000", bits: 32, wantErr: "exceeds the 32-bit maximum"},
		{in: "garbage", bits: 32, wantErr: `"garbage": not a decimal or 0x-hex number`},
		{in: "12abc", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "1 2", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "1_000", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "0b101", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "0o17", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "017", bits: 32, wantErr: "leading zero (octal or decimal?) is ambiguous"},
		{in: "00", bits: 32, wantErr: "leading zero"},
		{in: "0x", bits: 32, wantErr: "no digits after 0x"},
		{in: "0x-1", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "0xg", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "1.5", bits: 32, wantErr: "not a decimal or 0x-hex number"},
		{in: "\u00a01", bits: 32, wantErr: "not a decimal or 0x-hex number"}, // non-ASCII space is not trimmed
		{in: "1", bits: 0, wantErr: "bit size 0 is not 8, 16, 32 or 64"},
		{in: "1", bits: 65, wantErr: "bit size 65"},
		{in: "1", bits: -1, wantErr: "bit size -1"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q/%d", tc.in, tc.bits), func(t *testing.T) {
			got, err := ParseUint(tc.in, tc.bits)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseUint(%q, %d): unexpected error %v", tc.in, tc.bits, err)
				}
				if got != tc.want {
					t.Fatalf("ParseUint(%q, %d) = %d, want %d", tc.in, tc.bits, got, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseUint(%q, %d) = %d, want an error containing %q", tc.in, tc.bits, got, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseUint(%q, %d) error %q does not contain %q", tc.in, tc.bits, err, tc.wantErr)
			}
			if got != 0 {
				t.Fatalf("ParseUint(%q, %d) returned %d with its error, want 0", tc.in, tc.bits, got)
			}
		})
	}
}

func TestParseUintQuotesHugeInputBriefly(t *testing.T) {
	huge := strings.Repeat("x", 10000)
	_, err := ParseUint(huge, 32)
	if err == nil {
		t.Fatal("want an error")
	}
	if len(err.Error()) > 200 {
		t.Fatalf("error repeats the whole input (%d bytes): %.100s...", len(err.Error()), err)
	}
}

func TestParseRange(t *testing.T) {
	tests := []struct {
		in      string
		want    Range
		wantErr string
	}{
		{in: "0-15\n", want: Range{Min: 0, Max: 15}},
		{in: "3-3", want: Range{Min: 3, Max: 3}},
		{in: "0x10-0x1f", want: Range{Min: 16, Max: 31}},
		{in: " 100-200 ", want: Range{Min: 100, Max: 200}},
		{in: "4294967295-4294967295", want: Range{Min: 4294967295, Max: 4294967295}},

		{in: "", wantErr: "want min-max"},
		{in: "15", wantErr: "want min-max"},
		{in: "16-15", wantErr: "min 16 is greater than max 15"},
		{in: "-1-5", wantErr: "min: parse number: empty"},
		{in: "1-", wantErr: "max: parse number: empty"},
		{in: "1--5", wantErr: "max: parse number \"-5\": negative"},
		{in: "0-15-20", wantErr: "max: parse number \"15-20\": not a decimal"},
		{in: "0 - 15", wantErr: "not a decimal"},
		{in: "a-b", wantErr: "min: parse number \"a\""},
		{in: "0-4294967296", wantErr: "max: parse number \"4294967296\": exceeds the 32-bit maximum"},
		{in: "01-2", wantErr: "leading zero"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			got, err := ParseRange(tc.in)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseRange(%q): unexpected error %v", tc.in, err)
				}
				if got != tc.want {
					t.Fatalf("ParseRange(%q) = %+v, want %+v", tc.in, got, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseRange(%q) = %+v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
			if got != (Range{}) {
				t.Fatalf("ParseRange(%q) returned %+v with its error, want the zero Range", tc.in, got)
			}
		})
	}
}

// canonicalNumber is the language ParseUint accepts, written independently of
// its implementation so the fuzzer can check one against the other.
var canonicalNumber = regexp.MustCompile(`^(0|[1-9][0-9]*|0[xX][0-9a-fA-F]+)$`)

// referenceParseUint is an independent statement of ParseUint's contract.
func referenceParseUint(s string, bits int) (uint64, bool) {
	t := strings.Trim(s, " \t\n\r\v\f")
	if !canonicalNumber.MatchString(t) {
		return 0, false
	}
	var v uint64
	var err error
	if len(t) > 2 && (t[1] == 'x' || t[1] == 'X') {
		v, err = strconv.ParseUint(t[2:], 16, bits)
	} else {
		v, err = strconv.ParseUint(t, 10, bits)
	}
	return v, err == nil
}

func FuzzParseUint(f *testing.F) {
	for _, s := range []string{"0", "1024\n", "0x1f", "0X1F", "-1", "017", "0b1", "1_0", "4294967296", " 5 ", "0x", "", "+3", "18446744073709551616"} {
		for _, bits := range []uint8{8, 16, 32, 64} {
			f.Add(s, bits)
		}
	}
	f.Fuzz(func(t *testing.T, s string, bitsSel uint8) {
		bits := []int{8, 16, 32, 64}[bitsSel%4]
		got, err := ParseUint(s, bits)
		want, ok := referenceParseUint(s, bits)
		if ok != (err == nil) {
			t.Fatalf("ParseUint(%q, %d) = %d, %v; reference says ok=%v (%d)", s, bits, got, err, ok, want)
		}
		if err != nil {
			if got != 0 || !strings.HasPrefix(err.Error(), "parse number") {
				t.Fatalf("ParseUint(%q, %d) = %d, %q: want 0 and an error starting with \"parse number\"", s, bits, got, err)
			}
			return
		}
		if got != want {
			t.Fatalf("ParseUint(%q, %d) = %d, reference %d", s, bits, got, want)
		}
		if bits < 64 && got>>bits != 0 {
			t.Fatalf("ParseUint(%q, %d) = %d does not fit %d bits", s, bits, got, bits)
		}
		if back, err := ParseUint(strconv.FormatUint(got, 10), bits); err != nil || back != got {
			t.Fatalf("decimal round trip of %d: %d, %v", got, back, err)
		}
	})
}

func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"0-15\n", "3-3", "16-15", "-1-5", "0x10-0x1f", "1--2", "4294967295-4294967295", "", "-", "0-4294967296"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRange(s)

		// Reference: one '-' splits two canonical numbers, min <= max.
		refOK := false
		if lo, hi, ok := strings.Cut(strings.Trim(s, " \t\n\r\v\f"), "-"); ok &&
			canonicalNumber.MatchString(lo) && canonicalNumber.MatchString(hi) {
			l, lok := referenceParseUint(lo, 32)
			h, hok := referenceParseUint(hi, 32)
			refOK = lok && hok && l <= h
			if refOK && (r.Min != uint32(l) || r.Max != uint32(h)) {
				t.Fatalf("ParseRange(%q) = %+v, reference %d-%d", s, r, l, h)
			}
		}
		if refOK != (err == nil) {
			t.Fatalf("ParseRange(%q) = %+v, %v; reference ok=%v", s, r, err, refOK)
		}
		if err != nil {
			if r != (Range{}) || !strings.HasPrefix(err.Error(), "parse range") {
				t.Fatalf("ParseRange(%q) = %+v, %q: want the zero Range and a \"parse range\" error", s, r, err)
			}
			return
		}
		if r.Min > r.Max || r.Len() == 0 {
			t.Fatalf("ParseRange(%q) = %+v: min > max slipped through", s, r)
		}
		if back, err := ParseRange(fmt.Sprintf("%d-%d", r.Min, r.Max)); err != nil || back != r {
			t.Fatalf("round trip of %+v: %+v, %v", r, back, err)
		}
	})
}
