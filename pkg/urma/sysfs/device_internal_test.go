package sysfs

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReadDeviceLeavesOutUnpluggedDevices covers the hot-unplug race: a
// name listed by the scan whose entry is gone by the time it is read is no
// device, not a broken one.
func TestReadDeviceLeavesOutUnpluggedDevices(t *testing.T) {
	root := t.TempDir()
	opts := Options{SysfsRoot: root, DevRoot: root}
	if err := os.MkdirAll(opts.ClassDir(ClassUbcore), 0o755); err != nil {
		t.Fatal(err)
	}
	if d, ok := readDevice(opts, ClassUbcore, "udma0"); ok {
		t.Fatalf("a vanished entry was read as %+v", d)
	}

	// A dangling link is still there: it is reported, not hidden.
	if err := os.Symlink(filepath.Join(root, "gone"), filepath.Join(opts.ClassDir(ClassUbcore), "udma1")); err != nil {
		t.Fatal(err)
	}
	d, ok := readDevice(opts, ClassUbcore, "udma1")
	if !ok || len(d.Problems) != 1 || d.Problems[0] != "class entry: stat: no such file or directory" {
		t.Fatalf("dangling entry: ok=%v problems %q", ok, d.Problems)
	}
}
