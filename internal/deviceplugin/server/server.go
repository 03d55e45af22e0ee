// Package server implements kubelet's DevicePlugin gRPC service over the
// inventory: ListAndWatch streams the budget units, Allocate hands a
// container the device node and environment of the device its units are on,
// and GetPreferredAllocation packs a container onto one device.
package server

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/openeuler/urma-k8s/internal/deviceplugin/preferred"
	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/devpath"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/internal/node/shmdir"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

// CDIStrategy is one way of handing CDI device names to the container
// runtime; the names follow NVIDIA's --device-list-strategy.
type CDIStrategy string

// CDI strategies.
const (
	// CDIStrategyCRI fills the CdiDevices field of the Allocate response,
	// which kubelet passes on in the CRI (kubelet 1.28+, containerd 1.7+,
	// CRI-O 1.23+).
	CDIStrategyCRI CDIStrategy = "cdi-cri"
	// CDIStrategyAnnotations sets a cdi.k8s.io/ container annotation, for
	// runtimes that read CDI requests only from annotations.
	CDIStrategyAnnotations CDIStrategy = "cdi-annotations"
)

// ParseCDIStrategies reads a comma-separated list of strategies, naming
// the first unknown one.
func ParseCDIStrategies(list string) ([]CDIStrategy, error) {
	var out []CDIStrategy
	for _, part := range strings.Split(list, ",") {
		st := CDIStrategy(strings.TrimSpace(part))
		switch st {
		case "":
			continue
		case CDIStrategyCRI, CDIStrategyAnnotations:
			if !slices.Contains(out, st) {
				out = append(out, st)
			}
		default:
			return nil, fmt.Errorf("CDI strategy %q: want %s, %s or both, comma-separated", st, CDIStrategyCRI, CDIStrategyAnnotations)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("CDI strategy list %q is empty", list)
	}
	return out, nil
}

// DefaultResync is how often ListAndWatch resends the full list unasked.
const DefaultResync = time.Minute

// Config configures the service.
type Config struct {
	// DevRoot is where the plugin sees the host's /dev ("" means /dev). The
	// paths given to kubelet are always the host's /dev/... paths.
	DevRoot string
	// ExtraDevNodes are further device nodes, as /dev/... paths, to give
	// every container that gets a hardware device; missing ones are skipped.
	ExtraDevNodes []string
	// CDIKind, when set (e.g. "urma.openeuler.org/jetty"), switches Allocate
	// to answer with CDI device names "<kind>=<device>" instead of device
	// specs; a CDI spec with those names must exist (package cdispec).
	CDIKind string
	// CDIStrategies say how the CDI names reach the runtime; empty means
	// CDIStrategyCRI.
	CDIStrategies []CDIStrategy
	// Resync is how often ListAndWatch resends the full list; 0 means
	// DefaultResync.
	Resync time.Duration
	// ShmDir, when set, is a host directory mounted into every container
	// at the same path and named by URMA_SHM_DIR: there the software
	// provider of pods on this node meets for shared memory. Kubelet mounts
	// it, so the pod spec needs no hostPath.
	ShmDir string
	// Libs is the liburma a container gets for a C program: the host's
	// with a UB device (in CDI mode the CDI spec carries that one), the
	// software one with software devices only.
	Libs libinject.Set
}

// Validate checks that extra device nodes are /dev/... paths and the CDI
// kind looks like vendor/class.
func (c Config) Validate() error {
	for _, p := range c.ExtraDevNodes {
		clean := filepath.Clean(p)
		if !strings.HasPrefix(clean, "/dev/") || clean != p {
			return fmt.Errorf("extra device node %q: want a clean absolute path under /dev/", p)
		}
	}
	if c.CDIKind != "" {
		vendor, class, ok := strings.Cut(c.CDIKind, "/")
		if !ok || vendor == "" || class == "" || strings.ContainsAny(class, "/=") {
			return fmt.Errorf("CDI kind %q: want <vendor>/<class>", c.CDIKind)
		}
		if _, err := cdi.AnnotationKey(vendor, class); err != nil {
			return fmt.Errorf("CDI kind %q does not make an annotation key: %w", c.CDIKind, err)
		}
	}
	for _, st := range c.CDIStrategies {
		if st != CDIStrategyCRI && st != CDIStrategyAnnotations {
			return fmt.Errorf("CDI strategy %q: want %s or %s", st, CDIStrategyCRI, CDIStrategyAnnotations)
		}
	}
	if c.ShmDir != "" {
		if err := shmdir.Check(c.ShmDir); err != nil {
			return err
		}
	}
	return nil
}

// CDIAnnotationKey is the container annotation that carries a container's
// CDI devices under CDIStrategyAnnotations: cdi.k8s.io/<vendor>_<class>.
// Kubelet puts each container's Allocate annotations on that container
// alone, so one key per kind is unique.
func CDIAnnotationKey(kind string) (string, error) {
	vendor, class, _ := strings.Cut(kind, "/")
	key, err := cdi.AnnotationKey(vendor, class)
	if err != nil {
		return "", fmt.Errorf("CDI annotation key for kind %q: %w", kind, err)
	}
	return key, nil
}

// Server is the DevicePlugin service.
type Server struct {
	pluginapi.UnimplementedDevicePluginServer

	cfg     Config
	inv     *inventory.Inventory
	log     logr.Logger
	metrics *metrics.Metrics
}

// New returns the service; metrics may be nil.
func New(cfg Config, inv *inventory.Inventory, log logr.Logger, m *metrics.Metrics) *Server {
	if cfg.DevRoot == "" {
		cfg.DevRoot = "/dev"
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	return &Server{cfg: cfg, inv: inv, log: log, metrics: m}
}

// Options is what the plugin tells kubelet when registering.
func Options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions implements the DevicePlugin service.
func (s *Server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return Options(), nil
}

// PreStartContainer is not needed (PreStartRequired is false); it succeeds.
func (s *Server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// ListAndWatch sends the full unit list at once, after every inventory
// change and every resync interval, until the stream or the server ends.
func (s *Server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	resync := time.NewTicker(s.cfg.Resync)
	defer resync.Stop()
	for {
		snap, changed := s.inv.Current()
		devs := Units(snap)
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return fmt.Errorf("send device list: %w", err)
		}
		s.log.V(1).Info("sent device list to kubelet", "units", len(devs), "generation", snap.Generation)
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		case <-resync.C:
		}
	}
}

// Units lists the kubelet devices (budget units) of a snapshot.
func Units(snap *inventory.Snapshot) []*pluginapi.Device {
	var out []*pluginapi.Device
	for i := range snap.Devices {
		d := &snap.Devices[i]
		health := pluginapi.Unhealthy
		if d.Healthy {
			health = pluginapi.Healthy
		}
		var topo *pluginapi.TopologyInfo
		if d.NUMANode >= 0 {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
		}
		for k := range d.Budget.Units {
			out = append(out, &pluginapi.Device{ID: budget.UnitID(d.Name, k), Health: health, Topology: topo})
		}
	}
	return out
}

// GetPreferredAllocation packs each container onto one device, then one
// NUMA node (see package preferred).
func (s *Server) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	snap, _ := s.inv.Current()
	devs := make(map[string]preferred.Device, len(snap.Devices))
	for _, d := range snap.Devices {
		usable, _ := d.Usable()
		devs[d.Name] = preferred.Device{NUMANode: d.NUMANode, Healthy: usable}
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := preferred.Pick(preferred.Request{
			Available:   cr.GetAvailableDeviceIDs(),
			MustInclude: cr.GetMustIncludeDeviceIDs(),
			Size:        int(cr.GetAllocationSize()),
		}, devs)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers every container request, or refuses the whole call with
// InvalidArgument naming each unknown, unhealthy or repeated unit ID.
func (s *Server) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	snap, _ := s.inv.Current()
	resp := &pluginapi.AllocateResponse{}
	var shares [][]Share
	owner := map[string]int{} // unit ID -> the container request naming it
	for i, cr := range req.GetContainerRequests() {
		sh, err := Group(snap, cr.GetDevicesIds())
		if err == nil {
			err = claimUnits(owner, i, cr.GetDevicesIds())
		}
		if err != nil {
			s.metrics.AllocateRefused()
			s.log.Info("refused allocation", "ids", cr.GetDevicesIds(), "error", err.Error())
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		shares = append(shares, sh)
	}
	if d := s.cfg.ShmDir; d != "" {
		// Prepared at start, but an admin's cleanup or a remount may have
		// removed it or changed its mode since: the runtime would then
		// fail the container on a missing mount source, far from the cause.
		// Prepare is two stats when all is well.
		if err := shmdir.Prepare(d); err != nil {
			s.metrics.AllocateRefused()
			s.log.Error(err, "refused allocation: the shm directory is unusable")
			return nil, status.Error(codes.FailedPrecondition, fmt.Sprintf("cannot allocate: the shm directory every container mounts (--shm-dir) is unusable: %v", err))
		}
	}
	for _, sh := range shares {
		resp.ContainerResponses = append(resp.ContainerResponses, s.containerResponse(snap, sh))
		for _, x := range sh {
			s.metrics.ObserveAllocation(x.Device.Name, x.Units)
		}
		s.log.Info("allocated", "devices", describe(sh))
	}
	return resp, nil
}

// claimUnits records that container request i names ids (free of repeats,
// as Group checked) and refuses a unit an earlier container request of the
// same call names: both containers would be handed the same jetties.
func claimUnits(owner map[string]int, i int, ids []string) error {
	var shared []string
	for _, id := range ids {
		if prev, ok := owner[id]; ok {
			shared = append(shared, fmt.Sprintf("%s (containers %d and %d)", id, prev, i))
			continue
		}
		owner[id] = i
	}
	if len(shared) > 0 {
		return fmt.Errorf("cannot allocate: unit IDs requested by more than one container %s", strings.Join(shared, ","))
	}
	return nil
}

// Share is the part of one container's allocation on one device.
type Share struct {
	Device *inventory.Device
	Units  int
}

// Jetties is the share's jetty budget.
func (sh Share) Jetties(jettiesPerUnit uint32) uint64 {
	return uint64(sh.Units) * uint64(jettiesPerUnit)
}

// Group checks unit IDs against a snapshot and groups them by device, most
// units first (ties by name). Unknown IDs (malformed, no such device, index
// beyond the budget), IDs of unhealthy devices, or of devices the last scan
// (or their device node) did not find, and repeated IDs make an error that
// names every one of them. A repeat is refused, not counted once: kubelet
// never sends one, and counting it once would hand the container fewer
// units than it was charged for.
func Group(snap *inventory.Snapshot, ids []string) ([]Share, error) {
	var unknown, unhealthy, repeated []string
	reasons := map[string]string{}
	seen := map[string]int{}
	counts := map[string]int{}
	for _, id := range ids {
		seen[id]++
		if seen[id] > 1 {
			if seen[id] == 2 {
				repeated = append(repeated, id)
			}
			continue
		}
		name, k, err := budget.ParseUnitID(id)
		if err != nil {
			unknown = append(unknown, id)
			continue
		}
		d, ok := snap.Lookup(name)
		if !ok || k >= d.Budget.Units {
			unknown = append(unknown, id)
			continue
		}
		if ok, why := d.Usable(); !ok {
			unhealthy = append(unhealthy, id)
			reasons[name] = why
			continue
		}
		counts[name]++
	}
	if len(unknown)+len(unhealthy)+len(repeated) > 0 {
		var parts []string
		if len(repeated) > 0 {
			parts = append(parts, fmt.Sprintf("repeated unit IDs %s", strings.Join(repeated, ",")))
		}
		if len(unknown) > 0 {
			parts = append(parts, fmt.Sprintf("unknown unit IDs %s", strings.Join(unknown, ",")))
		}
		if len(unhealthy) > 0 {
			var why []string
			for _, name := range sortedKeys(reasons) {
				why = append(why, name+": "+reasons[name])
			}
			parts = append(parts, fmt.Sprintf("unhealthy unit IDs %s (%s)", strings.Join(unhealthy, ","), strings.Join(why, "; ")))
		}
		return nil, fmt.Errorf("cannot allocate: %s", strings.Join(parts, "; "))
	}
	if len(counts) == 0 {
		return nil, fmt.Errorf("cannot allocate: no unit IDs requested")
	}
	// In name order before sorting, so that the result never depends on
	// the map's order, even for a comparator that got it wrong.
	out := make([]Share, 0, len(counts))
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		d, _ := snap.Lookup(name)
		out = append(out, Share{Device: d, Units: counts[name]})
	}
	slices.SortFunc(out, func(a, b Share) int {
		if a.Units != b.Units {
			return b.Units - a.Units
		}
		return strings.Compare(a.Device.Name, b.Device.Name)
	})
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func describe(sh []Share) string {
	parts := make([]string, len(sh))
	for i, x := range sh {
		parts[i] = fmt.Sprintf("%s:%d units", x.Device.Name, x.Units)
	}
	return strings.Join(parts, ",")
}

// containerResponse builds one container's answer from its shares.
func (s *Server) containerResponse(snap *inventory.Snapshot, sh []Share) *pluginapi.ContainerAllocateResponse {
	primary := sh[0]
	n := snap.JettiesPerUnit
	env := map[string]string{
		podenv.Device:      primary.Device.Name,
		podenv.JettyBudget: strconv.FormatUint(primary.Jetties(n), 10),
	}
	if primary.Device.Software {
		env[podenv.Provider] = podenv.ProviderSoft
	} else if primary.Device.EID != "" {
		env[podenv.EID] = primary.Device.EID
	}
	if len(sh) > 1 {
		list := make([]podenv.DeviceJetties, len(sh))
		for i, x := range sh {
			list[i] = podenv.DeviceJetties{Device: x.Device.Name, Jetties: x.Jetties(n)}
		}
		env[podenv.Devices] = podenv.FormatDevices(list)
	}
	resp := &pluginapi.ContainerAllocateResponse{Envs: env}
	if d := s.cfg.ShmDir; d != "" {
		env[podenv.ShmDir] = d
		resp.Mounts = []*pluginapi.Mount{{ContainerPath: d, HostPath: d}}
	}

	var hw []*inventory.Device
	for _, x := range sh {
		if !x.Device.Software {
			hw = append(hw, x.Device)
		}
	}
	if len(hw) == 0 || s.cfg.CDIKind == "" {
		addLibs(resp, s.cfg.Libs.For(len(hw) > 0))
	}
	if len(hw) == 0 {
		return resp // software devices need no device node
	}
	if s.cfg.CDIKind != "" {
		names := make([]string, len(hw))
		for i, d := range hw {
			names[i] = s.cfg.CDIKind + "=" + d.Name
		}
		if s.cdiVia(CDIStrategyCRI) {
			for _, n := range names {
				resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
			}
		}
		if s.cdiVia(CDIStrategyAnnotations) {
			// Validate checked that the kind makes a key.
			key, _ := CDIAnnotationKey(s.cfg.CDIKind)
			resp.Annotations = map[string]string{key: strings.Join(names, ",")}
		}
		return resp
	}
	seen := map[string]bool{}
	add := func(pluginPath string) {
		p := s.HostPath(pluginPath)
		if p == "" || seen[p] {
			return
		}
		seen[p] = true
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"})
	}
	for _, d := range hw {
		add(d.DevNode)
	}
	add(snap.UMMUNode)
	for _, p := range s.ExtraNodes() {
		add(p)
	}
	return resp
}

// addLibs mounts an injection's libraries, read-only, and sets its
// environment (LD_LIBRARY_PATH), which replaces the image's value; a
// value the pod spec sets wins (kubelet puts the pod's environment after
// the device plugin's, and the runtime keeps the last).
func addLibs(resp *pluginapi.ContainerAllocateResponse, inj libinject.Injection) {
	for _, m := range inj.Mounts {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: true})
	}
	for _, kv := range inj.Env {
		k, v, _ := strings.Cut(kv, "=")
		resp.Envs[k] = v
	}
}

func (s *Server) cdiVia(st CDIStrategy) bool {
	if len(s.cfg.CDIStrategies) == 0 {
		return st == CDIStrategyCRI
	}
	return slices.Contains(s.cfg.CDIStrategies, st)
}

// HostPath maps a path under DevRoot (as the plugin sees it) to the host's
// /dev/... path that kubelet and the runtime understand; "" if the path is
// not under DevRoot.
func (s *Server) HostPath(pluginPath string) string {
	return devpath.ToHost(s.cfg.DevRoot, pluginPath)
}

// ExtraNodes returns the configured extra device nodes that exist, as paths
// under DevRoot, logging the ones that do not.
func (s *Server) ExtraNodes() []string {
	return devpath.Existing(s.cfg.DevRoot, s.cfg.ExtraDevNodes, s.log)
}
