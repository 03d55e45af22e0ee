package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/discover"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

func TestParseDiscover(t *testing.T) {
	const dev0 = `{"name":"udma0","driver":"udma","transportType":"UB","vendorID":"0x19e5","deviceID":"0xa001","numaNode":0,"devNode":"/dev/uburma/udma0",
		"ports":[{"index":0,"state":"ACTIVE","usable":true}],"eids":[{"index":0,"eid":"::ffff:10.0.0.1"}],
		"caps":{"maxJetty":1024,"maxJfsDepth":8192,"maxJfrDepth":4096,"maxJfcDepth":4194304,"maxMsgSize":4294967296},
		"reservedJetty":{"min":0,"max":15},"healthy":true,"reason":"","budget":{"jetties":1008,"units":63},"advertised":true}`
	tests := []struct {
		name      string
		in        string
		wantNames []string
		wantErr   string
	}{
		{name: "one device", in: "[" + dev0 + "]\n", wantNames: []string{"udma0"}},
		{name: "two devices", in: `[` + dev0 + `,{"name":"udma1","healthy":false,"reason":"no usable port","advertised":false,"selection":"bonding member"}]`, wantNames: []string{"udma0", "udma1"}},
		{name: "no devices", in: `[]`, wantNames: nil},
		{name: "empty output", in: "  \n", wantErr: "no output"},
		{name: "not JSON", in: "discovered 2 devices", wantErr: "not the discover JSON"},
		{name: "an object", in: `{"devices":[]}`, wantErr: "not the discover JSON"},
		{name: "device without name", in: `[{"driver":"udma"}]`, wantErr: "device 0 has no name"},
		{name: "field of the wrong type", in: `[{"name":"udma0","numaNode":"zero"}]`, wantErr: "not the discover JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			devs, err := parseDiscover([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseDiscover: %v", err)
			}
			var names []string
			for _, d := range devs {
				names = append(names, d.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.wantNames, ",") {
				t.Fatalf("names %v, want %v", names, tc.wantNames)
			}
		})
	}

	devs, err := parseDiscover([]byte("[" + dev0 + "]"))
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	if d.TransportType != "UB" || d.Ports[0].State != "ACTIVE" || d.Caps.MaxJFSDepth != 8192 || d.Caps.MaxMsgSize != 1<<32 ||
		d.Budget.Jetties != 1008 || d.Budget.Units != 63 || d.NUMANode != 0 || d.EIDs[0].EID != "::ffff:10.0.0.1" || !d.Advertised {
		t.Fatalf("fields read wrong: %+v", d)
	}
}

// TestParseDiscoverReadsWhatDiscoverWrites feeds parseDiscover the device
// plugin's own writer, so a change of its format breaks this test rather
// than the demo.
func TestParseDiscoverReadsWhatDiscoverWrites(t *testing.T) {
	why := "bonding member"
	in := []discover.Device{
		{Name: "bonding_dev_0", NUMANode: -1, Healthy: true, Advertised: true, Budget: discover.Budget{Jetties: 2016, Units: 126}},
		{Name: "udma0", NUMANode: 0, Healthy: true, Selection: &why},
	}
	var buf bytes.Buffer
	if err := discover.Write(&buf, in); err != nil {
		t.Fatal(err)
	}
	got, err := parseDiscover(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Budget.Units != 126 || got[1].Selection == nil || *got[1].Selection != why || got[0].NUMANode != -1 {
		t.Fatalf("read back %+v", got)
	}
	buf.Reset()
	if err := discover.Write(&buf, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := parseDiscover(buf.Bytes()); err != nil || len(got) != 0 {
		t.Fatalf("empty report read as %v, %v", got, err)
	}
}

func TestFormatDevices(t *testing.T) {
	member := "bonding member"
	devs := []discoveredDevice{
		{Name: "bonding_dev_0", Driver: "udma", NUMANode: -1, Ports: []discover.Port{{Index: 0, State: "ACTIVE"}}, EIDs: []discover.EID{{EID: "::ffff:10.0.0.3"}},
			Caps: discover.Caps{MaxJetty: 2048}, Healthy: true, Advertised: true, Budget: discover.Budget{Jetties: 2016, Units: 126}},
		{Name: "udma0", Driver: "udma", NUMANode: 1, Ports: []discover.Port{{Index: 0, State: "ACTIVE"}, {Index: 1, State: "DOWN"}},
			EIDs: []discover.EID{{EID: "::ffff:10.0.0.1"}, {Index: 1, EID: "fe80::1"}}, Caps: discover.Caps{MaxJetty: 1024}, Healthy: true,
			Selection: &member, Budget: discover.Budget{Jetties: 1008, Units: 63}},
		{Name: "udma9", Driver: "udma", NUMANode: -1, Healthy: false, Reason: "no usable port", Advertised: true},
	}
	out := formatDevices(devs)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("want a header, 3 rows, a footnote and a summary, got:\n%s", out)
	}
	for _, tc := range []struct {
		line    int
		want    []string
		notWant []string
	}{
		{0, []string{"DEVICE", "HEALTH", "BUDGET"}, nil},
		{1, []string{"bonding_dev_0", "2048", "healthy", "2016 jetties (126 units)", "::ffff:10.0.0.3", "0:ACTIVE"}, nil},
		{2, []string{"udma0", " 1 ", "0:ACTIVE,1:DOWN", "(+1)", "not advertised*"}, []string{"fe80", "1008", "bonding member"}},
		{3, []string{"udma9", "UNHEALTHY: no usable port", "  -  ", "0 jetties (0 units)"}, nil},
		{4, []string{"* udma0: bonding member"}, nil},
		{5, []string{"advertises 126 units of urma.openeuler.org/jetty", "(16 jetties each)"}, nil},
	} {
		for _, w := range tc.want {
			if !strings.Contains(lines[tc.line], w) {
				t.Errorf("row %d lacks %q:\n%s", tc.line, w, out)
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(lines[tc.line], w) {
				t.Errorf("row %d should not show %q:\n%s", tc.line, w, out)
			}
		}
	}
	if got := formatDevices(nil); !strings.Contains(got, "no devices") {
		t.Errorf("empty table: %q", got)
	}
	none := formatDevices([]discoveredDevice{{Name: "udma0", NUMANode: -1, Selection: &member}})
	if !strings.Contains(none, "advertises no urma.openeuler.org/jetty") {
		t.Errorf("a node advertising nothing should say so:\n%s", none)
	}
}

func TestFactsFromDiscovery(t *testing.T) {
	dev := func(name string, advertised bool, jfs uint32, msg uint64, jetties, units uint32) discoveredDevice {
		return discoveredDevice{Name: name, Advertised: advertised, Healthy: true,
			Caps:   discover.Caps{MaxJFSDepth: jfs, MaxJFRDepth: jfs / 2, MaxJFCDepth: jfs * 4, MaxMsgSize: msg},
			Budget: discover.Budget{Jetties: jetties, Units: units}}
	}
	tests := []struct {
		name    string
		devs    []discoveredDevice
		want    nodefacts.Facts
		wantErr string
	}{
		{
			name: "one advertised device",
			devs: []discoveredDevice{dev("bonding_dev_0", true, 8192, 1<<32, 2016, 126)},
			want: nodefacts.Facts{DeviceCount: 1, MaxJFSDepth: 8192, MaxJFRDepth: 4096, MaxJFCDepth: 32768, MaxMsgSize: 1 << 32, JettiesPerDevice: 2016, JettiesPerUnit: 16},
		},
		{
			name: "minimum over the advertised devices",
			devs: []discoveredDevice{
				dev("udma0", true, 8192, 1<<32, 1008, 63),
				dev("udma1", true, 4096, 1<<20, 2016, 126),
				dev("udma2", false, 16, 16, 16, 1), // a bonding member, say
			},
			want: nodefacts.Facts{DeviceCount: 2, MaxJFSDepth: 4096, MaxJFRDepth: 2048, MaxJFCDepth: 16384, MaxMsgSize: 1 << 20, JettiesPerDevice: 1008, JettiesPerUnit: 16},
		},
		{
			name: "an advertised device without budget keeps the default unit",
			devs: []discoveredDevice{dev("udma0", true, 64, 1024, 0, 0)},
			want: nodefacts.Facts{DeviceCount: 1, MaxJFSDepth: 64, MaxJFRDepth: 32, MaxJFCDepth: 256, MaxMsgSize: 1024, JettiesPerUnit: budget.DefaultJettiesPerUnit},
		},
		{name: "nothing advertised", devs: []discoveredDevice{dev("udma0", false, 8192, 1, 16, 1)}, wantErr: "advertises no device"},
		{name: "zero capability", devs: []discoveredDevice{dev("udma0", true, 0, 1, 16, 1)}, wantErr: "must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := factsFromDiscovery(tc.devs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("facts\n got %+v\nwant %+v", got, tc.want)
			}
			// What the demo puts on the Node reads back as the same facts.
			back, err := nodefacts.Parse(got.Annotations())
			if err != nil || back != got {
				t.Fatalf("annotations read back as %+v, %v", back, err)
			}
		})
	}
}
