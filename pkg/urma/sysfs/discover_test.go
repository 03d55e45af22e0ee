package sysfs_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

func TestDiscoverDefaultDevice(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	d := discoverOne(t, tr, "udma0")
	wantNoProblems(t, d)
	if !d.Usable() || d.Reason() != "" {
		t.Fatalf("default device not usable: %q", d.Reason())
	}

	want := urma.DeviceInfo{
		Name:          "udma0",
		Driver:        "udma",
		TransportType: urma.TransportUB,
		GUID:          "cc08:0000:0000:0000:0000:0000:0000:0001",
		Caps: urma.DeviceCaps{
			Feature: 0x5, MaxJFC: 65536, MaxJFS: 32768, MaxJFR: 16384, MaxJetty: 1024, MaxJettyGrp: 64,
			MaxJFCDepth: 4194304, MaxJFSDepth: 8192, MaxJFRDepth: 4096, MaxJFSInlineSize: 192,
			MaxJFSSge: 11, MaxJFSRsge: 6, MaxJFRSge: 3, MaxMsgSize: 1 << 32,
			TransMode: urma.TransModeRM | urma.TransModeRC | urma.TransModeUM, PortCount: 1, MaxEIDCnt: 4,
		},
		ReservedJetty: urma.Range{Min: 0, Max: 15},
		Ports:         []urma.Port{{Index: 0, State: urma.PortActive, MaxMTU: 5, ActiveMTU: 5, ActiveSpeed: 32, ActiveWidth: 1}},
		EIDs:          []urma.EIDEntry{{Index: 0, EID: eid(t, "::ffff:10.0.0.1")}},
	}
	if !reflect.DeepEqual(d.DeviceInfo, want) {
		t.Fatalf("DeviceInfo\n got %+v\nwant %+v", d.DeviceInfo, want)
	}
	if d.Class != "ubcore" || d.VendorID != "0x19e5" || d.DeviceID != "0xa001" || d.NUMANode != 0 ||
		d.IsBonding || !d.HasReservedJetty {
		t.Fatalf("got class %q vendor %q device %q numa %d bonding %v hasReserved %v",
			d.Class, d.VendorID, d.DeviceID, d.NUMANode, d.IsBonding, d.HasReservedJetty)
	}
	if wantNode := filepath.Join(tr.DevRoot, "uburma", "udma0"); d.DevNode != wantNode {
		t.Fatalf("DevNode = %q, want %q", d.DevNode, wantNode)
	}
}

// TestDefaultDeviceCapsAreDistinct guards the fixture: with two equal
// values, a value read into the wrong field could go unnoticed.
func TestDefaultDeviceCapsAreDistinct(t *testing.T) {
	c := reflect.ValueOf(sysfstest.DefaultDevice("x").Caps)
	seen := map[uint64]string{}
	for i := 0; i < c.NumField(); i++ {
		f := c.Field(i)
		var v uint64
		switch f.Kind() {
		case reflect.Uint32, reflect.Uint64:
			v = f.Uint()
		default:
			continue
		}
		name := c.Type().Field(i).Name
		if prev, dup := seen[v]; dup {
			t.Errorf("Caps.%s and Caps.%s are both %d", name, prev, v)
		}
		seen[v] = name
	}
}

// capField maps each capability file to the field it must land in. The
// file names are spelled out here, independently of sysfstest, so a swap
// made the same way in both the writer and the reader is still caught.
var capFields = []struct {
	file     string
	bits     int
	required bool
	get      func(*sysfs.Device) uint64
}{
	{"feature", 32, false, func(d *sysfs.Device) uint64 { return uint64(d.Caps.Feature) }},
	{"max_jfc", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFC) }},
	{"max_jfs", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFS) }},
	{"max_jfr", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFR) }},
	{"max_jetty", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJetty) }},
	{"max_jetty_grp", 32, false, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJettyGrp) }},
	{"max_jfc_depth", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFCDepth) }},
	{"max_jfs_depth", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFSDepth) }},
	{"max_jfr_depth", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFRDepth) }},
	{"max_jfs_inline_size", 32, false, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFSInlineSize) }},
	{"max_jfs_sge", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFSSge) }},
	{"max_jfs_rsge", 32, false, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFSRsge) }},
	{"max_jfr_sge", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxJFRSge) }},
	{"max_msg_size", 64, true, func(d *sysfs.Device) uint64 { return d.Caps.MaxMsgSize }},
	{"trans_mode", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.TransMode) }},
	{"port_count", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.PortCount) }},
	{"max_eid_cnt", 32, true, func(d *sysfs.Device) uint64 { return uint64(d.Caps.MaxEIDCnt) }},
}

func TestCapFilesLandInTheirFields(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	// Distinct values, written straight to the named files; port_count and
	// max_eid_cnt keep values the tree can back with directories.
	want := map[string]uint64{}
	for i, f := range capFields {
		v := uint64(1000 + 17*i)
		switch f.file {
		case "port_count":
			v = 1
		case "max_eid_cnt":
			v = 2
		case "max_msg_size":
			v = 1<<40 + 3 // needs all 64 bits
		}
		want[f.file] = v
		tr.WriteFile(t, "udma0", f.file, fmt.Sprintf("%d\n", v))
	}
	d := discoverOne(t, tr, "udma0")
	wantNoProblems(t, d)
	for _, f := range capFields {
		if got := f.get(&d); got != want[f.file] {
			t.Errorf("%s: field holds %d, want %d", f.file, got, want[f.file])
		}
	}
}

func TestCapFileFormats(t *testing.T) {
	tests := []struct {
		name, file, text string
		want             uint64
		problem          string // "" means no problem
	}{
		{"kernel hex feature", "feature", "0x1f\n", 0x1f, ""},
		{"upper-case hex", "max_jetty", "0X400\n", 1024, ""},
		{"no newline", "max_jetty", "77", 77, ""},
		{"blanks around", "max_jetty", "  88 \n\n", 88, ""},
		{"32-bit max", "max_jetty", "4294967295\n", 4294967295, ""},
		{"64-bit max_msg_size", "max_msg_size", "18446744073709551615\n", 18446744073709551615, ""},
		{"garbage", "max_jetty", "garbage\n", 0, `max_jetty: parse number "garbage": not a decimal or 0x-hex number`},
		{"empty", "max_jetty", "", 0, "max_jetty: parse number: empty"},
		{"blank", "max_jfr_depth", "\n", 0, "max_jfr_depth: parse number: empty"},
		{"negative", "max_jfc", "-1\n", 0, `max_jfc: parse number "-1": negative`},
		{"32-bit overflow", "max_jfs", "4294967296\n", 0, "max_jfs: parse number \"4294967296\": exceeds the 32-bit maximum"},
		{"64-bit overflow", "max_msg_size", "18446744073709551616\n", 0, "max_msg_size: parse number \"18446744073709551616\": exceeds the 64-bit maximum"},
		{"octal-looking", "max_jfs_sge", "010\n", 0, "max_jfs_sge: parse number \"010\": leading zero"},
		{"two numbers", "trans_mode", "1 2\n", 0, "trans_mode:"},
		{"float", "max_jetty_grp", "1.5\n", 0, "max_jetty_grp:"},
		{"optional file malformed", "max_jfs_rsge", "x\n", 0, "max_jfs_rsge:"},
		{"NUL bytes", "max_jetty", "10\x0024\n", 0, `max_jetty: parse number "10\x0024"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, sysfstest.DefaultDevice("udma0"))
			tr.WriteFile(t, "udma0", tc.file, tc.text)
			d := discoverOne(t, tr, "udma0")
			var got uint64
			for _, f := range capFields {
				if f.file == tc.file {
					got = f.get(&d)
				}
			}
			if got != tc.want {
				t.Errorf("%s = %d, want %d", tc.file, got, tc.want)
			}
			if tc.problem == "" {
				wantNoProblems(t, d)
			} else {
				wantProblem(t, d, tc.problem)
			}
		})
	}
}

func TestMissingCapFiles(t *testing.T) {
	for _, f := range capFields {
		t.Run(f.file, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, sysfstest.DefaultDevice("udma0"))
			tr.RemoveFile(t, "udma0", f.file)
			d := discoverOne(t, tr, "udma0")
			if got := f.get(&d); got != 0 {
				t.Errorf("missing %s left %d in its field", f.file, got)
			}
			if f.required {
				wantProblem(t, d, f.file+": missing")
				return
			}
			wantNoProblems(t, d)
			if !d.Usable() {
				t.Fatalf("device without optional %s is not usable: %s", f.file, d.Reason())
			}
		})
	}
}

func TestIdentityFiles(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		text    string // "-" removes the file
		check   func(t *testing.T, d sysfs.Device)
		problem string
	}{
		{name: "driver_name missing", file: "driver_name", text: "-", problem: "driver_name: missing",
			check: func(t *testing.T, d sysfs.Device) { expectEq(t, "Driver", d.Driver, "") }},
		{name: "driver_name empty", file: "driver_name", text: "\n", problem: "driver_name: \"\": empty"},
		{name: "driver_name odd bytes", file: "driver_name", text: "ud ma\x01\n", problem: `driver_name: "ud ma\x01": character ' '`,
			check: func(t *testing.T, d sysfs.Device) { expectEq(t, "Driver", d.Driver, "") }},
		{name: "driver_name other", file: "driver_name", text: "hns3_udma_v1\n",
			check: func(t *testing.T, d sysfs.Device) { expectEq(t, "Driver", d.Driver, "hns3_udma_v1") }},
		{name: "transport HNS_UB", file: "transport_type", text: "5\n",
			check: func(t *testing.T, d sysfs.Device) { expectEq(t, "TransportType", d.TransportType, urma.TransportHNSUB) }},
		{name: "transport IP", file: "transport_type", text: "2\n",
			check: func(t *testing.T, d sysfs.Device) { expectEq(t, "TransportType", d.TransportType, urma.TransportIP) }},
		{name: "transport unknown kept", file: "transport_type", text: "3\n",
			check: func(t *testing.T, d sysfs.Device) {
				expectEq(t, "TransportType", d.TransportType, urma.TransportType(3))
			}},
		{name: "transport invalid", file: "transport_type", text: "-1\n", problem: `transport_type: "-1" is negative`},
		{name: "transport missing", file: "transport_type", text: "-", problem: "transport_type: missing"},
		{name: "transport garbage", file: "transport_type", text: "UB\n", problem: `transport_type: parse number "UB"`},
		{name: "ubdev mismatch", file: "ubdev", text: "udma7\n", problem: `ubdev: names "udma7", not the directory name "udma0"`},
		{name: "ubdev missing is fine", file: "ubdev", text: "-"},
		{name: "guid old decimal form", file: "guid", text: "1234567890123\n",
			check: func(t *testing.T, d sysfs.Device) { expectEq(t, "GUID", d.GUID, "1234567890123") }},
		{name: "guid missing is fine", file: "guid", text: "-",
			check: func(t *testing.T, d sysfs.Device) { expectEq(t, "GUID", d.GUID, "") }},
		{name: "guid garbage", file: "guid", text: "zz:top\n", problem: `guid: "zz:top" is neither EID text nor a 64-bit number`,
			check: func(t *testing.T, d sysfs.Device) { expectEq(t, "GUID", d.GUID, "") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, sysfstest.DefaultDevice("udma0"))
			if tc.text == "-" {
				tr.RemoveFile(t, "udma0", tc.file)
			} else {
				tr.WriteFile(t, "udma0", tc.file, tc.text)
			}
			d := discoverOne(t, tr, "udma0")
			if tc.problem == "" {
				wantNoProblems(t, d)
			} else {
				wantProblem(t, d, tc.problem)
			}
			if tc.check != nil {
				tc.check(t, d)
			}
		})
	}
}

func expectEq[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func TestReservedJettyRange(t *testing.T) {
	tests := []struct {
		name    string
		text    string // "-" removes the file
		want    urma.Range
		has     bool
		problem string
	}{
		{name: "kernel form", text: "0-15\n", want: urma.Range{Min: 0, Max: 15}, has: true},
		{name: "single id", text: "7-7\n", want: urma.Range{Min: 7, Max: 7}, has: true},
		{name: "zero range is real", text: "0-0\n", want: urma.Range{}, has: true},
		{name: "hex bounds", text: "0x10-0x1f\n", want: urma.Range{Min: 16, Max: 31}, has: true},
		{name: "unsupported sentinel", text: "4294967295-4294967295\n"},
		{name: "absent on old kernels", text: "-"},
		{name: "min above max", text: "16-15\n", problem: "reserved_jetty_id: parse range \"16-15\": min 16 is greater than max 15"},
		{name: "one number", text: "15\n", problem: "reserved_jetty_id: parse range \"15\": want min-max"},
		{name: "negative", text: "-1-5\n", problem: "reserved_jetty_id: parse range"},
		{name: "garbage", text: "a-b\n", problem: "reserved_jetty_id: parse range \"a-b\": min"},
		{name: "overflow", text: "0-4294967296\n", problem: "exceeds the 32-bit maximum"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, sysfstest.DefaultDevice("udma0"))
			if tc.text == "-" {
				tr.RemoveFile(t, "udma0", "reserved_jetty_id")
			} else {
				tr.WriteFile(t, "udma0", "reserved_jetty_id", tc.text)
			}
			d := discoverOne(t, tr, "udma0")
			if d.ReservedJetty != tc.want || d.HasReservedJetty != tc.has {
				t.Errorf("ReservedJetty = %+v has=%v, want %+v has=%v", d.ReservedJetty, d.HasReservedJetty, tc.want, tc.has)
			}
			if tc.problem == "" {
				wantNoProblems(t, d)
			} else {
				wantProblem(t, d, tc.problem)
			}
		})
	}
}

func TestClassDirectories(t *testing.T) {
	legacy := func(name string) sysfstest.Device {
		d := sysfstest.DefaultDevice(name)
		d.Legacy = true
		return d
	}
	tests := []struct {
		name      string
		build     func(t *testing.T, tr *sysfstest.Tree)
		wantNames []string
		wantClass map[string]string
		check     func(t *testing.T, devs []sysfs.Device)
	}{
		{
			name:      "no class directory at all: empty, no error",
			build:     func(t *testing.T, tr *sysfstest.Tree) {},
			wantNames: nil,
		},
		{
			name: "empty class directory",
			build: func(t *testing.T, tr *sysfstest.Tree) {
				if err := os.MkdirAll(tr.Options().ClassDir("ubcore"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			wantNames: nil,
		},
		{
			name:      "ubcore",
			build:     func(t *testing.T, tr *sysfstest.Tree) { tr.Add(t, sysfstest.DefaultDevice("udma0")) },
			wantNames: []string{"udma0"},
			wantClass: map[string]string{"udma0": "ubcore"},
		},
		{
			name:      "legacy uburma",
			build:     func(t *testing.T, tr *sysfstest.Tree) { tr.Add(t, legacy("udma0")) },
			wantNames: []string{"udma0"},
			wantClass: map[string]string{"udma0": "uburma"},
		},
		{
			name: "both classes, different devices, sorted by name",
			build: func(t *testing.T, tr *sysfstest.Tree) {
				tr.Add(t, sysfstest.DefaultDevice("udma2"))
				tr.Add(t, legacy("udma10"))
				tr.Add(t, sysfstest.DefaultDevice("bonding_dev_0"))
				tr.Add(t, legacy("udma1"))
			},
			wantNames: []string{"bonding_dev_0", "udma1", "udma10", "udma2"},
			wantClass: map[string]string{"bonding_dev_0": "ubcore", "udma1": "uburma", "udma10": "uburma", "udma2": "ubcore"},
		},
		{
			name: "same device in both classes: listed once, from ubcore",
			build: func(t *testing.T, tr *sysfstest.Tree) {
				old := legacy("udma0")
				old.Caps.MaxJetty = 7
				tr.Add(t, old)
				tr.Add(t, sysfstest.DefaultDevice("udma0"))
			},
			wantNames: []string{"udma0"},
			wantClass: map[string]string{"udma0": "ubcore"},
			check: func(t *testing.T, devs []sysfs.Device) {
				if devs[0].Caps.MaxJetty != 1024 {
					t.Errorf("MaxJetty %d: attributes came from the uburma copy", devs[0].Caps.MaxJetty)
				}
			},
		},
		{
			name: "ubcore's own entry and dot entries are skipped",
			build: func(t *testing.T, tr *sysfstest.Tree) {
				tr.Add(t, sysfstest.DefaultDevice("udma0"))
				tr.WriteFile(t, "ubcore", "dev", "238:0\n")
				tr.WriteFile(t, ".hidden", "max_jetty", "1\n")
				if err := os.MkdirAll(filepath.Join(tr.Options().ClassDir("uburma"), "ubcore"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			wantNames: []string{"udma0"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tc.build(t, tr)
			devs := discover(t, tr)
			if !slices.Equal(names(devs), tc.wantNames) {
				t.Fatalf("names = %q, want %q", names(devs), tc.wantNames)
			}
			for _, d := range devs {
				wantNoProblems(t, d)
				if c, ok := tc.wantClass[d.Name]; ok && d.Class != c {
					t.Errorf("%s: Class = %q, want %q", d.Name, d.Class, c)
				}
			}
			if tc.check != nil {
				tc.check(t, devs)
			}
		})
	}
}

func TestDiscoverFailsOnUnlistableClassDir(t *testing.T) {
	tests := []struct {
		name  string
		build func(t *testing.T, tr *sysfstest.Tree) string // returns the path the error must name
		want  string
	}{
		{
			name: "class path is a file",
			build: func(t *testing.T, tr *sysfstest.Tree) string {
				p := tr.Options().ClassDir("ubcore")
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: "not a directory",
		},
		{
			name: "legacy class path is a symlink loop",
			build: func(t *testing.T, tr *sysfstest.Tree) string {
				tr.Add(t, sysfstest.DefaultDevice("udma0")) // a good ubcore does not hide the failure
				p := tr.Options().ClassDir("uburma")
				if err := os.Symlink(p, p); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: "too many levels of symbolic links",
		},
		{
			name: "too many entries",
			build: func(t *testing.T, tr *sysfstest.Tree) string {
				p := tr.Options().ClassDir("ubcore")
				if err := os.MkdirAll(p, 0o755); err != nil {
					t.Fatal(err)
				}
				for i := 0; i <= sysfs.MaxClassEntries; i++ {
					if err := os.WriteFile(filepath.Join(p, fmt.Sprintf("e%d", i)), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				return p
			},
			want: fmt.Sprintf("more than %d entries", sysfs.MaxClassEntries),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			path := tc.build(t, tr)
			devs, err := sysfs.Discover(tr.Options())
			if err == nil {
				t.Fatalf("Discover = %d devices, nil error; want an error", len(devs))
			}
			if devs != nil {
				t.Errorf("Discover returned %d devices with its error", len(devs))
			}
			for _, s := range []string{"discover URMA devices", path, tc.want} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestBondingAndParent(t *testing.T) {
	tests := []struct {
		name    string
		dev     func() sysfstest.Device
		after   func(t *testing.T, tr *sysfstest.Tree)
		bonding bool
		vendor  string
		devID   string
		numa    int
		problem string
	}{
		{name: "PCI device", dev: func() sysfstest.Device { return sysfstest.DefaultDevice("udma0") },
			vendor: "0x19e5", devID: "0xa001", numa: 0},
		{name: "bonding device has no parent", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("bonding_dev_0")
			d.Bonding = true
			return d
		}, bonding: true, numa: -1},
		{name: "bonding name with a parent", dev: func() sysfstest.Device { return sysfstest.DefaultDevice("bonding_dev_1") },
			bonding: true, vendor: "0x19e5", devID: "0xa001", numa: 0},
		{name: "no parent, ordinary name", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.Bonding = true
			return d
		}, bonding: true, numa: -1},
		{name: "NUMA absent", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.NUMANode = nil
			return d
		}, vendor: "0x19e5", devID: "0xa001", numa: -1},
		{name: "NUMA -1", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.NUMANode = intPtr(-1)
			return d
		}, vendor: "0x19e5", devID: "0xa001", numa: -1},
		{name: "NUMA 3", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.NUMANode = intPtr(3)
			return d
		}, vendor: "0x19e5", devID: "0xa001", numa: 3},
		{name: "NUMA garbage", dev: func() sysfstest.Device { return sysfstest.DefaultDevice("udma0") },
			after:  func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "device/numa_node", "node1\n") },
			vendor: "0x19e5", devID: "0xa001", numa: -1, problem: `device/numa_node: parse number "node1"`},
		{name: "NUMA negative garbage", dev: func() sysfstest.Device { return sysfstest.DefaultDevice("udma0") },
			after:  func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "device/numa_node", "-x\n") },
			vendor: "0x19e5", devID: "0xa001", numa: -1, problem: `device/numa_node: parse number "x"`},
		{name: "NUMA lone dash", dev: func() sysfstest.Device { return sysfstest.DefaultDevice("udma0") },
			after:  func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "device/numa_node", "-\n") },
			vendor: "0x19e5", devID: "0xa001", numa: -1, problem: `device/numa_node: parse number "-"`},
		{name: "vendor normalised", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.VendorID, d.DeviceID = "0x19E5", "41217" // 41217 == 0xa101
			return d
		}, vendor: "0x19e5", devID: "0xa101", numa: 0},
		{name: "vendor too wide", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.VendorID = "0x119e5"
			return d
		}, devID: "0xa001", numa: 0, problem: `device/vendor: parse number "0x119e5": exceeds the 16-bit maximum`},
		{name: "device id garbage", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.DeviceID = "pci"
			return d
		}, vendor: "0x19e5", numa: 0, problem: `device/device: parse number "pci"`},
		{name: "ids absent (UB bus parent)", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.VendorID, d.DeviceID = "", ""
			return d
		}, numa: 0},
		{name: "device link to a file", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.Bonding = true
			return d
		}, after: func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "device", "x") },
			bonding: true, numa: -1, problem: "device: not a directory but a regular file"},
		{name: "dangling device link", dev: func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.Bonding = true
			return d
		}, after: func(t *testing.T, tr *sysfstest.Tree) {
			link := filepath.Join(tr.ClassPath(sysfs.ClassUbcore, "udma0"), "device")
			if err := os.Symlink("../../gone/0000:01:00.0", link); err != nil {
				t.Fatal(err)
			}
		}, bonding: true, numa: -1, problem: `device: symbolic link to "../../gone/0000:01:00.0", whose target is missing`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			dev := tc.dev()
			tr.Add(t, dev)
			if tc.after != nil {
				tc.after(t, tr)
			}
			d := discoverOne(t, tr, dev.Name)
			if d.IsBonding != tc.bonding || d.VendorID != tc.vendor || d.DeviceID != tc.devID || d.NUMANode != tc.numa {
				t.Errorf("bonding %v vendor %q device %q numa %d; want %v %q %q %d",
					d.IsBonding, d.VendorID, d.DeviceID, d.NUMANode, tc.bonding, tc.vendor, tc.devID, tc.numa)
			}
			if tc.problem == "" {
				wantNoProblems(t, d)
				if !d.Usable() {
					t.Errorf("not usable: %s", d.Reason())
				}
			} else {
				wantProblem(t, d, tc.problem)
			}
		})
	}
}

func TestPorts(t *testing.T) {
	states := func(s ...urma.PortState) func() sysfstest.Device {
		return func() sysfstest.Device {
			d := sysfstest.DefaultDevice("udma0")
			d.Ports = s
			return d
		}
	}
	tests := []struct {
		name       string
		dev        func() sysfstest.Device
		after      func(t *testing.T, tr *sysfstest.Tree)
		wantStates []urma.PortState
		usable     bool
		reason     string   // substring of Reason when not usable
		problems   []string // each must appear
	}{
		{name: "NOP", dev: states(urma.PortNOP), wantStates: []urma.PortState{urma.PortNOP}, reason: "no usable port (port0 NOP)"},
		{name: "DOWN", dev: states(urma.PortDown), wantStates: []urma.PortState{urma.PortDown}, reason: "no usable port (port0 DOWN)"},
		{name: "INIT", dev: states(urma.PortInit), wantStates: []urma.PortState{urma.PortInit}, reason: "port0 INIT"},
		{name: "ARMED", dev: states(urma.PortArmed), wantStates: []urma.PortState{urma.PortArmed}, reason: "port0 ARMED"},
		{name: "ACTIVE", dev: states(urma.PortActive), wantStates: []urma.PortState{urma.PortActive}, usable: true},
		{name: "ACTIVE_DEFER", dev: states(urma.PortActiveDefer), wantStates: []urma.PortState{urma.PortActiveDefer}, usable: true},
		{name: "second port active", dev: states(urma.PortDown, urma.PortActive),
			wantStates: []urma.PortState{urma.PortDown, urma.PortActive}, usable: true},
		{name: "no ports", dev: states(), wantStates: nil, reason: "no usable port (the device reports no ports)"},
		{name: "state out of range", dev: states(urma.PortActive),
			after:      func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "port0/state", "6\n") },
			wantStates: []urma.PortState{urma.PortNOP}, problems: []string{"port0/state: 6 is not a port state (0..5)"}},
		{name: "state unreadable", dev: states(urma.PortActive),
			after:      func(t *testing.T, tr *sysfstest.Tree) { tr.RemoveFile(t, "udma0", "port0/state") },
			wantStates: []urma.PortState{urma.PortNOP}, problems: []string{"port0/state: missing"}},
		{name: "state is a directory", dev: states(urma.PortActive),
			after: func(t *testing.T, tr *sysfstest.Tree) {
				tr.RemoveFile(t, "udma0", "port0/state")
				tr.WriteFile(t, "udma0", "port0/state/x", "4\n")
			},
			wantStates: []urma.PortState{urma.PortNOP}, problems: []string{"port0/state: not a regular file but a directory"}},
		{name: "state garbage on the only active port", dev: states(urma.PortDown, urma.PortActive),
			after:      func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "port1/state", "ACTIVE\n") },
			wantStates: []urma.PortState{urma.PortDown, urma.PortNOP}, problems: []string{`port1/state: parse number "ACTIVE"`}},
		{name: "port directory missing", dev: states(urma.PortActive),
			after:      func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "port_count", "2\n") },
			wantStates: []urma.PortState{urma.PortActive, urma.PortNOP}, problems: []string{"port1: missing (port_count is 2)"}},
		{name: "optional port file malformed", dev: states(urma.PortActive),
			after:      func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "port0/active_speed", "fast\n") },
			wantStates: []urma.PortState{urma.PortActive}, problems: []string{`port0/active_speed: parse number "fast"`}},
		{name: "optional port files missing", dev: states(urma.PortActive),
			after: func(t *testing.T, tr *sysfstest.Tree) {
				for _, f := range []string{"max_mtu", "active_mtu", "active_speed", "active_width"} {
					tr.RemoveFile(t, "udma0", "port0/"+f)
				}
			},
			wantStates: []urma.PortState{urma.PortActive}, usable: true},
		{name: "port_count at the kernel limit", dev: states(slices.Repeat([]urma.PortState{urma.PortActive}, sysfs.MaxPorts)...),
			wantStates: slices.Repeat([]urma.PortState{urma.PortActive}, sysfs.MaxPorts), usable: true},
		{name: "port_count past the kernel limit", dev: states(urma.PortActive),
			after:      func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "port_count", "300\n") },
			wantStates: append([]urma.PortState{urma.PortActive}, make([]urma.PortState, sysfs.MaxPorts-1)...),
			problems:   []string{"port_count: 300 exceeds the kernel's limit of 16 ports", "port15: missing"}},
		{name: "extra and odd port directories ignored", dev: states(urma.PortActive),
			after: func(t *testing.T, tr *sysfstest.Tree) {
				tr.WriteFile(t, "udma0", "portX/state", "garbage\n")
				tr.WriteFile(t, "udma0", "port1/state", "garbage\n")
				tr.WriteFile(t, "udma0", "port01/state", "garbage\n")
			},
			wantStates: []urma.PortState{urma.PortActive}, usable: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, tc.dev())
			if tc.after != nil {
				tc.after(t, tr)
			}
			d := discoverOne(t, tr, "udma0")
			var got []urma.PortState
			for i, p := range d.Ports {
				if p.Index != i {
					t.Errorf("Ports[%d].Index = %d", i, p.Index)
				}
				got = append(got, p.State)
			}
			if !slices.Equal(got, tc.wantStates) {
				t.Errorf("port states %v, want %v", got, tc.wantStates)
			}
			if d.Usable() != tc.usable {
				t.Errorf("Usable = %v, want %v (reason %q)", d.Usable(), tc.usable, d.Reason())
			}
			if tc.reason != "" && !strings.Contains(d.Reason(), tc.reason) {
				t.Errorf("Reason %q does not contain %q", d.Reason(), tc.reason)
			}
			for _, p := range tc.problems {
				wantProblem(t, d, p)
			}
			if len(tc.problems) == 0 {
				wantNoProblems(t, d)
			}
		})
	}
}

func TestPortAttributes(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	for f, v := range map[string]string{"max_mtu": "3\n", "active_mtu": "2\n", "active_speed": "400\n", "active_width": "0x4\n"} {
		tr.WriteFile(t, "udma0", "port0/"+f, v)
	}
	d := discoverOne(t, tr, "udma0")
	wantNoProblems(t, d)
	want := urma.Port{Index: 0, State: urma.PortActive, MaxMTU: 3, ActiveMTU: 2, ActiveSpeed: 400, ActiveWidth: 4}
	if len(d.Ports) != 1 || d.Ports[0] != want {
		t.Fatalf("Ports = %+v, want [%+v]", d.Ports, want)
	}
}

func TestDevNode(t *testing.T) {
	tr := sysfstest.New(t)
	dev := sysfstest.DefaultDevice("udma0")
	dev.NoDevNode = true
	tr.Add(t, dev)
	d := discoverOne(t, tr, "udma0")
	wantNoProblems(t, d)
	node := filepath.Join(tr.DevRoot, "uburma", "udma0")
	if d.DevNode != "" || d.Usable() {
		t.Fatalf("DevNode %q usable %v without a node", d.DevNode, d.Usable())
	}
	if want := "device node " + node + " missing"; d.Reason() != want {
		t.Fatalf("Reason = %q, want %q", d.Reason(), want)
	}

	tr.AddDevNode(t, "uburma/udma0")
	if d := discoverOne(t, tr, "udma0"); d.DevNode != node || !d.Usable() {
		t.Fatalf("after the node appeared: DevNode %q, reason %q", d.DevNode, d.Reason())
	}

	tr.RemoveDevNode(t, "uburma/udma0")
	tr.AddDevNode(t, "uburma/udma0/oops") // a directory where the node should be
	d = discoverOne(t, tr, "udma0")
	if d.DevNode != "" {
		t.Fatalf("a directory was taken for the device node")
	}
	wantProblem(t, d, "device node "+node+": is a directory")
}

func TestUMMUNode(t *testing.T) {
	tr := sysfstest.New(t)
	if got := sysfs.UMMUNode(tr.Options()); got != "" {
		t.Fatalf("UMMUNode = %q before it exists", got)
	}
	tr.AddDevNode(t, sysfstest.UMMUNode)
	if got, want := sysfs.UMMUNode(tr.Options()), filepath.Join(tr.DevRoot, "ummu", "tid"); got != want {
		t.Fatalf("UMMUNode = %q, want %q", got, want)
	}
	tr.RemoveDevNode(t, sysfstest.UMMUNode)
	tr.AddDevNode(t, sysfstest.UMMUNode+"/x")
	if got := sysfs.UMMUNode(tr.Options()); got != "" {
		t.Fatalf("UMMUNode = %q for a directory", got)
	}
}

func TestClassDirs(t *testing.T) {
	tr := sysfstest.New(t)
	opts := tr.Options()
	if got := sysfs.ClassDirs(opts); len(got) != 0 {
		t.Fatalf("ClassDirs = %q before any exists", got)
	}
	legacy := sysfstest.DefaultDevice("udma1")
	legacy.Legacy = true
	tr.Add(t, legacy)
	if got := sysfs.ClassDirs(opts); !slices.Equal(got, []string{opts.ClassDir("uburma")}) {
		t.Fatalf("ClassDirs = %q", got)
	}
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	if got := sysfs.ClassDirs(opts); !slices.Equal(got, []string{opts.ClassDir("ubcore"), opts.ClassDir("uburma")}) {
		t.Fatalf("ClassDirs = %q, want ubcore first", got)
	}
}

func TestOptionsDefaults(t *testing.T) {
	var o sysfs.Options
	if got := o.ClassDir("ubcore"); got != "/sys/class/ubcore" {
		t.Errorf("ClassDir = %q", got)
	}
	if got := o.DevNodePath("udma0"); got != "/dev/uburma/udma0" {
		t.Errorf("DevNodePath = %q", got)
	}
	o = sysfs.Options{SysfsRoot: "/host/sys", DevRoot: "/host/dev"}
	if got := o.ClassDir("uburma"); got != "/host/sys/class/uburma" {
		t.Errorf("ClassDir = %q", got)
	}
	if got := o.DevNodePath("udma0"); got != "/host/dev/uburma/udma0" {
		t.Errorf("DevNodePath = %q", got)
	}
}

func TestReasonJoinsEverything(t *testing.T) {
	tr := sysfstest.New(t)
	dev := sysfstest.DefaultDevice("udma0")
	dev.Ports = []urma.PortState{urma.PortDown}
	dev.EIDs = nil
	dev.NoDevNode = true
	tr.Add(t, dev)
	tr.WriteFile(t, "udma0", "max_jetty", "lots\n")
	d := discoverOne(t, tr, "udma0")
	want := `max_jetty: parse number "lots": not a decimal or 0x-hex number; no usable port (port0 DOWN); device node ` +
		filepath.Join(tr.DevRoot, "uburma", "udma0") + " missing; no EID"
	if d.Reason() != want {
		t.Fatalf("Reason\n got %q\nwant %q", d.Reason(), want)
	}
	// A Device built by hand (no Discover) still names the default node path.
	var zero sysfs.Device
	zero.Name = "x"
	if r := zero.Reason(); !strings.Contains(r, "device node /dev/uburma/x missing") {
		t.Fatalf("zero Device Reason = %q", r)
	}
}

func TestDeviceJSON(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	d := discoverOne(t, tr, "udma0")
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var back sysfs.Device
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	if !reflect.DeepEqual(back.DeviceInfo, d.DeviceInfo) || back.Class != d.Class || back.DevNode != d.DevNode ||
		back.VendorID != d.VendorID || back.NUMANode != d.NUMANode {
		t.Fatalf("JSON round trip lost data:\n%s", b)
	}
	for _, key := range []string{`"name":"udma0"`, `"class":"ubcore"`, `"eid":"::ffff:10.0.0.1"`, `"vendorID":"0x19e5"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON lacks %s: %s", key, b)
		}
	}
}

// TestReservedJettySplitFiles: some openEuler ubcore revisions show the
// reserved range as two files, reserved_jetty_id_min and _max (both "%u"),
// instead of reserved_jetty_id. Ignoring them would advertise the reserved
// jetties to pods as budget.
func TestReservedJettySplitFiles(t *testing.T) {
	tests := []struct {
		name     string
		combined string // reserved_jetty_id; "-" removes it
		min, max string // "-" leaves the file out
		want     urma.Range
		has      bool
		problem  string
	}{
		{name: "split files", combined: "-", min: "0\n", max: "15\n", want: urma.Range{Min: 0, Max: 15}, has: true},
		{name: "split files, one id", combined: "-", min: "1023\n", max: "1023\n", want: urma.Range{Min: 1023, Max: 1023}, has: true},
		{name: "split sentinel", combined: "-", min: "4294967295\n", max: "4294967295\n"},
		{name: "neither form", combined: "-", min: "-", max: "-"},
		{name: "combined file wins", combined: "0-7\n", min: "0\n", max: "15\n", want: urma.Range{Min: 0, Max: 7}, has: true},
		{name: "half a pair", combined: "-", min: "0\n", max: "-", problem: "reserved_jetty_id_max: missing"},
		{name: "split min above max", combined: "-", min: "16\n", max: "15\n", problem: "reserved_jetty_id_min: 16 is greater than reserved_jetty_id_max 15"},
		{name: "split garbage", combined: "-", min: "x\n", max: "15\n", problem: "reserved_jetty_id_min: parse number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			tr.Add(t, sysfstest.DefaultDevice("udma0"))
			if tc.combined == "-" {
				tr.RemoveFile(t, "udma0", "reserved_jetty_id")
			} else {
				tr.WriteFile(t, "udma0", "reserved_jetty_id", tc.combined)
			}
			for file, text := range map[string]string{"reserved_jetty_id_min": tc.min, "reserved_jetty_id_max": tc.max} {
				if text != "-" {
					tr.WriteFile(t, "udma0", file, text)
				}
			}
			d := discoverOne(t, tr, "udma0")
			if d.ReservedJetty != tc.want || d.HasReservedJetty != tc.has {
				t.Errorf("ReservedJetty = %+v has=%v, want %+v has=%v", d.ReservedJetty, d.HasReservedJetty, tc.want, tc.has)
			}
			if tc.problem == "" {
				wantNoProblems(t, d)
			} else {
				wantProblem(t, d, tc.problem)
			}
		})
	}
}
