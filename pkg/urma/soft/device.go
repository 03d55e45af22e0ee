package soft

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

type (
	jettySlot = atomic.Pointer[jetty]
	jfrSlot   = atomic.Pointer[jfr]
)

// device is one virtual device: its identity, its id tables and, on a
// fabric between processes, its side of it (fabricSide).
type device struct {
	prov   *Provider
	info   urma.DeviceInfo
	caps   urma.DeviceCaps
	eids   []urma.EID
	closed atomic.Bool

	// Lock-free lookup by id for the data path; index 0 is never used.
	jetties []jettySlot
	jfrs    []jfrSlot

	mu          sync.Mutex // guards the allocation state below
	nJFC        uint32
	nextJFCID   uint32
	segs        map[uint32]*segment // by token id
	nextTokenID uint32

	nextUASID atomic.Uint32
	instances atomic.Uint32 // jetty instance numbers, unique per device

	// side is the device's side of the fabric between processes it is on,
	// shm or socket; nil on the in-process fabric.
	side *fabricSide
	// tcpSide is the socket fabric's side of a device on both fabrics
	// (Options.AlsoSocket): side is then the shm side, at eids[0], and
	// tcpSide is at eids[1]. Nil otherwise.
	tcpSide *fabricSide
}

// sides lists the device's fabric sides: none in-process, else side and,
// on both fabrics, tcpSide.
func (d *device) sides() []*fabricSide {
	switch {
	case d.side == nil:
		return nil
	case d.tcpSide == nil:
		return []*fabricSide{d.side}
	}
	return []*fabricSide{d.side, d.tcpSide}
}

// sideFor is the fabric side that reaches a peer device at eid: on both
// fabrics, an shm EID is reached over shared memory and any other over
// TCP.
func (d *device) sideFor(eid urma.EID) *fabricSide {
	if d.tcpSide != nil && !IsShmEID(eid) {
		return d.tcpSide
	}
	return d.side
}

func (d *device) infoCopy() urma.DeviceInfo {
	i := d.info
	i.Ports = slices.Clone(i.Ports)
	i.EIDs = slices.Clone(i.EIDs)
	return i
}

// jetty finds a live jetty by id.
func (d *device) jetty(id uint32) *jetty {
	if id == 0 || uint64(id) >= uint64(len(d.jetties)) {
		return nil
	}
	return d.jetties[id].Load()
}

// allocJetty gives j the lowest free id. Ids are reused, as on hardware, so
// a stale importer of a re-created jetty is caught by the token check. name
// gives j its identity before j is published: a connection's reader that
// finds it (a peer's late answer to the id's previous jetty) reads its id
// and instance unlocked.
func (d *device) allocJetty(j *jetty, name func(id uint32)) (uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := 1; id < len(d.jetties); id++ {
		if d.jetties[id].Load() == nil {
			name(uint32(id))
			d.jetties[id].Store(j)
			return uint32(id), nil
		}
	}
	return 0, urma.Errorf("create_jetty", urma.CodeNoMem, "device %s has all %d jetties in use", d.info.Name, d.caps.MaxJetty)
}

func (d *device) freeJetty(id uint32) {
	d.mu.Lock()
	d.jetties[id].Store(nil)
	d.mu.Unlock()
}

func (d *device) allocJFR(r *jfr) (uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := 1; id < len(d.jfrs); id++ {
		if d.jfrs[id].Load() == nil {
			d.jfrs[id].Store(r)
			return uint32(id), nil
		}
	}
	return 0, urma.Errorf("create_jfr", urma.CodeNoMem, "device %s has all %d JFRs in use", d.info.Name, d.caps.MaxJFR)
}

func (d *device) freeJFR(id uint32) {
	d.mu.Lock()
	d.jfrs[id].Store(nil)
	d.mu.Unlock()
}

func (d *device) allocJFC() (uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nJFC >= d.caps.MaxJFC {
		return 0, urma.Errorf("create_jfc", urma.CodeNoMem, "device %s has all %d JFCs in use", d.info.Name, d.caps.MaxJFC)
	}
	d.nJFC++
	d.nextJFCID++
	return d.nextJFCID, nil
}

func (d *device) freeJFC() {
	d.mu.Lock()
	d.nJFC--
	d.mu.Unlock()
}

func (d *device) addSegment(s *segment) uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		d.nextTokenID++
		if d.nextTokenID == 0 {
			continue
		}
		if _, taken := d.segs[d.nextTokenID]; !taken {
			d.segs[d.nextTokenID] = s
			return d.nextTokenID
		}
	}
}

func (d *device) removeSegment(tokenID uint32) {
	d.mu.Lock()
	delete(d.segs, tokenID)
	d.mu.Unlock()
}

func (d *device) segment(tokenID uint32) *segment {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.segs[tokenID]
}

// checkJettyImport answers an import of jetty id in mode, for a local
// importer or a peer's request. The token is not checked: udma stores it
// with the import (udma_u_jetty.c:701-704) and the target checks it on
// every packet (see jfr.accepts).
func (d *device) checkJettyImport(id uint32, mode urma.TransportMode) urma.Code {
	if d.closed.Load() {
		return urma.CodeConnRefused
	}
	j := d.jetty(id)
	switch {
	case j == nil:
		return urma.CodeNoEnt
	case j.mode != mode:
		return urma.CodeInval
	}
	return urma.CodeSuccess
}

// checkSegmentImport answers an import of a segment. Neither the token nor
// the access flags are checked: udma_u_import_seg stores the token, and the
// owner checks both on each access.
func (d *device) checkSegmentImport(id urma.SegmentID) urma.Code {
	if d.closed.Load() {
		return urma.CodeConnRefused
	}
	s := d.segment(id.TokenID)
	if s == nil || s.id.VA != id.VA || s.id.Len != id.Len || s.id.UASID != id.UASID {
		return urma.CodeNoEnt
	}
	return urma.CodeSuccess
}

// forEachJetty calls f for every live jetty.
func (d *device) forEachJetty(f func(*jetty)) {
	for i := range d.jetties {
		if j := d.jetties[i].Load(); j != nil {
			f(j)
		}
	}
}

// awaitedPeers are the remote peers whose answers sends of this device's
// jetties wait for (see jetty.addAwaited).
func (d *device) awaitedPeers() map[*peer]bool {
	m := make(map[*peer]bool)
	d.forEachJetty(func(j *jetty) { j.addAwaited(m) })
	return m
}

// route finds where eid lives: a device this process reaches directly (the
// in-process fabric, or this very device) or a socket peer.
func (d *device) route(op string, eid urma.EID) (*device, *peer, error) {
	if d.closed.Load() {
		return nil, nil, errClosed(op, "device")
	}
	if d.prov.fabric != nil {
		t := d.prov.fabric.lookup(eid)
		if t == nil || t.closed.Load() {
			return nil, nil, urma.Errorf(op, urma.CodeConnRefused, "no device with EID %s on the fabric", eid)
		}
		return t, nil, nil
	}
	if slices.Contains(d.eids, eid) {
		return d, nil, nil
	}
	p, err := d.sideFor(eid).peer(eid)
	if err != nil {
		return nil, nil, urma.Errorf(op, urma.CodeConnRefused, "%w", err)
	}
	return nil, p, nil
}
