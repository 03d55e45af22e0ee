// Package nodefacts names the labels and annotations the URMA device plugin
// puts on a Node, and turns a Node's annotations back into validated Facts.
//
// It is the contract between the device plugin (which writes the facts) and
// the operator (which tunes per-node settings against them), so it imports
// nothing but the standard library: both sides can depend on it.
package nodefacts

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Prefix is the domain every URMA label and annotation key lives under.
const Prefix = "urma.openeuler.org/"

// ResourceName is the extended resource the device plugin advertises; one
// unit of it is JettiesPerUnit jetties on one device.
const ResourceName = Prefix + "jetty"

// DefaultJettiesPerUnit is the device plugin's default JettiesPerUnit; the
// operator assumes it for nodes that have not published facts yet.
const DefaultJettiesPerUnit = 16

// Label keys (values are label-safe: "true"/"false" and decimal numbers).
const (
	// LabelPresent is "true" when the node advertises at least one URMA device
	// (hardware or software), "false" otherwise.
	LabelPresent = Prefix + "present"
	// LabelDeviceCount is the number of devices the plugin advertises.
	LabelDeviceCount = Prefix + "device-count"
	// LabelSoftware is "true" when the advertised devices are software-provider
	// devices (no UB hardware).
	LabelSoftware = Prefix + "software"
	// LabelHostLiburma is "true" when a container given one of the node's
	// UB devices gets the host's liburma injected (the agent found it and
	// injection is on), "false" otherwise: its image must bring liburma.
	LabelHostLiburma = Prefix + "host-liburma"
	// LabelSoftLiburma is "true" when a container given a software device
	// gets urma-k8s's liburma over the software provider injected.
	LabelSoftLiburma = Prefix + "soft-liburma"
)

// Annotation keys. Capability values are the minimum over the node's
// advertised devices, because a pod may land on any of them.
const (
	AnnotationDeviceCount      = Prefix + "device-count"
	AnnotationSoftware         = Prefix + "software"
	AnnotationMaxJFSDepth      = Prefix + "max-jfs-depth"
	AnnotationMaxJFRDepth      = Prefix + "max-jfr-depth"
	AnnotationMaxJFCDepth      = Prefix + "max-jfc-depth"
	AnnotationMaxMsgSize       = Prefix + "max-msg-size"
	AnnotationJettiesPerDevice = Prefix + "jetties-per-device"
	AnnotationJettiesPerUnit   = Prefix + "jetties-per-unit"
)

// AnnotationKeys lists every annotation key this package writes, so that a
// writer can remove stale ones and a reader can tell "no facts" apart.
func AnnotationKeys() []string {
	return []string{
		AnnotationDeviceCount, AnnotationSoftware, AnnotationMaxJFSDepth,
		AnnotationMaxJFRDepth, AnnotationMaxJFCDepth, AnnotationMaxMsgSize,
		AnnotationJettiesPerDevice, AnnotationJettiesPerUnit,
	}
}

// LabelKeys lists every label key this package writes.
func LabelKeys() []string {
	return []string{LabelPresent, LabelDeviceCount, LabelSoftware, LabelHostLiburma, LabelSoftLiburma}
}

// ErrNoFacts is returned by Parse when a node carries none of the annotations:
// the device plugin has not (yet) run there. It is not a validation failure.
var ErrNoFacts = errors.New("node has no " + Prefix + " annotations")

// Facts is what the device plugin knows about a node's URMA devices.
type Facts struct {
	// DeviceCount is the number of advertised devices; zero means none.
	DeviceCount int
	// Software is true when the devices are software-provider devices.
	Software bool
	// MaxJFSDepth, MaxJFRDepth and MaxJFCDepth are the smallest queue depth
	// limits among the devices (send queue, receive queue, completion queue).
	MaxJFSDepth uint32
	MaxJFRDepth uint32
	MaxJFCDepth uint32
	// MaxMsgSize is the smallest maximum message size among the devices, in bytes.
	MaxMsgSize uint64
	// JettiesPerDevice is the smallest jetty budget (jetties, not units) among
	// the devices.
	JettiesPerDevice uint32
	// JettiesPerUnit is how many jetties one unit of ResourceName stands for.
	JettiesPerUnit uint32
	// HostLiburma and SoftLiburma say which liburma containers get
	// injected (LabelHostLiburma, LabelSoftLiburma); labels only.
	HostLiburma, SoftLiburma bool
}

// Present reports whether the node advertises any URMA device.
func (f Facts) Present() bool { return f.DeviceCount > 0 }

// Validate checks the facts are internally consistent. A node without
// devices needs no capabilities; a node with devices must report all of them.
func (f Facts) Validate() error {
	var problems []string
	if f.DeviceCount < 0 {
		problems = append(problems, fmt.Sprintf("%s is negative (%d)", AnnotationDeviceCount, f.DeviceCount))
	}
	if f.DeviceCount > 0 {
		for _, c := range []struct {
			key string
			v   uint64
		}{
			{AnnotationMaxJFSDepth, uint64(f.MaxJFSDepth)},
			{AnnotationMaxJFRDepth, uint64(f.MaxJFRDepth)},
			{AnnotationMaxJFCDepth, uint64(f.MaxJFCDepth)},
			{AnnotationMaxMsgSize, f.MaxMsgSize},
			{AnnotationJettiesPerUnit, uint64(f.JettiesPerUnit)},
		} {
			if c.v == 0 {
				problems = append(problems, fmt.Sprintf("%s must be positive when %s is %d", c.key, AnnotationDeviceCount, f.DeviceCount))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid node facts: %s", strings.Join(problems, "; "))
	}
	return nil
}

// Labels renders the node labels for these facts.
func (f Facts) Labels() map[string]string {
	return map[string]string{
		LabelPresent:     strconv.FormatBool(f.Present()),
		LabelDeviceCount: strconv.Itoa(f.DeviceCount),
		LabelSoftware:    strconv.FormatBool(f.Software),
		LabelHostLiburma: strconv.FormatBool(f.HostLiburma),
		LabelSoftLiburma: strconv.FormatBool(f.SoftLiburma),
	}
}

// Annotations renders the node annotations for these facts. A node without
// devices gets only the count and software flag; the capability keys are
// absent (a writer should delete them, see AnnotationKeys).
func (f Facts) Annotations() map[string]string {
	a := map[string]string{
		AnnotationDeviceCount: strconv.Itoa(f.DeviceCount),
		AnnotationSoftware:    strconv.FormatBool(f.Software),
	}
	if f.DeviceCount == 0 {
		return a
	}
	a[AnnotationMaxJFSDepth] = strconv.FormatUint(uint64(f.MaxJFSDepth), 10)
	a[AnnotationMaxJFRDepth] = strconv.FormatUint(uint64(f.MaxJFRDepth), 10)
	a[AnnotationMaxJFCDepth] = strconv.FormatUint(uint64(f.MaxJFCDepth), 10)
	a[AnnotationMaxMsgSize] = strconv.FormatUint(f.MaxMsgSize, 10)
	a[AnnotationJettiesPerDevice] = strconv.FormatUint(uint64(f.JettiesPerDevice), 10)
	a[AnnotationJettiesPerUnit] = strconv.FormatUint(uint64(f.JettiesPerUnit), 10)
	return a
}

// Parse turns a Node's annotations into Facts and validates them. It returns
// ErrNoFacts when none of the keys is present, and otherwise an error naming
// every key whose value is missing or malformed. Keys outside Prefix are
// ignored, and so are capability keys when the device count is 0: such a
// node has no capabilities, whatever is left in them.
func Parse(annotations map[string]string) (Facts, error) {
	found := false
	for _, k := range AnnotationKeys() {
		if _, ok := annotations[k]; ok {
			found = true
			break
		}
	}
	if !found {
		return Facts{}, ErrNoFacts
	}

	p := parser{annotations: annotations}
	var f Facts
	count := p.uint(AnnotationDeviceCount, 31, true)
	countKnown := len(p.problems) == 0
	f.DeviceCount = int(count)
	f.Software = p.bool(AnnotationSoftware)
	// Capabilities left over from when the node had devices (the device
	// plugin deletes them; a hand edit leaves them) describe nothing on a
	// node without devices: they are not read, so that a malformed one
	// cannot make an empty node's facts unreadable. They are read when the
	// count itself is bad, so that the error names every bad key at once.
	if needCaps := count > 0; needCaps || !countKnown {
		f.MaxJFSDepth = uint32(p.uint(AnnotationMaxJFSDepth, 32, needCaps))
		f.MaxJFRDepth = uint32(p.uint(AnnotationMaxJFRDepth, 32, needCaps))
		f.MaxJFCDepth = uint32(p.uint(AnnotationMaxJFCDepth, 32, needCaps))
		f.MaxMsgSize = p.uint(AnnotationMaxMsgSize, 64, needCaps)
		f.JettiesPerDevice = uint32(p.uint(AnnotationJettiesPerDevice, 32, needCaps))
		f.JettiesPerUnit = uint32(p.uint(AnnotationJettiesPerUnit, 32, needCaps))
	}
	if len(p.problems) > 0 {
		sort.Strings(p.problems)
		return Facts{}, fmt.Errorf("parse node facts: %s", strings.Join(p.problems, "; "))
	}
	if err := f.Validate(); err != nil {
		return Facts{}, err
	}
	return f, nil
}

type parser struct {
	annotations map[string]string
	problems    []string
}

func (p *parser) uint(key string, bits int, required bool) uint64 {
	s, ok := p.annotations[key]
	if !ok {
		if required {
			p.problems = append(p.problems, key+" is missing")
		}
		return 0
	}
	v, err := strconv.ParseUint(strings.TrimSpace(s), 10, bits)
	if err != nil {
		p.problems = append(p.problems, fmt.Sprintf("%s=%q is not an unsigned %d-bit decimal number", key, s, bits))
		return 0
	}
	return v
}

func (p *parser) bool(key string) bool {
	s, ok := p.annotations[key]
	if !ok {
		return false
	}
	v, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		p.problems = append(p.problems, fmt.Sprintf("%s=%q is not true or false", key, s))
		return false
	}
	return v
}
