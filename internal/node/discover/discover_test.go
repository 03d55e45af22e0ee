package discover

import (
	"bytes"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

func scan(t *testing.T, tree *sysfstest.Tree) []sysfs.Device {
	t.Helper()
	devs, err := sysfs.Discover(tree.Options())
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

// decode parses the printed JSON generically, so the test sees the field
// names exactly as a consumer would.
func decode(t *testing.T, report []Device) []map[string]any {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, report); err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatalf("output is not a JSON array of objects: %v\n%s", err, buf.String())
	}
	return out
}

func keys(m map[string]any) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	sort.Strings(k)
	return k
}

func TestReportFields(t *testing.T) {
	tree := sysfstest.New(t)
	d := sysfstest.DefaultDevice("udma0")
	d.Ports = []urma.PortState{urma.PortDown, urma.PortActiveDefer}
	tree.Add(t, d)
	cfg := inventory.Config{Budget: budget.Config{JettiesPerUnit: 16, HostReserve: 100, MaxUnitsPerDevice: 1024}}
	out := decode(t, Report(scan(t, tree), cfg))
	if len(out) != 1 {
		t.Fatalf("%d devices", len(out))
	}
	got := out[0]
	wantKeys := []string{"advertised", "budget", "caps", "devNode", "deviceID", "driver", "eids", "healthy", "name", "numaNode", "ports", "reason", "reservedJetty", "transportType", "vendorID"}
	if !slices.Equal(keys(got), wantKeys) {
		t.Errorf("top-level fields %v\nwant %v", keys(got), wantKeys)
	}
	caps := got["caps"].(map[string]any)
	wantCaps := []string{"maxJetty", "maxJfcDepth", "maxJfrDepth", "maxJfrSge", "maxJfsDepth", "maxJfsInlineSize", "maxJfsSge", "maxMsgSize"}
	if !slices.Equal(keys(caps), wantCaps) {
		t.Errorf("caps fields %v", keys(caps))
	}
	dc := d.Caps
	for k, want := range map[string]float64{
		"maxJetty": float64(dc.MaxJetty), "maxJfsDepth": float64(dc.MaxJFSDepth), "maxJfrDepth": float64(dc.MaxJFRDepth),
		"maxJfcDepth": float64(dc.MaxJFCDepth), "maxJfsSge": float64(dc.MaxJFSSge), "maxJfrSge": float64(dc.MaxJFRSge),
		"maxMsgSize": float64(dc.MaxMsgSize), "maxJfsInlineSize": float64(dc.MaxJFSInlineSize),
	} {
		if caps[k] != want {
			t.Errorf("caps.%s = %v, want %v", k, caps[k], want)
		}
	}
	for k, want := range map[string]any{
		"name": "udma0", "driver": "udma", "transportType": "UB", "vendorID": d.VendorID, "deviceID": d.DeviceID,
		"numaNode": 0.0, "healthy": true, "reason": "", "advertised": true,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	if !strings.HasSuffix(got["devNode"].(string), "/uburma/udma0") {
		t.Errorf("devNode %v", got["devNode"])
	}
	ports := got["ports"].([]any)
	if len(ports) != 2 {
		t.Fatalf("ports %v", ports)
	}
	p0, p1 := ports[0].(map[string]any), ports[1].(map[string]any)
	if p0["index"] != 0.0 || p0["state"] != "DOWN" || p0["usable"] != false || p1["state"] != "ACTIVE_DEFER" || p1["usable"] != true {
		t.Errorf("ports %v", ports)
	}
	eids := got["eids"].([]any)
	e0 := eids[0].(map[string]any)
	if len(eids) != 1 || e0["index"] != 0.0 || e0["eid"] != "::ffff:10.0.0.1" {
		t.Errorf("eids %v", eids)
	}
	rj := got["reservedJetty"].(map[string]any)
	if rj["min"] != float64(d.Reserved.Min) || rj["max"] != float64(d.Reserved.Max) {
		t.Errorf("reservedJetty %v", rj)
	}
	// 1024 - 16 reserved - 100 host = 908 -> 56 units of 16 = 896 jetties.
	want := cfg.Budget.For(dc.MaxJetty, d.Reserved)
	b := got["budget"].(map[string]any)
	if b["jetties"] != float64(want.Jetties) || b["units"] != float64(want.Units) || want.Units != 56 {
		t.Errorf("budget %v, want %+v", b, want)
	}
}

func TestReportUnhealthyUnselectedAndSoft(t *testing.T) {
	tree := sysfstest.New(t)
	sick := sysfstest.DefaultDevice("udma0")
	sick.Ports = []urma.PortState{urma.PortDown}
	sick.EIDs = nil
	tree.Add(t, sick)
	tree.Add(t, sysfstest.DefaultDevice("udma1"))
	tree.WriteFile(t, "udma1", "max_jfs_depth", "deep\n")
	bond := sysfstest.DefaultDevice("bonding_dev_0")
	bond.Bonding = true
	tree.Add(t, bond)
	cfg := inventory.Config{Budget: budget.Default(), SoftDevices: 1, SoftJetties: 64}
	out := decode(t, Report(scan(t, tree), cfg))
	byName := map[string]map[string]any{}
	for _, d := range out {
		byName[d["name"].(string)] = d
	}
	if len(byName) != 4 {
		t.Fatalf("%d devices, want 4 distinct names", len(out))
	}
	u0 := byName["udma0"]
	if u0["healthy"] != false || !strings.Contains(u0["reason"].(string), "no usable port") || !strings.Contains(u0["reason"].(string), "no EID") {
		t.Errorf("udma0 health %v / %v", u0["healthy"], u0["reason"])
	}
	if u0["eids"] == nil || len(u0["eids"].([]any)) != 0 {
		t.Errorf("udma0 eids %v, want []", u0["eids"])
	}
	if u0["advertised"] != false || !strings.Contains(u0["selection"].(string), "bonding") {
		t.Errorf("udma0 advertised %v selection %v", u0["advertised"], u0["selection"])
	}
	u1 := byName["udma1"]
	if u1["healthy"] != false || !strings.Contains(u1["reason"].(string), "max_jfs_depth") {
		t.Errorf("udma1 malformed: %v", u1["reason"])
	}
	if b := byName["bonding_dev_0"]; b["advertised"] != true || b["numaNode"] != -1.0 || b["vendorID"] != "" {
		t.Errorf("bonding device %v", b)
	}
	s := byName["soft0"]
	if s["driver"] != inventory.SoftDriver || s["healthy"] != true || s["devNode"] != "" || s["budget"].(map[string]any)["units"] != 4.0 {
		t.Errorf("soft0 %v", s)
	}
}

func TestReportSoftDevicesWithoutHardware(t *testing.T) {
	// More software devices than discovered ones: a node without UB hardware.
	cfg := inventory.Config{Budget: budget.Default(), SoftDevices: 3, SoftJetties: 64}
	out := Report(nil, cfg)
	var names []string
	for _, d := range out {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"soft0", "soft1", "soft2"}) {
		t.Fatalf("report %v, want soft0 soft1 soft2", names)
	}
}

func TestWriteEmptyIsArray(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, nil); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(buf.String()) != "[]" {
		t.Fatalf("empty report %q, want []", buf.String())
	}
}
