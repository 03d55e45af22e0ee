package inventory

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/selection"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

func dev(name string, numa int) sysfs.Device {
	eid, _ := urma.ParseEID("::ffff:10.0.0.1")
	eid2, _ := urma.ParseEID("::ffff:10.0.0.9")
	return sysfs.Device{
		DeviceInfo: urma.DeviceInfo{
			Name: name, Driver: "udma", TransportType: urma.TransportUB,
			Caps:          urma.DeviceCaps{MaxJetty: 1024, MaxJFSDepth: 8192, MaxJFRDepth: 4096, MaxJFCDepth: 1 << 22, MaxMsgSize: 1 << 32},
			ReservedJetty: urma.Range{Min: 0, Max: 15},
			Ports:         []urma.Port{{Index: 0, State: urma.PortActive}},
			EIDs:          []urma.EIDEntry{{Index: 3, EID: eid2}, {Index: 1, EID: eid}},
		},
		Class: sysfs.ClassUbcore, NUMANode: numa, DevNode: "/dev/uburma/" + name, HasReservedJetty: true,
		IsBonding: strings.HasPrefix(name, "bonding"), VendorID: "0x19e5", DeviceID: "0xa001",
	}
}

func down(d sysfs.Device) sysfs.Device {
	d.Ports = []urma.Port{{Index: 0, State: urma.PortDown}}
	return d
}

func cfg(observations int) Config {
	return Config{Budget: budget.Default(), Debounce: health.Debounce{Observations: observations}}
}

func names(s Snapshot) []string {
	var out []string
	for _, d := range s.Devices {
		out = append(out, d.Name)
	}
	return out
}

func TestBuildDescribesDevices(t *testing.T) {
	b := NewBuilder(cfg(1))
	snap, decisions, recheck := b.Build(Scan{Devices: []sysfs.Device{dev("udma1", 1), dev("udma0", 0)}, UMMUNode: "/dev/ummu/tid"}, time.Now())
	if got := strings.Join(names(snap), ","); got != "udma0,udma1" {
		t.Fatalf("devices %s, want udma0,udma1 (sorted)", got)
	}
	if len(decisions) != 2 || !recheck.IsZero() {
		t.Fatalf("decisions %v recheck %v", decisions, recheck)
	}
	d, ok := snap.Lookup("udma1")
	if !ok {
		t.Fatal("Lookup(udma1) failed")
	}
	want := budget.Default().For(1024, urma.Range{Min: 0, Max: 15})
	if !d.Healthy || d.Reason != "" || d.NUMANode != 1 || d.Budget != want || d.DevNode != "/dev/uburma/udma1" {
		t.Errorf("udma1 = %+v", d)
	}
	if d.EID != "::ffff:10.0.0.1" {
		t.Errorf("EID = %q, want the lowest-index slot's ::ffff:10.0.0.1", d.EID)
	}
	if d.VendorID != "0x19e5" || d.DeviceID != "0xa001" || d.Bonding {
		t.Errorf("PCI ids / bonding = %q %q %v, want 0x19e5 0xa001 false", d.VendorID, d.DeviceID, d.Bonding)
	}
	if snap.UMMUNode != "/dev/ummu/tid" || snap.JettiesPerUnit != 16 {
		t.Errorf("snapshot %+v", snap)
	}
	if _, ok := snap.Lookup("udma9"); ok {
		t.Error("Lookup found a device that does not exist")
	}
}

// A device that names no reserved jetties (older kernels lack the file;
// ubcore writes 4294967295-4294967295 when it cannot reserve) loses none of
// its budget to them.
func TestBuildWithoutReservedJetties(t *testing.T) {
	d := dev("udma0", 0)
	d.ReservedJetty, d.HasReservedJetty = urma.Range{}, false
	snap, _, _ := NewBuilder(cfg(1)).Build(Scan{Devices: []sysfs.Device{d}}, time.Now())
	got, ok := snap.Lookup("udma0")
	if !ok {
		t.Fatal("udma0 not advertised")
	}
	if want := 1024 - budget.Default().HostReserve; got.Budget.Available != want {
		t.Errorf("available jetties %d, want max_jetty 1024 - host reserve = %d", got.Budget.Available, want)
	}
}

func TestBuildUnhealthyAndMalformed(t *testing.T) {
	noNode := dev("udma2", 0)
	noNode.DevNode = ""
	bad := dev("udma3", 0)
	bad.Problems = []string{`max_jetty: "garbage" is not a number`}
	noEID := dev("udma4", 0)
	noEID.EIDs = nil
	b := NewBuilder(cfg(1))
	snap, _, _ := b.Build(Scan{Devices: []sysfs.Device{down(dev("udma1", 0)), noNode, bad, noEID}}, time.Now())
	for _, tc := range []struct{ name, reason string }{
		{"udma1", "no usable port"},
		{"udma2", "device node"},
		{"udma3", "garbage"},
		{"udma4", "no EID"},
	} {
		d, _ := snap.Lookup(tc.name)
		if d == nil || d.Healthy || !strings.Contains(d.Reason, tc.reason) {
			t.Errorf("%s = %+v, want unhealthy with reason containing %q", tc.name, d, tc.reason)
		}
	}
	if d, _ := snap.Lookup("udma3"); d.Budget.Units != 0 {
		t.Errorf("malformed device advertises %d units, want 0", d.Budget.Units)
	}
}

// malformed is d as discovery reports it when max_jetty cannot be parsed.
func malformed(d sysfs.Device) sysfs.Device {
	d.Problems = []string{`max_jetty: "garbage" is not a number`}
	d.Caps.MaxJetty = 0
	return d
}

func TestBuildKeepsIDsThroughAFlappingMalformedFile(t *testing.T) {
	b := NewBuilder(cfg(2))
	now := time.Now()
	want := budget.Default().For(1024, urma.Range{Min: 0, Max: 15})
	steps := []struct {
		name    string
		scan    []sysfs.Device
		healthy bool
		listed  bool
	}{
		{"clean", []sysfs.Device{dev("udma0", 0)}, true, true},
		{"one malformed read: debounced", []sysfs.Device{malformed(dev("udma0", 0))}, true, true},
		{"clean again", []sysfs.Device{dev("udma0", 0)}, true, true},
		{"malformed", []sysfs.Device{malformed(dev("udma0", 0))}, true, true},
		{"still malformed: unhealthy, IDs kept", []sysfs.Device{malformed(dev("udma0", 0))}, false, true},
		{"gone once: listed while debounced", nil, false, true},
		{"gone for good: IDs vanish with the device", nil, false, false},
	}
	for _, st := range steps {
		now = now.Add(time.Second)
		snap, _, _ := b.Build(Scan{Devices: st.scan}, now)
		d, ok := snap.Lookup("udma0")
		if ok != st.listed {
			t.Fatalf("%s: listed %v, want %v", st.name, ok, st.listed)
		}
		if !ok {
			continue
		}
		if d.Budget != want {
			t.Errorf("%s: budget %+v, want the last trustworthy %+v", st.name, d.Budget, want)
		}
		if d.Info.Caps.MaxJetty != 1024 {
			t.Errorf("%s: max_jetty %d, want the last trustworthy 1024", st.name, d.Info.Caps.MaxJetty)
		}
		if d.Healthy != st.healthy {
			t.Errorf("%s: healthy %v (%s), want %v", st.name, d.Healthy, d.Reason, st.healthy)
		}
	}
}

func TestBuildTakesACleanlyReadBudgetChange(t *testing.T) {
	b := NewBuilder(cfg(2))
	now := time.Now()
	b.Build(Scan{Devices: []sysfs.Device{dev("udma0", 0)}}, now)
	smaller := dev("udma0", 0)
	smaller.Caps.MaxJetty = 512
	snap, _, _ := b.Build(Scan{Devices: []sysfs.Device{smaller}}, now.Add(time.Second))
	want := budget.Default().For(512, urma.Range{Min: 0, Max: 15})
	if d, _ := snap.Lookup("udma0"); d == nil || d.Budget != want || d.Info.Caps.MaxJetty != 512 {
		t.Fatalf("udma0 after max_jetty was read as 512: %+v, want budget %+v: only malformed reads keep the old one", d, want)
	}
}

func TestBuildNewMalformedDeviceAdvertisesNothing(t *testing.T) {
	b := NewBuilder(cfg(2))
	snap, _, _ := b.Build(Scan{Devices: []sysfs.Device{malformed(dev("udma0", 0))}}, time.Now())
	if d, ok := snap.Lookup("udma0"); !ok || d.Healthy || d.Budget.Units != 0 {
		t.Fatalf("a device first seen malformed: %+v, want listed, unhealthy, no units", d)
	}
}

func TestBuildSelection(t *testing.T) {
	c := cfg(1)
	b := NewBuilder(c)
	snap, decisions, _ := b.Build(Scan{Devices: []sysfs.Device{dev("udma0", 0), dev("bonding_dev_0", -1), dev("udma1", 0)}}, time.Now())
	if got := strings.Join(names(snap), ","); got != "bonding_dev_0" {
		t.Fatalf("devices %s, want only the bonding device", got)
	}
	if !snap.Devices[0].Bonding {
		t.Error("bonding_dev_0 is not marked Bonding")
	}
	if decisions[0].Selected || !strings.Contains(decisions[0].Why, "bonding") {
		t.Errorf("udma0 decision %+v", decisions[0])
	}

	c.Selection = selection.Policy{Exclude: []string{"udma1"}, Bonding: selection.BondingNever}
	b = NewBuilder(c)
	snap, _, _ = b.Build(Scan{Devices: []sysfs.Device{dev("udma0", 0), dev("bonding_dev_0", -1), dev("udma1", 0)}}, time.Now())
	if got := strings.Join(names(snap), ","); got != "udma0" {
		t.Fatalf("devices %s, want udma0", got)
	}
}

func TestBuildDebouncesHealthBothWays(t *testing.T) {
	b := NewBuilder(cfg(2))
	now := time.Now()
	healthyAfter := func(d sysfs.Device) bool {
		now = now.Add(time.Second)
		snap, _, _ := b.Build(Scan{Devices: []sysfs.Device{d}}, now)
		got, _ := snap.Lookup("udma0")
		return got.Healthy
	}
	steps := []struct {
		d    sysfs.Device
		want bool
	}{
		{dev("udma0", 0), true},
		{down(dev("udma0", 0)), true}, // one bad scan: debounced
		{down(dev("udma0", 0)), false},
		{dev("udma0", 0), false}, // one good scan: still down
		{dev("udma0", 0), true},  // recovered without a restart
	}
	for i, s := range steps {
		if got := healthyAfter(s.d); got != s.want {
			t.Fatalf("step %d: healthy %v, want %v", i, got, s.want)
		}
	}
}

func TestBuildHotPlugAndRemoval(t *testing.T) {
	b := NewBuilder(cfg(2))
	now := time.Now()
	build := func(devs ...sysfs.Device) Snapshot {
		now = now.Add(time.Second)
		s, _, _ := b.Build(Scan{Devices: devs}, now)
		return s
	}
	build(dev("udma0", 0))
	s := build(dev("udma0", 0), dev("udma1", 1))
	if got := strings.Join(names(s), ","); got != "udma0,udma1" {
		t.Fatalf("hot-plugged device not listed at once: %s", got)
	}
	s = build(dev("udma1", 1))
	d, ok := s.Lookup("udma0")
	if !ok || !d.Vanished {
		t.Fatalf("udma0 after one absent scan: %+v, want listed and Vanished", d)
	}
	s = build(dev("udma0", 0), dev("udma1", 1)) // back: a blip
	if d, _ := s.Lookup("udma0"); d.Vanished || !d.Healthy {
		t.Fatalf("udma0 back: %+v", d)
	}
	build(dev("udma1", 1))
	s = build(dev("udma1", 1))
	if got := strings.Join(names(s), ","); got != "udma1" {
		t.Fatalf("after two absent scans: %s, want udma1", got)
	}
	// Gone for good: coming back is a fresh device, taken at once.
	s = build(down(dev("udma0", 0)), dev("udma1", 1))
	if d, _ := s.Lookup("udma0"); d == nil || d.Healthy {
		t.Fatalf("re-added udma0: %+v, want listed unhealthy at once", d)
	}
}

func TestBuildVanishedWithoutDebounceGoesAtOnce(t *testing.T) {
	b := NewBuilder(cfg(1))
	now := time.Now()
	b.Build(Scan{Devices: []sysfs.Device{dev("udma0", 0)}}, now)
	s, _, _ := b.Build(Scan{}, now.Add(time.Second))
	if len(s.Devices) != 0 {
		t.Fatalf("devices %v, want none", names(s))
	}
}

func TestBuildRecheckForHold(t *testing.T) {
	c := cfg(1)
	c.Debounce.Hold = 10 * time.Second
	b := NewBuilder(c)
	now := time.Now()
	b.Build(Scan{Devices: []sysfs.Device{dev("udma0", 0)}}, now)
	_, _, recheck := b.Build(Scan{Devices: []sysfs.Device{down(dev("udma0", 0))}}, now.Add(time.Second))
	if want := now.Add(11 * time.Second); !recheck.Equal(want) {
		t.Fatalf("recheck %v, want %v", recheck, want)
	}
}

func TestSoftDevices(t *testing.T) {
	c := cfg(1)
	c.SoftDevices, c.SoftJetties = 2, 100
	c.Budget.HostReserve = 50
	b := NewBuilder(c)
	s, _, _ := b.Build(Scan{}, time.Now())
	if got := strings.Join(names(s), ","); got != "soft0,soft1" {
		t.Fatalf("devices %s", got)
	}
	d, _ := s.Lookup("soft1")
	if !d.Software || !d.Healthy || d.DevNode != "" || d.NUMANode != -1 || d.Info.Driver != SoftDriver {
		t.Errorf("soft1 = %+v", d)
	}
	if d.Budget.Units != 6 || d.Budget.Jetties != 96 {
		t.Errorf("soft budget %+v, want 6 units / 96 jetties (host reserve does not apply)", d.Budget)
	}
	if d.Info.Caps.MaxJFSDepth == 0 || d.Info.Caps.MaxMsgSize == 0 {
		t.Errorf("soft caps missing: %+v", d.Info.Caps)
	}
	// Beside hardware.
	s, _, _ = b.Build(Scan{Devices: []sysfs.Device{dev("udma0", 0)}}, time.Now())
	if got := strings.Join(names(s), ","); got != "soft0,soft1,udma0" {
		t.Fatalf("devices %s", got)
	}
}

func TestConfigValidate(t *testing.T) {
	good := cfg(1)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []Config{
		{Budget: budget.Config{}},
		{Budget: budget.Default(), Selection: selection.Policy{Include: []string{"["}}},
		{Budget: budget.Default(), Debounce: health.Debounce{Observations: -1}},
		{Budget: budget.Default(), SoftDevices: -1},
		{Budget: budget.Default(), SoftDevices: 1},
	}
	for i, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("config %d: Validate = nil, want an error", i)
		}
	}
}

func TestPublish(t *testing.T) {
	inv := New(16)
	s0, ch0 := inv.Current()
	if s0.Generation != 0 || len(s0.Devices) != 0 {
		t.Fatalf("initial snapshot %+v", s0)
	}
	b := NewBuilder(cfg(1))
	snap, _, _ := b.Build(Scan{Devices: []sysfs.Device{dev("udma0", 0)}}, time.Now())
	if !inv.Publish(snap) {
		t.Fatal("Publish of a new device set reported no change")
	}
	select {
	case <-ch0:
	default:
		t.Fatal("changed channel not closed by Publish")
	}
	s1, ch1 := inv.Current()
	if s1.Generation != 1 || len(s1.Devices) != 1 {
		t.Fatalf("after publish: %+v", s1)
	}
	snap2, _, _ := b.Build(Scan{Devices: []sysfs.Device{dev("udma0", 0)}}, time.Now())
	if inv.Publish(snap2) {
		t.Fatal("Publish of identical content reported a change")
	}
	select {
	case <-ch1:
		t.Fatal("changed channel closed without a change")
	default:
	}
	snap3, _, _ := b.Build(Scan{Devices: []sysfs.Device{down(dev("udma0", 0))}}, time.Now())
	if !inv.Publish(snap3) {
		t.Fatal("a health flip is a change")
	}
	if s, _ := inv.Current(); s.Generation != 2 {
		t.Fatalf("generation %d, want 2", s.Generation)
	}
}

func TestSnapshotsAreIndependentOfLaterScans(t *testing.T) {
	b := NewBuilder(cfg(1))
	d := dev("udma0", 0)
	snap, _, _ := b.Build(Scan{Devices: []sysfs.Device{d}}, time.Now())
	d.Ports[0].State = urma.PortDown
	if got, _ := snap.Lookup("udma0"); got.Info.Ports[0].State != urma.PortActive {
		t.Fatal("snapshot shares the scan's port slice")
	}
}

func TestPublishSeesIdentityChanges(t *testing.T) {
	for _, change := range []func(*sysfs.Device){
		func(d *sysfs.Device) { d.VendorID = "0x1234" },
		func(d *sysfs.Device) { d.DeviceID = "0x1234" },
		func(d *sysfs.Device) { d.IsBonding = true },
	} {
		inv := New(16)
		b := NewBuilder(cfg(1))
		d := dev("udma0", 0)
		snap, _, _ := b.Build(Scan{Devices: []sysfs.Device{d}}, time.Now())
		inv.Publish(snap)
		change(&d)
		snap, _, _ = b.Build(Scan{Devices: []sysfs.Device{d}}, time.Now())
		if !inv.Publish(snap) {
			t.Errorf("a changed PCI id or bonding flag was not published")
		}
	}
}

func TestFirstScanIsPublishedEvenWhenEmpty(t *testing.T) {
	inv := New(16)
	if s, _ := inv.Current(); s.Scanned {
		t.Fatal("the initial snapshot claims to come from a scan")
	}
	snap, _, _ := NewBuilder(cfg(1)).Build(Scan{}, time.Now())
	if !inv.Publish(snap) {
		t.Fatal("an empty first scan was not published: consumers could not tell it from no scan")
	}
	if s, _ := inv.Current(); !s.Scanned || s.Generation != 1 {
		t.Fatalf("after the first scan: %+v", s)
	}
}

func TestWaitScanned(t *testing.T) {
	inv := New(16)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := inv.WaitScanned(ctx); ok {
		t.Fatal("WaitScanned returned a snapshot before any scan")
	}
	// A node without devices: the first scan finds nothing, and that is an
	// answer consumers must be able to tell from "not scanned yet".
	snap, _, _ := NewBuilder(cfg(1)).Build(Scan{}, time.Now())
	inv.Publish(snap)
	s, ok := inv.WaitScanned(context.Background())
	if !ok || !s.Scanned || len(s.Devices) != 0 {
		t.Fatalf("WaitScanned = %+v, %v; want the empty first scan", s, ok)
	}
}

// New work goes only to a device that is healthy, that the last scan saw
// and, for hardware, whose device node it saw; a vanished device says so
// whatever its health says.
func TestDeviceUsable(t *testing.T) {
	const node = "/dev/uburma/udma0"
	for _, c := range []struct {
		name    string
		d       Device
		ok      bool
		wantWhy string
	}{
		{"healthy", Device{Healthy: true, DevNode: node}, true, ""},
		{"healthy software device, which has no node", Device{Healthy: true, Software: true}, true, ""},
		{"healthy, its node gone", Device{Healthy: true}, false, ReasonNoDevNode},
		{"unhealthy", Device{Reason: "no usable port", DevNode: node}, false, "no usable port"},
		{"unhealthy, its node gone", Device{Reason: "device node missing"}, false, "device node missing"},
		{"vanished, still healthy", Device{Healthy: true, Vanished: true, DevNode: node}, false, ReasonVanished},
		{"vanished and unhealthy", Device{Reason: "no usable port", Vanished: true}, false, ReasonVanished},
	} {
		t.Run(c.name, func(t *testing.T) {
			if ok, why := c.d.Usable(); ok != c.ok || why != c.wantWhy {
				t.Errorf("Usable() = %v, %q; want %v, %q", ok, why, c.ok, c.wantWhy)
			}
		})
	}
}
