package soft

import (
	"fmt"
	"sync"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Fabric is the in-process fabric: a registry in which the devices of several
// Providers find each other by EID, as if each Provider were a host. A Fabric
// is safe for concurrent use and holds no goroutines.
type Fabric struct {
	mu      sync.RWMutex
	devices map[urma.EID]*device
	next    uint64
}

// NewFabric returns an empty in-process fabric.
func NewFabric() *Fabric {
	return &Fabric{devices: make(map[urma.EID]*device)}
}

// attach gives d its EIDs (drawing one when the spec has none) and registers
// it; every EID must be free.
func (f *Fabric) attach(d *device, want []urma.EID) ([]urma.EID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	eids := want
	if len(eids) == 0 {
		for {
			f.next++
			e := inprocEID(f.next)
			if _, taken := f.devices[e]; !taken {
				eids = []urma.EID{e}
				break
			}
		}
	}
	for i, e := range eids {
		if _, taken := f.devices[e]; taken {
			return nil, fmt.Errorf("attach device %s to fabric: EID %s is already in use", d.info.Name, e)
		}
		for _, o := range eids[:i] {
			if o == e {
				return nil, fmt.Errorf("attach device %s to fabric: EID %s listed twice", d.info.Name, e)
			}
		}
	}
	for _, e := range eids {
		f.devices[e] = d
	}
	return eids, nil
}

// detach removes d's EIDs.
func (f *Fabric) detach(d *device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for e, o := range f.devices {
		if o == d {
			delete(f.devices, e)
		}
	}
}

// lookup finds the device that owns eid.
func (f *Fabric) lookup(eid urma.EID) *device {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.devices[eid]
}
