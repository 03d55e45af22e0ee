package sysfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// reader reads one device directory, recording trouble on the device.
type reader struct {
	dir     string // the device directory, through the class symlink
	d       *Device
	dropped int // problems past MaxProblems
}

func (r *reader) problemf(format string, args ...any) {
	if len(r.d.Problems) >= MaxProblems {
		r.dropped++
		return
	}
	r.d.Problems = append(r.d.Problems, fmt.Sprintf(format, args...))
}

// readDevice reads everything Device holds about class/<name>. It reports
// false when the class entry is gone by the end of the read: the device was
// unplugged during the scan, and its half-read files are no device at all.
func readDevice(opts Options, class, name string) (Device, bool) {
	d := Device{
		DeviceInfo:  urma.DeviceInfo{Name: name},
		Class:       class,
		NUMANode:    -1,
		devNodePath: opts.DevNodePath(name),
	}
	r := &reader{dir: filepath.Join(opts.ClassDir(class), name), d: &d}
	r.read()
	if _, err := os.Lstat(r.dir); errors.Is(err, fs.ErrNotExist) {
		return Device{}, false
	}
	if r.dropped > 0 {
		d.Problems = append(d.Problems, fmt.Sprintf("%d more problems not listed", r.dropped))
	}
	return d, true
}

func (r *reader) read() {
	if err := checkName(r.d.Name); err != nil {
		r.problemf("device name %s: %v", quote(r.d.Name), err)
	}
	fi, err := os.Stat(r.dir)
	if err != nil {
		r.problemf("class entry: %v", describe(err))
		return
	}
	if !fi.IsDir() {
		r.problemf("class entry: not a directory but %s", kind(fi.Mode()))
		return
	}
	r.identity()
	r.caps()
	r.reserved()
	r.parent()
	r.ports()
	r.eids()
	r.devNode()
}

// identity reads the name, driver, transport and GUID.
func (r *reader) identity() {
	d := r.d
	if t, ok := r.text("ubdev", false); ok && t != d.Name {
		// liburma opens /dev/uburma/<ubdev>; a mismatch means our DevNode
		// is not the node liburma would use.
		r.problemf("ubdev: names %s, not the directory name %s", quote(t), quote(d.Name))
	}
	if t, ok := r.text("driver_name", true); ok {
		if err := checkName(t); err != nil {
			r.problemf("driver_name: %s: %v", quote(t), err)
		} else {
			d.Driver = t
		}
	}
	if t, ok := r.text("transport_type", true); ok {
		// Printed with %d: -1 is URMA_TRANSPORT_INVALID.
		if strings.HasPrefix(t, "-") {
			r.problemf("transport_type: %s is negative (an invalid transport)", quote(t))
		} else if v, err := urma.ParseUint(t, 16); err != nil {
			r.problemf("transport_type: %v", err)
		} else {
			d.TransportType = urma.TransportType(v)
		}
	}
	if t, ok := r.text("guid", false); ok {
		// ubcore prints the GUID like an EID; uburma printed a 64-bit number.
		if _, err := urma.ParseEID(t); err == nil {
			d.GUID = t
		} else if _, err := urma.ParseUint(t, 64); err == nil {
			d.GUID = t
		} else {
			r.problemf("guid: %s is neither EID text nor a 64-bit number", quote(t))
		}
	}
}

// capFile is one capability attribute: its file, whether a device without
// it is broken, and where the value goes.
type capFile struct {
	name     string
	required bool
	dst      *uint32
}

// caps reads the capability attributes. Required are those a transport sizes
// its queues and checks its requests by, and the counts that say how many
// ports and EIDs to read; the rest only inform.
func (r *reader) caps() {
	c := &r.d.Caps
	for _, f := range []capFile{
		{"feature", false, &c.Feature},
		{"max_jfc", true, &c.MaxJFC},
		{"max_jfs", true, &c.MaxJFS},
		{"max_jfr", true, &c.MaxJFR},
		{"max_jetty", true, &c.MaxJetty},
		{"max_jetty_grp", false, &c.MaxJettyGrp},
		{"max_jfc_depth", true, &c.MaxJFCDepth},
		{"max_jfs_depth", true, &c.MaxJFSDepth},
		{"max_jfr_depth", true, &c.MaxJFRDepth},
		{"max_jfs_inline_size", false, &c.MaxJFSInlineSize},
		{"max_jfs_sge", true, &c.MaxJFSSge},
		{"max_jfs_rsge", false, &c.MaxJFSRsge},
		{"max_jfr_sge", true, &c.MaxJFRSge},
		{"port_count", true, &c.PortCount},
		{"max_eid_cnt", true, &c.MaxEIDCnt},
	} {
		if v, ok := r.uint(f.name, 32, f.required); ok {
			*f.dst = uint32(v)
		}
	}
	if v, ok := r.uint("max_msg_size", 64, true); ok {
		c.MaxMsgSize = v
	}
	if v, ok := r.uint("trans_mode", 32, true); ok {
		c.TransMode = urma.TransMode(v)
	}
}

// reserved reads reserved_jetty_id, which older kernels lack, or else the
// pair reserved_jetty_id_min and reserved_jetty_id_max that some ubcore
// revisions show instead.
func (r *reader) reserved() {
	var rg urma.Range
	switch {
	case r.exists("reserved_jetty_id"):
		t, ok := r.text("reserved_jetty_id", false)
		if !ok {
			return
		}
		var err error
		if rg, err = urma.ParseRange(t); err != nil {
			r.problemf("reserved_jetty_id: %v", err)
			return
		}
	case r.exists("reserved_jetty_id_min") || r.exists("reserved_jetty_id_max"):
		// One of the pair without the other is a broken tree.
		lo, okLo := r.uint("reserved_jetty_id_min", 32, true)
		hi, okHi := r.uint("reserved_jetty_id_max", 32, true)
		if !okLo || !okHi {
			return
		}
		if lo > hi {
			r.problemf("reserved_jetty_id_min: %d is greater than reserved_jetty_id_max %d", lo, hi)
			return
		}
		rg = urma.Range{Min: uint32(lo), Max: uint32(hi)}
	default:
		return
	}
	if rg.Min == math.MaxUint32 && rg.Max == math.MaxUint32 {
		// ubcore's way of saying the device cannot reserve jetties (and
		// liburma's stand-in for an unreadable file).
		return
	}
	r.d.ReservedJetty = rg
	r.d.HasReservedJetty = true
}

// parent reads the device/ link: PCI ids and NUMA node. Bonding devices
// have no device/ entry. An entry that cannot be read, or a link whose
// target is missing, is a Problem; such a device has no parent to read and
// is classed bonding too (selection ignores broken bonding devices).
func (r *reader) parent() {
	d := r.d
	hasParent := false
	link := filepath.Join(r.dir, "device")
	switch fi, err := os.Stat(link); {
	case errors.Is(err, fs.ErrNotExist):
		// No entry at all is a device without a parent (a bonding device).
		// A link whose target is missing is a broken device instead.
		if li, lerr := os.Lstat(link); lerr == nil && li.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(link)
			r.problemf("device: symbolic link to %s, whose target is missing", quote(target))
		}
	case err != nil:
		r.problemf("device: %v", describe(err))
	case !fi.IsDir():
		r.problemf("device: not a directory but %s", kind(fi.Mode()))
	default:
		hasParent = true
	}
	d.IsBonding = d.Bonding() || !hasParent
	if !hasParent {
		return
	}
	if v, ok := r.uint("device/vendor", 16, false); ok {
		d.VendorID = fmt.Sprintf("0x%04x", v)
	}
	if v, ok := r.uint("device/device", 16, false); ok {
		d.DeviceID = fmt.Sprintf("0x%04x", v)
	}
	if t, ok := r.text("device/numa_node", false); ok {
		// The kernel prints -1 (NUMA_NO_NODE) when the parent has no node.
		if len(t) > 1 && t[0] == '-' {
			if _, err := urma.ParseUint(t[1:], 32); err != nil {
				r.problemf("device/numa_node: %v", err)
			}
		} else if v, err := urma.ParseUint(t, 16); err != nil {
			r.problemf("device/numa_node: %v", err)
		} else {
			d.NUMANode = int(v)
		}
	}
}

// ports reads port0..port<port_count-1>.
func (r *reader) ports() {
	d := r.d
	n := int(d.Caps.PortCount)
	if n > MaxPorts {
		r.problemf("port_count: %d exceeds the kernel's limit of %d ports; reading the first %d", n, MaxPorts, MaxPorts)
		n = MaxPorts
	}
	for i := 0; i < n; i++ {
		p := urma.Port{Index: i, State: urma.PortNOP}
		dir := fmt.Sprintf("port%d", i)
		switch fi, err := os.Stat(filepath.Join(r.dir, dir)); {
		case errors.Is(err, fs.ErrNotExist):
			r.problemf("%s: missing (port_count is %d)", dir, d.Caps.PortCount)
		case err != nil:
			r.problemf("%s: %v", dir, describe(err))
		case !fi.IsDir():
			r.problemf("%s: not a directory but %s", dir, kind(fi.Mode()))
		default:
			// A state that cannot be read leaves the port NOP: unusable.
			if v, ok := r.uint(dir+"/state", 32, true); ok {
				if v > uint64(urma.PortActiveDefer) {
					r.problemf("%s/state: %d is not a port state (0..%d)", dir, v, urma.PortActiveDefer)
				} else {
					p.State = urma.PortState(v)
				}
			}
			for _, f := range []struct {
				name string
				dst  *uint32
			}{
				{"max_mtu", &p.MaxMTU},
				{"active_mtu", &p.ActiveMTU},
				{"active_speed", &p.ActiveSpeed},
				{"active_width", &p.ActiveWidth},
			} {
				if v, ok := r.uint(dir+"/"+f.name, 32, false); ok {
					*f.dst = uint32(v)
				}
			}
		}
		d.Ports = append(d.Ports, p)
	}
}

// eids probes slots 0..max_eid_cnt-1 in both layouts, as liburma does:
// eids/eid<N> (current kernels) first, then eid<N>/eid (older ones).
// All-zero slots are empty (or belong to another network namespace).
func (r *reader) eids() {
	d := r.d
	n := int(min(d.Caps.MaxEIDCnt, MaxEIDSlots))
	newLayout := false
	switch fi, err := os.Stat(filepath.Join(r.dir, "eids")); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		r.problemf("eids: %v", describe(err))
	case !fi.IsDir():
		r.problemf("eids: not a directory but %s", kind(fi.Mode()))
	default:
		newLayout = true
	}
	for i := 0; i < n; i++ {
		var rels []string
		if newLayout {
			rels = append(rels, fmt.Sprintf("eids/eid%d", i))
		}
		rels = append(rels, fmt.Sprintf("eid%d/eid", i))
		for _, rel := range rels {
			b, err := readAttr(filepath.Join(r.dir, rel))
			if isMissing(err) {
				continue
			}
			if err != nil {
				r.problemf("%s: %v", rel, describe(err))
				break
			}
			e, err := urma.ParseEID(string(b))
			if err != nil {
				r.problemf("%s: %v", rel, err)
			} else if !e.IsZero() {
				d.EIDs = append(d.EIDs, urma.EIDEntry{Index: i, EID: e})
			}
			break
		}
	}
}

// devNode looks for /dev/uburma/<name>. Its absence makes the device
// unusable but is no Problem: the node may simply not be there yet.
func (r *reader) devNode() {
	d := r.d
	switch fi, err := os.Stat(d.devNodePath); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		r.problemf("device node %s: %v", d.devNodePath, describe(err))
	case fi.IsDir():
		r.problemf("device node %s: is a directory", d.devNodePath)
	default:
		d.DevNode = d.devNodePath
	}
}

// exists reports whether the attribute file is there at all (readable or
// not).
func (r *reader) exists(rel string) bool {
	_, err := os.Lstat(filepath.Join(r.dir, rel))
	return !isMissing(err)
}

// text reads an attribute and trims the surrounding whitespace. A missing
// file is a Problem only when required; any other failure always is.
func (r *reader) text(rel string, required bool) (string, bool) {
	b, err := readAttr(filepath.Join(r.dir, rel))
	switch {
	case err == nil:
		return strings.Trim(string(b), " \t\n\r\v\f"), true
	case isMissing(err):
		if required {
			r.problemf("%s: missing", rel)
		}
	default:
		r.problemf("%s: %v", rel, describe(err))
	}
	return "", false
}

// uint reads an unsigned attribute of the given width.
func (r *reader) uint(rel string, bits int, required bool) (uint64, bool) {
	t, ok := r.text(rel, required)
	if !ok {
		return 0, false
	}
	v, err := urma.ParseUint(t, bits)
	if err != nil {
		r.problemf("%s: %v", rel, err)
		return 0, false
	}
	return v, true
}

// readAttr reads one attribute file of at most MaxAttrSize bytes. It refuses
// anything but a regular file before opening it, so a hostile link to a FIFO
// or device node can neither block the scan nor trigger a device's open.
func readAttr(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file but %s", kind(fi.Mode()))
	}
	// O_NONBLOCK in case the file was swapped for a FIFO since the Stat.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file but %s", kind(fi.Mode()))
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxAttrSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxAttrSize {
		return nil, fmt.Errorf("larger than %d bytes", MaxAttrSize)
	}
	return b, nil
}

// isMissing reports a file that does not exist, as opposed to one that
// exists and cannot be read.
func isMissing(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// describe drops the path from a *fs.PathError: Problems already name the
// file relative to the device.
func describe(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// checkName accepts the names the kernel gives devices and drivers:
// letters, digits and _ . : -, at most 63 bytes.
func checkName(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > maxNameLen {
		return fmt.Errorf("longer than %d bytes", maxNameLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !nameChar(c) {
			return fmt.Errorf("character %q is not a letter, digit, or one of _ . : -", c)
		}
	}
	return nil
}

func nameChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c == '_' || c == '.' || c == ':' || c == '-'
}

// quote renders s for a Problem, cut to 64 bytes so a hostile value cannot
// flood a log line.
func quote(s string) string {
	const limit = 64
	if len(s) > limit {
		return fmt.Sprintf("%q...", s[:limit])
	}
	return fmt.Sprintf("%q", s)
}

// kind names a file type for a Problem.
func kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device node"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "an irregular file"
}
