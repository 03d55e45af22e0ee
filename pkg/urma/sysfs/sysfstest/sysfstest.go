// Package sysfstest writes fake URMA sysfs and /dev trees into temporary
// directories, laid out as the kernel lays them out, for tests of package
// sysfs and of anything built on it (the device plugin).
//
// The layout mirrors a real host: <SysfsRoot>/class/<class>/<dev> is a
// symbolic link to the device's directory under <SysfsRoot>/devices, whose
// device link points at a parent directory holding vendor, device and
// numa_node. Add replaces a device by building a fresh directory and
// switching the class link with one rename, and WriteFile replaces files by
// rename too, so a scan running concurrently (a plugin's watch loop) sees a
// device either whole before or whole after a change, never half written.
package sysfstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

// ZeroEID is how the kernel prints an empty EID slot.
const ZeroEID = "0000:0000:0000:0000:0000:0000:0000:0000"

// UMMUNode is the device node, relative to DevRoot, that the UDMA provider
// opens besides /dev/uburma/<dev>; create it with AddDevNode.
const UMMUNode = "ummu/tid"

// Device describes one fake device.
type Device struct {
	Name          string
	Driver        string
	TransportType urma.TransportType
	// GUID is written verbatim to guid; "" writes no guid file.
	GUID string
	// Caps become the capability files. Caps.PortCount is ignored: port_count
	// is len(Ports). max_eid_cnt is the larger of Caps.MaxEIDCnt and
	// len(EIDs); slots past len(EIDs) are written empty. Caps.OrderedRM has
	// no file.
	Caps urma.DeviceCaps
	// Reserved is written as reserved_jetty_id "min-max" unless NoReserved.
	Reserved   urma.Range
	NoReserved bool
	// Ports are the port states; port<i> is Ports[i].
	Ports []urma.PortState
	// EIDs are the EID slots; slot i is EIDs[i], written verbatim, except
	// "" which writes ZeroEID (an empty slot). "::" is empty too.
	EIDs []string
	// OldEIDLayout writes eid<N>/eid instead of eids/eid<N>.
	OldEIDLayout bool
	// Legacy puts the device under class/uburma instead of class/ubcore.
	Legacy bool
	// Bonding gives the device no device/ parent link, as on ubagg bonding
	// devices; VendorID, DeviceID and NUMANode are then not written.
	Bonding bool
	// NUMANode is written to device/numa_node; nil writes no file.
	NUMANode *int
	// VendorID and DeviceID are written verbatim to device/vendor and
	// device/device; "" writes no file.
	VendorID, DeviceID string
	// NoDevNode leaves out (or removes) <DevRoot>/uburma/<Name>.
	NoDevNode bool
}

// DefaultDevice is a realistic healthy UDMA device: Huawei vendor 0x19e5,
// driver udma, UB transport, max_jetty 1024, reserved jetties 0-15, one
// ACTIVE port, one EID (in slot 0 of 4), NUMA node 0, and a device node.
// Every capability has a different value, so a test that finds a value in
// the wrong field fails.
func DefaultDevice(name string) Device {
	numa := 0
	return Device{
		Name:          name,
		Driver:        "udma",
		TransportType: urma.TransportUB,
		GUID:          "cc08:0000:0000:0000:0000:0000:0000:0001",
		Caps: urma.DeviceCaps{
			Feature:          0x5,
			MaxJFC:           65536,
			MaxJFS:           32768,
			MaxJFR:           16384,
			MaxJetty:         1024,
			MaxJettyGrp:      64,
			MaxJFCDepth:      4194304,
			MaxJFSDepth:      8192,
			MaxJFRDepth:      4096,
			MaxJFSInlineSize: 192,
			MaxJFSSge:        11,
			MaxJFSRsge:       6,
			MaxJFRSge:        3,
			MaxMsgSize:       1 << 32,
			TransMode:        urma.TransModeRM | urma.TransModeRC | urma.TransModeUM,
			PortCount:        1,
			MaxEIDCnt:        4,
		},
		Reserved: urma.Range{Min: 0, Max: 15},
		Ports:    []urma.PortState{urma.PortActive},
		EIDs:     []string{"0000:0000:0000:0000:0000:ffff:0a00:0001"},
		NUMANode: &numa,
		VendorID: "0x19e5",
		DeviceID: "0xa001",
	}
}

// TwoNUMANodes is a small UB host's devices: udma0 on NUMA node 0 and
// udma1 on NUMA node 1, each a DefaultDevice with its own GUID and EID.
// make demo and make e2e build their fake UB node from it.
func TwoNUMANodes() []Device {
	u0 := DefaultDevice("udma0")
	u1 := DefaultDevice("udma1")
	numa1 := 1
	u1.NUMANode = &numa1
	u1.GUID = "cc08:0000:0000:0000:0000:0000:0000:0002"
	u1.EIDs = []string{"0000:0000:0000:0000:0000:ffff:0a00:0002"}
	return []Device{u0, u1}
}

// Tree is a fake host: a sysfs root and a /dev root. Its methods may be
// called from several goroutines.
type Tree struct {
	SysfsRoot string
	DevRoot   string

	mu  sync.Mutex
	gen int // numbers device directories so a replacement never reuses one
}

// New makes an empty tree (no class directories yet: as if the driver were
// not loaded) under t.TempDir().
func New(t testing.TB) *Tree {
	t.Helper()
	root := t.TempDir()
	tr := &Tree{SysfsRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev")}
	mkdir(t, tr.SysfsRoot)
	mkdir(t, tr.DevRoot)
	return tr
}

// Options returns sysfs options that point at this tree.
func (tr *Tree) Options() sysfs.Options {
	return sysfs.Options{SysfsRoot: tr.SysfsRoot, DevRoot: tr.DevRoot}
}

// ClassPath is the class entry of a device: <SysfsRoot>/class/<class>/<name>.
func (tr *Tree) ClassPath(class, name string) string {
	return filepath.Join(tr.SysfsRoot, "class", class, name)
}

// Add writes a device, replacing any earlier one of the same name in the
// same class, and creates (or, with NoDevNode, removes) its device node as
// a regular file.
func (tr *Tree) Add(t testing.TB, d Device) {
	t.Helper()
	if err := tr.AddDevice(d); err != nil {
		t.Fatal(err)
	}
}

// AddDevice is Add for callers without a testing.TB (the demo's fake node):
// it returns the first error instead of failing a test.
func (tr *Tree) AddDevice(d Device) error {
	if d.Name == "" || strings.ContainsRune(d.Name, '/') {
		return fmt.Errorf("sysfstest: bad device name %q", d.Name)
	}
	class := sysfs.ClassUbcore
	if d.Legacy {
		class = sysfs.ClassUburma
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.gen++
	dir := filepath.Join(tr.SysfsRoot, "devices", "ub", class, fmt.Sprintf("%s.%d", d.Name, tr.gen))
	if err := mkdirErr(dir); err != nil {
		return err
	}
	// w records the first failed write; later writes are skipped. The new
	// directory is not linked from the class directory until the end, so
	// plain (not rename-atomic) writes are safe until then.
	var werr error
	w := func(rel, format string, args ...any) {
		if werr == nil {
			werr = writeNewErr(filepath.Join(dir, rel), fmt.Sprintf(format, args...))
		}
	}

	w("ubdev", "%s\n", d.Name)
	w("driver_name", "%s\n", d.Driver)
	w("transport_type", "%d\n", int(d.TransportType))
	if d.GUID != "" {
		w("guid", "%s\n", d.GUID)
	}
	c := d.Caps
	w("feature", "0x%x\n", c.Feature)
	for _, f := range []struct {
		name string
		v    uint32
	}{
		{"max_jfc", c.MaxJFC}, {"max_jfs", c.MaxJFS}, {"max_jfr", c.MaxJFR}, {"max_jetty", c.MaxJetty},
		{"max_jetty_grp", c.MaxJettyGrp}, {"max_jfc_depth", c.MaxJFCDepth}, {"max_jfs_depth", c.MaxJFSDepth},
		{"max_jfr_depth", c.MaxJFRDepth}, {"max_jfs_inline_size", c.MaxJFSInlineSize},
		{"max_jfs_sge", c.MaxJFSSge}, {"max_jfs_rsge", c.MaxJFSRsge}, {"max_jfr_sge", c.MaxJFRSge},
		{"trans_mode", uint32(c.TransMode)},
	} {
		w(f.name, "%d\n", f.v)
	}
	w("max_msg_size", "%d\n", c.MaxMsgSize)
	if !d.NoReserved {
		w("reserved_jetty_id", "%d-%d\n", d.Reserved.Min, d.Reserved.Max)
	}

	w("port_count", "%d\n", len(d.Ports))
	for i, s := range d.Ports {
		w(fmt.Sprintf("port%d/state", i), "%d\n", int(s))
		w(fmt.Sprintf("port%d/max_mtu", i), "%d\n", 5) // URMA_MTU_4096
		w(fmt.Sprintf("port%d/active_mtu", i), "%d\n", 5)
		w(fmt.Sprintf("port%d/active_speed", i), "%d\n", 32)
		w(fmt.Sprintf("port%d/active_width", i), "%d\n", 1)
	}

	slots := max(int(c.MaxEIDCnt), len(d.EIDs))
	w("max_eid_cnt", "%d\n", slots)
	for i := 0; i < min(slots, sysfs.MaxEIDSlots); i++ {
		v := ZeroEID
		if i < len(d.EIDs) && d.EIDs[i] != "" {
			v = d.EIDs[i]
		}
		rel := fmt.Sprintf("eids/eid%d", i)
		if d.OldEIDLayout {
			rel = fmt.Sprintf("eid%d/eid", i)
		}
		w(rel, "%s\n", v)
	}
	if werr != nil {
		return werr
	}

	if !d.Bonding {
		parent := filepath.Join(tr.SysfsRoot, "devices", "pci0000:00", fmt.Sprintf("%s.%d", d.Name, tr.gen))
		if err := mkdirErr(parent); err != nil {
			return err
		}
		for _, f := range []struct{ name, content string }{
			{"vendor", d.VendorID}, {"device", d.DeviceID},
		} {
			if f.content == "" {
				continue
			}
			if err := writeNewErr(filepath.Join(parent, f.name), f.content+"\n"); err != nil {
				return err
			}
		}
		if d.NUMANode != nil {
			if err := writeNewErr(filepath.Join(parent, "numa_node"), fmt.Sprintf("%d\n", *d.NUMANode)); err != nil {
				return err
			}
		}
		if err := relSymlink(parent, filepath.Join(dir, "device")); err != nil {
			return err
		}
	}

	// The node first, then the class link: a scan never sees the new
	// device without its node.
	node := filepath.Join(tr.DevRoot, "uburma", d.Name)
	if d.NoDevNode {
		if err := removeErr(node); err != nil {
			return err
		}
	} else if err := writeFileErr(node, ""); err != nil {
		return err
	}
	classDir := filepath.Join(tr.SysfsRoot, "class", class)
	if err := mkdirErr(classDir); err != nil {
		return err
	}
	// Old device directories stay behind (t.TempDir removes them) so a scan
	// that resolved the old link still reads a whole device.
	tmp := filepath.Join(classDir, fmt.Sprintf(".new-%s.%d", d.Name, tr.gen))
	if err := relSymlink(dir, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(classDir, d.Name)); err != nil {
		return fmt.Errorf("sysfstest: %w", err)
	}
	return nil
}

// relSymlink links link to target with a relative path, as sysfs does
// (../../devices/...), so the tree still resolves when it is bind-mounted
// elsewhere, e.g. at /host/sys in the device plugin's container.
func relSymlink(target, link string) error {
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		return fmt.Errorf("sysfstest: %w", err)
	}
	if err := os.Symlink(rel, link); err != nil {
		return fmt.Errorf("sysfstest: %w", err)
	}
	return nil
}

// WriteTree writes a fake host outside of tests (the demo's fake UB node):
// the sysfs and /dev roots are created if needed and every device is added
// as Add would. The caller owns and removes the directories.
func WriteTree(sysfsRoot, devRoot string, devs ...Device) error {
	tr := &Tree{SysfsRoot: sysfsRoot, DevRoot: devRoot}
	for _, dir := range []string{sysfsRoot, devRoot} {
		if err := mkdirErr(dir); err != nil {
			return err
		}
	}
	for _, d := range devs {
		if err := tr.AddDevice(d); err != nil {
			return fmt.Errorf("write fake device %s: %w", d.Name, err)
		}
	}
	return nil
}

// Remove hot-unplugs a device: its class entries (in both classes) and its
// device node disappear.
func (tr *Tree) Remove(t testing.TB, name string) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, class := range []string{sysfs.ClassUbcore, sysfs.ClassUburma} {
		remove(t, tr.ClassPath(class, name))
	}
	remove(t, filepath.Join(tr.DevRoot, "uburma", name))
}

// SetPortState rewrites port<port>/state of a device.
func (tr *Tree) SetPortState(t testing.TB, dev string, port int, s urma.PortState) {
	t.Helper()
	tr.WriteFile(t, dev, fmt.Sprintf("port%d/state", port), fmt.Sprintf("%d\n", int(s)))
}

// WriteFile writes content (verbatim: add the kernel's trailing newline
// yourself) to rel inside a device's directory, creating directories on the
// way, e.g. ("udma0", "max_jetty", "garbage\n") or ("udma0",
// "device/numa_node", "1\n"). The device is looked up in class/ubcore, then
// class/uburma; a name in neither gets a plain directory under class/ubcore,
// which is how to create odd entries such as class/ubcore/ubcore.
func (tr *Tree) WriteFile(t testing.TB, dev, rel, content string) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	writeFile(t, filepath.Join(tr.deviceDir(t, dev), rel), content)
}

// RemoveFile deletes rel (a file or a whole directory) inside a device's
// directory, e.g. ("udma0", "max_jetty") to test a missing attribute.
func (tr *Tree) RemoveFile(t testing.TB, dev, rel string) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	remove(t, filepath.Join(tr.deviceDir(t, dev), rel))
}

// AddDevNode creates <DevRoot>/<rel> as a regular file, e.g. UMMUNode.
func (tr *Tree) AddDevNode(t testing.TB, rel string) {
	t.Helper()
	writeFile(t, filepath.Join(tr.DevRoot, rel), "")
}

// RemoveDevNode deletes <DevRoot>/<rel>.
func (tr *Tree) RemoveDevNode(t testing.TB, rel string) {
	t.Helper()
	remove(t, filepath.Join(tr.DevRoot, rel))
}

// deviceDir is the class entry of dev (through which writes follow the link
// to the current device directory). Callers hold tr.mu.
func (tr *Tree) deviceDir(t testing.TB, dev string) string {
	t.Helper()
	if dev == "" || strings.ContainsRune(dev, '/') {
		t.Fatalf("sysfstest: bad device name %q", dev)
	}
	for _, class := range []string{sysfs.ClassUbcore, sysfs.ClassUburma} {
		p := tr.ClassPath(class, dev)
		if _, err := os.Lstat(p); err == nil {
			return p
		}
	}
	return tr.ClassPath(sysfs.ClassUbcore, dev)
}

func mkdir(t testing.TB, dir string) {
	t.Helper()
	if err := mkdirErr(dir); err != nil {
		t.Fatal(err)
	}
}

func mkdirErr(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sysfstest: %w", err)
	}
	return nil
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := writeFileErr(path, content); err != nil {
		t.Fatal(err)
	}
}

// writeFileErr replaces path atomically: a concurrent reader sees the old
// content or the new, never a prefix.
func writeFileErr(path, content string) error {
	dir := filepath.Dir(path)
	if err := mkdirErr(dir); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("sysfstest: %w", err)
	}
	_, werr := f.WriteString(content)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(f.Name())
		return fmt.Errorf("sysfstest: write %s: %w", path, errors.Join(werr, cerr))
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("sysfstest: %w", err)
	}
	return nil
}

// writeNewErr writes a file into a directory no reader can see yet.
func writeNewErr(path, content string) error {
	if err := mkdirErr(filepath.Dir(path)); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return fmt.Errorf("sysfstest: %w", err)
	}
	return nil
}

func remove(t testing.TB, path string) {
	t.Helper()
	if err := removeErr(path); err != nil {
		t.Fatal(err)
	}
}

func removeErr(path string) error {
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("sysfstest: %w", err)
	}
	return nil
}
