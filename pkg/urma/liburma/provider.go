//go:build linux && cgo

package liburma

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Bounds of what one listing returns; UB nodes have a handful of devices.
const (
	maxDevices = 64
	maxEIDs    = 1024 // URMA_MAX_EID_CNT
)

// Provider is urma.Provider over liburma. It is safe for concurrent use.
type Provider struct {
	lib *library
	log logr.Logger

	mu       sync.Mutex
	closed   bool
	contexts map[*devContext]struct{}
	// torndown is closed when the first Close has finished its teardown,
	// with closeErr its result: every Close waits for it and returns that.
	torndown chan struct{}
	closeErr error
}

var _ urma.Provider = (*Provider)(nil)

// New loads liburma (Options.Library, $URMA_LIBRARY, or liburma.so.0) and
// initialises it. The error names the library when it cannot be loaded, or
// when it lacks a function this package calls.
func New(opts Options) (urma.Provider, error) {
	p, err := newProvider(opts)
	if err != nil {
		return nil, err // not a nil *Provider in a non-nil interface
	}
	return p, nil
}

func newProvider(opts Options) (*Provider, error) {
	path := opts.Library
	if path == "" {
		path = os.Getenv(EnvLibrary)
	}
	if path == "" {
		path = DefaultLibrary
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	lib, err := openLibrary(path)
	if err != nil {
		return nil, err
	}
	return &Provider{lib: lib, log: opts.Logger, contexts: make(map[*devContext]struct{})}, nil
}

// Name is "liburma".
func (p *Provider) Name() string { return Name }

// Devices lists liburma's devices with their capabilities, ports and EIDs.
func (p *Provider) Devices() ([]urma.DeviceInfo, error) {
	// Under p.mu throughout: the last Provider.Close uninitialises
	// liburma, which frees the device list (and unloads the providers)
	// a listing reads (core/urma_main.c urma_uninit).
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, urma.Errorf("get_device_list", urma.ErrClosed.Code, "provider is closed")
	}
	var raw [maxDevices]C.shim_dev_info
	var cerr C.int
	n := C.shim_list_devices(p.lib.c, &raw[0], maxDevices, &cerr)
	switch n {
	case C.SHIM_ERR_GET_DEVICE_LIST:
		// cerr is an errno here; ENODEV (no device) came back as 0 devices.
		return nil, urma.Errorf("get_device_list", urma.Code(cerr), "list devices: urma_get_device_list failed with errno %d", int(cerr))
	case C.SHIM_ERR_QUERY_DEVICE:
		return nil, statusErr("query_device", cerr, "list devices")
	}
	out := make([]urma.DeviceInfo, 0, int(n))
	for i := range int(n) {
		d := deviceInfo(&raw[i])
		eids, err := p.eids(d.Name)
		if err != nil {
			return nil, err
		}
		d.EIDs = eids
		out = append(out, d)
	}
	return out, nil
}

// eids lists a device's populated EID slots; p.mu is held.
func (p *Provider) eids(dev string) ([]urma.EIDEntry, error) {
	name := C.CString(dev)
	defer C.free(unsafe.Pointer(name))
	raw := make([]C.shim_eid, maxEIDs)
	var cerr C.int
	n := C.shim_list_eids(p.lib.c, name, &raw[0], maxEIDs, &cerr)
	if n < 0 {
		return nil, statusErr("get_eid_list", cerr, "list the EIDs of %s", dev)
	}
	var out []urma.EIDEntry
	for _, e := range raw[:n] {
		var eid urma.EID
		copy(eid[:], C.GoBytes(unsafe.Pointer(&e.raw[0]), 16))
		if !eid.IsZero() {
			out = append(out, urma.EIDEntry{Index: int(e.index), EID: eid})
		}
	}
	return out, nil
}

// postable is how many of a device's SGEs a work request can carry: at most
// SHIM_MAX_SGE (the shim's arrays; urma_jfs_cfg_t.max_sge is a uint8_t, so
// a device may report up to 255). More would overrun them in PostSend.
func postable(sges C.uint32_t) uint32 { return min(uint32(sges), C.SHIM_MAX_SGE) }

func deviceInfo(d *C.shim_dev_info) urma.DeviceInfo {
	info := urma.DeviceInfo{
		Name:          C.GoString(&d.name[0]),
		Driver:        Name,
		TransportType: urma.TransportType(d.transport_type),
		GUID:          fmt.Sprintf("%x", C.GoBytes(unsafe.Pointer(&d.guid[0]), 16)),
		Caps: urma.DeviceCaps{
			Feature:          uint32(d.feature),
			MaxJFC:           uint32(d.max_jfc),
			MaxJFS:           uint32(d.max_jfs),
			MaxJFR:           uint32(d.max_jfr),
			MaxJetty:         uint32(d.max_jetty),
			MaxJettyGrp:      uint32(d.max_jetty_grp),
			MaxJFCDepth:      uint32(d.max_jfc_depth),
			MaxJFSDepth:      uint32(d.max_jfs_depth),
			MaxJFRDepth:      uint32(d.max_jfr_depth),
			MaxJFSInlineSize: uint32(d.max_jfs_inline_len),
			MaxJFSSge:        postable(d.max_jfs_sge),
			MaxJFSRsge:       postable(d.max_jfs_rsge),
			MaxJFRSge:        postable(d.max_jfr_sge),
			MaxMsgSize:       uint64(d.max_msg_size),
			TransMode:        urma.TransMode(d.trans_mode),
			PortCount:        uint32(d.port_cnt),
			MaxEIDCnt:        uint32(d.max_eid_cnt),
			OrderedRM:        d.rm_order_ot != 0,
		},
		ReservedJetty: urma.Range{Min: uint32(d.reserved_jetty_min), Max: uint32(d.reserved_jetty_max)},
	}
	for i := range int(d.port_cnt) {
		pt := &d.ports[i]
		info.Ports = append(info.Ports, urma.Port{
			Index: i, State: urma.PortState(pt.state), MaxMTU: mtuBytes(pt.max_mtu), ActiveMTU: mtuBytes(pt.active_mtu),
			ActiveSpeed: uint32(pt.active_speed), ActiveWidth: uint32(pt.active_width),
		})
	}
	return info
}

// mtuBytes turns urma_mtu_t (1 is 256 bytes, each step doubles) into bytes.
func mtuBytes(m C.uint32_t) uint32 {
	if m == 0 || m > 6 {
		return 0
	}
	return 128 << m
}

// Open creates a context on the named device ("" is the first) bound to the
// EID whose index (urma_eid_info_t.eid_index) is eidIndex.
func (p *Provider) Open(name string, eidIndex int) (urma.Context, error) {
	const op = "create_context"
	devs, err := p.Devices()
	if err != nil {
		return nil, err
	}
	var dev *urma.DeviceInfo
	for i := range devs {
		if name == "" || devs[i].Name == name {
			dev = &devs[i]
			break
		}
	}
	if dev == nil {
		return nil, urma.Errorf(op, urma.CodeNoDev, "no device named %q", name)
	}
	found := false
	for _, e := range dev.EIDs {
		found = found || e.Index == eidIndex
	}
	if !found || eidIndex < 0 {
		return nil, urma.Errorf(op, urma.CodeInval, "device %s has no EID at index %d", dev.Name, eidIndex)
	}
	cname := C.CString(dev.Name)
	defer C.free(unsafe.Pointer(cname))
	var id C.shim_id
	var cerr C.int
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, urma.Errorf(op, urma.ErrClosed.Code, "provider is closed")
	}
	cc := C.shim_create_context(p.lib.c, cname, C.uint32_t(eidIndex), &id, &cerr)
	if cc == nil {
		return nil, statusErr(op, cerr, "create a context on %s, EID index %d", dev.Name, eidIndex)
	}
	c := &devContext{prov: p, lib: p.lib, c: cc, dev: *dev, eid: eidOf(&id), uasid: uint32(id.uasid)}
	p.contexts[c] = struct{}{}
	return c, nil
}

func (p *Provider) forgetContext(c *devContext) {
	p.mu.Lock()
	delete(p.contexts, c)
	p.mu.Unlock()
}

// Close destroys every context and object still open, then releases
// liburma (the last Provider of the process uninitialises it). Outstanding
// work requests are dropped without completions. A delete that fails in
// liburma does not stop the teardown: Close goes on with the rest, and
// returns every failure. Close is idempotent: a Close while another one
// tears down waits for it, and every Close returns the first one's result.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		torndown := p.torndown
		p.mu.Unlock()
		<-torndown
		return p.closeErr
	}
	p.closed = true
	p.torndown = make(chan struct{})
	defer close(p.torndown) // after closeErr is set
	ctxs := make([]*devContext, 0, len(p.contexts))
	for c := range p.contexts {
		ctxs = append(ctxs, c)
	}
	p.mu.Unlock()
	var errs []error
	for _, c := range ctxs {
		errs = append(errs, c.forceClose())
	}
	errs = append(errs, p.lib.release())
	if err := errors.Join(errs...); err != nil {
		p.closeErr = fmt.Errorf("close the liburma provider: %w", err)
	}
	return p.closeErr
}

// killContexts makes every context of this provider vanish as a crashed
// process would, through the fake liburma's test hook; real liburma has no
// such call and it fails with ENOSYS.
func (p *Provider) killContexts() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.contexts {
		if st := C.shim_kill_context(p.lib.c, c.c); st != 0 {
			return statusErr("kill_context", st, "kill a context")
		}
	}
	return nil
}

// eidOf copies an EID out of C memory, without allocating (every
// completion record carries one).
func eidOf(id *C.shim_id) urma.EID {
	var e urma.EID
	for i := range e {
		e[i] = byte(id.eid[i])
	}
	return e
}

func jettyIDOf(id *C.shim_id) urma.JettyID {
	return urma.JettyID{EID: eidOf(id), UASID: uint32(id.uasid), ID: uint32(id.id)}
}
