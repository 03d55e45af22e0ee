package sysfs_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

func TestEIDs(t *testing.T) {
	type slot struct {
		index int
		eid   string // IPv6 text of the expected EID
	}
	tests := []struct {
		name     string
		eids     []string
		old      bool
		legacy   bool
		maxCnt   uint32
		after    func(t *testing.T, tr *sysfstest.Tree)
		want     []slot
		problems []string
	}{
		{name: "new layout", eids: []string{"fe80::1", "fe80::2"}, want: []slot{{0, "fe80::1"}, {1, "fe80::2"}}},
		{name: "old layout", eids: []string{"fe80::1", "fe80::2"}, old: true, want: []slot{{0, "fe80::1"}, {1, "fe80::2"}}},
		{name: "old layout in the legacy class", eids: []string{"fe80::9"}, old: true, legacy: true, want: []slot{{0, "fe80::9"}}},
		{name: "new layout in the legacy class", eids: []string{"fe80::9"}, legacy: true, want: []slot{{0, "fe80::9"}}},
		{name: "empty slots skipped, indexes kept",
			eids: []string{"", "::", sysfstest.ZeroEID, "0:0:0:0:0:0:0:0", "fe80::5", ""},
			want: []slot{{4, "fe80::5"}}},
		{name: "kernel full form", eids: []string{"0000:0000:0000:0000:0000:ffff:c0a8:0102"}, want: []slot{{0, "::ffff:192.168.1.2"}}},
		{name: "IPv4 dotted quad", eids: []string{"192.168.1.2"}, want: []slot{{0, "::ffff:192.168.1.2"}}},
		{name: "decimal number", eids: []string{"3232235778"}, want: []slot{{0, "::ffff:192.168.1.2"}}},
		{name: "hex number", eids: []string{"0xc0a80102"}, want: []slot{{0, "::ffff:192.168.1.2"}}},
		{name: "number zero is a real EID", eids: []string{"0"}, want: []slot{{0, "::ffff:0.0.0.0"}}},
		{name: "no EIDs at all", eids: nil, maxCnt: 4, want: nil},
		{name: "malformed slot is a problem, others still read",
			eids:     []string{"fe80::1", "not-an-eid", "fe80::3"},
			want:     []slot{{0, "fe80::1"}, {2, "fe80::3"}},
			problems: []string{`eids/eid1: parse EID "not-an-eid"`}},
		{name: "malformed slot in the old layout names its file",
			eids: []string{"1.2.3"}, old: true,
			problems: []string{`eid0/eid: parse EID "1.2.3": not an IPv4 address`}},
		{name: "slots past max_eid_cnt are not read",
			eids: []string{"fe80::1"}, maxCnt: 1,
			after: func(t *testing.T, tr *sysfstest.Tree) {
				tr.WriteFile(t, "udma0", "eids/eid1", "fe80::2\n")
				tr.WriteFile(t, "udma0", "eid2/eid", "fe80::3\n")
			},
			want: []slot{{0, "fe80::1"}}},
		{name: "both layouts probed per slot",
			eids: []string{"fe80::1", "", ""}, maxCnt: 3,
			after: func(t *testing.T, tr *sysfstest.Tree) {
				tr.RemoveFile(t, "udma0", "eids/eid2")
				tr.WriteFile(t, "udma0", "eid2/eid", "fe80::3\n")
			},
			want: []slot{{0, "fe80::1"}, {2, "fe80::3"}}},
		{name: "new layout wins when a slot is in both",
			eids: []string{"fe80::1"},
			after: func(t *testing.T, tr *sysfstest.Tree) {
				tr.WriteFile(t, "udma0", "eid0/eid", "fe80::99\n")
			},
			want: []slot{{0, "fe80::1"}}},
		{name: "eids is a file",
			eids: []string{"fe80::1"},
			after: func(t *testing.T, tr *sysfstest.Tree) {
				tr.RemoveFile(t, "udma0", "eids")
				tr.WriteFile(t, "udma0", "eids", "fe80::1\n")
			},
			problems: []string{"eids: not a directory but a regular file"}},
		{name: "EID file is a directory",
			eids: []string{"fe80::1"},
			after: func(t *testing.T, tr *sysfstest.Tree) {
				tr.RemoveFile(t, "udma0", "eids/eid0")
				tr.WriteFile(t, "udma0", "eids/eid0/x", "fe80::1\n")
			},
			problems: []string{"eids/eid0: not a regular file but a directory"}},
		{name: "max_eid_cnt garbage: no slots read",
			eids:     []string{"fe80::1"},
			after:    func(t *testing.T, tr *sysfstest.Tree) { tr.WriteFile(t, "udma0", "max_eid_cnt", "many\n") },
			problems: []string{`max_eid_cnt: parse number "many"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := sysfstest.New(t)
			dev := sysfstest.DefaultDevice("udma0")
			dev.EIDs, dev.OldEIDLayout, dev.Legacy = tc.eids, tc.old, tc.legacy
			dev.Caps.MaxEIDCnt = tc.maxCnt
			tr.Add(t, dev)
			if tc.after != nil {
				tc.after(t, tr)
			}
			d := discoverOne(t, tr, "udma0")
			var want []urma.EIDEntry
			for _, s := range tc.want {
				want = append(want, urma.EIDEntry{Index: s.index, EID: eid(t, s.eid)})
			}
			if !reflect.DeepEqual(d.EIDs, want) {
				t.Errorf("EIDs = %v, want %v", d.EIDs, want)
			}
			for _, p := range tc.problems {
				wantProblem(t, d, p)
			}
			if len(tc.problems) == 0 {
				wantNoProblems(t, d)
			}
			if len(want) == 0 && d.Usable() {
				t.Errorf("usable without an EID")
			}
			if len(want) == 0 && len(tc.problems) == 0 && d.Reason() != "no EID" {
				t.Errorf("Reason = %q, want \"no EID\"", d.Reason())
			}
		})
	}
}

func TestEIDSlotsCappedAtKernelLimit(t *testing.T) {
	tr := sysfstest.New(t)
	dev := sysfstest.DefaultDevice("udma0")
	dev.EIDs = nil
	dev.Caps.MaxEIDCnt = 1
	tr.Add(t, dev)
	// A huge max_eid_cnt must not make discovery walk four billion slots;
	// an EID at the last probed slot is found, one past it is not.
	tr.WriteFile(t, "udma0", "max_eid_cnt", "4294967295\n")
	tr.WriteFile(t, "udma0", "eids/eid1023", "fe80::1023\n")
	tr.WriteFile(t, "udma0", "eids/eid1024", "fe80::1024\n")
	d := discoverOne(t, tr, "udma0")
	wantNoProblems(t, d)
	want := []urma.EIDEntry{{Index: 1023, EID: eid(t, "fe80::1023")}}
	if !reflect.DeepEqual(d.EIDs, want) {
		t.Fatalf("EIDs = %v, want %v", d.EIDs, want)
	}
	if d.Caps.MaxEIDCnt != 4294967295 {
		t.Fatalf("MaxEIDCnt = %d: the reported capability must not be clipped", d.Caps.MaxEIDCnt)
	}
}

func TestManyBadEIDsCapProblems(t *testing.T) {
	tr := sysfstest.New(t)
	dev := sysfstest.DefaultDevice("udma0")
	dev.EIDs = make([]string, 100)
	for i := range dev.EIDs {
		dev.EIDs[i] = fmt.Sprintf("bad%d", i)
	}
	tr.Add(t, dev)
	d := discoverOne(t, tr, "udma0")
	if len(d.Problems) != 33 {
		t.Fatalf("%d problems, want 32 listed plus one count", len(d.Problems))
	}
	if last := d.Problems[32]; last != "68 more problems not listed" {
		t.Fatalf("last problem = %q", last)
	}
	wantProblem(t, d, `eids/eid0: parse EID "bad0"`)
	wantProblem(t, d, `eids/eid31: parse EID "bad31"`)
}
