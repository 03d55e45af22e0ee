package chart_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestMigrationReleasesDoNotCollide renders the two releases docs/dra.md's
// migration runs side by side in one namespace (the full release on the
// device plugin's nodes, and one holding only the DRA driver and its
// DeviceClass) and checks that no object of one has the kind and name of an
// object of the other, which Helm would refuse to install, and that each
// driver runs only on the nodes labelled for it.
func TestMigrationReleasesDoNotCollide(t *testing.T) {
	t.Parallel()
	const label = `urma\.openeuler\.org/driver`
	main := renderRelease(t, releaseName, "--set-string", "devicePlugin.nodeSelector."+label+"=device-plugin")
	dra := renderRelease(t, "urma-dra", "--set", "driver=dra", "--set", "operator.enabled=false", "--set", "webhook.enabled=false",
		"--set", "crds.install=false", "--set-string", "draDriver.nodeSelector."+label+"=dra")

	seen := map[string]bool{}
	for _, o := range main {
		seen[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = true
	}
	for _, o := range dra {
		if key := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName(); seen[key] {
			t.Errorf("both releases render %s", key)
		}
	}
	for _, r := range []struct {
		name, value string
		objs        []map[string]any
	}{{"urma", "device-plugin", objects(main)}, {"urma-dra", "dra", objects(dra)}} {
		var daemonSets int
		for _, o := range r.objs {
			if o["kind"] != "DaemonSet" {
				continue
			}
			daemonSets++
			spec, _ := o["spec"].(map[string]any)
			tmpl, _ := spec["template"].(map[string]any)
			pod, _ := tmpl["spec"].(map[string]any)
			sel, _ := pod["nodeSelector"].(map[string]any)
			if sel["urma.openeuler.org/driver"] != r.value {
				t.Errorf("release %s's DaemonSet selects nodes %v, want urma.openeuler.org/driver=%s", r.name, sel, r.value)
			}
		}
		if daemonSets != 1 {
			t.Errorf("release %s renders %d DaemonSets, want its one driver", r.name, daemonSets)
		}
	}
	if len(ofKind(dra, "DeviceClass")) != 1 || len(ofKind(main, "DeviceClass")) != 0 {
		t.Error("the DeviceClass must come with the DRA release alone")
	}
	for _, kind := range []string{"CustomResourceDefinition", "MutatingWebhookConfiguration", "Deployment"} {
		if found := ofKind(dra, kind); len(found) != 0 {
			t.Errorf("the DRA release renders %v: one release per cluster owns it", names(found))
		}
	}
}

// renderRelease is render for a release of another name.
func renderRelease(t *testing.T, release string, values ...string) []*unstructured.Unstructured {
	t.Helper()
	res := runHelm(t, append([]string{"template", release, chartRelPath, "--namespace", releaseNS}, values...)...)
	if res.err != nil {
		t.Fatalf("helm template %s %v: %v\n%s", release, values, res.err, res.stderr)
	}
	objs, err := decodeManifests(res.stdout)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func objects(objs []*unstructured.Unstructured) []map[string]any {
	out := make([]map[string]any, len(objs))
	for i, o := range objs {
		out[i] = o.Object
	}
	return out
}
