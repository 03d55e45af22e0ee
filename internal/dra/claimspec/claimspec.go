// Package claimspec writes one Container Device Interface spec per prepared
// ResourceClaim: the device nodes of the URMA devices the claim was given,
// and the environment pkg/transport reads (URMA_DEVICE, URMA_EID,
// URMA_JETTY_BUDGET = the jetties the claim consumed, ...), plus the host's
// shm directory where the shm fabric exists.
//
// A spec per claim (named after the claim's UID) lets NodeUnprepareResources
// remove exactly what NodePrepareResources wrote, and its CDI device names
// are never reused, so a runtime's cached spec can never be stale.
package claimspec

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/openeuler/urma-k8s/internal/node/libinject"
	"github.com/openeuler/urma-k8s/internal/node/shmdir"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

// Defaults.
const (
	DefaultDir  = "/var/run/cdi"
	DefaultKind = "urma.openeuler.org/claim"
)

// Config says where specs go and what every container gets.
type Config struct {
	// Dir is the CDI spec directory the container runtime reads.
	Dir string
	// Kind is "<vendor>/<class>" of the CDI devices.
	Kind string
	// ShmDir, when set, is bind-mounted (same path) into every container
	// and named by URMA_SHM_DIR.
	ShmDir string
	// Libs is the liburma a claim's containers get for C programs: the
	// host's when the claim has a UB device, the software one otherwise.
	Libs libinject.Set
}

// Validate checks the directory and kind.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("CDI spec directory is empty")
	}
	if !filepath.IsAbs(c.Dir) {
		// The container runtime looks for specs in its own absolute
		// directories, never relative to this process.
		return fmt.Errorf("CDI spec directory %q must be an absolute path", c.Dir)
	}
	vendor, class := parser.ParseQualifier(c.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return fmt.Errorf("CDI kind %q: %w", c.Kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return fmt.Errorf("CDI kind %q: %w", c.Kind, err)
	}
	if c.ShmDir != "" {
		if err := shmdir.Check(c.ShmDir); err != nil {
			return err
		}
	}
	return nil
}

// Device is one allocated share as the spec describes it.
type Device struct {
	// Name is the DRA device name (a DNS label); CDI names derive from it.
	Name string
	// URMADevice is the URMA device name (URMA_DEVICE).
	URMADevice string
	// EID is the device's lowest-index EID, "" for software devices.
	EID string
	// Jetties is the consumed capacity.
	Jetties int64
	// Software marks a software-provider device: no device node.
	Software bool
	// DevNodes are host /dev/... paths the container needs for it
	// (/dev/uburma/<dev>, /dev/ummu/tid).
	DevNodes []string
}

// Writer writes and removes the specs.
type Writer struct {
	cfg   Config
	cache *cdi.Cache
}

// New returns a writer; the directory is created if missing.
func New(cfg Config) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI spec directory: %w", err)
	}
	// Errors from NewCache are about other vendors' files in the
	// directory; this writer only writes and removes its own.
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(cfg.Dir), cdi.WithAutoRefresh(false))
	return &Writer{cfg: cfg, cache: cache}, nil
}

// DeviceID is the qualified CDI name of a claim's share of a device.
func (w *Writer) DeviceID(claimUID, device string) string {
	vendor, class := parser.ParseQualifier(w.cfg.Kind)
	return parser.QualifiedName(vendor, class, cdiName(claimUID, device))
}

func cdiName(claimUID, device string) string { return claimUID + "-" + device }

// FileName is the spec file of a claim in the spec directory.
func (w *Writer) FileName(claimUID string) string {
	vendor, class := parser.ParseQualifier(w.cfg.Kind)
	return cdi.GenerateTransientSpecName(vendor, class, claimUID) + ".yaml"
}

// Build renders a claim's spec. Each share is a CDI device carrying its
// device nodes and the environment, which describes the whole claim (the
// same on every device, so a container gets it whichever of the claim's
// devices it is given; the runtime replaces equal keys): URMA_DEVICE is the device with the most jetties (ties: by name),
// URMA_JETTY_BUDGET its jetties, URMA_DEVICES every device when there are
// several, as the device plugin does.
func (w *Writer) Build(claimUID string, devs []Device) (*specs.Spec, error) {
	if len(devs) == 0 {
		return nil, fmt.Errorf("claim %s: no devices to describe", claimUID)
	}
	perDevice := map[string]int64{}
	var order []string
	for _, d := range devs {
		if _, ok := perDevice[d.URMADevice]; !ok {
			order = append(order, d.URMADevice)
		}
		perDevice[d.URMADevice] += d.Jetties
	}
	slices.SortStableFunc(order, func(a, b string) int {
		if c := cmp.Compare(perDevice[b], perDevice[a]); c != 0 {
			return c // most jetties first
		}
		return strings.Compare(a, b)
	})
	main := order[0]
	spec := &specs.Spec{Kind: w.cfg.Kind}
	env := []string{podenv.Device + "=" + main, podenv.JettyBudget + "=" + strconv.FormatInt(perDevice[main], 10)}
	first := devs[slices.IndexFunc(devs, func(d Device) bool { return d.URMADevice == main })]
	if first.EID != "" {
		env = append(env, podenv.EID+"="+first.EID)
	}
	if first.Software {
		env = append(env, podenv.Provider+"="+podenv.ProviderSoft)
	}
	if len(order) > 1 {
		list := make([]podenv.DeviceJetties, len(order))
		for i, name := range order {
			list[i] = podenv.DeviceJetties{Device: name, Jetties: uint64(perDevice[name])}
		}
		env = append(env, podenv.Devices+"="+podenv.FormatDevices(list))
	}
	for _, d := range devs {
		edits := specs.ContainerEdits{Env: env}
		for _, p := range d.DevNodes {
			edits.DeviceNodes = append(edits.DeviceNodes, &specs.DeviceNode{Path: p, HostPath: p, Permissions: "rw"})
		}
		spec.Devices = append(spec.Devices, specs.Device{Name: cdiName(claimUID, d.Name), ContainerEdits: edits})
	}
	if w.cfg.ShmDir != "" {
		spec.ContainerEdits.Env = []string{podenv.ShmDir + "=" + w.cfg.ShmDir}
		spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, &specs.Mount{
			HostPath: w.cfg.ShmDir, ContainerPath: w.cfg.ShmDir, Type: "bind",
			Options: []string{"rbind", "rw", "nosuid", "nodev"},
		})
	}
	hardware := slices.ContainsFunc(devs, func(d Device) bool { return !d.Software })
	libMounts, libEnv := libinject.CDIEdits(w.cfg.Libs.For(hardware))
	spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, libMounts...)
	spec.ContainerEdits.Env = append(spec.ContainerEdits.Env, libEnv...)
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("claim %s: CDI spec version: %w", claimUID, err)
	}
	spec.Version = v
	return spec, nil
}

// EnsureShmDir makes sure the shm directory every spec mounts exists, open
// to every pod user (shmdir.Prepare; two stats when all is well). The
// driver prepares it at start, but an admin's cleanup or a remount may
// remove it or change its mode later, and the runtime would then fail the
// container on a missing mount source, far from the cause. Without a shm
// directory it does nothing.
func (w *Writer) EnsureShmDir() error {
	if w.cfg.ShmDir == "" {
		return nil
	}
	if err := shmdir.Prepare(w.cfg.ShmDir); err != nil {
		return fmt.Errorf("the shm directory every claim's containers mount (--shm-dir) is unusable: %w", err)
	}
	return nil
}

// Write renders and writes a claim's spec (replacing any earlier one) and
// returns the qualified CDI names of its devices, in the order given. It
// makes sure of the shm directory first (EnsureShmDir).
func (w *Writer) Write(claimUID string, devs []Device) ([]string, error) {
	spec, err := w.Build(claimUID, devs)
	if err != nil {
		return nil, err
	}
	if err := w.EnsureShmDir(); err != nil {
		return nil, fmt.Errorf("claim %s: %w", claimUID, err)
	}
	if err := w.cache.WriteSpec(spec, w.FileName(claimUID)); err != nil {
		return nil, fmt.Errorf("write CDI spec of claim %s into %s: %w", claimUID, w.cfg.Dir, err)
	}
	ids := make([]string, len(devs))
	for i, d := range devs {
		ids[i] = w.DeviceID(claimUID, d.Name)
	}
	return ids, nil
}

// Exists reports whether a claim's spec file is present.
func (w *Writer) Exists(claimUID string) bool {
	_, err := os.Stat(filepath.Join(w.cfg.Dir, w.FileName(claimUID)))
	return err == nil
}

// ClaimUIDs lists the claims whose spec files this writer's kind has in the
// spec directory (the files FileName names), sorted; other files are left
// out; a directory that is not there holds none. A driver that lost its
// record of prepared claims finds them here.
func (w *Writer) ClaimUIDs() ([]string, error) {
	entries, err := os.ReadDir(w.cfg.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the CDI spec directory %s: %w", w.cfg.Dir, err)
	}
	prefix, suffix, _ := strings.Cut(w.FileName("\x00"), "\x00")
	var uids []string
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, suffix) ||
			len(name) <= len(prefix)+len(suffix) {
			continue
		}
		uids = append(uids, name[len(prefix):len(name)-len(suffix)])
	}
	slices.Sort(uids)
	return uids, nil
}

// Remove deletes a claim's spec; a missing spec is not an error.
func (w *Writer) Remove(claimUID string) error {
	if err := w.cache.RemoveSpec(w.FileName(claimUID)); err != nil {
		return fmt.Errorf("remove CDI spec of claim %s: %w", claimUID, err)
	}
	return nil
}
