package preferred

import (
	"fmt"
	"slices"
	"testing"
)

func ids(dev string, ks ...int) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = fmt.Sprintf("%s-%d", dev, k)
	}
	return out
}

func rangeIDs(dev string, from, to int) []string {
	var out []string
	for k := from; k < to; k++ {
		out = append(out, fmt.Sprintf("%s-%d", dev, k))
	}
	return out
}

func concat(lists ...[]string) []string { return slices.Concat(lists...) }

func TestPick(t *testing.T) {
	devs := map[string]Device{
		"udma0": {NUMANode: 0, Healthy: true},
		"udma1": {NUMANode: 0, Healthy: true},
		"udma2": {NUMANode: 1, Healthy: true},
		"udma3": {NUMANode: 1, Healthy: true},
		"sick":  {NUMANode: 0, Healthy: false},
	}
	tests := []struct {
		name string
		req  Request
		want []string
	}{
		{
			"one device, lowest units",
			Request{Available: ids("udma0", 5, 1, 3, 2), Size: 2},
			ids("udma0", 1, 2),
		},
		{
			"best fit: the fullest device that still holds the request",
			Request{Available: concat(rangeIDs("udma0", 0, 10), rangeIDs("udma1", 0, 3), rangeIDs("udma2", 0, 2)), Size: 3},
			ids("udma1", 0, 1, 2),
		},
		{
			"never split when one device fits, even if others are interleaved",
			Request{Available: []string{"udma0-0", "udma1-0", "udma0-1", "udma1-1", "udma1-2"}, Size: 3},
			ids("udma1", 0, 1, 2),
		},
		{
			"must-include device holds the rest",
			Request{Available: concat(rangeIDs("udma0", 0, 4), rangeIDs("udma1", 0, 2)), MustInclude: ids("udma0", 7), Size: 3},
			concat(ids("udma0", 7), ids("udma0", 0, 1)),
		},
		{
			"must-include device too small: single device on its NUMA node",
			Request{Available: concat(ids("udma0", 1), rangeIDs("udma1", 0, 8), rangeIDs("udma2", 0, 3)), MustInclude: ids("udma0", 0), Size: 4},
			concat(ids("udma0", 0), ids("udma1", 0, 1, 2)),
		},
		{
			"no single device fits: one NUMA node",
			Request{Available: concat(rangeIDs("udma0", 0, 3), rangeIDs("udma1", 0, 2), rangeIDs("udma2", 0, 4), rangeIDs("udma3", 0, 4)), Size: 5},
			concat(ids("udma0", 0, 1, 2), ids("udma1", 0, 1)),
		},
		{
			"NUMA choice: smallest node total that fits",
			Request{Available: concat(rangeIDs("udma0", 0, 4), rangeIDs("udma1", 0, 4), rangeIDs("udma2", 0, 3), rangeIDs("udma3", 0, 3)), Size: 6},
			concat(ids("udma2", 0, 1, 2), ids("udma3", 0, 1, 2)),
		},
		{
			"nothing fits one NUMA node: spread, largest first",
			Request{Available: concat(rangeIDs("udma0", 0, 2), rangeIDs("udma2", 0, 3)), Size: 4},
			concat(ids("udma2", 0, 1, 2), ids("udma0", 0)),
		},
		{
			"unhealthy, unknown and malformed IDs are skipped",
			Request{Available: concat(ids("sick", 0, 1, 2), ids("ghost", 0), []string{"garbage", "udma3-x"}, ids("udma3", 4)), Size: 1},
			ids("udma3", 4),
		},
		{
			"not enough units: return what exists",
			Request{Available: ids("udma0", 0), Size: 3},
			ids("udma0", 0),
		},
		{
			"must-include already fills the request",
			Request{Available: rangeIDs("udma0", 0, 4), MustInclude: ids("udma1", 1, 2), Size: 2},
			ids("udma1", 1, 2),
		},
		{
			"must-include IDs listed as available are not duplicated",
			Request{Available: rangeIDs("udma0", 0, 3), MustInclude: ids("udma0", 0), Size: 2},
			ids("udma0", 0, 1),
		},
		{
			"duplicate available IDs count once",
			Request{Available: concat(ids("udma0", 0, 0, 0), ids("udma1", 0, 1)), Size: 2},
			ids("udma1", 0, 1),
		},
		{
			"zero size",
			Request{Available: rangeIDs("udma0", 0, 3)},
			nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Pick(tt.req, devs)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Pick = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPickIsDeterministic(t *testing.T) {
	devs := map[string]Device{}
	var avail []string
	for i := range 8 {
		name := fmt.Sprintf("udma%d", i)
		devs[name] = Device{NUMANode: i % 2, Healthy: true}
		avail = append(avail, rangeIDs(name, 0, 4)...)
	}
	first := Pick(Request{Available: avail, Size: 10}, devs)
	for range 20 {
		rev := slices.Clone(avail)
		slices.Reverse(rev)
		if got := Pick(Request{Available: rev, Size: 10}, devs); !slices.Equal(got, first) {
			t.Fatalf("Pick depends on input order / map order: %v vs %v", got, first)
		}
	}
	if len(first) != 10 {
		t.Fatalf("got %d units, want 10", len(first))
	}
}

// TestPickAmongSeveralCandidates covers the choices between devices that can
// each hold the request: must-include devices by how many units they hold,
// the must-include units' NUMA node when they agree, and names on a tie.
func TestPickAmongSeveralCandidates(t *testing.T) {
	devs := map[string]Device{
		"a0": {NUMANode: 0, Healthy: true},
		"a1": {NUMANode: 0, Healthy: true},
		"b0": {NUMANode: 1, Healthy: true},
		"b1": {NUMANode: 1, Healthy: true},
		"c0": {NUMANode: 0, Healthy: true},
		"d2": {NUMANode: 2, Healthy: true},
	}
	tests := []struct {
		name string
		req  Request
		want []string
	}{
		{
			// b1 sorts first by name and could hold the rest too.
			"the must-include device holding most units wins, exactly full",
			Request{Available: concat(rangeIDs("b1", 1, 6), rangeIDs("c0", 2, 4)), MustInclude: concat(ids("b1", 0), ids("c0", 0, 1)), Size: 5},
			concat(ids("b1", 0), ids("c0", 0, 1), ids("c0", 2, 3)),
		},
		{
			// Neither must-include device has room; b0 would be the best fit.
			"must-include devices agreeing on a NUMA node pick a device there",
			Request{Available: concat(rangeIDs("b0", 0, 2), rangeIDs("c0", 0, 3)), MustInclude: concat(ids("a0", 0), ids("a1", 0)), Size: 4},
			concat(ids("a0", 0), ids("a1", 0), ids("c0", 0, 1)),
		},
		{
			"must-include devices on different NUMA nodes: best fit",
			Request{Available: concat(rangeIDs("b1", 0, 2), rangeIDs("c0", 0, 3)), MustInclude: concat(ids("a0", 0), ids("b0", 0)), Size: 4},
			concat(ids("a0", 0), ids("b0", 0), ids("b1", 0, 1)),
		},
		{
			// No NUMA node is preferred, not even one that is no anchor's.
			"must-include devices on different NUMA nodes: no node preferred",
			Request{Available: concat(rangeIDs("b1", 0, 2), rangeIDs("d2", 0, 3)), MustInclude: concat(ids("a0", 0), ids("b0", 0)), Size: 4},
			concat(ids("a0", 0), ids("b0", 0), ids("b1", 0, 1)),
		},
		{
			"equally good devices: the first by name",
			Request{Available: concat(rangeIDs("b1", 0, 2), rangeIDs("b0", 0, 2)), Size: 2},
			ids("b0", 0, 1),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Pick(tt.req, devs); !slices.Equal(got, tt.want) {
				t.Errorf("Pick = %v, want %v", got, tt.want)
			}
		})
	}
}
