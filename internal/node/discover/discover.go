// Package discover renders what the device plugin sees as JSON, for the
// `urma-device-plugin discover` command: every discovered device with its
// ports, EIDs, capabilities, health and the budget the plugin would
// advertise. An operator runs it on a node to see why a budget is what it
// is (or 0).
package discover

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

// Device is one device in the report. The field names are part of the
// command's interface.
type Device struct {
	Name          string  `json:"name"`
	Driver        string  `json:"driver"`
	TransportType string  `json:"transportType"`
	VendorID      string  `json:"vendorID"`
	DeviceID      string  `json:"deviceID"`
	NUMANode      int     `json:"numaNode"`
	DevNode       string  `json:"devNode"`
	Ports         []Port  `json:"ports"`
	EIDs          []EID   `json:"eids"`
	Caps          Caps    `json:"caps"`
	ReservedJetty Range   `json:"reservedJetty"`
	Healthy       bool    `json:"healthy"`
	Reason        string  `json:"reason"`
	Budget        Budget  `json:"budget"`
	Advertised    bool    `json:"advertised"`
	Selection     *string `json:"selection,omitempty"` // why not advertised
}

// Port is a device port.
type Port struct {
	Index  int    `json:"index"`
	State  string `json:"state"`
	Usable bool   `json:"usable"`
}

// EID is a populated EID slot.
type EID struct {
	Index int    `json:"index"`
	EID   string `json:"eid"`
}

// Caps are the capabilities the plugin and the operator care about.
type Caps struct {
	MaxJetty         uint32 `json:"maxJetty"`
	MaxJFSDepth      uint32 `json:"maxJfsDepth"`
	MaxJFRDepth      uint32 `json:"maxJfrDepth"`
	MaxJFCDepth      uint32 `json:"maxJfcDepth"`
	MaxJFSSge        uint32 `json:"maxJfsSge"`
	MaxJFRSge        uint32 `json:"maxJfrSge"`
	MaxMsgSize       uint64 `json:"maxMsgSize"`
	MaxJFSInlineSize uint32 `json:"maxJfsInlineSize"`
}

// Range is the reserved jetty ID range.
type Range struct {
	Min uint32 `json:"min"`
	Max uint32 `json:"max"`
}

// Budget is what the plugin advertises for the device.
type Budget struct {
	Jetties uint32 `json:"jetties"`
	Units   uint32 `json:"units"`
}

// Report describes the discovered devices (in discovery order) and then the
// configured software devices. Health is undebounced: this scan's verdict.
func Report(devs []sysfs.Device, cfg inventory.Config) []Device {
	decisions := cfg.Selection.Select(inventory.Candidates(devs))
	out := make([]Device, 0, len(devs)+cfg.SoftDevices)
	for i := range devs {
		d := inventory.FromSysfs(&devs[i], cfg.Budget)
		r := fromInventory(&d)
		r.VendorID, r.DeviceID = devs[i].VendorID, devs[i].DeviceID
		r.Advertised = decisions[i].Selected
		if !r.Advertised {
			why := decisions[i].Why
			r.Selection = &why
		}
		out = append(out, r)
	}
	for _, d := range inventory.SoftDevices(cfg) {
		r := fromInventory(&d)
		r.Advertised = true
		out = append(out, r)
	}
	return out
}

func fromInventory(d *inventory.Device) Device {
	info := &d.Info
	r := Device{
		Name:          d.Name,
		Driver:        info.Driver,
		TransportType: info.TransportType.String(),
		NUMANode:      d.NUMANode,
		DevNode:       d.DevNode,
		Ports:         make([]Port, 0, len(info.Ports)),
		EIDs:          make([]EID, 0, len(info.EIDs)),
		Caps: Caps{
			MaxJetty: info.Caps.MaxJetty, MaxJFSDepth: info.Caps.MaxJFSDepth, MaxJFRDepth: info.Caps.MaxJFRDepth,
			MaxJFCDepth: info.Caps.MaxJFCDepth, MaxJFSSge: info.Caps.MaxJFSSge, MaxJFRSge: info.Caps.MaxJFRSge,
			MaxMsgSize: info.Caps.MaxMsgSize, MaxJFSInlineSize: info.Caps.MaxJFSInlineSize,
		},
		ReservedJetty: Range{Min: info.ReservedJetty.Min, Max: info.ReservedJetty.Max},
		Healthy:       d.Healthy,
		Reason:        d.Reason,
		Budget:        Budget{Jetties: d.Budget.Jetties, Units: d.Budget.Units},
	}
	for _, p := range info.Ports {
		r.Ports = append(r.Ports, Port{Index: p.Index, State: p.State.String(), Usable: p.State.Usable()})
	}
	for _, e := range info.EIDs {
		r.EIDs = append(r.EIDs, EID{Index: e.Index, EID: e.EID.String()})
	}
	return r
}

// Write prints the report as indented JSON (an array, [] when empty).
func Write(w io.Writer, report []Device) error {
	if report == nil {
		report = []Device{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(report); err != nil {
		return fmt.Errorf("write discovery report: %w", err)
	}
	return nil
}
