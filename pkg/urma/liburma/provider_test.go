//go:build linux && cgo

package liburma

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A library that is absent, or is not liburma, fails New with an error that
// names it (and the missing function).
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	notLiburma := filepath.Join(dir, "libnot.so")
	src := filepath.Join(dir, "not.c")
	if err := os.WriteFile(src, []byte("int urma_init(void *conf) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("gcc", "-shared", "-fPIC", "-o", notLiburma, src).CombinedOutput(); err != nil {
		t.Fatalf("build a library that is not liburma: %v\n%s", err, b)
	}
	for _, tc := range []struct {
		lib  string
		want []string
	}{
		{filepath.Join(dir, "nope", "liburma.so.0"), []string{"load " + filepath.Join(dir, "nope", "liburma.so.0"), "No such file"}},
		{notLiburma, []string{notLiburma + " has no symbol urma_uninit"}},
	} {
		p, err := New(Options{Library: tc.lib})
		if p != nil || err == nil {
			t.Fatalf("New(%s) = %v, %v; want an error", tc.lib, p, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New(%s): %q does not say %q", tc.lib, err, w)
			}
		}
	}
}

// urma_init works once per process and then returns EEXIST
// (core/urma_main.c:216-219): providers share one initialisation, also when
// they name the same library differently (a symlink, $URMA_LIBRARY beside
// liburma.so.0), and only the last Close ends it, whatever the order.
func TestInitShared(t *testing.T) {
	lib := os.Getenv(EnvLibrary)
	alias := filepath.Join(t.TempDir(), "liburma.so.0")
	if err := os.Symlink(lib, alias); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		order []int // closes, by index into a and b (by path) and c (by the alias)
	}{
		{"alias-first", []int{2, 0, 1}},
		{"alias-last", []int{0, 1, 2}}, // counted by name, the path's last Close uninitialised liburma under c
		{"alias-between", []int{0, 2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ps []*Provider
			for _, path := range []string{"", "", alias} {
				p, err := newProvider(Options{Library: path})
				if err != nil {
					t.Fatalf("provider over %q: %v", path, err)
				}
				ps = append(ps, p)
			}
			if l := ps[0].lib; ps[1].lib != l || ps[2].lib != l || l.refs != 3 || !l.ownsInit {
				t.Errorf("providers do not share one initialised library: %+v, %+v, %+v", ps[0].lib, ps[1].lib, ps[2].lib)
			}
			for k, i := range tc.order {
				if err := ps[i].Close(); err != nil {
					t.Fatal(err)
				}
				// The fake lists no device once uninitialised.
				for _, j := range tc.order[k+1:] {
					if devs, err := ps[j].Devices(); err != nil || len(devs) != 2 {
						t.Errorf("provider %d after closing %v: %d devices, %v; liburma was uninitialised under it", j, tc.order[:k+1], len(devs), err)
					}
				}
			}
			if _, err := ps[0].Devices(); !errors.Is(err, urma.ErrClosed) {
				t.Errorf("devices of a closed provider: %v, want ErrClosed", err)
			}
			// Everything closed: the next provider initialises liburma again.
			if d := newTestProvider(t); !d.lib.ownsInit {
				t.Error("liburma was not initialised again after the last Close")
			}
		})
	}
}

// A provider that finds liburma initialised by someone else in the process
// (EEXIST) works alongside and leaves the uninit to them.
func TestInitOutside(t *testing.T) {
	uninit, err := initOutside(os.Getenv(EnvLibrary))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second finds it initialised still
		p, err := newProvider(Options{})
		if err != nil {
			t.Fatalf("provider over an initialised liburma: %v", err)
		}
		if p.lib.ownsInit {
			t.Error("a provider that met EEXIST thinks it initialised liburma")
		}
		if devs, err := p.Devices(); err != nil || len(devs) != 2 {
			t.Errorf("devices: %d, %v", len(devs), err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := uninit(); err != nil {
		t.Fatalf("the other user's uninit: %v", err)
	}
	if d := newTestProvider(t); !d.lib.ownsInit {
		t.Error("liburma was not initialised again after its other user uninitialised it")
	}
}

// A context is deleted in liburma once, even when its Close and the
// provider's Close both reach it: Provider.Close lists the open contexts,
// and one may close on its own before Provider.Close gets to it. The fake
// frees the context, so a second urma_delete_context is a double free
// (glibc aborts the process).
func TestContextDeletedOnce(t *testing.T) {
	t.Run("close-then-forced", func(t *testing.T) {
		// The interleaving, in order: the context closes after
		// Provider.Close listed it, then Provider.Close forces it.
		p := newTestProvider(t)
		c, err := p.Open("udma0", 0)
		if err != nil {
			t.Fatal(err)
		}
		dc := c.(*devContext)
		if err := dc.Close(); err != nil {
			t.Fatal(err)
		}
		dc.forceClose()
	})
	t.Run("concurrent", func(t *testing.T) {
		// The same race as it happens, for the race detector to check
		// the locking. It rarely lands on the bad interleaving, so the
		// case above is the one that proves the fix.
		for range 200 {
			p, err := newProvider(Options{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := p.Open("udma0", 0)
			if err != nil {
				t.Fatal(err)
			}
			var ctxErr, provErr error
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); ctxErr = c.Close() }()
			go func() { defer wg.Done(); provErr = p.Close() }()
			wg.Wait()
			if ctxErr != nil || provErr != nil {
				t.Fatalf("context Close: %v; provider Close: %v", ctxErr, provErr)
			}
		}
	})
}

// Devices reports what liburma's device list, query_device and eid list say.
func TestDevices(t *testing.T) {
	requireFake(t) // the fake's devices
	p := newTestProvider(t)
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 {
		t.Fatalf("%d devices, want the fake's 2", len(devs))
	}
	d := devs[1]
	wantEID, _ := urma.ParseEID("10.99.0.2")
	switch {
	case d.Name != "udma1" || d.TransportType != urma.TransportUB || d.Driver != Name:
		t.Errorf("identity %s/%s/%s", d.Name, d.TransportType, d.Driver)
	case len(d.EIDs) != 1 || d.EIDs[0].EID != wantEID || d.EIDs[0].Index != 0:
		t.Errorf("EIDs %v, want %s at 0", d.EIDs, wantEID)
	case len(d.Ports) != 1 || d.Ports[0].State != urma.PortActive || d.Ports[0].ActiveMTU != 4096:
		t.Errorf("ports %+v", d.Ports)
	case d.Caps.MaxJFSDepth != 4096 || d.Caps.MaxJFRSge != 16 || d.Caps.MaxMsgSize != 16<<20 || d.Caps.MaxJFSInlineSize != 256:
		t.Errorf("caps %+v", d.Caps)
	case d.Caps.TransMode != urma.TransModeRC|urma.TransModeRM || !d.Caps.OrderedRM:
		t.Errorf("modes %#x ordered RM %v", d.Caps.TransMode, d.Caps.OrderedRM)
	case !strings.HasSuffix(d.GUID, "02"):
		t.Errorf("GUID %s", d.GUID)
	}
	c, err := p.Open("udma1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.EID() != wantEID || c.UASID() == 0 || c.Device().Name != "udma1" {
		t.Errorf("context %s uasid %d on %s", c.EID(), c.UASID(), c.Device().Name)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// A failing urma_get_device_list is an error that names the call and its
// errno, not "no devices"; only ENODEV (or no errno) means no device.
func TestDevicesListFails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		errno   syscall.Errno
		wantErr bool // false: no devices and no error
	}{
		{"ENOEXEC", syscall.ENOEXEC, true},
		{"ENOMEM", syscall.ENOMEM, true},
		{"ENODEV", syscall.ENODEV, false},
		{"no-errno", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := providerOfFake(t, "listfail", fmt.Sprintf("-DLIST_ERRNO=%d", int(tc.errno)))
			devs, err := p.Devices()
			if !tc.wantErr {
				if err != nil || len(devs) != 0 {
					t.Fatalf("Devices() = %d devices, %v; want none and no error", len(devs), err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Devices() = %d devices, nil; urma_get_device_list failed with %v and the failure was dropped", len(devs), tc.errno)
			}
			var ue *urma.Error
			if !errors.As(err, &ue) || ue.Op != "get_device_list" || syscall.Errno(ue.Code) != tc.errno {
				t.Errorf("Devices() error %q; want op get_device_list with code %v", err, tc.errno)
			}
			if !strings.Contains(err.Error(), tc.errno.Error()) || !strings.Contains(err.Error(), fmt.Sprintf("errno %d", int(tc.errno))) {
				t.Errorf("Devices() error %q does not name errno %d (%v)", err, int(tc.errno), tc.errno)
			}
		})
	}
}

// The JFCE's fd can sleep in Go's poller, where pkg/transport puts it:
// uburma's fd is blocking (the fake's too), and a File made from a blocking
// fd cannot wait, so the provider makes it non-blocking.
func TestJFCEFdInGoPoller(t *testing.T) {
	p := newTestProvider(t)
	c, err := p.Open("udma0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e, err := c.CreateJFCE()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	dup, err := unix.FcntlInt(uintptr(e.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "jfce")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
		t.Fatalf("the JFCE fd is not in Go's poller: %v", err)
	}
	// No event is pending: the wait ends at the deadline, in the poller.
	if err := rc.Read(func(uintptr) bool { return false }); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("waiting on the JFCE fd: %v, want the deadline", err)
	}
}

// A device may report more SGEs than a work request through the shim can
// carry (urma_jfs_cfg_t.max_sge is a uint8_t; the shim's arrays hold
// SHIM_MAX_SGE): the provider offers no more than it can post, so a jetty
// or JFR asking for more is refused at creation, not overrun in PostSend.
func TestDeviceSGEsClampedToWhatCanBePosted(t *testing.T) {
	p := providerOfFake(t, "fakeurma", "-DFAKE_DEVICE_SGE=200")
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	const postable = 64 // SHIM_MAX_SGE
	caps := devs[0].Caps
	if caps.MaxJFSSge != postable || caps.MaxJFSRsge != postable || caps.MaxJFRSge != postable {
		t.Fatalf("a device reporting 200 SGEs is offered %d/%d/%d (JFS/JFS read/JFR), want %d",
			caps.MaxJFSSge, caps.MaxJFSRsge, caps.MaxJFRSge, postable)
	}
	c, err := p.Open("udma0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	jfc, err := c.CreateJFC(urma.JFCConfig{Depth: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer jfc.Close()
	if r, err := c.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 4, JFC: jfc, MaxSGE: postable + 1}); err == nil {
		r.Close()
		t.Errorf("a JFR of %d SGEs was created", postable+1)
	} else if !strings.Contains(err.Error(), "max SGE 65 above the device's 64") {
		t.Errorf("JFR of 65 SGEs: %v, want it refused naming the limit", err)
	}
	r, err := c.CreateJFR(urma.JFRConfig{Mode: urma.RM, Depth: 4, JFC: jfc})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if j, err := c.CreateJetty(urma.JettyConfig{Mode: urma.RM, SQDepth: 4, SendJFC: jfc, JFR: r, MaxSGE: postable + 1}); err == nil {
		j.Close()
		t.Errorf("a jetty of %d SGEs was created", postable+1)
	} else if !strings.Contains(err.Error(), "max SGE 65 above the device's 64") {
		t.Errorf("jetty of 65 SGEs: %v, want it refused naming the limit", err)
	}
}

// providerOfFake loads testdata/<name>/<name>.c built with flags into a
// provider of its own, closed when the test ends.
func providerOfFake(t *testing.T, name string, flags ...string) *Provider {
	requireFake(t)
	t.Helper()
	lib, err := buildFake(t.TempDir(), "lib"+name+".so", filepath.Join("testdata", name, name+".c"), flags...)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProvider(Options{Library: lib})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Devices holds the provider while it is in liburma: a last Provider.Close
// that ran under it would uninitialise liburma, which frees the device list
// (and unloads the providers) the listing reads. The fake's gate holds
// urma_get_device_list in the middle; Close must wait for it.
func TestDevicesHoldsOffClose(t *testing.T) {
	p := providerOfFake(t, "fakeurma")
	if err := p.lib.fakeGate("urma_get_device_list"); err != nil {
		t.Fatal(err)
	}
	type listing struct {
		devs []urma.DeviceInfo
		err  error
	}
	listed := make(chan listing, 1)
	go func() {
		devs, err := p.Devices()
		listed <- listing{devs, err}
	}()
	if err := p.lib.fakeHook("fakeurma_wait_gated", nil); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	var closeErr error
	go func() {
		defer close(closed)
		closeErr = p.Close()
	}()
	if !waitBlockedIn(closed, "liburma.(*Provider).Close") {
		t.Error("Provider.Close returned while Devices was in liburma")
	}
	if err := p.lib.fakeGate(""); err != nil {
		t.Fatal(err)
	}
	if l := <-listed; l.err != nil || len(l.devs) != 2 {
		t.Errorf("Devices: %d devices, %v; liburma was uninitialised under it", len(l.devs), l.err)
	}
	<-closed
	if closeErr != nil {
		t.Errorf("Close: %v", closeErr)
	}
}
