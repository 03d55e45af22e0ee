package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

// fakeNode is the generated UB node and what the device plugin made of it.
type fakeNode struct {
	sysfsRoot, devRoot string
	devices            []discoveredDevice
}

// fakeDevices is a small UB node: two UDMA devices on different NUMA nodes
// and the bonding device that aggregates them.
func fakeDevices() []sysfstest.Device {
	u0 := sysfstest.DefaultDevice("udma0")
	u1 := sysfstest.DefaultDevice("udma1")
	numa1 := 1
	u1.NUMANode = &numa1
	u1.GUID = "cc08:0000:0000:0000:0000:0000:0000:0002"
	u1.EIDs = []string{"0000:0000:0000:0000:0000:ffff:0a00:0002"}
	bond := sysfstest.DefaultDevice("bonding_dev_0")
	bond.Bonding = true
	bond.GUID = "cc08:0000:0000:0000:0000:0000:0000:00b0"
	bond.EIDs = []string{"0000:0000:0000:0000:0000:ffff:0a00:0003"}
	bond.Caps.MaxJetty = 2048
	bond.Reserved = urma.Range{Min: 0, Max: 31}
	return []sysfstest.Device{u0, u1, bond}
}

// discoverFakeNode writes a fake UB node and runs the device plugin's
// discover command on it.
func (d *demo) discoverFakeNode(ctx context.Context) error {
	n := fakeNode{sysfsRoot: filepath.Join(d.tmp, "node", "sys"), devRoot: filepath.Join(d.tmp, "node", "dev")}
	devs := fakeDevices()
	if err := sysfstest.WriteTree(n.sysfsRoot, n.devRoot, devs...); err != nil {
		return fmt.Errorf("generate the fake UB node: %w", err)
	}
	names := make([]string, len(devs))
	for i, dv := range devs {
		names[i] = dv.Name
	}
	fmt.Fprintf(d.out, "    generated a fake UB node (%s) in %s\n", strings.Join(names, ", "), filepath.Dir(n.sysfsRoot))
	args := []string{"discover", "--sysfs-root", n.sysfsRoot, "--dev-root", n.devRoot}
	fmt.Fprintf(d.out, "    $ %s %s\n", binDevicePlugin, strings.Join(args, " "))
	c, err := d.start("device-plugin-discover", binDevicePlugin, args, nil)
	if err != nil {
		return err
	}
	out, err := c.wait(ctx, 30*time.Second)
	if err != nil {
		return err
	}
	n.devices, err = parseDiscover(out)
	if err != nil {
		return fmt.Errorf("read %s discover's output: %w", binDevicePlugin, err)
	}
	d.node = n
	fmt.Fprint(d.out, indent(formatDevices(n.devices), "    ")+"\n")
	return nil
}

// discoveredDevice is the part of one entry of `urma-device-plugin
// discover`'s JSON that the demo shows.
type discoveredDevice struct {
	Name          string      `json:"name"`
	Driver        string      `json:"driver"`
	TransportType looseString `json:"transportType"`
	NUMANode      *int        `json:"numaNode"`
	DevNode       string      `json:"devNode"`
	Ports         []discPort  `json:"ports"`
	EIDs          []discEID   `json:"eids"`
	Caps          discCaps    `json:"caps"`
	ReservedJetty urma.Range  `json:"reservedJetty"`
	Healthy       bool        `json:"healthy"`
	Reason        string      `json:"reason"`
	Budget        *discBudget `json:"budget"`
}

type discPort struct {
	Index  int         `json:"index"`
	State  looseString `json:"state"`
	Usable bool        `json:"usable"`
}

type discEID struct {
	Index int    `json:"index"`
	EID   string `json:"eid"`
}

type discCaps struct {
	MaxJetty    uint32 `json:"maxJetty"`
	MaxJFSDepth uint32 `json:"maxJfsDepth"`
	MaxJFRDepth uint32 `json:"maxJfrDepth"`
	MaxJFCDepth uint32 `json:"maxJfcDepth"`
	MaxMsgSize  uint64 `json:"maxMsgSize"`
}

type discBudget struct {
	Jetties uint32 `json:"jetties"`
	Units   uint32 `json:"units"`
}

// looseString reads a JSON string or number as text, so an enum shown
// either as its name or as its kernel value prints the same way.
type looseString string

func (s *looseString) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		*s = looseString(str)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a string or a number, got %s", b)
	}
	*s = looseString(n.String())
	return nil
}

// parseDiscover reads discover's JSON: an array of devices, or an object
// with a "devices" array.
func parseDiscover(b []byte) ([]discoveredDevice, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("no output")
	}
	var devs []discoveredDevice
	if b[0] == '{' {
		var wrapped struct {
			Devices *[]discoveredDevice `json:"devices"`
		}
		if err := json.Unmarshal(b, &wrapped); err != nil {
			return nil, fmt.Errorf("not the discover JSON: %w", err)
		}
		if wrapped.Devices == nil {
			return nil, fmt.Errorf(`not the discover JSON: an object without a "devices" array`)
		}
		devs = *wrapped.Devices
	} else if err := json.Unmarshal(b, &devs); err != nil {
		return nil, fmt.Errorf("not the discover JSON: %w", err)
	}
	for i, dv := range devs {
		if dv.Name == "" {
			return nil, fmt.Errorf("device %d has no name", i)
		}
	}
	return devs, nil
}

// formatDevices renders discovered devices as a table.
func formatDevices(devs []discoveredDevice) string {
	if len(devs) == 0 {
		return "no devices discovered\n"
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tDRIVER\tNUMA\tPORTS\tEID\tMAX JETTY\tHEALTH\tBUDGET")
	for _, dv := range devs {
		numa := "-"
		if dv.NUMANode != nil && *dv.NUMANode >= 0 {
			numa = strconv.Itoa(*dv.NUMANode)
		}
		ports := make([]string, len(dv.Ports))
		for i, p := range dv.Ports {
			ports[i] = fmt.Sprintf("%d:%s", p.Index, p.State)
		}
		eid := "-"
		if len(dv.EIDs) > 0 {
			eid = dv.EIDs[0].EID
			if len(dv.EIDs) > 1 {
				eid += fmt.Sprintf(" (+%d)", len(dv.EIDs)-1)
			}
		}
		health := "healthy"
		if !dv.Healthy {
			health = "UNHEALTHY"
			if dv.Reason != "" {
				health += ": " + dv.Reason
			}
		}
		budget := "not advertised"
		if dv.Budget != nil && dv.Budget.Units > 0 {
			budget = fmt.Sprintf("%d jetties (%d units)", dv.Budget.Jetties, dv.Budget.Units)
		} else if dv.Budget != nil {
			budget = "0"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", dv.Name, dv.Driver, numa, orDash(strings.Join(ports, ",")), eid, dv.Caps.MaxJetty, health, budget)
	}
	tw.Flush()
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
