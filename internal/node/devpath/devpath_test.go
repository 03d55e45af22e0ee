package devpath

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/go-logr/logr/testr"
)

func TestToHost(t *testing.T) {
	tests := []struct{ root, in, want string }{
		{"/host/dev", "/host/dev/uburma/udma0", "/dev/uburma/udma0"},
		{"/host/dev/", "/host/dev/ummu/tid", "/dev/ummu/tid"},
		{"", "/dev/uburma/udma0", "/dev/uburma/udma0"},
		{"/host/dev", "/host/devx/foo", ""},
		{"/host/dev", "/host/dev", ""},
		{"/host/dev", "", ""},
		{"/host/dev", "/etc/passwd", ""},
		{"/host/dev", "/host/dev/../etc", ""},
		{"/host/dev", "/host/dev/..foo", "/dev/..foo"},
	}
	for _, tt := range tests {
		if got := ToHost(tt.root, tt.in); got != tt.want {
			t.Errorf("ToHost(%q, %q) = %q, want %q", tt.root, tt.in, got, tt.want)
		}
	}
}

func TestToLocal(t *testing.T) {
	tests := []struct{ root, in, want string }{
		{"/host/dev", "/dev/uburma/udma0", "/host/dev/uburma/udma0"},
		{"", "/dev/ummu/tid", "/dev/ummu/tid"},
		{"/host/dev", "/dev", ""},
		{"/host/dev", "/etc/x", ""},
		{"/host/dev", "/dev/../etc/x", ""},
		{"/host/dev", "dev/x", ""},
	}
	for _, tt := range tests {
		if got := ToLocal(tt.root, tt.in); got != tt.want {
			t.Errorf("ToLocal(%q, %q) = %q, want %q", tt.root, tt.in, got, tt.want)
		}
	}
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"/host/dev/uburma/udma0", "/host/dev/../x", "/host/dev/a/../../b", "/host/dev/./x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, local string) {
		host := ToHost("/host/dev", local)
		if host == "" {
			return
		}
		back := ToLocal("/host/dev", host)
		if ToHost("/host/dev", back) != host {
			t.Fatalf("%q -> %q -> %q does not round-trip", local, host, back)
		}
	})
}

func TestExisting(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "ummu"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ummu", "tid"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := Existing(root, []string{"/dev/ummu/tid", "/dev/missing", "/etc/passwd", ""}, testr.New(t))
	if want := []string{filepath.Join(root, "ummu", "tid")}; !slices.Equal(got, want) {
		t.Errorf("Existing = %q, want %q (only the node that is there, inside the dev root)", got, want)
	}
}
