package main

import (
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/nodefacts"
)

func TestParseDiscover(t *testing.T) {
	const dev0 = `{"name":"udma0","driver":"udma","transportType":"UB","numaNode":0,"devNode":"/dev/uburma/udma0",
		"ports":[{"index":0,"state":"ACTIVE","usable":true}],"eids":[{"index":0,"eid":"::ffff:10.0.0.1"}],
		"caps":{"maxJetty":1024,"maxJfsDepth":8192,"maxJfrDepth":4096,"maxJfcDepth":4194304,"maxMsgSize":4294967296},
		"reservedJetty":{"min":0,"max":15},"healthy":true,"reason":"","budget":{"jetties":1008,"units":63}}`
	tests := []struct {
		name      string
		in        string
		wantNames []string
		wantErr   string
	}{
		{name: "array", in: "[" + dev0 + "]\n", wantNames: []string{"udma0"}},
		{name: "object with devices", in: `{"devices":[` + dev0 + `,{"name":"udma1","healthy":false,"reason":"no usable port"}]}`, wantNames: []string{"udma0", "udma1"}},
		{name: "no devices", in: `[]`, wantNames: nil},
		{name: "numeric enums", in: `[{"name":"udma0","transportType":0,"ports":[{"index":0,"state":4}]}]`, wantNames: []string{"udma0"}},
		{name: "empty output", in: "  \n", wantErr: "no output"},
		{name: "not JSON", in: "discovered 2 devices", wantErr: "not the discover JSON"},
		{name: "object without devices", in: `{"items":[]}`, wantErr: `without a "devices" array`},
		{name: "device without name", in: `[{"driver":"udma"}]`, wantErr: "device 0 has no name"},
		{name: "enum of the wrong type", in: `[{"name":"udma0","transportType":true}]`, wantErr: "string or a number"},
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
		d.Budget == nil || d.Budget.Jetties != 1008 || d.Budget.Units != 63 || *d.NUMANode != 0 || d.EIDs[0].EID != "::ffff:10.0.0.1" {
		t.Fatalf("fields read wrong: %+v", d)
	}
	devs, err = parseDiscover([]byte(`[{"name":"udma0","transportType":5,"ports":[{"index":0,"state":4}]}]`))
	if err != nil || devs[0].TransportType != "5" || devs[0].Ports[0].State != "4" {
		t.Fatalf("numeric enums read as %+v, %v", devs, err)
	}
}

func intp(i int) *int { return &i }

func TestFormatDevices(t *testing.T) {
	devs := []discoveredDevice{
		{Name: "bonding_dev_0", Driver: "udma", Ports: []discPort{{Index: 0, State: "ACTIVE"}}, EIDs: []discEID{{EID: "::ffff:10.0.0.3"}},
			Caps: discCaps{MaxJetty: 2048}, Healthy: true, Budget: &discBudget{Jetties: 2016, Units: 126}},
		{Name: "udma0", Driver: "udma", NUMANode: intp(1), Ports: []discPort{{Index: 0, State: "ACTIVE"}, {Index: 1, State: "DOWN"}},
			EIDs: []discEID{{EID: "::ffff:10.0.0.1"}, {Index: 1, EID: "fe80::1"}}, Caps: discCaps{MaxJetty: 1024}, Healthy: true},
		{Name: "udma9", Driver: "udma", NUMANode: intp(-1), Healthy: false, Reason: "no usable port", Budget: &discBudget{}},
	}
	out := formatDevices(devs)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header and 3 rows, got:\n%s", out)
	}
	for _, tc := range []struct {
		line int
		want []string
	}{
		{0, []string{"DEVICE", "HEALTH", "BUDGET"}},
		{1, []string{"bonding_dev_0", "2048", "healthy", "2016 jetties (126 units)", "::ffff:10.0.0.3", "0:ACTIVE"}},
		{2, []string{"udma0", " 1 ", "0:ACTIVE,1:DOWN", "fe80", "not advertised"}},
		{3, []string{"udma9", "UNHEALTHY: no usable port", "  -  "}},
	} {
		for _, w := range tc.want {
			if w == "fe80" {
				if strings.Contains(lines[tc.line], w) || !strings.Contains(lines[tc.line], "(+1)") {
					t.Errorf("row %d should show the first EID and count the rest:\n%s", tc.line, lines[tc.line])
				}
				continue
			}
			if !strings.Contains(lines[tc.line], w) {
				t.Errorf("row %d lacks %q:\n%s", tc.line, w, out)
			}
		}
	}
	if got := formatDevices(nil); !strings.Contains(got, "no devices") {
		t.Errorf("empty table: %q", got)
	}
}

func TestFactsFromDiscovery(t *testing.T) {
	dev := func(name string, healthy bool, jfs uint32, msg uint64, jetties, units uint32) discoveredDevice {
		d := discoveredDevice{Name: name, Healthy: healthy,
			Caps: discCaps{MaxJFSDepth: jfs, MaxJFRDepth: jfs / 2, MaxJFCDepth: jfs * 4, MaxMsgSize: msg}}
		if units > 0 || jetties > 0 {
			d.Budget = &discBudget{Jetties: jetties, Units: units}
		}
		return d
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
			name: "minimum over advertised, unhealthy and unadvertised ones left out",
			devs: []discoveredDevice{
				dev("udma0", true, 8192, 1<<32, 1008, 63),
				dev("udma1", true, 4096, 1<<20, 2016, 126),
				dev("udma2", false, 16, 16, 16, 1), // unhealthy
				dev("udma3", true, 32, 32, 0, 0),   // not advertised
			},
			want: nodefacts.Facts{DeviceCount: 2, MaxJFSDepth: 4096, MaxJFRDepth: 2048, MaxJFCDepth: 16384, MaxMsgSize: 1 << 20, JettiesPerDevice: 1008, JettiesPerUnit: 16},
		},
		{name: "nothing advertised", devs: []discoveredDevice{dev("udma0", false, 8192, 1, 16, 1)}, wantErr: "no healthy device"},
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
