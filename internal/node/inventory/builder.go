package inventory

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/health"
	"github.com/openeuler/urma-k8s/internal/node/selection"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

// Config is how scans become snapshots.
type Config struct {
	Budget    budget.Config
	Selection selection.Policy
	Debounce  health.Debounce
	// SoftDevices is the number of software-provider devices (soft0, soft1,
	// ...) to advertise besides whatever hardware is found.
	SoftDevices int
	// SoftJetties is each software device's max_jetty.
	SoftJetties uint32
}

// Validate checks every part of the configuration.
func (c Config) Validate() error {
	if err := c.Budget.Validate(); err != nil {
		return err
	}
	if err := c.Selection.Validate(); err != nil {
		return err
	}
	if err := c.Debounce.Validate(); err != nil {
		return err
	}
	if c.SoftDevices < 0 {
		return fmt.Errorf("soft devices: %d is negative", c.SoftDevices)
	}
	if c.SoftDevices > 0 && c.SoftJetties == 0 {
		return fmt.Errorf("soft devices: jetties per soft device must be at least 1")
	}
	return nil
}

// Scan is one discovery result.
type Scan struct {
	Devices  []sysfs.Device
	UMMUNode string
	Missing  []string
}

// Builder turns scans into snapshots, debouncing health and disappearance.
// One scan loop owns it; it is not safe for concurrent use.
type Builder struct {
	cfg      Config
	health   *health.Tracker
	presence *health.Tracker
	known    map[string]Device
	// bonding names the bonding devices selected from a clean read (no
	// Problems), until they are forgotten: while one of them is missing
	// or unreadable, its members stay hidden (selection.SelectRemembering).
	// A device classed as bonding only in an unreadable scan is not
	// remembered, as a broken device link looks like bonding.
	bonding map[string]bool
}

// NewBuilder returns a builder with no history.
func NewBuilder(cfg Config) *Builder {
	return &Builder{
		cfg:      cfg,
		health:   health.NewTracker(cfg.Debounce),
		presence: health.NewTracker(cfg.Debounce),
		known:    map[string]Device{},
		bonding:  map[string]bool{},
	}
}

// ReasonVanished is the health reason of a device the last scan did not see.
const ReasonVanished = "device no longer discovered (removed, or driver reloading)"

// Build returns the snapshot for a scan (Generation left zero), the
// selection decision on every discovered device, and, when a health change
// is pending, the time at which another scan could commit it (zero if none).
func (b *Builder) Build(scan Scan, now time.Time) (Snapshot, []selection.Decision, time.Time) {
	cands := Candidates(scan.Devices)
	decisions := b.cfg.Selection.SelectRemembering(cands, b.bondingAway(cands))
	b.rememberBonding(cands, decisions)
	var recheck time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (recheck.IsZero() || t.Before(recheck)) {
			recheck = t
		}
	}

	seen := map[string]bool{}
	var out []Device
	for i := range scan.Devices {
		if !decisions[i].Selected {
			continue
		}
		d := FromSysfs(&scan.Devices[i], b.cfg.Budget)
		if prev, ok := b.known[d.Name]; ok && len(scan.Devices[i].Problems) > 0 {
			// A read problem says nothing about the device's size: keep the
			// IDs kubelet knows (the health debounce marks them Unhealthy if
			// the problem persists). IDs only vanish with the device.
			d.Budget, d.Info.Caps, d.Info.ReservedJetty = prev.Budget, prev.Info.Caps, prev.Info.ReservedJetty
		}
		seen[d.Name] = true
		b.presence.Observe(d.Name, health.Verdict{Healthy: true}, now)
		v, r := b.health.Observe(d.Name, health.Verdict{Healthy: d.Healthy, Reason: d.Reason}, now)
		earliest(r)
		d.Healthy, d.Reason = v.Healthy, v.Reason
		b.known[d.Name] = d
		out = append(out, d)
	}
	for name, d := range b.known {
		if seen[name] {
			continue
		}
		present, r := b.presence.Observe(name, health.Verdict{Reason: ReasonVanished}, now)
		earliest(r)
		if !present.Healthy {
			b.presence.Forget(name)
			b.health.Forget(name)
			delete(b.known, name)
			delete(b.bonding, name)
			continue
		}
		v, r := b.health.Observe(name, health.Verdict{Reason: ReasonVanished}, now)
		earliest(r)
		d.Healthy, d.Reason, d.Vanished = v.Healthy, v.Reason, true
		out = append(out, d)
	}
	for _, d := range SoftDevices(b.cfg) {
		if _, clash := b.known[d.Name]; clash {
			continue // a hardware device of that name wins
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Device) int { return strings.Compare(a.Name, b.Name) })
	return Snapshot{
		Devices:        out,
		JettiesPerUnit: b.cfg.Budget.JettiesPerUnit,
		UMMUNode:       scan.UMMUNode,
		Missing:        slices.Clone(scan.Missing),
		Scanned:        true,
	}, decisions, recheck
}

// bondingAway reports whether a remembered bonding device is missing from
// cands or unreadable in them.
func (b *Builder) bondingAway(cands []selection.Candidate) bool {
	for name := range b.bonding {
		i := slices.IndexFunc(cands, func(c selection.Candidate) bool { return c.Name == name })
		if i < 0 || cands[i].Broken {
			return true
		}
	}
	return false
}

// rememberBonding records the bonding devices this scan selected from a
// clean read, and drops a remembered one that a clean read shows is not
// bonding (any more) or not selected.
func (b *Builder) rememberBonding(cands []selection.Candidate, decisions []selection.Decision) {
	for i, c := range cands {
		if c.Broken {
			continue
		}
		if c.Bonding && decisions[i].Selected {
			b.bonding[c.Name] = true
		} else {
			delete(b.bonding, c.Name)
		}
	}
}

// Candidates extracts what selection looks at from discovered devices.
func Candidates(devs []sysfs.Device) []selection.Candidate {
	out := make([]selection.Candidate, len(devs))
	for i := range devs {
		d := &devs[i]
		out[i] = selection.Candidate{Name: d.Name, Driver: d.Driver, Transport: d.TransportType, Bonding: d.IsBonding, Broken: len(d.Problems) > 0}
	}
	return out
}

// reservedJetties is the device's reserved jetty range, empty when sysfs
// names none (no reserved_jetty_id file, or ubcore's "cannot reserve"): the
// zero Range{0,0} would be jetty 0 and cost the budget one jetty.
func reservedJetties(d *sysfs.Device) urma.Range {
	if !d.HasReservedJetty {
		return urma.Range{Min: 1, Max: 0}
	}
	return d.ReservedJetty
}

// FromSysfs describes a discovered device with its undebounced health (the
// sysfs rule: no malformed files, a port ACTIVE or ACTIVE_DEFER, the device
// node present, at least one EID) and its budget.
func FromSysfs(d *sysfs.Device, rule budget.Config) Device {
	out := Device{
		Name:     d.Name,
		NUMANode: d.NUMANode,
		Healthy:  d.Usable(),
		Reason:   d.Reason(),
		Budget:   rule.For(d.Caps.MaxJetty, reservedJetties(d)),
		DevNode:  d.DevNode,
		Info:     cloneInfo(&d.DeviceInfo),
		VendorID: d.VendorID,
		DeviceID: d.DeviceID,
		Bonding:  d.IsBonding,
	}
	if len(d.Problems) > 0 {
		// A device whose files cannot be read has no trustworthy budget;
		// Builder keeps the last trustworthy one of a known device.
		out.Budget = budget.Budget{}
	}
	if len(d.EIDs) > 0 {
		first := slices.MinFunc(d.EIDs, func(a, b urma.EIDEntry) int { return a.Index - b.Index })
		out.EID = first.EID.String()
	}
	return out
}

func cloneInfo(in *urma.DeviceInfo) urma.DeviceInfo {
	out := *in
	out.Ports = slices.Clone(in.Ports)
	out.EIDs = slices.Clone(in.EIDs)
	return out
}

// SoftDevices returns the configured software-provider devices: always
// healthy, no device node, no NUMA affinity, the software provider's default
// capabilities with max_jetty set to SoftJetties.
func SoftDevices(cfg Config) []Device {
	out := make([]Device, 0, cfg.SoftDevices)
	rule := cfg.Budget
	rule.HostReserve = 0 // no host process shares a software device
	for i := range cfg.SoftDevices {
		name := fmt.Sprintf("soft%d", i)
		caps := softCaps()
		caps.MaxJetty = cfg.SoftJetties
		caps.PortCount = 1
		out = append(out, Device{
			Name:     name,
			Software: true,
			NUMANode: -1,
			Healthy:  true,
			Budget:   rule.For(cfg.SoftJetties, urma.Range{Min: 1}),
			Info: urma.DeviceInfo{
				Name:          name,
				Driver:        SoftDriver,
				TransportType: urma.TransportUB,
				Caps:          caps,
				ReservedJetty: urma.Range{Min: 1},
				Ports:         []urma.Port{{Index: 0, State: urma.PortActive}},
			},
		})
	}
	return out
}

// SoftDriver is the driver name software devices report.
const SoftDriver = urma.SoftDriver

// softCaps are the limits the software provider enforces; the node facts
// the operator tunes against come from here.
func softCaps() urma.DeviceCaps { return urma.SoftDeviceCaps() }
