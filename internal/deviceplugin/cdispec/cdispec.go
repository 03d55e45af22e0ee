// Package cdispec writes the Container Device Interface spec for the
// advertised URMA devices, so that in CDI mode Allocate can answer with CDI
// device names ("urma.openeuler.org/jetty=udma0") and the container runtime
// injects the device nodes.
//
// One spec file holds every hardware device: each device's node is a
// per-device edit, and the nodes every UDMA container needs besides
// (/dev/ummu/tid and configured extras) are spec-wide edits, applied once
// whichever devices a container gets. Software devices need no node and are
// not in the spec. The file is rewritten when the set changes or when it
// is found deleted (checked at every retry), and left in place on shutdown,
// so containers created while the plugin restarts still start. A plugin
// running with CDI off leaves it too: kubelet replays a pod's checkpointed
// Allocate answer, CDI names included, at every container restart.
package cdispec

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/openeuler/urma-k8s/internal/node/devpath"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
)

// Defaults.
const (
	DefaultDir  = "/var/run/cdi"
	DefaultKind = "urma.openeuler.org/jetty"
)

// Config configures the writer.
type Config struct {
	// Dir is the CDI spec directory the runtime reads (e.g. /var/run/cdi).
	Dir string
	// Kind is "<vendor>/<class>"; device names are "<Kind>=<device>".
	Kind string
	// DevRoot is where the plugin sees the host's /dev.
	DevRoot string
	// ExtraDevNodes are host /dev/... paths every hardware container gets.
	ExtraDevNodes []string
	// Libs is the host's liburma every hardware container gets
	// (libinject.Host); empty injects none.
	Libs libinject.Injection
}

// Validate checks the kind with the CDI parser's rules.
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
	return nil
}

// Writer keeps the spec file in step with the inventory.
type Writer struct {
	cfg   Config
	cache *cdi.Cache
	log   logr.Logger
	name  string // spec file name, without extension
	last  string // rendering of the last spec written, "" = none/removed
	// covered maps each device in the spec on disk to its host device node.
	covered map[string]string
	// synced says a Sync wrote or removed the spec: until then a file on
	// disk is a previous process's, not known to match anything.
	synced bool
}

// New returns a writer for cfg.
func New(cfg Config, log logr.Logger) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cfg.Dir), cdi.WithAutoRefresh(false))
	if err != nil {
		// Errors here are about existing files in the directory (someone
		// else's broken spec); we only write, so they do not stop us.
		log.Info("CDI spec directory has problems; writing ours anyway", "dir", cfg.Dir, "error", err.Error())
	}
	vendor, class := parser.ParseQualifier(cfg.Kind)
	return &Writer{cfg: cfg, cache: cache, log: log, name: cdi.GenerateSpecName(vendor, class)}, nil
}

// Name is the qualified CDI device name of a URMA device.
func (w *Writer) Name(device string) string { return w.cfg.Kind + "=" + device }

// Build renders the spec for a snapshot; ok is false when no hardware
// device has a device node (nothing for CDI to inject).
func (w *Writer) Build(snap *inventory.Snapshot) (spec *specs.Spec, ok bool) {
	spec = &specs.Spec{Kind: w.cfg.Kind}
	for _, d := range snap.Devices {
		host := devpath.ToHost(w.cfg.DevRoot, d.DevNode)
		if d.Software || host == "" {
			continue
		}
		spec.Devices = append(spec.Devices, specs.Device{
			Name:           d.Name,
			ContainerEdits: specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{{Path: host, HostPath: host, Permissions: "rw"}}},
		})
	}
	if len(spec.Devices) == 0 {
		return nil, false
	}
	var common []string
	if p := devpath.ToHost(w.cfg.DevRoot, snap.UMMUNode); p != "" {
		common = append(common, p)
	}
	for _, local := range devpath.Existing(w.cfg.DevRoot, w.cfg.ExtraDevNodes, w.log) {
		if p := devpath.ToHost(w.cfg.DevRoot, local); p != "" && !slices.Contains(common, p) {
			common = append(common, p)
		}
	}
	for _, p := range common {
		spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes, &specs.DeviceNode{Path: p, HostPath: p, Permissions: "rw"})
	}
	spec.ContainerEdits.Mounts, spec.ContainerEdits.Env = libinject.CDIEdits(w.cfg.Libs)
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		v = specs.CurrentVersion
	}
	spec.Version = v
	return spec, true
}

// Sync writes the spec for a snapshot if it differs from the last one
// written or the file is gone (someone cleaned the CDI directory), or
// removes the file when there is nothing to inject, a spec that a previous
// run of the plugin left included: it would name device nodes that are
// gone.
func (w *Writer) Sync(snap *inventory.Snapshot) error {
	spec, ok := w.Build(snap)
	if !ok {
		if w.last == "" && w.synced {
			return nil
		}
		_, statErr := os.Stat(w.path())
		if err := w.cache.RemoveSpec(w.name + ".yaml"); err != nil {
			return fmt.Errorf("remove CDI spec %s: %w", w.name, err)
		}
		w.last, w.covered, w.synced = "", nil, true
		if statErr == nil {
			w.log.Info("removed the CDI spec: no hardware device to inject", "dir", w.cfg.Dir)
		}
		return nil
	}
	key := render(spec)
	if key == w.last {
		// The same spec: rewrite it only if the file went away, since
		// without it no CDI name Allocate answers with resolves.
		switch _, err := os.Stat(w.path()); {
		case err == nil:
			return nil
		case errors.Is(err, fs.ErrNotExist):
			w.log.Info("the CDI spec disappeared (CDI directory cleaned?); writing it again", "path", w.path())
		default:
			w.log.Info("the CDI spec cannot be checked; writing it again", "path", w.path(), "error", err.Error())
		}
	}
	if err := w.cache.WriteSpec(spec, w.name+".yaml"); err != nil {
		return fmt.Errorf("write CDI spec %s into %s: %w", w.name, w.cfg.Dir, err)
	}
	w.last, w.synced = key, true
	w.covered = map[string]string{}
	for _, d := range spec.Devices {
		w.covered[d.Name] = d.ContainerEdits.DeviceNodes[0].HostPath
	}
	w.log.Info("wrote the CDI spec", "dir", w.cfg.Dir, "kind", w.cfg.Kind, "devices", len(spec.Devices))
	return nil
}

// path is the spec file.
func (w *Writer) path() string { return filepath.Join(w.cfg.Dir, w.name+".yaml") }

func render(s *specs.Spec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|", s.Version, s.Kind)
	for _, n := range s.ContainerEdits.DeviceNodes {
		fmt.Fprintf(&b, "%s,", n.Path)
	}
	for _, m := range s.ContainerEdits.Mounts {
		fmt.Fprintf(&b, "%s>%s,", m.HostPath, m.ContainerPath)
	}
	fmt.Fprintf(&b, "%q", s.ContainerEdits.Env)
	for _, d := range s.Devices {
		fmt.Fprintf(&b, "|%s:", d.Name)
		for _, n := range d.ContainerEdits.DeviceNodes {
			fmt.Fprintf(&b, "%s,", n.Path)
		}
	}
	return b.String()
}

// Covered returns the part of a snapshot the spec on disk can serve: every
// device but the hardware devices with a device node that the last written
// spec does not name (with that node). Devices without a node are unhealthy
// and cannot be allocated, so they stay listed.
func (w *Writer) Covered(snap *inventory.Snapshot) inventory.Snapshot {
	out := *snap
	out.Devices = make([]inventory.Device, 0, len(snap.Devices))
	for _, d := range snap.Devices {
		host := devpath.ToHost(w.cfg.DevRoot, d.DevNode)
		if !d.Software && host != "" && w.covered[d.Name] != host {
			continue
		}
		out.Devices = append(out.Devices, d)
	}
	return out
}

// Run keeps the spec in step with discovered and publishes to advertised
// (what kubelet is told) only what the spec on disk covers, so that no
// device is allocated before the runtime can resolve its CDI name. It waits
// for the first scan and syncs again every retry interval: a failed write
// is retried, and a spec file deleted meanwhile is written again. Until a
// write succeeds, devices the spec lacks are held back.
func (w *Writer) Run(ctx context.Context, discovered, advertised *inventory.Inventory, retry time.Duration) error {
	t := time.NewTicker(retry)
	defer t.Stop()
	for {
		snap, changed := discovered.Current()
		if snap.Scanned {
			pub := *snap
			if err := w.Sync(snap); err != nil {
				w.log.Error(err, "CDI spec not updated; devices it lacks are not advertised until a retry succeeds", "retryIn", retry)
				pub = w.Covered(snap)
			}
			advertised.Publish(pub)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-t.C:
		}
	}
}
