// Package nodelabel publishes the node facts the operator tunes against:
// labels and annotations on the Node (package nodefacts names them) and,
// optionally, a Node Feature Discovery feature file.
//
// It writes only after the first discovery scan, so a restarting plugin
// never flashes "no devices" onto the node, and it never removes its labels
// on shutdown. Between device changes it checks the published facts every
// resync interval and puts back what someone else removed or edited.
package nodelabel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

// FeatureFileName is the NFD feature file written into the features dir.
const FeatureFileName = "urma"

// Defaults.
const (
	DefaultRetryInitial = time.Second
	DefaultRetryMax     = time.Minute
	DefaultResync       = 5 * time.Minute
)

// FactsFor summarizes a snapshot over its healthy devices that advertise at
// least one unit: their number, whether they are all software devices, and
// the smallest of each capability (a pod may land on any of them, so the
// operator must not exceed any). An unhealthy or budgetless device takes no
// pods, so it must not lower the node's limits.
func FactsFor(snap *inventory.Snapshot) nodefacts.Facts {
	var f nodefacts.Facts
	for _, d := range snap.Devices {
		if !d.Healthy || d.Budget.Units == 0 {
			continue
		}
		c := d.Info.Caps
		if f.DeviceCount == 0 {
			f = nodefacts.Facts{
				Software: true, JettiesPerUnit: snap.JettiesPerUnit,
				MaxJFSDepth: c.MaxJFSDepth, MaxJFRDepth: c.MaxJFRDepth, MaxJFCDepth: c.MaxJFCDepth,
				MaxMsgSize: c.MaxMsgSize, JettiesPerDevice: d.Budget.Jetties,
			}
		}
		f.DeviceCount++
		f.Software = f.Software && d.Software
		f.MaxJFSDepth = min(f.MaxJFSDepth, c.MaxJFSDepth)
		f.MaxJFRDepth = min(f.MaxJFRDepth, c.MaxJFRDepth)
		f.MaxJFCDepth = min(f.MaxJFCDepth, c.MaxJFCDepth)
		f.MaxMsgSize = min(f.MaxMsgSize, c.MaxMsgSize)
		f.JettiesPerDevice = min(f.JettiesPerDevice, d.Budget.Jetties)
	}
	return f
}

// NodePatch is the JSON merge patch that sets the facts' labels and
// annotations and deletes the annotation keys the facts do not carry.
func NodePatch(f nodefacts.Facts) ([]byte, error) {
	annotations := map[string]*string{}
	have := f.Annotations()
	for _, k := range nodefacts.AnnotationKeys() {
		if v, ok := have[k]; ok {
			annotations[k] = &v
		} else {
			annotations[k] = nil // null deletes in a merge patch
		}
	}
	patch := map[string]any{"metadata": map[string]any{"labels": f.Labels(), "annotations": annotations}}
	b, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encode node patch: %w", err)
	}
	return b, nil
}

// FeatureFile renders the NFD local feature file: one name=value per line.
// NFD prefixes names without a namespace with feature.node.kubernetes.io/;
// ours carry urma.openeuler.org/, which NFD must be allowed to write
// (nfd-master -extra-label-ns=urma.openeuler.org). NFD files carry labels
// only, so the capabilities become labels there.
func FeatureFile(f nodefacts.Facts) string {
	kv := f.Labels()
	for k, v := range f.Annotations() {
		kv[k] = v
	}
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("# Written by urma-device-plugin; rewritten when devices change, and put back when edited or removed.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, kv[k])
	}
	return b.String()
}

// Config configures the publisher. With neither a node name nor a features
// directory it does nothing.
type Config struct {
	// NodeName is the Node to label (from the NODE_NAME env); "" disables
	// labeling.
	NodeName string
	// FeaturesDir is NFD's features.d directory; "" disables the file.
	FeaturesDir string
	// RetryInitial and RetryMax bound the backoff after a failed update.
	RetryInitial, RetryMax time.Duration
	// Resync is how often the published facts are checked against the
	// Node and the feature file, and put back where they differ; 0 means
	// DefaultResync.
	Resync time.Duration
	// HostLiburma and SoftLiburma are the injection facts, fixed at
	// start (nodefacts.LabelHostLiburma, LabelSoftLiburma).
	HostLiburma, SoftLiburma bool
}

// Publisher keeps the node facts in step with the inventory.
type Publisher struct {
	cfg     Config
	client  kubernetes.Interface
	log     logr.Logger
	metrics *metrics.Metrics
	clock   clock.WithTicker // the resync ticker's; tests use a fake

	afterApply  func(nodefacts.Facts, error) // test hook
	afterResync func(wrote bool, err error)  // test hook: a resync check ended
	retryIn     func(time.Duration)          // test hook: a retry was scheduled after this delay
	looked      func(generation uint64)      // test hook: a snapshot was considered
}

// New returns a publisher; client may be nil when NodeName is empty, and
// metrics may be nil.
func New(cfg Config, client kubernetes.Interface, log logr.Logger, m *metrics.Metrics) *Publisher {
	if cfg.RetryInitial <= 0 {
		cfg.RetryInitial = DefaultRetryInitial
	}
	if cfg.RetryMax < cfg.RetryInitial {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryInitial)
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	return &Publisher{cfg: cfg, client: client, log: log, metrics: m, clock: clock.RealClock{}}
}

// Enabled reports whether there is anything to publish to.
func (p *Publisher) Enabled() bool {
	return (p.cfg.NodeName != "" && p.client != nil) || p.cfg.FeaturesDir != ""
}

// Apply publishes one set of facts.
func (p *Publisher) Apply(ctx context.Context, f nodefacts.Facts) error {
	if p.labelsNode() {
		if err := p.patchNode(ctx, f); err != nil {
			return err
		}
	}
	if p.cfg.FeaturesDir != "" {
		if err := p.writeFeatureFile(f); err != nil {
			return err
		}
	}
	return nil
}

// Reapply puts back what of f the Node or the feature file no longer
// carries (someone removed or edited it: an admin, another controller, a
// Node registered afresh, a cleanup of features.d) and reports whether it
// wrote anything. What is intact is only read, never written again.
func (p *Publisher) Reapply(ctx context.Context, f nodefacts.Facts) (bool, error) {
	wrote := false
	if p.labelsNode() {
		node, err := p.client.CoreV1().Nodes().Get(ctx, p.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("read node %s to check its labels and annotations (RBAC needs nodes get/patch): %w", p.cfg.NodeName, err)
		}
		if !NodeCarries(node, f) {
			if err := p.patchNode(ctx, f); err != nil {
				return false, err
			}
			wrote = true
		}
	}
	if p.cfg.FeaturesDir != "" {
		got, err := os.ReadFile(filepath.Join(p.cfg.FeaturesDir, FeatureFileName))
		if err != nil || string(got) != FeatureFile(f) {
			if err := p.writeFeatureFile(f); err != nil {
				return wrote, err
			}
			wrote = true
		}
	}
	return wrote, nil
}

// NodeCarries reports whether a Node has the labels and annotations that
// NodePatch(f) sets, and none of the annotations it deletes.
func NodeCarries(n *corev1.Node, f nodefacts.Facts) bool {
	for k, v := range f.Labels() {
		if got, ok := n.Labels[k]; !ok || got != v {
			return false
		}
	}
	want := f.Annotations()
	for _, k := range nodefacts.AnnotationKeys() {
		w, set := want[k]
		got, ok := n.Annotations[k]
		if ok != set || got != w {
			return false
		}
	}
	return true
}

func (p *Publisher) labelsNode() bool { return p.cfg.NodeName != "" && p.client != nil }

func (p *Publisher) patchNode(ctx context.Context, f nodefacts.Facts) error {
	patch, err := NodePatch(f)
	if err != nil {
		return err
	}
	if _, err := p.client.CoreV1().Nodes().Patch(ctx, p.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "urma-device-plugin"}); err != nil {
		return fmt.Errorf("patch node %s labels and annotations (RBAC needs nodes get/patch): %w", p.cfg.NodeName, err)
	}
	return nil
}

func (p *Publisher) writeFeatureFile(f nodefacts.Facts) error {
	if err := writeAtomic(filepath.Join(p.cfg.FeaturesDir, FeatureFileName), FeatureFile(f)); err != nil {
		return fmt.Errorf("write NFD feature file: %w", err)
	}
	return nil
}

// Run publishes the facts of every new snapshot (after the first scan),
// and every Resync puts back what of the last published facts went
// missing, until ctx ends; failures are retried with backoff and never
// end Run.
func (p *Publisher) Run(ctx context.Context, inv *inventory.Inventory) error {
	if !p.Enabled() {
		p.log.Info("node facts not published: set NODE_NAME (with RBAC to get and patch nodes) or --nfd-features-dir")
		<-ctx.Done()
		return nil
	}
	var applied *nodefacts.Facts
	backoff := p.cfg.RetryInitial
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	failed := func(err error) {
		p.log.Error(err, "node facts not published; retrying", "in", backoff)
		retry.Reset(backoff)
		if p.retryIn != nil {
			p.retryIn(backoff)
		}
		backoff = min(backoff*2, p.cfg.RetryMax)
	}
	// Facts written once may be removed or edited by others later, and
	// would stay wrong until the next device change: check them.
	resync := p.clock.NewTicker(p.cfg.Resync)
	defer resync.Stop()
	resyncDue := false
	for {
		snap, changed := inv.Current()
		if snap.Generation > 0 {
			f := FactsFor(snap)
			f.HostLiburma, f.SoftLiburma = p.cfg.HostLiburma, p.cfg.SoftLiburma
			switch {
			case applied == nil || *applied != f:
				err := p.Apply(ctx, f)
				p.metrics.ObserveNodeUpdate(err)
				if err != nil {
					failed(err)
				} else {
					applied, backoff = &f, p.cfg.RetryInitial
					p.log.Info("published node facts", "node", p.cfg.NodeName, "devices", f.DeviceCount, "software", f.Software,
						"jettiesPerDevice", f.JettiesPerDevice)
				}
				if p.afterApply != nil {
					p.afterApply(f, err)
				}
			case resyncDue:
				wrote, err := p.Reapply(ctx, f)
				if wrote || err != nil {
					p.metrics.ObserveNodeUpdate(err)
				}
				switch {
				case err != nil:
					// The retry applies the facts whole.
					applied = nil
					failed(err)
				case wrote:
					p.log.Info("node facts had been removed or changed by someone else; published them again", "node", p.cfg.NodeName,
						"featuresDir", p.cfg.FeaturesDir)
				}
				if p.afterResync != nil {
					p.afterResync(wrote, err)
				}
			}
		}
		resyncDue = false
		if p.looked != nil {
			p.looked(snap.Generation)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-retry.C:
		case <-resync.C():
			resyncDue = true
		}
	}
}

func writeAtomic(path, content string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".urma-*")
	if err != nil {
		return err
	}
	_, werr := f.WriteString(content)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", f.Name(), errors.Join(werr, cerr))
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
