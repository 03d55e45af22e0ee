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

	"github.com/openeuler/urma-k8s/hack/internal/proc"
	"github.com/openeuler/urma-k8s/internal/node/discover"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
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
	bond := sysfstest.DefaultDevice("bonding_dev_0")
	bond.Bonding = true
	bond.GUID = "cc08:0000:0000:0000:0000:0000:0000:00b0"
	bond.EIDs = []string{"0000:0000:0000:0000:0000:ffff:0a00:0003"}
	bond.Caps.MaxJetty = 2048
	bond.Reserved = urma.Range{Min: 0, Max: 31}
	return append(sysfstest.TwoNUMANodes(), bond)
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
	out, err := c.Wait(ctx, 30*time.Second)
	if err != nil {
		return err
	}
	n.devices, err = parseDiscover(out)
	if err != nil {
		return fmt.Errorf("read %s discover's output: %w", binDevicePlugin, err)
	}
	d.node = n
	fmt.Fprint(d.out, proc.Indent(formatDevices(n.devices), "    ")+"\n")
	return nil
}

// discoveredDevice is one entry of `urma-device-plugin discover`'s JSON.
type discoveredDevice = discover.Device

// parseDiscover reads discover's JSON array of devices.
func parseDiscover(b []byte) ([]discoveredDevice, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("no output")
	}
	var devs []discoveredDevice
	if err := json.Unmarshal(b, &devs); err != nil {
		return nil, fmt.Errorf("not the discover JSON (an array of devices): %w", err)
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
	// Why devices are not advertised, as footnotes: the reasons are long.
	notAdvertised := map[string][]string{}
	var reasons []string
	var resource, perUnit uint32
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tDRIVER\tNUMA\tPORTS\tEID\tMAX JETTY\tHEALTH\tBUDGET")
	for _, dv := range devs {
		numa := "-"
		if dv.NUMANode >= 0 {
			numa = strconv.Itoa(dv.NUMANode)
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
		budget := fmt.Sprintf("%d jetties (%d units)", dv.Budget.Jetties, dv.Budget.Units)
		if !dv.Advertised {
			budget = "not advertised*"
			why := "(no reason given)"
			if dv.Selection != nil && *dv.Selection != "" {
				why = *dv.Selection
			}
			if _, seen := notAdvertised[why]; !seen {
				reasons = append(reasons, why)
			}
			notAdvertised[why] = append(notAdvertised[why], dv.Name)
		} else {
			resource += dv.Budget.Units
			if dv.Budget.Units > 0 {
				perUnit = dv.Budget.Jetties / dv.Budget.Units
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", dv.Name, dv.Driver, numa, orDash(strings.Join(ports, ",")), eid, dv.Caps.MaxJetty, health, budget)
	}
	tw.Flush()
	for _, why := range reasons {
		fmt.Fprintf(&b, "* %s: %s\n", strings.Join(notAdvertised[why], ", "), why)
	}
	if resource > 0 {
		fmt.Fprintf(&b, "=> the device plugin advertises %d units of %s on this node (%d jetties each)\n", resource, nodefacts.ResourceName, perUnit)
	} else {
		fmt.Fprintf(&b, "=> the device plugin advertises no %s on this node\n", nodefacts.ResourceName)
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
