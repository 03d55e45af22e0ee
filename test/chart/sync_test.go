package chart_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestChartCopiesInSync fails when the chart's copies of the generated
// manifests differ from config/ (run hack/sync-chart-crds.sh).
func TestChartCopiesInSync(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	chart := chartDir(t)

	sources, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(sources) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (err %v): run `make manifests`", err)
	}
	copies, err := filepath.Glob(filepath.Join(chart, "files", "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	base := func(paths []string) []string {
		out := make([]string, len(paths))
		for i, p := range paths {
			out[i] = filepath.Base(p)
		}
		slices.Sort(out)
		return out
	}
	if got, want := base(copies), base(sources); !slices.Equal(got, want) {
		t.Errorf("chart CRDs %v, config/crd/bases has %v: run hack/sync-chart-crds.sh", got, want)
	}

	pairs := map[string]string{
		filepath.Join("config", "rbac", "role.yaml"):         filepath.Join("files", "rbac", "role.yaml"),
		filepath.Join("config", "webhook", "manifests.yaml"): filepath.Join("files", "webhook", "manifests.yaml"),
	}
	for _, src := range sources {
		pairs[filepath.Join("config", "crd", "bases", filepath.Base(src))] = filepath.Join("files", "crds", filepath.Base(src))
	}
	for src, dst := range pairs {
		want, err := os.ReadFile(filepath.Join(root, src))
		if err != nil {
			t.Errorf("reading %s: %v (run `make manifests`)", src, err)
			continue
		}
		got, err := os.ReadFile(filepath.Join(chart, dst))
		if err != nil {
			t.Errorf("reading %s/%s: %v (run hack/sync-chart-crds.sh)", chartRelPath, dst, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s/%s differs from %s: run hack/sync-chart-crds.sh", chartRelPath, dst, src)
		}
	}
}

// TestSyncScriptCheck checks that `hack/sync-chart-crds.sh --check` agrees:
// clean on the repository, and failing on a copy of it with a stale CRD.
func TestSyncScriptCheck(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	run := func(dir string) (string, error) {
		cmd := exec.Command("bash", filepath.Join(dir, "hack", "sync-chart-crds.sh"), "--check")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(root); err != nil {
		t.Fatalf("sync-chart-crds.sh --check on the repository: %v\n%s", err, out)
	}

	// A minimal copy of the tree with one CRD edited.
	tmp := t.TempDir()
	for _, dir := range []string{"config", filepath.Join(chartRelPath, "files")} {
		copyTree(t, filepath.Join(root, dir), filepath.Join(tmp, dir))
	}
	copyTree(t, filepath.Join(root, "hack", "sync-chart-crds.sh"), filepath.Join(tmp, "hack", "sync-chart-crds.sh"))
	crds, _ := filepath.Glob(filepath.Join(tmp, "config", "crd", "bases", "*.yaml"))
	if len(crds) == 0 {
		t.Fatal("no CRDs in config/crd/bases")
	}
	f, err := os.OpenFile(crds[0], os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("# edited\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := run(tmp)
	if err == nil {
		t.Fatalf("sync-chart-crds.sh --check passed with a stale CRD copy:\n%s", out)
	}
	if !strings.Contains(out, filepath.Base(crds[0])) {
		t.Errorf("sync-chart-crds.sh --check does not name the stale file %s:\n%s", filepath.Base(crds[0]), out)
	}
}

// TestOperatorRBACMatchesGenerated compares the rendered operator RBAC with
// config/rbac/role.yaml, generated from the operator's markers: the
// ClusterRole's rules must be the generated ClusterRole's, and the chart's
// Role (in the release namespace) must hold the generated Role's rules.
func TestOperatorRBACMatchesGenerated(t *testing.T) {
	t.Parallel()
	generated := readManifests(t, filepath.Join(repoRoot(t), "config", "rbac", "role.yaml"))
	var clusterRules, roleRules []any
	for _, o := range generated {
		rules, _ := o.Object["rules"].([]any)
		switch o.GetKind() {
		case "ClusterRole":
			clusterRules = append(clusterRules, rules...)
		case "Role":
			roleRules = append(roleRules, rules...)
		default:
			t.Errorf("config/rbac/role.yaml has a %s, which the chart does not render", o.GetKind())
		}
	}
	if len(clusterRules) == 0 {
		t.Fatal("config/rbac/role.yaml has no ClusterRole rules")
	}
	objs := render(t)
	role := named(objs, "ClusterRole", operatorName)
	if role == nil {
		t.Fatalf("no ClusterRole %s rendered", operatorName)
	}
	if got := role.Object["rules"]; !reflect.DeepEqual(got, clusterRules) {
		t.Errorf("ClusterRole %s rules differ from config/rbac/role.yaml:\n got %v\nwant %v", operatorName, got, clusterRules)
	}
	nsRole := named(objs, "Role", operatorName)
	if len(roleRules) == 0 {
		if nsRole != nil {
			t.Errorf("Role %s rendered although config/rbac/role.yaml has no Role", operatorName)
		}
		return
	}
	if nsRole == nil {
		t.Fatalf("no Role %s rendered", operatorName)
	}
	if nsRole.GetNamespace() != releaseNS {
		t.Errorf("Role %s is in namespace %q, want the release namespace %s", operatorName, nsRole.GetNamespace(), releaseNS)
	}
	if got := nsRole.Object["rules"]; !reflect.DeepEqual(got, roleRules) {
		t.Errorf("Role %s rules differ from config/rbac/role.yaml:\n got %v\nwant %v", operatorName, got, roleRules)
	}
}

// TestWebhooksMatchGenerated checks that every generated webhook is rendered
// with its generated path, rules and side effects.
func TestWebhooksMatchGenerated(t *testing.T) {
	t.Parallel()
	generated := readManifests(t, filepath.Join(repoRoot(t), "config", "webhook", "manifests.yaml"))
	if len(generated) == 0 {
		t.Fatal("config/webhook/manifests.yaml has no webhook configuration")
	}
	objs := render(t)
	for _, cfg := range generated {
		rendered := ofKind(objs, cfg.GetKind())
		if len(rendered) != 1 {
			t.Errorf("want one rendered %s, got %v", cfg.GetKind(), names(rendered))
			continue
		}
		got := map[string]map[string]any{}
		for _, w := range field(t, rendered[0], "webhooks").([]any) {
			wh := w.(map[string]any)
			got[wh["name"].(string)] = wh
		}
		for _, w := range field(t, cfg, "webhooks").([]any) {
			want := w.(map[string]any)
			name := want["name"].(string)
			have, ok := got[name]
			if !ok {
				t.Errorf("generated webhook %s is not rendered", name)
				continue
			}
			for _, key := range []string{"rules", "sideEffects", "admissionReviewVersions", "matchPolicy", "reinvocationPolicy"} {
				if !reflect.DeepEqual(have[key], want[key]) {
					t.Errorf("webhook %s %s = %v, generated %v", name, key, have[key], want[key])
				}
			}
			wantPath := want["clientConfig"].(map[string]any)["service"].(map[string]any)["path"]
			havePath := have["clientConfig"].(map[string]any)["service"].(map[string]any)["path"]
			if wantPath != havePath {
				t.Errorf("webhook %s path = %v, generated %v", name, havePath, wantPath)
			}
		}
	}
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatalf("copying %s: %v", src, err)
	}
}
