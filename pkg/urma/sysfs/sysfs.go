// Package sysfs discovers URMA devices from the tree the kernel exposes:
// /sys/class/ubcore/<dev> (or /sys/class/uburma/<dev> on older kernels) for
// attributes, ports and EIDs, and /dev/uburma/<dev> for the device node a
// workload opens. It needs neither liburma nor hardware, and every host path
// hangs off Options so tests run against fake trees in temporary directories
// (see package sysfstest).
//
// Reading is defensive: the tree may be mid-hot-plug or simply wrong, so each
// malformed or missing file becomes a Problem on its device rather than an
// error for the whole scan, no number is ever guessed, and hostile trees
// (huge files, FIFOs, symlink loops, thousands of entries) are bounded.
package sysfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Class directory names under <SysfsRoot>/class, in order of preference.
const (
	ClassUbcore = "ubcore" // current kernels
	ClassUburma = "uburma" // older kernels
)

// Bounds that keep a hostile or broken tree from costing unbounded work.
const (
	// MaxAttrSize is the most bytes read from one attribute file: a sysfs
	// attribute is at most a page.
	MaxAttrSize = 4096
	// MaxPorts is the kernel's UBCORE_MAX_PORT_CNT; higher port_count values
	// are a Problem and only this many ports are read.
	MaxPorts = 16
	// MaxEIDSlots is the kernel's UBCORE_MAX_EID_CNT: EID slots at or past it
	// are never probed.
	MaxEIDSlots = 1024
	// MaxClassEntries bounds a class directory listing.
	MaxClassEntries = 4096
	// MaxProblems bounds Device.Problems; one more entry counts the rest.
	MaxProblems = 32
	// maxNameLen is UBCORE_MAX_DEV_NAME (64) less the terminating NUL.
	maxNameLen = 63
)

// Options locates the host trees. The zero value means the real host.
type Options struct {
	// SysfsRoot is the root of the sysfs tree; "" means "/sys". Devices are
	// read from <SysfsRoot>/class/ubcore and <SysfsRoot>/class/uburma.
	SysfsRoot string
	// DevRoot is the root of the device nodes; "" means "/dev". A device's
	// node is <DevRoot>/uburma/<dev>; the UDMA provider also needs
	// <DevRoot>/ummu/tid.
	DevRoot string
}

func (o Options) sysfsRoot() string {
	if o.SysfsRoot == "" {
		return "/sys"
	}
	return o.SysfsRoot
}

func (o Options) devRoot() string {
	if o.DevRoot == "" {
		return "/dev"
	}
	return o.DevRoot
}

// ClassDir is the path of a class directory (ClassUbcore or ClassUburma).
func (o Options) ClassDir(class string) string {
	return filepath.Join(o.sysfsRoot(), "class", class)
}

// DevNodePath is where the device node of the named device is expected.
func (o Options) DevNodePath(name string) string {
	return filepath.Join(o.devRoot(), "uburma", name)
}

// Device is one device as sysfs describes it, plus what this package found
// wrong with it.
type Device struct {
	// DeviceInfo holds the name, driver, transport, GUID, capabilities,
	// reserved jetty range, ports (one per port_count, in index order) and
	// the populated EID slots. Caps.OrderedRM is never set: sysfs does not
	// show it.
	urma.DeviceInfo
	// Class is the class directory the device came from: "ubcore" or "uburma".
	Class string `json:"class"`
	// VendorID and DeviceID come from device/vendor and device/device,
	// normalised to 0x%04x (e.g. "0x19e5"); "" when the files are absent, as
	// on bonding devices.
	VendorID string `json:"vendorID,omitempty"`
	DeviceID string `json:"deviceID,omitempty"`
	// NUMANode is device/numa_node, or -1 when absent or negative.
	NUMANode int `json:"numaNode"`
	// DevNode is the full path of <DevRoot>/uburma/<name> if it exists, else "".
	DevNode string `json:"devNode,omitempty"`
	// IsBonding marks a bonding (aggregate) device: its name starts with
	// "bonding" or it has no device/ parent link.
	IsBonding bool `json:"isBonding,omitempty"`
	// HasReservedJetty reports that reserved_jetty_id names a real range.
	// Older kernels lack the file, and a kernel whose device cannot reserve
	// jetties shows 4294967295-4294967295; both leave ReservedJetty zero.
	HasReservedJetty bool `json:"hasReservedJetty"`
	// Problems lists every malformed or missing file, each naming the file
	// (relative to the device directory) and what is wrong with it.
	Problems []string `json:"problems,omitempty"`

	// devNodePath is where DevNode was looked for, for Reason.
	devNodePath string
}

// Usable reports whether a workload can be given this device: no Problems, a
// port ACTIVE or ACTIVE_DEFER, the device node present and at least one EID.
func (d *Device) Usable() bool { return d.Reason() == "" }

// Reason says why the device is not usable, "" when it is.
func (d *Device) Reason() string {
	why := append([]string(nil), d.Problems...)
	if !d.HasUsablePort() {
		why = append(why, "no usable port ("+d.portSummary()+")")
	}
	if d.DevNode == "" {
		p := d.devNodePath
		if p == "" {
			p = Options{}.DevNodePath(d.Name)
		}
		why = append(why, "device node "+p+" missing")
	}
	if len(d.EIDs) == 0 {
		why = append(why, "no EID")
	}
	return strings.Join(why, "; ")
}

func (d *Device) portSummary() string {
	if len(d.Ports) == 0 {
		return "the device reports no ports"
	}
	s := make([]string, len(d.Ports))
	for i, p := range d.Ports {
		s[i] = fmt.Sprintf("port%d %s", p.Index, p.State)
	}
	return strings.Join(s, ", ")
}

// Discover lists the devices under both class directories, sorted by name.
// A device present in both is listed once, from ubcore. Neither directory
// existing is not an error (no driver loaded: an empty list); a class
// directory that exists but cannot be listed is, because returning a partial
// list would look like devices vanishing. Per-device trouble never fails the
// scan: it lands in that device's Problems. A device whose class entry
// disappears while it is being read was unplugged and is left out.
func Discover(opts Options) ([]Device, error) {
	seen := map[string]bool{}
	var devs []Device
	for _, class := range []string{ClassUbcore, ClassUburma} {
		dir := opts.ClassDir(class)
		names, err := listDir(dir, MaxClassEntries)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("discover URMA devices: list %s: %w", dir, err)
		}
		for _, name := range names {
			// "ubcore" is the class entry of ubcore's own admin node, and
			// liburma skips dot entries too.
			if name == "ubcore" || strings.HasPrefix(name, ".") || seen[name] {
				continue
			}
			if d, ok := readDevice(opts, class, name); ok {
				seen[name] = true
				devs = append(devs, d)
			}
		}
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Name < devs[j].Name })
	return devs, nil
}

// ClassDirs returns the class directories that exist, preferred first; a
// device plugin waiting for the driver to load can report what is missing.
func ClassDirs(opts Options) []string {
	var dirs []string
	for _, class := range []string{ClassUbcore, ClassUburma} {
		if fi, err := os.Stat(opts.ClassDir(class)); err == nil && fi.IsDir() {
			dirs = append(dirs, opts.ClassDir(class))
		}
	}
	return dirs
}

// UMMUNode returns <DevRoot>/ummu/tid if it exists, else "". The UDMA
// provider opens it, so containers using UDMA devices need it too.
func UMMUNode(opts Options) string {
	p := filepath.Join(opts.devRoot(), "ummu", "tid")
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return p
	}
	return ""
}

// listDir returns at most limit names from dir, or an error saying there
// were more.
func listDir(dir string, limit int) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	for {
		batch, err := f.Readdirnames(256)
		names = append(names, batch...)
		if len(names) > limit {
			return nil, fmt.Errorf("more than %d entries", limit)
		}
		if errors.Is(err, io.EOF) {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
