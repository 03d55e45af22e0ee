package chart_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// quickStartValues is the values file docs/quick-start.md installs with.
const quickStartValues = "examples/quick-start/values.yaml"

// checkQuickStart installs the chart as docs/quick-start.md does, with its
// exact values (server-side dry-run on the API server of kubeconfig), and
// checks the Pod Security level the quick start labels the namespace with:
// the device plugin's pods are refused at baseline and admitted at
// privileged, and the quick start's workload pods are admitted at baseline.
func checkQuickStart(t *testing.T, kubeconfig string, cfg *rest.Config) {
	t.Helper()
	for _, extra := range [][]string{nil, {"--set", "global.imageRegistry=registry.example.com/urma"}} {
		rel := installDryRun(t, kubeconfig, append([]string{"-f", quickStartValues}, extra...)...)
		ds := named(rel.objs, "DaemonSet", dpName)
		if ds == nil {
			t.Fatalf("the quick start's install (%v) renders no DaemonSet %s: %v", extra, dpName, names(rel.objs))
		}
		c := container(t, ds, "device-plugin")
		if v, _ := argValue(args(t, c), "--soft-devices"); v != "2" {
			t.Errorf("the quick start's install (%v) runs the plugin with --soft-devices=%q, want 2", extra, v)
		}
		wantRegistry := "ghcr.io/openeuler/"
		if extra != nil {
			wantRegistry = "registry.example.com/urma/"
		}
		if img := fmt.Sprint(c["image"]); !strings.HasPrefix(img, wantRegistry+"urma-device-plugin:") {
			t.Errorf("the quick start's install (%v) runs image %s, want it from %s", extra, img, wantRegistry)
		}
		if extra == nil {
			checkPodSecurity(t, cfg, ds)
		}
	}
}

func checkPodSecurity(t *testing.T, cfg *rest.Config, ds *unstructured.Unstructured) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var tmpl corev1.PodTemplateSpec
	raw, found, err := unstructured.NestedMap(ds.Object, "spec", "template")
	if err != nil || !found {
		t.Fatalf("the DaemonSet has no pod template: %v", err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &tmpl); err != nil {
		t.Fatalf("the DaemonSet's pod template: %v", err)
	}
	quickStart := readQuickStartPods(t)

	for _, level := range []string{"baseline", "privileged"} {
		ns := "psa-" + level
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{"pod-security.kubernetes.io/enforce": level},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
		// No controller-manager makes ServiceAccounts here.
		for _, sa := range []string{tmpl.Spec.ServiceAccountName, "default"} {
			if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create ServiceAccount %s/%s: %v", ns, sa, err)
			}
		}
		dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
		plugin := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "device-plugin", Namespace: ns, Labels: tmpl.Labels}, Spec: tmpl.Spec}
		_, err = cs.CoreV1().Pods(ns).Create(ctx, plugin, dryRun)
		switch {
		case level == "privileged" && err != nil:
			t.Errorf("the device plugin's pod is refused in a namespace labelled enforce=privileged, as the quick start labels urma-system: %v", err)
		case level == "baseline" && (err == nil || !strings.Contains(err.Error(), "violates PodSecurity") || !strings.Contains(err.Error(), "hostPath")):
			t.Errorf("the device plugin's pod in a namespace enforcing baseline: err = %v, want a PodSecurity refusal naming hostPath (the docs say baseline refuses it)", err)
		}
		if level != "baseline" {
			continue
		}
		for _, p := range quickStart {
			p = p.DeepCopy()
			p.Namespace = ns
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, dryRun); err != nil {
				t.Errorf("the quick start's pod %s is refused in a namespace enforcing baseline (the docs say workload pods need no label): %v", p.Name, err)
			}
		}
	}
}

// readQuickStartPods decodes examples/quick-start/pods.yaml.
func readQuickStartPods(t *testing.T) []*corev1.Pod {
	t.Helper()
	objs := readManifests(t, filepath.Join(repoRoot(t), "examples", "quick-start", "pods.yaml"))
	var out []*corev1.Pod
	for _, o := range objs {
		p := &corev1.Pod{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, p); err != nil {
			t.Fatalf("examples/quick-start/pods.yaml: %v", err)
		}
		out = append(out, p)
	}
	if len(out) != 2 {
		t.Fatalf("examples/quick-start/pods.yaml has %d pods, want 2", len(out))
	}
	return out
}
