package chart_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"

	draslices "github.com/openeuler/urma-k8s/internal/dra/slices"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

// TestDRADriver renders driver: dra and checks what the DRA driver needs:
// its DaemonSet (no device plugin beside it), kubelet's plugin paths at the
// same place inside and out, its RBAC for ResourceSlices and the policy that
// narrows it to the driver's node, and the DeviceClass equal to the one the
// driver's code describes.
func TestDRADriver(t *testing.T) {
	t.Parallel()
	objs := render(t, "--set", "driver=dra", "--set", "draDriver.jettyRequest.default=32")
	ds := one(t, objs, "DaemonSet") // and no device plugin beside it
	if ds.GetLabels()["app.kubernetes.io/component"] != "dra-driver" {
		t.Fatalf("driver: dra renders DaemonSet %s", ds.GetName())
	}
	c := container(t, ds, "dra-driver")
	argv := args(t, c)
	checkArgs(t, argv, map[string]string{
		"--plugin-data-dir":       "/var/lib/kubelet/plugins/urma.openeuler.org",
		"--registrar-dir":         "/var/lib/kubelet/plugins_registry",
		"--jetty-request-default": "32",
		"--shm-dir":               "/var/run/urma-k8s/shm",
	})
	// kubelet dials the sockets by their host paths: they must be mounted
	// at the same paths.
	mounts := map[string]string{}
	for _, m := range c["volumeMounts"].([]any) {
		mm := m.(map[string]any)
		mounts[mm["name"].(string)] = mm["mountPath"].(string)
	}
	for _, v := range podSpec(t, ds)["volumes"].([]any) {
		vv := v.(map[string]any)
		name := vv["name"].(string)
		if name != "plugin-data" && name != "plugins-registry" {
			continue
		}
		host := vv["hostPath"].(map[string]any)["path"].(string)
		if mounts[name] != host {
			t.Errorf("volume %s: host %s mounted at %s", name, host, mounts[name])
		}
	}
	// The shm directory's parent, at the same path: claims mount the
	// directory by its host path, and the driver must recreate it there.
	checkHostPaths(t, ds, map[string]hostMount{
		"/var/run/urma-k8s": {mountPath: "/var/run/urma-k8s", readOnly: false},
	})

	role := named(objs, "ClusterRole", ds.GetName())
	if role == nil {
		t.Fatalf("no ClusterRole for the driver; have %v", names(ofKind(objs, "ClusterRole")))
	}
	var verbs []string
	for _, r := range field(t, role, "rules").([]any) {
		rule := r.(map[string]any)
		if slices.Contains(rule["resources"].([]any), any("resourceslices")) {
			for _, v := range rule["verbs"].([]any) {
				verbs = append(verbs, v.(string))
			}
		}
	}
	for _, want := range []string{"create", "update", "delete", "list", "watch"} {
		if !slices.Contains(verbs, want) {
			t.Errorf("the driver may not %s resourceslices (verbs %v)", want, verbs)
		}
	}
	// The helper's slice controller uses neither.
	for _, unwanted := range []string{"patch", "deletecollection", "*"} {
		if slices.Contains(verbs, unwanted) {
			t.Errorf("the driver may %s resourceslices, which it never does (verbs %v)", unwanted, verbs)
		}
	}

	// RBAC cannot limit the slices to the driver's node: the policy does
	// (TestDRASlicePolicyOnTheAPIServer tries it).
	vap := one(t, objs, "ValidatingAdmissionPolicy")
	if conds, want := fmt.Sprint(field(t, vap, "spec", "matchConditions")), "system:serviceaccount:"+releaseNS+":"+draName; !strings.Contains(conds, want) {
		t.Errorf("policy %s matches %s, want the driver's ServiceAccount %s", vap.GetName(), conds, want)
	}
	if rules := fmt.Sprint(field(t, vap, "spec", "validations")); !strings.Contains(rules, "'"+slicefacts.DriverName+"'") {
		t.Errorf("policy %s does not name driver %s: %s", vap.GetName(), slicefacts.DriverName, rules)
	}
	binding := one(t, objs, "ValidatingAdmissionPolicyBinding")
	if got := field(t, binding, "spec", "policyName"); got != vap.GetName() {
		t.Errorf("binding names policy %v, want %s", got, vap.GetName())
	}
	if got := fmt.Sprint(field(t, binding, "spec", "validationActions")); got != "[Deny]" {
		t.Errorf("binding validationActions %s, want [Deny]", got)
	}
	// A release upgraded with --reuse-values from a chart older than the
	// key has no value for it: the policy stays.
	unset := render(t, "--set", "driver=dra", "--set", "draDriver.restrictSlicesToOwnNode=null")
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if found := ofKind(unset, kind); len(found) != 1 {
			t.Errorf("draDriver.restrictSlicesToOwnNode unset renders %d %s, want 1", len(found), kind)
		}
	}
	off := render(t, "--set", "driver=dra", "--set", "draDriver.restrictSlicesToOwnNode=false")
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if found := ofKind(off, kind); len(found) != 0 {
			t.Errorf("draDriver.restrictSlicesToOwnNode=false renders %v", names(found))
		}
	}

	var dc resourceapi.DeviceClass
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(one(t, objs, "DeviceClass").Object, &dc); err != nil {
		t.Fatal(err)
	}
	want := draslices.DeviceClass()
	if dc.Name != want.Name || !equality.Semantic.DeepEqual(dc.Spec, want.Spec) {
		t.Errorf("chart DeviceClass %s %+v, want %s %+v (internal/dra/slices)", dc.Name, dc.Spec, want.Name, want.Spec)
	}

	// The default is the device plugin, with no DRA object at all.
	for _, o := range render(t) {
		if o.GetKind() == "DeviceClass" || o.GetLabels()["app.kubernetes.io/component"] == "dra-driver" {
			t.Errorf("the default render has DRA object %s %s", o.GetKind(), o.GetName())
		}
	}
}

// TestDRAModeRendersNoDevicePlugin renders driver: dra with every optional
// object of the device plugin asked for (ServiceMonitor, NodeFeatureRule,
// node labels with their admission policy), on a cluster that serves all
// their APIs: the device plugin does not run, so none of them may render,
// and the monitoring is for what runs. The DRA driver serves no metrics,
// so only the operator is scraped.
func TestDRAModeRendersNoDevicePlugin(t *testing.T) {
	t.Parallel()
	objs := render(t, "--set", "driver=dra",
		"--set", "devicePlugin.enabled=true",
		"--set", "metrics.serviceMonitor.enabled=true", "-a", "monitoring.coreos.com/v1",
		"--set", "devicePlugin.nfd.nodeFeatureRule=true", "-a", "nfd.k8s-sigs.io/v1alpha1",
		"--set", "devicePlugin.nodeLabels.enabled=true", "--set", "devicePlugin.nodeLabels.admissionPolicy=true")
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/component"] == "device-plugin" || strings.Contains(o.GetName(), "device-plugin") {
			t.Errorf("driver: dra renders %s/%s of the device plugin", o.GetKind(), o.GetName())
		}
	}
	monitors := ofKind(objs, "ServiceMonitor")
	if len(monitors) != 1 || monitors[0].GetName() != operatorName {
		t.Errorf("driver: dra renders ServiceMonitors %v, want only %s", names(monitors), operatorName)
	}
	for _, sm := range monitors {
		sel, _ := field(t, sm, "spec", "selector", "matchLabels").(map[string]any)
		if !serviceWithMetricsPort(objs, sel) {
			t.Errorf("%s selects %v, which matches no Service with a port named metrics", sm.GetName(), sel)
		}
	}

	// The device plugin's values are not checked when it does not run.
	render(t, "--set", "driver=dra", "--set", "devicePlugin.extraArgs={--nfd-features-dir=/x}")

	// Nothing to scrape: no ServiceMonitor, and so no need for its API.
	objs = render(t, "--set", "driver=dra", "--set", "operator.enabled=false", "--set", "webhook.enabled=false",
		"--set", "metrics.serviceMonitor.enabled=true")
	if found := ofKind(objs, "ServiceMonitor"); len(found) != 0 {
		t.Errorf("with no component that serves metrics the chart renders %v", names(found))
	}
	one(t, objs, "DaemonSet")
}
