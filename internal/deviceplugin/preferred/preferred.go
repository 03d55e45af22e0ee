// Package preferred chooses which budget units a container should get, for
// kubelet's GetPreferredAllocation.
//
// A container's units are best all on one device (its transport opens one
// device, see URMA_DEVICE), and failing that on devices of one NUMA node.
// Among devices that can hold the whole request the one with the fewest free
// units wins (best fit), which keeps large free blocks for later containers.
// Units a container must include (kubelet's must-include list) are always
// part of the answer, and their devices are filled first.
package preferred

import (
	"cmp"
	"slices"

	"github.com/openeuler/urma-k8s/internal/node/budget"
)

// Device is what packing needs to know about a device.
type Device struct {
	NUMANode int // -1 when unknown
	Healthy  bool
}

// Request is one container's preferred-allocation request.
type Request struct {
	Available   []string // unit IDs kubelet may choose from
	MustInclude []string // unit IDs that must be in the answer
	Size        int      // how many units the container needs
}

type unit struct {
	id string
	k  uint32
}

type pool struct {
	name    string
	numa    int
	free    []unit // sorted by k
	anchors int    // must-include units on this device
}

// Pick returns the unit IDs to allocate: MustInclude first, then units
// chosen by the rules in the package comment. Available IDs that do not
// parse, name an unknown or unhealthy device, or repeat are ignored. When
// fewer than Size usable units are available, Pick returns all it can.
func Pick(req Request, devices map[string]Device) []string {
	out := slices.Clone(req.MustInclude)
	need := req.Size - len(out)
	if need <= 0 {
		return out
	}
	taken := map[string]bool{}
	anchors := map[string]int{}
	for _, id := range req.MustInclude {
		taken[id] = true
		if dev, _, err := budget.ParseUnitID(id); err == nil {
			anchors[dev]++
		}
	}
	pools := map[string]*pool{}
	for _, id := range req.Available {
		if taken[id] {
			continue
		}
		dev, k, err := budget.ParseUnitID(id)
		if err != nil {
			continue
		}
		d, ok := devices[dev]
		if !ok || !d.Healthy {
			continue
		}
		taken[id] = true
		p := pools[dev]
		if p == nil {
			p = &pool{name: dev, numa: d.NUMANode, anchors: anchors[dev]}
			pools[dev] = p
		}
		p.free = append(p.free, unit{id: id, k: k})
	}
	list := make([]*pool, 0, len(pools))
	for _, p := range pools {
		slices.SortFunc(p.free, func(a, b unit) int { return cmp.Compare(a.k, b.k) })
		list = append(list, p)
	}
	for _, p := range order(list, need, anchorNUMA(anchors, devices)) {
		n := min(need, len(p.free))
		for _, u := range p.free[:n] {
			out = append(out, u.id)
		}
		need -= n
		if need == 0 {
			break
		}
	}
	return out
}

// anchorNUMA is the NUMA node of the must-include devices when they agree,
// else -2 (no preference).
func anchorNUMA(anchors map[string]int, devices map[string]Device) int {
	numa := -2
	for dev := range anchors {
		d, ok := devices[dev]
		if !ok {
			continue
		}
		if numa != -2 && numa != d.NUMANode {
			return -2
		}
		numa = d.NUMANode
	}
	return numa
}

// order returns the pools in the order to fill them.
func order(list []*pool, need, prefNUMA int) []*pool {
	// Deterministic base order: devices holding must-include units first
	// (most of them first), then by name.
	slices.SortFunc(list, func(a, b *pool) int {
		if c := cmp.Compare(b.anchors, a.anchors); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})

	// 1. A must-include device that can hold the rest alone.
	for _, p := range list {
		if p.anchors > 0 && len(p.free) >= need {
			return []*pool{p}
		}
	}
	// 2. One device that can hold the rest: best fit, same NUMA node as the
	// must-include units preferred.
	var best *pool
	better := func(p, q *pool) bool { // is p better than q?
		if q == nil {
			return true
		}
		if (p.numa == prefNUMA) != (q.numa == prefNUMA) {
			return p.numa == prefNUMA
		}
		return len(p.free) < len(q.free)
	}
	for _, p := range list {
		if len(p.free) >= need && better(p, best) {
			best = p
		}
	}
	if best != nil {
		return []*pool{best}
	}
	// 3. Several devices of one NUMA node: anchors first, then the largest
	// pools, so the fewest devices are used. Prefer the anchors' node, then
	// the node with the smallest total that fits.
	byNUMA := map[int][]*pool{}
	total := map[int]int{}
	for _, p := range list {
		byNUMA[p.numa] = append(byNUMA[p.numa], p)
		total[p.numa] += len(p.free)
	}
	bestNUMA, found := 0, false
	for numa, t := range total {
		if t < need {
			continue
		}
		switch {
		case !found:
		case (numa == prefNUMA) != (bestNUMA == prefNUMA):
			if numa != prefNUMA {
				continue
			}
		case t > total[bestNUMA] || (t == total[bestNUMA] && numa > bestNUMA):
			continue
		}
		bestNUMA, found = numa, true
	}
	if found {
		return largestFirst(byNUMA[bestNUMA])
	}
	// 4. Whatever it takes: anchors first, then the largest pools.
	return largestFirst(list)
}

func largestFirst(list []*pool) []*pool {
	out := slices.Clone(list)
	slices.SortStableFunc(out, func(a, b *pool) int {
		if c := cmp.Compare(b.anchors, a.anchors); c != 0 {
			return c
		}
		if c := cmp.Compare(len(b.free), len(a.free)); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	return out
}
