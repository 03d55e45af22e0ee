package chart_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestInstallOnAPIServer runs `helm install --dry-run=server` against real
// kube-apiservers (envtest). There helm's capabilities are the APIs the API
// server serves, not helm's offline defaults, so this is where the chart's
// checks of the cluster's APIs meet a cluster: one that serves
// resource.k8s.io/v1 and one that does not (it is switched off, as on a
// cluster before Kubernetes 1.34).
func TestInstallOnAPIServer(t *testing.T) {
	t.Parallel()

	t.Run("DRA served", func(t *testing.T) {
		t.Parallel()
		// With the stand-in CRDs, for the ServiceMonitor below.
		env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("testdata", "crds")}, ErrorIfCRDPathMissing: true}
		kubeconfig := envtestKubeconfig(t, env)
		// docs/quick-start.md's install, on this API server too.
		checkQuickStart(t, kubeconfig, env.Config)
		rel := installDryRun(t, kubeconfig, "--set", "driver=dra")
		dc := one(t, rel.objs, "DeviceClass")
		if dc.GetAPIVersion() != "resource.k8s.io/v1" {
			t.Errorf("DeviceClass is %s, want resource.k8s.io/v1", dc.GetAPIVersion())
		}

		// The notes describe DRA: claims of the DeviceClass, the slices;
		// nothing of the device plugin, which does not run.
		for _, want := range []string{"DRA driver", "ResourceClaim", "deviceClassName: urma.openeuler.org", "jetties: \"64\"",
			"A request that names no amount gets 16 jetties", "The DeviceClass urma.openeuler.org is part of this release", "from\n  the webhook"} {
			if !strings.Contains(rel.notes, want) {
				t.Errorf("driver=dra notes lack %q:\n%s", want, rel.notes)
			}
		}
		for _, unwanted := range []string{"Device plugin", "device plugin", "allocatable", "urma.openeuler.org/jetty"} {
			if strings.Contains(rel.notes, unwanted) {
				t.Errorf("driver=dra notes mention %q:\n%s", unwanted, rel.notes)
			}
		}
		// The command the notes give works on this API server.
		_, selector, ok := strings.Cut(rel.notes, "kubectl get resourceslices --field-selector ")
		selector, _, _ = strings.Cut(selector, "\n")
		if !ok || selector == "" {
			t.Fatalf("driver=dra notes give no command that lists the driver's ResourceSlices:\n%s", rel.notes)
		}
		cs, err := kubernetes.NewForConfig(env.Config)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: selector}); err != nil {
			t.Errorf("listing ResourceSlices with the notes' --field-selector %s: %v", selector, err)
		}

		rel = installDryRun(t, kubeconfig, "--set", "driver=dra", "--set", "draDriver.installDeviceClass=false",
			"--set", "webhook.enabled=false", "--set", "metrics.serviceMonitor.enabled=true")
		if found := ofKind(rel.objs, "DeviceClass"); len(found) != 0 {
			t.Errorf("draDriver.installDeviceClass=false renders %v", names(found))
		}
		one(t, rel.objs, "ServiceMonitor") // the operator's
		for _, want := range []string{"not part of this release (draDriver.installDeviceClass=false)", "kubectl get deviceclass urma.openeuler.org",
			"ResourceClaimTemplate <name>-urma-jetties", "The DRA driver serves no metrics"} {
			if !strings.Contains(rel.notes, want) {
				t.Errorf("notes lack %q:\n%s", want, rel.notes)
			}
		}
	})

	t.Run("DRA not served", func(t *testing.T) {
		t.Parallel()
		env := &envtest.Environment{}
		env.ControlPlane.GetAPIServer().Configure().Set("runtime-config", "resource.k8s.io/v1=false")
		kubeconfig := envtestKubeconfig(t, env)
		if served(t, env, "resource.k8s.io/v1") {
			t.Fatal("the API server serves resource.k8s.io/v1 despite --runtime-config=resource.k8s.io/v1=false")
		}

		res := runHelmWithKubeconfig(t, kubeconfig, installArgs("--set", "driver=dra")...)
		if res.err == nil {
			t.Fatalf("helm install --set driver=dra succeeded on a cluster without resource.k8s.io/v1:\n%s", res.stdout)
		}
		for _, want := range []string{"driver=dra needs the resource.k8s.io/v1 API", "set driver=devicePlugin"} {
			if !strings.Contains(res.stderr, want) {
				t.Errorf("helm's error does not say %q:\n%s", want, res.stderr)
			}
		}

		// The device plugin needs no DRA: the default still installs, and
		// its notes are the device plugin's.
		rel := installDryRun(t, kubeconfig)
		if found := ofKind(rel.objs, "DeviceClass"); len(found) != 0 {
			t.Errorf("the default install renders %v", names(found))
		}
		one(t, rel.objs, "DaemonSet")
		for _, want := range []string{"Device plugin: runs on every Linux node", "allocatable.urma\\.openeuler\\.org/jetty", "no urma-k8s image is\n  published"} {
			if !strings.Contains(rel.notes, want) {
				t.Errorf("default notes lack %q:\n%s", want, rel.notes)
			}
		}
		for _, unwanted := range []string{"DRA", "ResourceClaim", "ResourceSlice"} {
			if strings.Contains(rel.notes, unwanted) {
				t.Errorf("default notes mention %q:\n%s", unwanted, rel.notes)
			}
		}
	})
}

// dryRunRelease is what `helm install --dry-run=server -o json` reports.
type dryRunRelease struct {
	notes string
	objs  []*unstructured.Unstructured
}

// installArgs are the arguments of a server-side dry-run install of the
// chart with extra value flags, reported as JSON.
func installArgs(values ...string) []string {
	return append([]string{"install", releaseName, chartRelPath, "--namespace", releaseNS, "--dry-run=server", "-o", "json"}, values...)
}

// installDryRun runs a server-side dry-run install against the cluster of
// kubeconfig and decodes its manifest and notes; it fails the test when
// helm fails.
func installDryRun(t *testing.T, kubeconfig string, values ...string) dryRunRelease {
	t.Helper()
	res := runHelmWithKubeconfig(t, kubeconfig, installArgs(values...)...)
	if res.err != nil {
		t.Fatalf("helm install --dry-run=server %s: %v\n%s", strings.Join(values, " "), res.err, res.stderr)
	}
	var out struct {
		Info struct {
			Notes string `json:"notes"`
		} `json:"info"`
		Manifest string `json:"manifest"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &out); err != nil {
		t.Fatalf("decoding helm install -o json %s: %v\n%s", strings.Join(values, " "), err, res.stdout)
	}
	objs, err := decodeManifests(out.Manifest)
	if err != nil {
		t.Fatalf("decoding the manifest of helm install %s: %v", strings.Join(values, " "), err)
	}
	if len(objs) == 0 {
		t.Fatalf("helm install %s rendered nothing", strings.Join(values, " "))
	}
	return dryRunRelease{notes: out.Info.Notes, objs: objs}
}

// envtestKubeconfig starts env and returns the path of a kubeconfig file for
// an administrator of it.
func envtestKubeconfig(t *testing.T, env *envtest.Environment) string {
	t.Helper()
	startEnvtest(t, env)
	user, err := env.AddUser(envtest.User{Name: "helm", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatalf("adding a user to envtest: %v", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		t.Fatalf("kubeconfig of the envtest user: %v", err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// served reports whether env's API server serves a group/version.
func served(t *testing.T, env *envtest.Environment, groupVersion string) bool {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := dc.ServerGroups()
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	for _, g := range groups.Groups {
		for _, v := range g.Versions {
			if v.GroupVersion == groupVersion {
				return true
			}
		}
	}
	return false
}
