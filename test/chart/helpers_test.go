package chart_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

const (
	modulePath   = "github.com/openeuler/urma-k8s"
	releaseName  = "urma"
	releaseNS    = "urma-system"
	chartRelPath = "charts/urma-k8s"
)

// repoRoot finds the module root by walking up from the test's directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("getting the working directory: %v", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module "+modulePath+"\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of %s above the test directory", modulePath)
		}
		dir = parent
	}
}

func chartDir(t testing.TB) string {
	return filepath.Join(repoRoot(t), chartRelPath)
}

// helmBinary is $HELM, or bin/helm in the repository. A missing helm fails
// the test: skipping would let a broken chart pass `make test`.
func helmBinary(t testing.TB) string {
	t.Helper()
	path := os.Getenv("HELM")
	if path == "" {
		path = filepath.Join(repoRoot(t), "bin", "helm")
	}
	if _, err := exec.LookPath(path); err != nil {
		t.Fatalf("helm not found at %q (%v): run `make test`, which builds bin/helm, or set HELM to a helm v3 binary", path, err)
	}
	return path
}

// kubebuilderAssets is $KUBEBUILDER_ASSETS, or bin/k8s in the repository, and
// must hold kube-apiserver and etcd.
func kubebuilderAssets(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	from := "KUBEBUILDER_ASSETS"
	if dir == "" {
		dir = filepath.Join(repoRoot(t), "bin", "k8s")
		from = "the default bin/k8s"
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := exec.LookPath(filepath.Join(dir, bin)); err != nil {
			t.Fatalf("%s not found in %s (%s): run `make test`, which builds the envtest binaries into bin/k8s, or set KUBEBUILDER_ASSETS", bin, dir, from)
		}
	}
	return dir
}

// helmResult is one helm run.
type helmResult struct {
	stdout, stderr string
	err            error
}

// runHelm runs helm in the repository root, with HOME-like state kept in a
// temporary directory so that the user's helm config and repos play no part,
// and with no cluster.
func runHelm(t testing.TB, args ...string) helmResult {
	t.Helper()
	return runHelmWithKubeconfig(t, "", args...)
}

// runHelmWithKubeconfig is runHelm talking to the cluster of a kubeconfig
// file; "" means no cluster.
func runHelmWithKubeconfig(t testing.TB, kubeconfig string, args ...string) helmResult {
	t.Helper()
	helm := helmBinary(t)
	state := t.TempDir()
	if kubeconfig == "" {
		kubeconfig = filepath.Join(state, "no-kubeconfig")
	}
	cmd := exec.Command(helm, args...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(state, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(state, "config"),
		"HELM_DATA_HOME="+filepath.Join(state, "data"),
		"KUBECONFIG="+kubeconfig,
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	return helmResult{stdout: stdout.String(), stderr: stderr.String(), err: err}
}

// templateArgs are the `helm template` arguments for the chart with extra
// value flags (--set ..., -f ...).
func templateArgs(values ...string) []string {
	return append([]string{"template", releaseName, chartRelPath, "--namespace", releaseNS}, values...)
}

// render runs `helm template` and decodes its output; it fails the test when
// helm fails.
func render(t testing.TB, values ...string) []*unstructured.Unstructured {
	t.Helper()
	res := runHelm(t, templateArgs(values...)...)
	if res.err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(values, " "), res.err, res.stderr)
	}
	objs, err := decodeManifests(res.stdout)
	if err != nil {
		t.Fatalf("decoding helm template %s output: %v", strings.Join(values, " "), err)
	}
	return objs
}

// decodeManifests splits a multi-document YAML stream into objects, skipping
// empty documents.
func decodeManifests(manifests string) ([]*unstructured.Unstructured, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifests)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading document %d: %w", len(objs)+1, err)
		}
		var m map[string]any
		// utilyaml.Unmarshal keeps integers as int64, as the API machinery expects.
		if err := utilyaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("parsing document %d: %w\n%s", len(objs)+1, err, doc)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("document %d has no kind, apiVersion or name:\n%s", len(objs)+1, doc)
		}
		objs = append(objs, u)
	}
}

// readManifests decodes a YAML file of one or more objects.
func readManifests(t testing.TB, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	objs, err := decodeManifests(string(data))
	if err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	return objs
}

// ofKind returns the objects of one kind.
func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// one returns the only object of a kind, failing the test when there are none
// or several.
func one(t testing.TB, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	found := ofKind(objs, kind)
	if len(found) != 1 {
		t.Fatalf("want exactly one %s, rendered %d: %v", kind, len(found), names(found))
	}
	return found[0]
}

// named returns the object of a kind and name, or nil.
func named(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range ofKind(objs, kind) {
		if o.GetName() == name {
			return o
		}
	}
	return nil
}

func names(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

// field reads a nested field, failing the test when it is absent.
func field(t testing.TB, o *unstructured.Unstructured, path ...string) any {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(o.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s/%s has no %s (err %v)", o.GetKind(), o.GetName(), strings.Join(path, "."), err)
	}
	return v
}

// podSpec returns the pod template spec of a workload.
func podSpec(t testing.TB, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	spec, ok := field(t, o, "spec", "template", "spec").(map[string]any)
	if !ok {
		t.Fatalf("%s/%s: spec.template.spec is not an object", o.GetKind(), o.GetName())
	}
	return spec
}

// container returns the named container of a workload's pod template.
func container(t testing.TB, o *unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	containers, _ := podSpec(t, o)["containers"].([]any)
	for _, c := range containers {
		if m, ok := c.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	t.Fatalf("%s/%s has no container %q", o.GetKind(), o.GetName(), name)
	return nil
}

// args returns a container's args as strings.
func args(t testing.TB, c map[string]any) []string {
	t.Helper()
	raw, _ := c["args"].([]any)
	out := make([]string, 0, len(raw))
	for _, a := range raw {
		s, ok := a.(string)
		if !ok {
			t.Fatalf("container %v: arg %v is not a string", c["name"], a)
		}
		out = append(out, s)
	}
	return out
}

// argValue returns the value of --name=value in args and whether it is there.
func argValue(argv []string, name string) (string, bool) {
	for _, a := range argv {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
		if a == name {
			return "", true
		}
	}
	return "", false
}

// ciValuesFiles lists the chart's ci/*-values.yaml files (chart-testing's convention).
func ciValuesFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no %s/ci/*-values.yaml (err %v)", chartRelPath, err)
	}
	return files
}

// ciAPIVersions names, per ci/*-values.yaml file, the optional APIs its
// values need (cert-manager, the Prometheus Operator, NFD). Helm sees no
// cluster when it renders offline, so those files are rendered with
// --api-versions; without them the chart refuses to render
// (TestBadValuesRejected). helm lint only logs such a failure.
var ciAPIVersions = map[string][]string{
	"cert-manager-values.yaml":    {"cert-manager.io/v1", "monitoring.coreos.com/v1"},
	"existing-issuer-values.yaml": {"cert-manager.io/v1"},
	"nfd-values.yaml":             {"nfd.k8s-sigs.io/v1alpha1"},
}

// ciValuesArgs are the helm arguments that render a ci values file on a
// cluster that serves the APIs it needs.
func ciValuesArgs(file string) []string {
	out := []string{"-f", file}
	for _, api := range ciAPIVersions[filepath.Base(file)] {
		out = append(out, "--api-versions", api)
	}
	return out
}

// startEnvtest starts env's kube-apiserver and etcd (from kubebuilderAssets)
// and stops them when the test ends. envtest's 20 s default is too short on
// a loaded 2-core machine; a timeout set in the environment (make test sets
// one) wins.
func startEnvtest(t *testing.T, env *envtest.Environment) *rest.Config {
	t.Helper()
	env.BinaryAssetsDirectory = kubebuilderAssets(t)
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		env.ControlPlaneStartTimeout = 120 * time.Second
	}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_STOP_TIMEOUT") == "" {
		env.ControlPlaneStopTimeout = 60 * time.Second
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest (kube-apiserver and etcd from %s): %v", env.BinaryAssetsDirectory, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	return cfg
}
