// Package plan decides what an UrmaEndpoint should render: it turns the spec
// into a tuning profile, groups the relevant nodes by their device limits,
// picks the limits to tune against and runs internal/operator/tuning. Make
// is pure; Observe does the reads Make needs. Both the reconciler and the
// admission webhook use it, so a warning at admission and a condition in
// status say the same.
package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/operator/tuning"
)

// MaxGroupsInStatus and MaxNodesPerGroup bound what status lists.
const (
	MaxGroupsInStatus = 16
	MaxNodesPerGroup  = 5
)

// Node is one node as far as tuning is concerned.
type Node struct {
	Name   string
	Labels map[string]string
	// Limits are the node's device limits; nil when it reports no usable
	// facts (no annotations, no devices, or malformed ones: see FactsErr).
	Limits *tuning.Limits
	// FactsErr is set when the node's annotations are present but invalid.
	FactsErr error
	// JettiesPerUnit is how many jetties one unit of the
	// urma.openeuler.org/jetty resource stands for on this node (0: unknown).
	JettiesPerUnit int64
}

// NodeFromAnnotations parses a node's URMA facts (internal/nodefacts) from its
// annotations, which the device plugin writes, or, on a node without them,
// from its labels: Node Feature Discovery publishes the plugin's feature
// file (--nfd-features-dir) as labels of the same names, so a plugin that
// is not allowed to patch Nodes still informs the operator.
func NodeFromAnnotations(name string, nodeLabels, annotations map[string]string) Node {
	f, err := nodefacts.Parse(annotations)
	if errors.Is(err, nodefacts.ErrNoFacts) {
		f, err = nodefacts.Parse(nodeLabels)
	}
	return NodeFromFacts(name, nodeLabels, f, err)
}

// NodeFromFacts is a node with facts read by the device plugin's
// annotations or from the DRA driver's ResourceSlices; err is the reading's
// error (nodefacts.ErrNoFacts: none published).
func NodeFromFacts(name string, nodeLabels map[string]string, f nodefacts.Facts, err error) Node {
	n := Node{Name: name, Labels: nodeLabels}
	switch {
	case errors.Is(err, nodefacts.ErrNoFacts):
	case err != nil:
		n.FactsErr = err
	case f.Present():
		l := LimitsFromFacts(f)
		n.Limits = &l
		n.JettiesPerUnit = int64(f.JettiesPerUnit)
	}
	return n
}

// LimitsFromFacts converts the device plugin's facts to tuning limits.
func LimitsFromFacts(f nodefacts.Facts) tuning.Limits {
	return tuning.Limits{
		MaxJFSDepth:      int64(f.MaxJFSDepth),
		MaxJFRDepth:      int64(f.MaxJFRDepth),
		MaxJFCDepth:      int64(f.MaxJFCDepth),
		MaxMsgSize:       int64(min(f.MaxMsgSize, 1<<62)),
		JettiesPerDevice: int64(f.JettiesPerDevice),
		DeviceCount:      int64(f.DeviceCount),
	}
}

// Input is everything Make looks at.
type Input struct {
	Spec v1alpha1.UrmaEndpointSpec
	// Nodes is every node in the cluster (metadata only).
	Nodes []Node
	// PodNodes names the nodes the endpoint's pods are scheduled on.
	PodNodes []string
	// LastKnown are the limits the current ConfigMap was rendered with, if any.
	LastKnown *tuning.Limits
	// FallbackJettiesPerUnit is the jetties per unit assumed when no
	// relevant node has published facts; 0 means the device plugin's
	// default (nodefacts.DefaultJettiesPerUnit).
	FallbackJettiesPerUnit int64
}

// Problem is one reason the flags were rendered with less than full
// information; it becomes the Degraded condition.
type Problem struct {
	Reason  string
	Message string
}

// Plan is what the endpoint should render.
type Plan struct {
	Result tuning.Result
	// Rendered is the flags file (flags.Render).
	Rendered string
	// Hash identifies Rendered.
	Hash   string
	Limits tuning.Limits
	Source v1alpha1.LimitsSource
	Groups []v1alpha1.NodeGroup
	// Problems, most important first.
	Problems []Problem
	// JettyUnits is how many units of urma.openeuler.org/jetty a pod
	// requests so that it gets at least JettyBudget jetties on any of the
	// relevant nodes (see JettyUnits).
	JettyUnits int64
}

// Profile converts the spec's traffic description to tuning's.
func Profile(spec v1alpha1.UrmaEndpointSpec) tuning.Profile {
	p := tuning.Profile{
		MessageSize:           bytes(spec.Profile.MessageSize),
		ConnectionsPerPod:     int64(spec.Profile.ConnectionsPerPod),
		InflightPerConnection: int64(spec.Profile.InflightPerConnection),
		Objective:             tuning.Objective(spec.Profile.Objective),
		JettyBudget:           int64(spec.JettyBudget),
		Completion:            tuning.Completion(spec.Completion),
		HandshakeVersion:      int64(spec.HandshakeVersion),
	}
	// Defaults the API server applies, for objects that skipped defaulting
	// (e.g. built in Go by a test or another controller).
	if p.ConnectionsPerPod == 0 {
		p.ConnectionsPerPod = 1
	}
	if p.InflightPerConnection == 0 {
		p.InflightPerConnection = 32
	}
	if spec.Profile.MaxMessageSize != nil {
		p.MaxMessageSize = bytes(*spec.Profile.MaxMessageSize)
	}
	if spec.Profile.MemoryBudget != nil {
		p.MemoryBudget = bytes(*spec.Profile.MemoryBudget)
	}
	if b := spec.Bonding; b != nil {
		switch b.Mode {
		case v1alpha1.BondingActiveBackup:
			p.BondingMode = 1
		case v1alpha1.BondingBalance:
			p.BondingMode = 2
		}
		if b.Level == v1alpha1.BondingLevelPort {
			p.BondingLevel = 1
		}
	}
	return p
}

// bytes is q in bytes, saturated to the int64 range: Quantity.Value of a
// quantity past int64 is 0 or wraps (a 100E memoryBudget would read as no
// cap), where a saturated value fails tuning.ValidateProfile's bounds.
func bytes(q resource.Quantity) int64 {
	switch {
	case q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.BinarySI)) > 0:
		return math.MaxInt64
	case q.Cmp(*resource.NewQuantity(math.MinInt64, resource.BinarySI)) < 0:
		return math.MinInt64
	}
	return q.Value()
}

// Overrides converts the spec's overrides to plain strings.
func Overrides(spec v1alpha1.UrmaEndpointSpec) map[string]string {
	if len(spec.Overrides) == 0 {
		return nil
	}
	o := make(map[string]string, len(spec.Overrides))
	for k, v := range spec.Overrides {
		o[k] = string(v)
	}
	return o
}

// Hash identifies a rendered flags file: the first 16 hex digits of its
// SHA-256, short enough for a printer column, long enough never to collide
// between two versions of one endpoint.
func Hash(rendered string) string {
	sum := sha256.Sum256([]byte(rendered))
	return hex.EncodeToString(sum[:8])
}

// EncodeLimits and DecodeLimits store limits in a ConfigMap annotation.
func EncodeLimits(l tuning.Limits) string {
	b, _ := json.Marshal(toAPI(l)) // plain struct of ints: cannot fail
	return string(b)
}

// DecodeLimits reads what EncodeLimits wrote; it fails on anything else.
func DecodeLimits(s string) (tuning.Limits, error) {
	var d v1alpha1.DeviceLimits
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		return tuning.Limits{}, fmt.Errorf("decode device limits %q: %w", s, err)
	}
	l := fromAPI(d)
	if err := l.Validate(); err != nil {
		return tuning.Limits{}, fmt.Errorf("decode device limits %q: %w", s, err)
	}
	return l, nil
}

// ToAPI converts limits for status.
func ToAPI(l tuning.Limits) *v1alpha1.DeviceLimits { d := toAPI(l); return &d }

func toAPI(l tuning.Limits) v1alpha1.DeviceLimits {
	return v1alpha1.DeviceLimits{
		MaxJFSDepth: l.MaxJFSDepth, MaxJFRDepth: l.MaxJFRDepth, MaxJFCDepth: l.MaxJFCDepth,
		MaxMsgSize: l.MaxMsgSize, JettiesPerDevice: l.JettiesPerDevice, DeviceCount: l.DeviceCount,
	}
}

func fromAPI(d v1alpha1.DeviceLimits) tuning.Limits {
	return tuning.Limits{
		MaxJFSDepth: d.MaxJFSDepth, MaxJFRDepth: d.MaxJFRDepth, MaxJFCDepth: d.MaxJFCDepth,
		MaxMsgSize: d.MaxMsgSize, JettiesPerDevice: d.JettiesPerDevice, DeviceCount: d.DeviceCount,
	}
}

// group is a set of nodes with identical limits (nil: no usable facts).
type group struct {
	limits *tuning.Limits
	nodes  []string
}

// Make decides the flags. It fails (wrapping tuning.ErrInvalid) only when the
// spec is wrong on its face, e.g. an override out of range that the CRD's
// rules do not cover.
func Make(in Input) (Plan, error) {
	if err := ValidateNodeSelector(in.Spec.NodeSelector); err != nil {
		return Plan{}, fmt.Errorf("%w: %w", tuning.ErrInvalid, err)
	}
	groups, invalid := selectNodes(in)
	var pl Plan
	switch {
	case len(groups) == 0 && in.LastKnown != nil:
		pl.Limits, pl.Source = *in.LastKnown, v1alpha1.LimitsLastKnown
		pl.Problems = append(pl.Problems, Problem{v1alpha1.ReasonNoNodeFacts, fmt.Sprintf(
			"no node facts yet: no node with URMA device facts matches; keeping the device limits the current flags were tuned against; %s",
			assumedUnit(in))})
	case len(groups) == 0:
		pl.Limits, pl.Source = tuning.SoftwareLimits(), v1alpha1.LimitsSoftware
		pl.Problems = append(pl.Problems, Problem{v1alpha1.ReasonNoNodeFacts, fmt.Sprintf(
			"no node facts yet: no node with URMA device facts matches; tuned against the software provider's limits; %s",
			assumedUnit(in))})
	default:
		// Nodes without facts are assumed to have the software provider's
		// limits, unless the current ConfigMap recorded limits: a node that
		// ran the endpoint's pods and now publishes nothing is far more
		// likely a device plugin or DRA driver restarting (device-count=0
		// until the driver loads, slices being republished) than a node
		// that lost its hardware, and re-tuning against the software
		// limits (queues far deeper than any device's) would hand pods
		// admitted meanwhile flags they cannot use. The recorded limits
		// were the minimum over every group then, so where some groups
		// still have facts the minimum with them is never looser than the
		// current flags (Source stays NodeFacts, and what is recorded is
		// that minimum). The cost: while a node without facts stays
		// relevant, limits that grow elsewhere are not followed until it
		// publishes facts again or its pods leave; the NoNodeFacts problem
		// says so.
		noFacts, noFactsSource := tuning.SoftwareLimits(), v1alpha1.LimitsSoftware
		if in.LastKnown != nil {
			noFacts, noFactsSource = *in.LastKnown, v1alpha1.LimitsLastKnown
		}
		pl.Source = noFactsSource
		first := true
		for _, g := range groups {
			l := noFacts
			if g.limits != nil {
				l = *g.limits
				pl.Source = v1alpha1.LimitsFromNodes
			}
			if first {
				pl.Limits, first = l, false
			} else {
				pl.Limits = pl.Limits.Min(l)
			}
		}
		if last := groups[len(groups)-1]; last.limits == nil {
			assumed := "the software provider's limits are assumed there"
			if noFactsSource == v1alpha1.LimitsLastKnown {
				assumed = "the device limits the current flags were tuned against are kept for them"
			}
			msg := fmt.Sprintf("pods run on %d node(s) without URMA device facts (%s); %s",
				len(last.nodes), listNames(last.nodes), assumed)
			if pl.Source != v1alpha1.LimitsFromNodes {
				msg = "no node facts yet: " + msg + "; " + assumedUnit(in)
			}
			pl.Problems = append(pl.Problems, Problem{v1alpha1.ReasonNoNodeFacts, msg})
		}
	}
	if len(invalid) > 0 {
		pl.Problems = append(pl.Problems, Problem{v1alpha1.ReasonInvalidNodeFacts, fmt.Sprintf(
			"node(s) with malformed URMA facts are ignored: %s", strings.Join(invalid, "; "))})
	}
	if len(groups) > 1 {
		desc := make([]string, 0, len(groups))
		for _, g := range groups {
			l := "no facts"
			if g.limits != nil {
				l = g.limits.String()
			}
			desc = append(desc, fmt.Sprintf("[%s: %s]", listNames(g.nodes), l))
		}
		pl.Problems = append(pl.Problems, Problem{v1alpha1.ReasonNodeGroupsDiffer, fmt.Sprintf(
			"%d node groups report different device limits; one flag set serves every pod, so it uses the smallest of each limit: %s",
			len(groups), strings.Join(desc, " "))})
	}
	pl.Groups = statusGroups(groups)
	pl.JettyUnits = jettyUnits(int64(in.Spec.JettyBudget), groups, in.Nodes, fallbackUnit(in))

	res, err := tuning.Derive(Profile(in.Spec), Overrides(in.Spec), pl.Limits)
	if err != nil {
		return Plan{}, fmt.Errorf("derive flags: %w", err)
	}
	if len(res.Warnings) > 0 {
		pl.Problems = append(pl.Problems, Problem{v1alpha1.ReasonHardwareWarnings, strings.Join(res.Warnings, "; ")})
	}
	pl.Result = res
	pl.Rendered = res.Flags.Render()
	pl.Hash = Hash(pl.Rendered)
	return pl, nil
}

// JettyUnits is how many units of urma.openeuler.org/jetty each URMA
// container of this endpoint requests: the device plugin advertises jetties
// in units of JettiesPerUnit, which may differ between nodes, so a container
// asks for ceil(jettyBudget / smallest unit) units and gets at least its
// budget wherever it lands. Before any relevant node has published facts,
// the unit is the device plugin's (FallbackJettiesPerUnit): counting one
// unit as one jetty would ask for 16 times too many and leave pods Pending.
func JettyUnits(in Input) int64 {
	groups, _ := selectNodes(in)
	return jettyUnits(int64(in.Spec.JettyBudget), groups, in.Nodes, fallbackUnit(in))
}

// fallbackUnit is the jetties per unit assumed without facts.
func fallbackUnit(in Input) int64 {
	if in.FallbackJettiesPerUnit > 0 {
		return in.FallbackJettiesPerUnit
	}
	return nodefacts.DefaultJettiesPerUnit
}

// assumedUnit says which unit a pod's request was computed with.
func assumedUnit(in Input) string {
	return fmt.Sprintf("each container's jetty request assumes the device plugin's %d jetties per unit", fallbackUnit(in))
}

func jettyUnits(budget int64, groups []group, nodes []Node, fallback int64) int64 {
	perUnit := map[string]int64{}
	for _, n := range nodes {
		perUnit[n.Name] = n.JettiesPerUnit
	}
	var smallest int64
	for _, g := range groups {
		for _, name := range g.nodes {
			if u := perUnit[name]; u > 0 && (smallest == 0 || u < smallest) {
				smallest = u
			}
		}
	}
	if smallest <= 0 {
		smallest = fallback
	}
	return max(1, (budget+smallest-1)/smallest)
}

// ValidateNodeSelector checks spec.nodeSelector as labels: a key or value
// no label can have would silently match no node (the CRD only says it is a
// map of strings).
func ValidateNodeSelector(sel map[string]string) error {
	var bad []string
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		for _, e := range validation.IsQualifiedName(k) {
			bad = append(bad, fmt.Sprintf("key %q: %s", k, e))
		}
		for _, e := range validation.IsValidLabelValue(sel[k]) {
			bad = append(bad, fmt.Sprintf("value %q of key %q: %s", sel[k], k, e))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("nodeSelector: %s", strings.Join(bad, "; "))
	}
	return nil
}

// selectNodes returns the groups of relevant nodes (those with facts that
// match the node selector, and those running the endpoint's pods), groups
// with facts first (sorted by their limits' text), the no-facts group last;
// and the relevant nodes whose facts are malformed, which never count as
// having facts.
func selectNodes(in Input) ([]group, []string) {
	byName := make(map[string]Node, len(in.Nodes))
	for _, n := range in.Nodes {
		byName[n.Name] = n
	}
	sel := labels.SelectorFromSet(in.Spec.NodeSelector)
	chosen := map[string]bool{}
	reported := map[string]bool{}
	for _, n := range in.Nodes {
		if !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		if n.Limits != nil {
			chosen[n.Name] = true
		}
		if n.FactsErr != nil {
			reported[n.Name] = true
		}
	}
	for _, name := range in.PodNodes {
		if n, ok := byName[name]; ok {
			chosen[name] = true
			if n.FactsErr != nil {
				reported[name] = true
			}
		}
	}
	var invalid []string
	for _, name := range sortedSet(reported) {
		invalid = append(invalid, fmt.Sprintf("%s: %v", name, byName[name].FactsErr))
	}
	keyed := map[string]*group{}
	var noFacts *group
	for _, name := range sortedSet(chosen) {
		n := byName[name]
		if n.Limits == nil {
			if noFacts == nil {
				noFacts = &group{}
			}
			noFacts.nodes = append(noFacts.nodes, name)
			continue
		}
		k := n.Limits.String()
		g, ok := keyed[k]
		if !ok {
			l := *n.Limits
			g = &group{limits: &l}
			keyed[k] = g
		}
		g.nodes = append(g.nodes, name)
	}
	out := make([]group, 0, len(keyed)+1)
	for _, k := range sortedKeys(keyed) {
		out = append(out, *keyed[k])
	}
	if noFacts != nil {
		out = append(out, *noFacts)
	}
	return out, invalid
}

func statusGroups(groups []group) []v1alpha1.NodeGroup {
	var out []v1alpha1.NodeGroup
	for _, g := range groups {
		if len(out) == MaxGroupsInStatus {
			break
		}
		ng := v1alpha1.NodeGroup{NodeCount: int32(len(g.nodes))}
		if g.limits != nil {
			ng.Limits = ToAPI(*g.limits)
		}
		ng.Nodes = append([]string(nil), g.nodes[:min(len(g.nodes), MaxNodesPerGroup)]...)
		out = append(out, ng)
	}
	return out
}

// listNames shows up to MaxNodesPerGroup names and how many more.
func listNames(names []string) string {
	if len(names) <= MaxNodesPerGroup {
		return strings.Join(names, ",")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:MaxNodesPerGroup], ","), len(names)-MaxNodesPerGroup)
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
