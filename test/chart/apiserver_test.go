package chart_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestRenderedObjectsAcceptedByAPIServer renders the chart with default values
// and with every ci/*-values.yaml, starts a real kube-apiserver and etcd
// (envtest), installs the chart's CRDs for real (and stand-ins for
// cert-manager's and the Prometheus Operator's, testdata/crds), and then
// server-side applies every rendered object with dryRun=All. Server-side apply
// rejects fields a schema does not declare, so a misplaced field fails too.
func TestRenderedObjectsAcceptedByAPIServer(t *testing.T) {
	t.Parallel()

	type variant struct {
		name string
		objs []*unstructured.Unstructured
	}
	variants := []variant{{name: "default", objs: render(t)}}
	for _, f := range ciValuesFiles(t) {
		variants = append(variants, variant{name: filepath.Base(f), objs: render(t, ciValuesArgs(f)...)})
	}

	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, o := range ofKind(variants[0].objs, "CustomResourceDefinition") {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, crd); err != nil {
			t.Fatalf("converting rendered CRD %s: %v", o.GetName(), err)
		}
		crds = append(crds, crd)
	}
	if len(crds) == 0 {
		t.Fatal("the default render has no CRD to install")
	}

	cfg := startEnvtest(t, &envtest.Environment{
		CRDs:                  crds,
		CRDDirectoryPaths:     []string{filepath.Join("testdata", "crds")},
		ErrorIfCRDPathMissing: true,
	})
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("creating a client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatalf("creating namespace %s: %v", releaseNS, err)
	}

	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			if len(v.objs) == 0 {
				t.Fatal("nothing rendered")
			}
			for _, o := range v.objs {
				t.Run(o.GetKind()+"/"+o.GetName(), func(t *testing.T) {
					if err := dryRunApply(ctx, c, o); err != nil {
						t.Error(err)
					}
				})
			}
		})
	}
}

// dryRunApply server-side applies one object with dryRun=All, putting
// namespaced objects that carry no namespace into the release namespace.
func dryRunApply(ctx context.Context, c client.Client, o *unstructured.Unstructured) error {
	obj := o.DeepCopy()
	mapping, err := c.RESTMapper().RESTMapping(obj.GroupVersionKind().GroupKind(), obj.GroupVersionKind().Version)
	if err != nil {
		return fmt.Errorf("the API server does not serve %s: %w", obj.GroupVersionKind(), err)
	}
	namespaced := mapping.Scope.Name() == meta.RESTScopeNameNamespace
	switch {
	case namespaced && obj.GetNamespace() == "":
		obj.SetNamespace(releaseNS)
	case !namespaced && obj.GetNamespace() != "":
		return fmt.Errorf("cluster-scoped %s/%s is rendered with namespace %q", obj.GetKind(), obj.GetName(), obj.GetNamespace())
	}
	err = c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj),
		client.FieldOwner("urma-chart-test"), client.ForceOwnership, client.DryRunAll)
	if err != nil {
		return fmt.Errorf("server-side dry-run apply of %s/%s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}
