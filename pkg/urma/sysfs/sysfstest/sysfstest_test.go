package sysfstest_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

func discover(t *testing.T, tr *sysfstest.Tree) map[string]sysfs.Device {
	t.Helper()
	devs, err := sysfs.Discover(tr.Options())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	m := map[string]sysfs.Device{}
	for _, d := range devs {
		m[d.Name] = d
	}
	return m
}

func TestNewTreeIsEmpty(t *testing.T) {
	tr := sysfstest.New(t)
	if got := discover(t, tr); len(got) != 0 {
		t.Fatalf("new tree has devices: %v", got)
	}
	if dirs := sysfs.ClassDirs(tr.Options()); len(dirs) != 0 {
		t.Fatalf("new tree has class dirs %q (the driver should look unloaded)", dirs)
	}
	if o := tr.Options(); o.SysfsRoot != tr.SysfsRoot || o.DevRoot != tr.DevRoot {
		t.Fatalf("Options %+v do not match the tree %+v", o, tr)
	}
}

func TestLayoutLooksLikeTheKernel(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	entry := tr.ClassPath("ubcore", "udma0")
	fi, err := os.Lstat(entry)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("class entry is not a symlink: %v %v", fi, err)
	}
	fi, err = os.Lstat(filepath.Join(entry, "device"))
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("device is not a symlink: %v %v", fi, err)
	}
	for rel, want := range map[string]string{
		"feature": "0x5\n", "max_jetty": "1024\n", "reserved_jetty_id": "0-15\n", "port_count": "1\n",
		"port0/state": "4\n", "eids/eid0": "0000:0000:0000:0000:0000:ffff:0a00:0001\n",
		"eids/eid3": sysfstest.ZeroEID + "\n", "max_eid_cnt": "4\n", "transport_type": "0\n",
		"device/vendor": "0x19e5\n", "device/numa_node": "0\n", "max_msg_size": "4294967296\n",
	} {
		b, err := os.ReadFile(filepath.Join(entry, rel))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", rel, b, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(tr.DevRoot, "uburma", "udma0")); err != nil {
		t.Errorf("device node: %v", err)
	}
}

func TestAddReplaceRemove(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	tr.Add(t, sysfstest.DefaultDevice("udma1"))

	d := sysfstest.DefaultDevice("udma0")
	d.Caps.MaxJetty = 77
	d.EIDs = []string{"", "fe80::2"}
	d.NoDevNode = true
	tr.Add(t, d) // replaces: old files such as eids/eid0's EID must be gone
	got := discover(t, tr)
	u0 := got["udma0"]
	if u0.Caps.MaxJetty != 77 || len(u0.EIDs) != 1 || u0.EIDs[0].Index != 1 || u0.DevNode != "" {
		t.Fatalf("replaced device reads %+v", u0)
	}

	tr.Remove(t, "udma0")
	got = discover(t, tr)
	if _, ok := got["udma0"]; ok || len(got) != 1 {
		t.Fatalf("after Remove: %v", got)
	}
	if _, err := os.Stat(filepath.Join(tr.DevRoot, "uburma", "udma0")); !os.IsNotExist(err) {
		t.Fatalf("device node survived Remove: %v", err)
	}
	tr.Remove(t, "never-added") // harmless
}

func TestSetPortStateAndWriteFile(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	tr.SetPortState(t, "udma0", 0, urma.PortDown)
	if d := discover(t, tr)["udma0"]; d.Usable() || d.Ports[0].State != urma.PortDown {
		t.Fatalf("port state not applied: %+v", d.Ports)
	}
	tr.SetPortState(t, "udma0", 0, urma.PortActiveDefer)
	if d := discover(t, tr)["udma0"]; !d.Usable() {
		t.Fatalf("recovered port not usable: %s", d.Reason())
	}

	legacy := sysfstest.DefaultDevice("udma1")
	legacy.Legacy = true
	tr.Add(t, legacy)
	tr.WriteFile(t, "udma1", "max_jetty", "5\n") // found under uburma
	if d := discover(t, tr)["udma1"]; d.Caps.MaxJetty != 5 || d.Class != "uburma" {
		t.Fatalf("WriteFile missed the legacy device: %+v", d)
	}
	tr.RemoveFile(t, "udma1", "max_jetty")
	if d := discover(t, tr)["udma1"]; d.Usable() {
		t.Fatal("RemoveFile did not remove max_jetty")
	}
}

// TestConcurrentScansSeeWholeDevices checks the promise plugin tests rely
// on: a scan running while a device is replaced sees the old or the new
// device, never a half-written one.
func TestConcurrentScansSeeWholeDevices(t *testing.T) {
	tr := sysfstest.New(t)
	tr.Add(t, sysfstest.DefaultDevice("udma0"))
	const rounds = 40
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	errs := make(chan string, 1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			devs, err := sysfs.Discover(tr.Options())
			if err != nil || len(devs) != 1 || !devs[0].Usable() {
				msg := "no devices"
				if err != nil {
					msg = err.Error()
				} else if len(devs) == 1 {
					msg = devs[0].Reason()
				}
				select {
				case errs <- msg:
				default:
				}
				return
			}
		}
	}()
	for i := 0; i < rounds; i++ {
		d := sysfstest.DefaultDevice("udma0")
		d.Caps.MaxJetty = uint32(100 + i)
		tr.Add(t, d)
	}
	close(done)
	wg.Wait()
	select {
	case msg := <-errs:
		t.Fatalf("a concurrent scan saw a broken device: %s", msg)
	default:
	}
	if d := discover(t, tr)["udma0"]; d.Caps.MaxJetty != 100+rounds-1 {
		t.Fatalf("final MaxJetty %d", d.Caps.MaxJetty)
	}
}

// The tree is bind-mounted elsewhere in the device plugin's container
// (/host/sys): its links must be relative, as real sysfs's are.
func TestWriteTreeResolvesWhenMoved(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old")
	if err := sysfstest.WriteTree(filepath.Join(old, "sys"), filepath.Join(old, "dev"), sysfstest.DefaultDevice("udma0")); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(dir, "moved")
	if err := os.Rename(old, moved); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"class/ubcore/udma0/ubdev", "class/ubcore/udma0/device/numa_node"} {
		if _, err := os.Stat(filepath.Join(moved, "sys", rel)); err != nil {
			t.Errorf("%s does not resolve after the tree moved: %v", rel, err)
		}
	}
	link, err := os.Readlink(filepath.Join(moved, "sys", "class", "ubcore", "udma0"))
	if err != nil || filepath.IsAbs(link) {
		t.Errorf("class link = %q, %v; want a relative link", link, err)
	}
}

func TestTwoNUMANodesDiffer(t *testing.T) {
	devs := sysfstest.TwoNUMANodes()
	if len(devs) != 2 || devs[0].Name != "udma0" || devs[1].Name != "udma1" {
		t.Fatalf("devices = %+v", devs)
	}
	if *devs[0].NUMANode == *devs[1].NUMANode || devs[0].GUID == devs[1].GUID || devs[0].EIDs[0] == devs[1].EIDs[0] {
		t.Errorf("the two devices share a NUMA node, GUID or EID: %+v", devs)
	}
}
