package urma

import (
	"errors"
	"strings"
	"testing"
)

func TestAccessValidate(t *testing.T) {
	tests := []struct {
		name    string
		access  Access
		wantErr string // "" means valid
	}{
		{"local only", AccessLocalOnly, ""},
		{"read", AccessRead, ""},
		{"read write", AccessRead | AccessWrite, ""},
		{"read write atomic", AccessRead | AccessWrite | AccessAtomic, ""},
		{"none", 0, "no access flag set"},
		{"local with read", AccessLocalOnly | AccessRead, "LOCAL_ONLY cannot be combined"},
		{"local with everything", AccessLocalOnly | AccessRead | AccessWrite | AccessAtomic, "LOCAL_ONLY cannot be combined"},
		{"write alone", AccessWrite, "WRITE needs READ"},
		{"atomic alone", AccessAtomic, "WRITE"}, // fails on the first rule it breaks
		{"atomic with read", AccessRead | AccessAtomic, "ATOMIC needs READ and WRITE"},
		{"atomic with write", AccessWrite | AccessAtomic, "WRITE needs READ"},
		{"unknown bit with read", AccessRead | 1<<4, ""}, // unknown bits are not this check's business
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.access.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate(%#x) = %v, want nil", uint32(tc.access), err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate(%#x) = nil, want an error containing %q", uint32(tc.access), tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate(%#x) = %q, want it to contain %q", uint32(tc.access), err, tc.wantErr)
			}
			if !errors.Is(err, ErrInval) {
				t.Fatalf("Validate(%#x) error is not ErrInval: %v", uint32(tc.access), err)
			}
			var ue *Error
			if !errors.As(err, &ue) || ue.Op != "register_seg" {
				t.Fatalf("Validate(%#x) error does not name register_seg: %v", uint32(tc.access), err)
			}
		})
	}
}
