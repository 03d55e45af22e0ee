package watch

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
)

// Source is where scans come from.
type Source interface {
	// Scan discovers the devices. An error means the scan as a whole failed
	// and says nothing about the devices; the previous set is kept.
	Scan() (inventory.Scan, error)
	// WatchPaths lists the directories whose changes should trigger a scan,
	// given the last scan; paths that do not exist are skipped.
	WatchPaths(last inventory.Scan) []string
}

// SysfsSource scans the host's (or a fake) sysfs and /dev trees.
type SysfsSource struct {
	Opts sysfs.Options
}

func (s SysfsSource) sysfsRoot() string {
	if s.Opts.SysfsRoot == "" {
		return "/sys"
	}
	return s.Opts.SysfsRoot
}

func (s SysfsSource) devRoot() string {
	if s.Opts.DevRoot == "" {
		return "/dev"
	}
	return s.Opts.DevRoot
}

// Scan runs sysfs discovery and notes what is missing for devices to
// appear: the class directory (driver not loaded) and the device node
// directory.
func (s SysfsSource) Scan() (inventory.Scan, error) {
	devs, err := sysfs.Discover(s.Opts)
	if err != nil {
		return inventory.Scan{}, err
	}
	scan := inventory.Scan{Devices: devs, UMMUNode: sysfs.UMMUNode(s.Opts)}
	if len(sysfs.ClassDirs(s.Opts)) == 0 {
		scan.Missing = append(scan.Missing, fmt.Sprintf("class directory %s (or %s): URMA driver not loaded",
			s.Opts.ClassDir(sysfs.ClassUbcore), s.Opts.ClassDir(sysfs.ClassUburma)))
	}
	if fi, err := os.Stat(filepath.Join(s.devRoot(), "uburma")); err != nil || !fi.IsDir() {
		scan.Missing = append(scan.Missing, fmt.Sprintf("device node directory %s", filepath.Join(s.devRoot(), "uburma")))
	}
	return scan, nil
}

// WatchPaths returns the class directories, each device's directory and its
// port and EID directories, and the /dev directories holding device nodes.
// On a real host sysfs raises no inotify events for attribute changes, so
// polling stays the backstop; /dev (devtmpfs) does raise them.
func (s SysfsSource) WatchPaths(last inventory.Scan) []string {
	classRoot := filepath.Join(s.sysfsRoot(), "class")
	// The roots too, so that a class directory created later (driver
	// loaded) is noticed.
	paths := []string{s.sysfsRoot(), classRoot, s.Opts.ClassDir(sysfs.ClassUbcore), s.Opts.ClassDir(sysfs.ClassUburma)}
	for i := range last.Devices {
		d := &last.Devices[i]
		dir := filepath.Join(classRoot, d.Class, d.Name)
		paths = append(paths, dir, filepath.Join(dir, "eids"))
		for _, p := range d.Ports {
			paths = append(paths, filepath.Join(dir, fmt.Sprintf("port%d", p.Index)))
		}
		for _, e := range d.EIDs {
			paths = append(paths, filepath.Join(dir, fmt.Sprintf("eid%d", e.Index)))
		}
	}
	dev := s.devRoot()
	return append(paths, dev, filepath.Join(dev, "uburma"), filepath.Join(dev, "ummu"))
}
