package sysfstest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

func TestWriteTree(t *testing.T) {
	bond := sysfstest.DefaultDevice("bonding_dev_0")
	bond.Bonding = true
	bond.Caps.MaxJetty = 2048

	tests := []struct {
		name    string
		devs    []sysfstest.Device
		want    map[string]uint32 // device -> MaxJetty read back
		wantErr string
	}{
		{name: "empty host", want: map[string]uint32{}},
		{
			name: "two udma and a bonding device",
			devs: []sysfstest.Device{sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("udma1"), bond},
			want: map[string]uint32{"udma0": 1024, "udma1": 1024, "bonding_dev_0": 2048},
		},
		{
			name:    "bad name",
			devs:    []sysfstest.Device{sysfstest.DefaultDevice("udma0"), sysfstest.DefaultDevice("a/b")},
			wantErr: `bad device name "a/b"`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			opts := sysfs.Options{SysfsRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev")}
			err := sysfstest.WriteTree(opts.SysfsRoot, opts.DevRoot, tc.devs...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("WriteTree error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("WriteTree: %v", err)
			}
			devs, err := sysfs.Discover(opts)
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			got := map[string]uint32{}
			for _, d := range devs {
				if !d.Usable() {
					t.Errorf("%s is not usable: %s", d.Name, d.Reason())
				}
				got[d.Name] = d.Caps.MaxJetty
			}
			if len(got) != len(tc.want) {
				t.Fatalf("discovered %v, want %v", got, tc.want)
			}
			for name, mj := range tc.want {
				if got[name] != mj {
					t.Errorf("%s MaxJetty = %d, want %d", name, got[name], mj)
				}
			}
		})
	}
}

func TestWriteTreeReportsUnwritableRoot(t *testing.T) {
	root := t.TempDir()
	blocker := filepath.Join(root, "sys")
	if err := os.WriteFile(blocker, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := sysfstest.WriteTree(blocker, filepath.Join(root, "dev"), sysfstest.DefaultDevice("udma0"))
	if err == nil || !strings.Contains(err.Error(), "sysfstest") {
		t.Fatalf("WriteTree over a file returned %v, want a sysfstest error", err)
	}
}
