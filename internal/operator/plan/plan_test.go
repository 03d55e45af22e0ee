package plan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/operator/tuning"
)

func spec() v1alpha1.UrmaEndpointSpec {
	return v1alpha1.UrmaEndpointSpec{
		JettyBudget: 8,
		Profile: v1alpha1.TrafficProfile{
			MessageSize: resource.MustParse("4Ki"), ConnectionsPerPod: 4, InflightPerConnection: 32,
			Objective: v1alpha1.ObjectiveBalanced,
		},
	}
}

func facts(jfs uint32, perUnit uint32) nodefacts.Facts {
	return nodefacts.Facts{DeviceCount: 1, MaxJFSDepth: jfs, MaxJFRDepth: 4096, MaxJFCDepth: 8192,
		MaxMsgSize: 1 << 20, JettiesPerDevice: 512, JettiesPerUnit: perUnit}
}

func node(name string, labels map[string]string, f *nodefacts.Facts) Node {
	var ann map[string]string
	if f != nil {
		ann = f.Annotations()
	}
	return NodeFromAnnotations(name, labels, ann)
}

func TestProfile(t *testing.T) {
	s := spec()
	maxMsg := resource.MustParse("1Mi")
	mem := resource.MustParse("64Mi")
	s.Profile.MaxMessageSize, s.Profile.MemoryBudget = &maxMsg, &mem
	s.Completion, s.HandshakeVersion = v1alpha1.CompletionPolling, 3
	s.Bonding = &v1alpha1.Bonding{Mode: v1alpha1.BondingBalance, Level: v1alpha1.BondingLevelPort}
	want := tuning.Profile{MessageSize: 4096, MaxMessageSize: 1 << 20, ConnectionsPerPod: 4, InflightPerConnection: 32,
		Objective: tuning.Balanced, MemoryBudget: 64 << 20, JettyBudget: 8, Completion: tuning.CompletionPolling,
		HandshakeVersion: 3, BondingMode: 2, BondingLevel: 1}
	if got := Profile(s); got != want {
		t.Errorf("Profile:\n got  %+v\n want %+v", got, want)
	}
	bare := v1alpha1.UrmaEndpointSpec{JettyBudget: 1, Profile: v1alpha1.TrafficProfile{MessageSize: resource.MustParse("1")}}
	if got := Profile(bare); got.ConnectionsPerPod != 1 || got.InflightPerConnection != 32 {
		t.Errorf("API defaults not applied to an undefaulted spec: %+v", got)
	}
	for mode, want := range map[v1alpha1.BondingMode]int64{v1alpha1.BondingStandalone: 0, v1alpha1.BondingActiveBackup: 1, v1alpha1.BondingBalance: 2} {
		s.Bonding = &v1alpha1.Bonding{Mode: mode, Level: v1alpha1.BondingLevelIODIE}
		if got := Profile(s); got.BondingMode != want || got.BondingLevel != 0 {
			t.Errorf("bonding %s -> %d/%d, want %d/0", mode, got.BondingMode, got.BondingLevel, want)
		}
	}
}

// A quantity past int64 has no int64 Value (0, or wrapped negative): a
// memoryBudget of 100E read as no cap. Profile saturates it instead, so the
// spec is refused as above the bound rather than tuned without one.
func TestProfileQuantitiesPastInt64AreRefused(t *testing.T) {
	for _, c := range []struct {
		name    string
		set     func(*v1alpha1.UrmaEndpointSpec, resource.Quantity)
		value   string
		wantErr string
	}{
		{"memoryBudget 100E", setMemoryBudget, "100E", "memoryBudget 9223372036854775807 is above 1152921504606846976 bytes (1Ei)"},
		{"memoryBudget 2^63 bytes", setMemoryBudget, "9223372036854775808", "memoryBudget 9223372036854775807 is above"},
		{"memoryBudget 9Ei", setMemoryBudget, "9Ei", "memoryBudget 9223372036854775807 is above"},
		{"memoryBudget 1Ei and a byte", setMemoryBudget, "1152921504606846977", "memoryBudget 1152921504606846977 is above"},
		{"memoryBudget -100E", setMemoryBudget, "-100E", "memoryBudget must not be negative"},
		{"messageSize 100E", func(s *v1alpha1.UrmaEndpointSpec, q resource.Quantity) { s.Profile.MessageSize = q }, "100E",
			"messageSize and maxMessageSize must be at most 1099511627776"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := spec()
			c.set(&s, resource.MustParse(c.value))
			_, err := Make(Input{Spec: s})
			if !errors.Is(err, tuning.ErrInvalid) || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Make: %v; want ErrInvalid containing %q", err, c.wantErr)
			}
		})
	}
	s := spec()
	setMemoryBudget(&s, resource.MustParse("1Ei"))
	if got := Profile(s).MemoryBudget; got != tuning.MaxMemoryBudget {
		t.Errorf("memoryBudget 1Ei -> %d, want %d", got, int64(tuning.MaxMemoryBudget))
	}
	if _, err := Make(Input{Spec: s}); err != nil {
		t.Errorf("memoryBudget 1Ei: %v", err)
	}
}

func setMemoryBudget(s *v1alpha1.UrmaEndpointSpec, q resource.Quantity) { s.Profile.MemoryBudget = &q }

func TestNodeFromAnnotations(t *testing.T) {
	f := facts(1024, 16)
	n := node("a", nil, &f)
	if n.Limits == nil || n.Limits.MaxJFSDepth != 1024 || n.JettiesPerUnit != 16 || n.FactsErr != nil {
		t.Errorf("hardware node: %+v", n)
	}
	if n := node("b", nil, nil); n.Limits != nil || n.FactsErr != nil {
		t.Errorf("node without annotations: %+v", n)
	}
	none := nodefacts.Facts{DeviceCount: 0}
	if n := node("c", nil, &none); n.Limits != nil || n.FactsErr != nil {
		t.Errorf("node without devices: %+v", n)
	}
	bad := NodeFromAnnotations("d", nil, map[string]string{nodefacts.AnnotationDeviceCount: "two"})
	if bad.Limits != nil || bad.FactsErr == nil {
		t.Errorf("malformed node: %+v", bad)
	}
	// Facts published through an NFD feature file arrive as labels.
	nfd := f.Annotations()
	for k, v := range f.Labels() {
		nfd[k] = v
	}
	if n := NodeFromAnnotations("e", nfd, nil); n.Limits == nil || n.Limits.MaxJFSDepth != 1024 || n.JettiesPerUnit != 16 {
		t.Errorf("node with NFD feature labels: %+v", n)
	}
	// Annotations win over labels.
	ann := facts(64, 8)
	if n := NodeFromAnnotations("f", nfd, ann.Annotations()); n.Limits == nil || n.Limits.MaxJFSDepth != 64 {
		t.Errorf("node with both: %+v, want the annotations' limits", n)
	}
	// The plugin's own labels alone (device count, no capabilities) are no facts.
	if n := NodeFromAnnotations("g", nodefacts.Facts{}.Labels(), nil); n.Limits != nil || n.FactsErr != nil {
		t.Errorf("node with only presence labels: %+v", n)
	}
}

func TestMakeNodeSelection(t *testing.T) {
	big, small := facts(4096, 16), facts(256, 8)
	gpu := map[string]string{"pool": "a"}
	other := map[string]string{"pool": "b"}
	malformed := NodeFromAnnotations("bad", gpu, map[string]string{nodefacts.AnnotationDeviceCount: "x"})
	last := tuning.Limits{MaxJFSDepth: 100, MaxJFRDepth: 100, MaxJFCDepth: 400, MaxMsgSize: 4096}
	lastBig := LimitsFromFacts(facts(1024, 16))
	// restarting: the device plugin reports device-count=0 until the
	// driver loads (no usable facts, not malformed ones).
	restarting := nodefacts.Facts{}
	cases := []struct {
		name       string
		selector   map[string]string
		nodes      []Node
		podNodes   []string
		lastKnown  *tuning.Limits
		source     v1alpha1.LimitsSource
		jfs        int64
		reasons    []string
		groupSizes []int32
		units      int64
		// noFactsYet: the NoNodeFacts problem says "no node facts yet" and
		// names the jetties per unit assumed.
		noFactsYet bool
	}{
		{name: "no nodes, first render - software limits", source: v1alpha1.LimitsSoftware,
			jfs: tuning.SoftwareLimits().MaxJFSDepth, reasons: []string{v1alpha1.ReasonNoNodeFacts}, units: 1, noFactsYet: true},
		{name: "no nodes, rendered before - last known limits", lastKnown: &last, source: v1alpha1.LimitsLastKnown,
			jfs: 100, reasons: []string{v1alpha1.ReasonNoNodeFacts}, units: 1, noFactsYet: true},
		{name: "one group", nodes: []Node{node("n1", gpu, &big), node("n2", gpu, &big)}, source: v1alpha1.LimitsFromNodes,
			jfs: 4096, groupSizes: []int32{2}, units: 1},
		{name: "groups differ - smallest of each", nodes: []Node{node("n1", gpu, &big), node("n2", gpu, &small)}, source: v1alpha1.LimitsFromNodes,
			jfs: 256, reasons: []string{v1alpha1.ReasonNodeGroupsDiffer}, groupSizes: []int32{1, 1}, units: 1},
		{name: "selector leaves out other pools", selector: gpu, nodes: []Node{node("n1", gpu, &big), node("n2", other, &small)},
			source: v1alpha1.LimitsFromNodes, jfs: 4096, groupSizes: []int32{1}, units: 1},
		{name: "pods nodes count even outside the selector", selector: gpu, nodes: []Node{node("n1", gpu, &big), node("n2", other, &small)},
			podNodes: []string{"n2"}, source: v1alpha1.LimitsFromNodes, jfs: 256, reasons: []string{v1alpha1.ReasonNodeGroupsDiffer}, groupSizes: []int32{1, 1}, units: 1},
		{name: "pod on a node without facts", nodes: []Node{node("n1", gpu, &big), node("plain", nil, nil)}, podNodes: []string{"plain"},
			source: v1alpha1.LimitsFromNodes, jfs: 4096, reasons: []string{v1alpha1.ReasonNoNodeFacts, v1alpha1.ReasonNodeGroupsDiffer}, groupSizes: []int32{1, 1}, units: 1},
		{name: "pods only on nodes without facts", nodes: []Node{node("plain", nil, nil)}, podNodes: []string{"plain", "gone"},
			source: v1alpha1.LimitsSoftware, jfs: tuning.SoftwareLimits().MaxJFSDepth, reasons: []string{v1alpha1.ReasonNoNodeFacts}, groupSizes: []int32{1}, units: 1, noFactsYet: true},
		{name: "selected node briefly without facts, no pods - last known limits", selector: gpu, nodes: []Node{node("n1", gpu, &restarting)},
			lastKnown: &last, source: v1alpha1.LimitsLastKnown, jfs: 100, reasons: []string{v1alpha1.ReasonNoNodeFacts}, units: 1, noFactsYet: true},
		{name: "pods node briefly without facts, rendered before - last known limits", selector: gpu, nodes: []Node{node("n1", gpu, &restarting)},
			podNodes: []string{"n1"}, lastKnown: &last, source: v1alpha1.LimitsLastKnown, jfs: 100,
			reasons: []string{v1alpha1.ReasonNoNodeFacts}, groupSizes: []int32{1}, units: 1, noFactsYet: true},
		{name: "pods node without facts, first render - software limits", selector: gpu, nodes: []Node{node("n1", gpu, &restarting)},
			podNodes: []string{"n1"}, source: v1alpha1.LimitsSoftware, jfs: tuning.SoftwareLimits().MaxJFSDepth,
			reasons: []string{v1alpha1.ReasonNoNodeFacts}, groupSizes: []int32{1}, units: 1, noFactsYet: true},
		{name: "one pod node with facts, one without - smallest of the facts and the last known limits",
			nodes: []Node{node("n1", gpu, &big), node("n2", gpu, &restarting)}, podNodes: []string{"n1", "n2"}, lastKnown: &last,
			source: v1alpha1.LimitsFromNodes, jfs: 100, reasons: []string{v1alpha1.ReasonNoNodeFacts, v1alpha1.ReasonNodeGroupsDiffer},
			groupSizes: []int32{1, 1}, units: 1},
		{name: "one pod node with facts, one without - facts smaller than the last known limits",
			nodes: []Node{node("n1", gpu, &small), node("n2", gpu, &restarting)}, podNodes: []string{"n1", "n2"}, lastKnown: &lastBig,
			source: v1alpha1.LimitsFromNodes, jfs: 256, reasons: []string{v1alpha1.ReasonNoNodeFacts, v1alpha1.ReasonNodeGroupsDiffer},
			groupSizes: []int32{1, 1}, units: 1},
		{name: "malformed facts reported, not used", nodes: []Node{node("n1", gpu, &big), malformed}, source: v1alpha1.LimitsFromNodes,
			jfs: 4096, reasons: []string{v1alpha1.ReasonInvalidNodeFacts}, groupSizes: []int32{1}, units: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := spec()
			s.NodeSelector = c.selector
			pl, err := Make(Input{Spec: s, Nodes: c.nodes, PodNodes: c.podNodes, LastKnown: c.lastKnown})
			if err != nil {
				t.Fatal(err)
			}
			if pl.Source != c.source {
				t.Errorf("source %s, want %s", pl.Source, c.source)
			}
			if pl.Limits.MaxJFSDepth != c.jfs {
				t.Errorf("maxJfsDepth %d, want %d", pl.Limits.MaxJFSDepth, c.jfs)
			}
			var reasons []string
			for _, p := range pl.Problems {
				reasons = append(reasons, p.Reason)
			}
			if !reflect.DeepEqual(reasons, c.reasons) {
				t.Errorf("problems %+v, want reasons %v", pl.Problems, c.reasons)
			}
			var sizes []int32
			for _, g := range pl.Groups {
				sizes = append(sizes, g.NodeCount)
			}
			if !reflect.DeepEqual(sizes, c.groupSizes) {
				t.Errorf("group sizes %v, want %v", sizes, c.groupSizes)
			}
			if pl.JettyUnits != c.units {
				t.Errorf("jetty units %d, want %d", pl.JettyUnits, c.units)
			}
			said := len(pl.Problems) > 0 && strings.HasPrefix(pl.Problems[0].Message, "no node facts yet") &&
				strings.Contains(pl.Problems[0].Message, "16 jetties per unit")
			if said != c.noFactsYet {
				t.Errorf("problems %+v: says no node facts yet with the assumed unit: %v, want %v", pl.Problems, said, c.noFactsYet)
			}
			if pl.Hash != Hash(pl.Rendered) || pl.Rendered != pl.Result.Flags.Render() {
				t.Error("hash or rendering inconsistent")
			}
		})
	}
}

// TestMakeKeepsFlagsWhileFactsVanish: the endpoint's pods run on a
// hardware node whose facts disappear for a moment (the device plugin
// restarts and reports device-count=0 until the driver loads; the DRA
// driver republishes its slices). The flags rendered before must stay, so
// pods admitted meanwhile get flags their device accepts.
func TestMakeKeepsFlagsWhileFactsVanish(t *testing.T) {
	s := spec()
	s.NodeSelector = map[string]string{"pool": "a"}
	s.Profile.InflightPerConnection = 1000 // deeper than the device allows: clamped
	pool := map[string]string{"pool": "a"}
	hw := facts(256, 16)
	before, err := Make(Input{Spec: s, Nodes: []Node{node("n1", pool, &hw)}, PodNodes: []string{"n1"}})
	if err != nil {
		t.Fatal(err)
	}
	last := before.Limits
	empty := nodefacts.Facts{}
	for _, c := range []struct {
		name     string
		node     Node
		podNodes []string
	}{
		{"device plugin restarting, no pods", node("n1", pool, &empty), nil},
		{"device plugin restarting, pods on the node", node("n1", pool, &empty), []string{"n1"}},
		{"DRA slices republished, pods on the node", NodeFromFacts("n1", pool, nodefacts.Facts{}, nodefacts.ErrNoFacts), []string{"n1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl, err := Make(Input{Spec: s, Nodes: []Node{c.node}, PodNodes: c.podNodes, LastKnown: &last})
			if err != nil {
				t.Fatal(err)
			}
			if pl.Source != v1alpha1.LimitsLastKnown || pl.Limits != last {
				t.Errorf("source %s limits %v, want %s %v", pl.Source, pl.Limits, v1alpha1.LimitsLastKnown, last)
			}
			if pl.Hash != before.Hash || pl.Result.Flags.SQSize != before.Result.Flags.SQSize {
				t.Errorf("flags re-tuned: hash %s -> %s, sq_size %d -> %d", before.Hash, pl.Hash, before.Result.Flags.SQSize, pl.Result.Flags.SQSize)
			}
			// The condition says which limits stand in for the node's.
			const kept = "the device limits the current flags were tuned against"
			if len(pl.Problems) == 0 || !strings.Contains(pl.Problems[0].Message, kept) || strings.Contains(pl.Problems[0].Message, "software provider's limits are assumed") {
				t.Errorf("problems %+v, want a NoNodeFacts message saying %q", pl.Problems, kept)
			}
		})
	}
}

func TestMakeGroupsMessageAndTruncation(t *testing.T) {
	var nodes []Node
	for i := 0; i < 20; i++ {
		f := facts(uint32(100+i), 16)
		nodes = append(nodes, node(fmt.Sprintf("n%02d", i), nil, &f))
	}
	for i := 0; i < 7; i++ {
		f := facts(4096, 16)
		nodes = append(nodes, node(fmt.Sprintf("same%d", i), nil, &f))
	}
	pl, err := Make(Input{Spec: spec(), Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.Groups) != MaxGroupsInStatus {
		t.Errorf("%d groups in status, want at most %d", len(pl.Groups), MaxGroupsInStatus)
	}
	for _, g := range pl.Groups {
		if len(g.Nodes) > MaxNodesPerGroup {
			t.Errorf("group lists %d nodes", len(g.Nodes))
		}
	}
	msg := pl.Problems[0].Message
	if !strings.Contains(msg, "21 node groups") || !strings.Contains(msg, "same0,same1,same2,same3,same4 and 2 more") {
		t.Errorf("NodeGroupsDiffer message: %s", msg)
	}
	if pl.Limits.MaxJFSDepth != 100 {
		t.Errorf("maxJfsDepth %d, want the smallest (100)", pl.Limits.MaxJFSDepth)
	}
}

func TestListNames(t *testing.T) {
	names := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("n%d", i))
		}
		return out
	}
	for _, tc := range []struct {
		n    int
		want string
	}{
		{1, "n0"},
		{MaxNodesPerGroup, "n0,n1,n2,n3,n4"},
		{MaxNodesPerGroup + 1, "n0,n1,n2,n3,n4 and 1 more"},
	} {
		if got := listNames(names(tc.n)); got != tc.want {
			t.Errorf("listNames of %d names = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestJettyUnitsUseTheSmallestUnit(t *testing.T) {
	a, b := facts(4096, 16), facts(4096, 8)
	s := spec()
	s.JettyBudget = 40
	in := Input{Spec: s, Nodes: []Node{node("a", nil, &a), node("b", nil, &b)}}
	if got := JettyUnits(in); got != 5 {
		t.Errorf("JettyUnits = %d, want ceil(40/8) = 5", got)
	}
	// No facts yet: one unit is not one jetty but the device plugin's unit,
	// or a pod would ask for 16 times what it needs and stay Pending.
	in.Nodes = nil
	if got := JettyUnits(in); got != 3 {
		t.Errorf("JettyUnits without facts = %d, want ceil(40/16) = 3 (the plugin's default unit)", got)
	}
	in.FallbackJettiesPerUnit = 32
	if got := JettyUnits(in); got != 2 {
		t.Errorf("JettyUnits without facts, plugin at 32 per unit = %d, want 2", got)
	}
	// A pod's node without facts has no unit: it is skipped, not taken as
	// the smallest; the unit of the node with facts counts.
	in.Nodes = []Node{node("a", nil, &b), node("plain", nil, nil)}
	in.PodNodes = []string{"plain"}
	if got := JettyUnits(in); got != 5 {
		t.Errorf("JettyUnits with one node without facts = %d, want ceil(40/8) = 5", got)
	}
	in.Nodes = []Node{node("plain", nil, nil)}
	in.PodNodes = []string{"plain"}
	if got := JettyUnits(in); got != 2 {
		t.Errorf("JettyUnits with pods only on nodes without facts = %d, want 2", got)
	}
}

func TestMakeRejectsInvalidOverrides(t *testing.T) {
	for _, tc := range []struct {
		name      string
		overrides map[string]v1alpha1.FlagValue
		wantErr   string
	}{
		{"out of range", map[string]v1alpha1.FlagValue{"urma_poller_num": "100"}, "urma_poller_num"},
		// A newline would render a line of its own into the ConfigMap, which
		// every pod's transport then refuses at startup.
		{"newline in a device name", map[string]v1alpha1.FlagValue{"urma_device": "udma0\n--urma_buffer_count=99999999"},
			`flag urma_device: value "udma0\n--urma_buffer_count=99999999" contains a newline at byte 5`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec()
			s.Overrides = tc.overrides
			pl, err := Make(Input{Spec: s})
			if !errors.Is(err, tuning.ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v (rendered %q), want an ErrInvalid containing %q", err, pl.Rendered, tc.wantErr)
			}
		})
	}
}

// A nodeSelector that no label can match is refused, naming each bad key
// and value, rather than silently matching no node.
func TestMakeRejectsInvalidNodeSelector(t *testing.T) {
	for _, tc := range []struct {
		name string
		sel  map[string]string
		want []string // each in the error
	}{
		{"space in a key", map[string]string{"zone a": "x"}, []string{`nodeSelector: key "zone a": name part must consist of`}},
		{"slash in a value", map[string]string{"zone": "a/b"}, []string{`nodeSelector: value "a/b" of key "zone": a valid label must be`}},
		{"every problem named", map[string]string{"-k": "v", "ok": "-v"}, []string{`key "-k": `, `; value "-v" of key "ok": `}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec()
			s.NodeSelector = tc.sel
			pl, err := Make(Input{Spec: s})
			if !errors.Is(err, tuning.ErrInvalid) {
				t.Fatalf("error %v (rendered %q), want an ErrInvalid", err, pl.Rendered)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	s := spec()
	s.NodeSelector = map[string]string{"urma.openeuler.org/group": "a", "zone": ""}
	if _, err := Make(Input{Spec: s}); err != nil {
		t.Errorf("a valid nodeSelector refused: %v", err)
	}
}

func TestLimitsEncoding(t *testing.T) {
	l := tuning.Limits{MaxJFSDepth: 1, MaxJFRDepth: 2, MaxJFCDepth: 3, MaxMsgSize: 4, JettiesPerDevice: 5, DeviceCount: 6}
	got, err := DecodeLimits(EncodeLimits(l))
	if err != nil || got != l {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "{", `{"maxJfsDepth":0,"maxJfrDepth":1,"maxJfcDepth":1,"maxMsgSize":1}`} {
		if _, err := DecodeLimits(bad); err == nil {
			t.Errorf("DecodeLimits(%q) accepted", bad)
		}
	}
}

func TestHash(t *testing.T) {
	a, b := Hash("--urma_sq_size=16\n"), Hash("--urma_sq_size=32\n")
	if len(a) != 16 || a == b || a != Hash("--urma_sq_size=16\n") {
		t.Errorf("Hash: %q %q", a, b)
	}
}

// TestExamplesRenderAsDocumented keeps docs/operator.md's numbers true.
func TestExamplesRenderAsDocumented(t *testing.T) {
	hardware := tuning.Limits{MaxJFSDepth: 1024, MaxJFRDepth: 1024, MaxJFCDepth: 2048, MaxMsgSize: 1 << 20, JettiesPerDevice: 960, DeviceCount: 2}
	cases := []struct {
		file    string
		limits  tuning.Limits
		want    map[string]string
		clamped []string
	}{
		{file: "latency", limits: hardware, want: map[string]string{
			"urma_buffer_size": "2048", "urma_sq_size": "35", "urma_rq_size": "35", "urma_buffer_count": "1120",
			"urma_use_polling": "true", "urma_poller_num": "2", "urma_cqe_poll_once": "16", "urma_zerocopy_min_size": "2048",
			"urma_prepared_jetty_cnt": "16"}},
		{file: "throughput", limits: hardware, want: map[string]string{
			"urma_buffer_size": "1048576", "urma_sq_size": "35", "urma_rq_size": "35", "urma_buffer_count": "280",
			"urma_use_polling": "false", "urma_cqe_poll_once": "64"},
			clamped: []string{"urma_buffer_size 4194304 -> 1048576 (device maxMsgSize 1048576)"}},
		{file: "throughput", limits: tuning.SoftwareLimits(), want: map[string]string{
			"urma_buffer_size": "4194304", "urma_sq_size": "16", "urma_buffer_count": "128"}},
		{file: "balanced", limits: hardware, want: map[string]string{
			"urma_buffer_size": "16384", "urma_sq_size": "35", "urma_buffer_count": "560", "urma_use_polling": "false",
			"urma_client_handshake_version": "3", "urma_bonding_mode": "1", "urma_bonding_level": "1",
			"urma_prepared_jetty_cnt": "4", "urma_cqe_poll_once": "16"}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "urmaendpoint-"+c.file+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var ep v1alpha1.UrmaEndpoint
			if err := yaml.UnmarshalStrict(raw, &ep); err != nil {
				t.Fatalf("example does not decode: %v", err)
			}
			r, err := tuning.Derive(Profile(ep.Spec), Overrides(ep.Spec), c.limits)
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range c.want {
				if got, _ := r.Flags.Get(name); got != want {
					t.Errorf("%s = %s, docs say %s", name, got, want)
				}
			}
			var clamps []string
			for _, cl := range r.Clamps {
				clamps = append(clamps, cl.String())
			}
			if !reflect.DeepEqual(clamps, c.clamped) {
				t.Errorf("clamps %q, docs say %q", clamps, c.clamped)
			}
		})
	}
}
