package chart_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openeuler/urma-k8s/internal/deviceplugin"
	"github.com/openeuler/urma-k8s/internal/dra"
)

const (
	endpointLabel  = "urma.openeuler.org/endpoint"
	presentLabel   = "urma.openeuler.org/present"
	nfdLabel       = "feature.node.kubernetes.io/urma-ub"
	crdName        = "urmaendpoints.urma.openeuler.org"
	dpName         = releaseName + "-urma-k8s-device-plugin"
	operatorName   = releaseName + "-urma-k8s-operator"
	webhookSvcName = releaseName + "-urma-k8s-webhook"
	webhookCfgName = "urma-operator-mutating" // generated name, kept by the chart
	certSecretName = releaseName + "-urma-k8s-webhook-cert"
)

// TestTemplateDefaults checks what a default install creates.
func TestTemplateDefaults(t *testing.T) {
	t.Parallel()
	objs := render(t)

	for _, kind := range []string{"CustomResourceDefinition", "DaemonSet", "Deployment", "MutatingWebhookConfiguration"} {
		if len(ofKind(objs, kind)) == 0 {
			t.Errorf("default render has no %s; it has %v", kind, names(objs))
		}
	}
	for _, kind := range []string{"Certificate", "Issuer", "ServiceMonitor", "PodDisruptionBudget"} {
		if found := ofKind(objs, kind); len(found) != 0 {
			t.Errorf("default render has %v, want no %s (it is opt-in)", names(found), kind)
		}
	}

	crd := named(objs, "CustomResourceDefinition", crdName)
	if crd == nil {
		t.Fatalf("no CRD %s in %v", crdName, names(objs))
	}
	if got := crd.GetAnnotations()["helm.sh/resource-policy"]; got != "keep" {
		t.Errorf("CRD resource-policy annotation = %q, want keep (uninstall must not delete every UrmaEndpoint)", got)
	}

	t.Run("device plugin", func(t *testing.T) {
		ds := named(objs, "DaemonSet", dpName)
		if ds == nil {
			t.Fatalf("no DaemonSet %s in %v", dpName, names(objs))
		}
		spec := podSpec(t, ds)
		// A fresh install runs the plugin on every Linux node: nothing to
		// label first (where no UB device exists it advertises nothing).
		if terms := requiredNodeTerms(spec); terms != nil {
			t.Errorf("required node affinity = %v, want none: the plugin must start on every Linux node", terms)
		}
		if got, want := spec["nodeSelector"], map[string]any{"kubernetes.io/os": "linux"}; !reflect.DeepEqual(got, want) {
			t.Errorf("nodeSelector = %v, want %v", got, want)
		}
		if got := spec["priorityClassName"]; got != "system-node-critical" {
			t.Errorf("priorityClassName = %v, want system-node-critical", got)
		}
		if v, ok := argValue(args(t, container(t, ds, "device-plugin")), "--nfd-features-dir"); ok {
			t.Errorf("--nfd-features-dir=%s by default, want none", v)
		}
		c := container(t, ds, "device-plugin")
		argv := args(t, c)
		if v, ok := argValue(argv, "--soft-devices"); ok {
			t.Errorf("hardware mode passes --soft-devices=%s", v)
		}
		if v, _ := argValue(argv, "--socket-dir"); v != "/var/lib/kubelet/device-plugins" {
			t.Errorf("--socket-dir = %q, want the mounted kubelet directory", v)
		}
		checkNodeNameEnv(t, c)
		checkHostPaths(t, ds, map[string]hostMount{
			"/var/lib/kubelet/device-plugins": {mountPath: "/var/lib/kubelet/device-plugins", readOnly: false},
			"/sys":                            {mountPath: "/host/sys", readOnly: true},
			"/dev":                            {mountPath: "/host/dev", readOnly: true},
			// Where same-node pods meet for shared memory: its parent at
			// the same path, since Allocate mounts the directory into pods
			// under it, and the plugin must recreate it on the host.
			"/var/run/urma-k8s": {mountPath: "/var/run/urma-k8s", readOnly: false},
		})
		if v, _ := argValue(argv, "--shm-dir"); v != "/var/run/urma-k8s/shm" {
			t.Errorf("--shm-dir = %q, want the mounted shm directory", v)
		}
		// The binary's own defaults, spelled out.
		dflt := deviceplugin.Default()
		checkDurationArgs(t, argv, map[string]time.Duration{
			"--node-facts-resync-interval": dflt.NodeResync,
			"--kubelet-check-interval":     dflt.Registrar.CheckInterval,
			"--resync-interval":            dflt.Server.Resync,
		})
		sc, _ := c["securityContext"].(map[string]any)
		if sc["privileged"] != false || sc["allowPrivilegeEscalation"] != false {
			t.Errorf("device plugin securityContext = %v, want unprivileged without privilege escalation", sc)
		}
		if caps, _ := sc["capabilities"].(map[string]any); !reflect.DeepEqual(caps["drop"], []any{"ALL"}) {
			t.Errorf("device plugin capabilities = %v, want drop ALL", caps)
		}
		role := named(objs, "ClusterRole", dpName)
		if role == nil {
			t.Fatalf("no ClusterRole %s for node labelling", dpName)
		}
		wantRules := []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"nodes"}, "verbs": []any{"get", "patch"}}}
		if got := field(t, role, "rules"); !reflect.DeepEqual(got, wantRules) {
			t.Errorf("device plugin rules = %v, want %v", got, wantRules)
		}
		// RBAC cannot limit the patch to the plugin's own node: the policy does.
		vap := one(t, objs, "ValidatingAdmissionPolicy")
		conds := fmt.Sprint(field(t, vap, "spec", "matchConditions"))
		if want := "system:serviceaccount:" + releaseNS + ":" + dpName; !strings.Contains(conds, want) {
			t.Errorf("policy %s matches %s, want the plugin's ServiceAccount %s", vap.GetName(), conds, want)
		}
		binding := one(t, objs, "ValidatingAdmissionPolicyBinding")
		if got := field(t, binding, "spec", "policyName"); got != vap.GetName() {
			t.Errorf("binding names policy %v, want %s", got, vap.GetName())
		}
		if got := fmt.Sprint(field(t, binding, "spec", "validationActions")); got != "[Deny]" {
			t.Errorf("binding validationActions %s, want [Deny]", got)
		}
	})

	t.Run("operator", func(t *testing.T) {
		dep := named(objs, "Deployment", operatorName)
		if dep == nil {
			t.Fatalf("no Deployment %s in %v", operatorName, names(objs))
		}
		c := container(t, dep, "operator")
		argv := args(t, c)
		for flag, want := range map[string]string{"--leader-elect": "true", "--enable-webhooks": "true"} {
			if got, _ := argValue(argv, flag); got != want {
				t.Errorf("%s = %q, want %q (args %v)", flag, got, want, argv)
			}
		}
		for _, probe := range []string{"livenessProbe", "readinessProbe"} {
			if c[probe] == nil {
				t.Errorf("operator container has no %s", probe)
			}
		}
		// Labelled pods are refused (failurePolicy Fail) until a restarted
		// operator is ready: its readiness must follow its start closely
		// (with a 10 s period, the period set the gap in make e2e's chaos
		// step 4, not the operator's start).
		if rp, _ := c["readinessProbe"].(map[string]any); fmt.Sprint(rp["initialDelaySeconds"]) != "1" || fmt.Sprint(rp["periodSeconds"]) != "2" {
			t.Errorf("operator readinessProbe %v, want initialDelaySeconds 1 and periodSeconds 2", rp)
		}
		if sc, _ := podSpec(t, dep)["securityContext"].(map[string]any); sc["runAsNonRoot"] != true {
			t.Errorf("operator pod securityContext = %v, want runAsNonRoot", sc)
		}
		checkWebhookTargetsService(t, objs)
		if got, _ := argValue(argv, "--metrics-secure"); got != "true" {
			t.Errorf("--metrics-secure = %q, want true: /metrics over HTTPS with authentication and authorization", got)
		}
		reader := named(objs, "ClusterRole", releaseName+"-urma-k8s-metrics-reader")
		if reader == nil {
			t.Fatal("no metrics-reader ClusterRole for Prometheus to bind")
		}
		want := []any{map[string]any{"nonResourceURLs": []any{"/metrics"}, "verbs": []any{"get"}}}
		if got := field(t, reader, "rules"); !reflect.DeepEqual(got, want) {
			t.Errorf("metrics-reader rules %v, want %v", got, want)
		}
		cfg := named(objs, "MutatingWebhookConfiguration", webhookCfgName)
		if cfg == nil {
			t.Fatalf("no MutatingWebhookConfiguration %s", webhookCfgName)
		}
		if _, ok := cfg.GetAnnotations()["cert-manager.io/inject-ca-from"]; ok {
			t.Errorf("self-generated certificate mode must not ask cert-manager for the CA")
		}
		for flag, want := range map[string]string{"--self-signed-certs": "true", "--cert-secret": certSecretName, "--webhook-service": webhookSvcName} {
			if got, _ := argValue(argv, flag); got != want {
				t.Errorf("%s = %q, want %q", flag, got, want)
			}
		}
	})
}

// TestTemplateValues checks that non-default values change what they should.
func TestTemplateValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values []string
		check  func(t *testing.T, objs []*unstructured.Unstructured)
	}{{
		name:   "DRA driver on Linux nodes only",
		values: []string{"--set", "driver=dra", "--set", "draDriver.nodeSelector.pool=a"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			// It tolerates every taint, a Windows node's too.
			ds := one(t, objs, "DaemonSet")
			if sel := podSpec(t, ds)["nodeSelector"]; !reflect.DeepEqual(sel, map[string]any{"kubernetes.io/os": "linux", "pool": "a"}) {
				t.Errorf("DRA driver nodeSelector %v, want the given one on Linux nodes", sel)
			}
		},
	}, {
		// A plugin that labels nothing binds no role and mounts no token,
		// so it may run as the namespace's default account.
		name:   "plugin without node labels on the default ServiceAccount",
		values: []string{"--set", "devicePlugin.nodeLabels.enabled=false", "--set", "devicePlugin.serviceAccount.create=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			spec := podSpec(t, ds)
			if got := spec["serviceAccountName"]; got != "default" {
				t.Errorf("serviceAccountName %v, want default", got)
			}
			if got := spec["automountServiceAccountToken"]; got != false {
				t.Errorf("automountServiceAccountToken %v, want false", got)
			}
		},
	}, {
		name:   "operator budget that leaves a replica to evict",
		values: []string{"--set", "operator.podDisruptionBudget.enabled=true", "--set", "operator.replicas=2"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			pdb := one(t, objs, "PodDisruptionBudget")
			if got := field(t, pdb, "spec", "minAvailable"); fmt.Sprint(got) != "1" {
				t.Errorf("minAvailable %v, want 1 of the 2 replicas", got)
			}
		},
	}, {
		name: "device plugin intervals",
		values: []string{"--set", "devicePlugin.nodeFactsResyncInterval=1h30m", "--set", "devicePlugin.kubeletCheckInterval=1500ms",
			"--set", "devicePlugin.resyncInterval=2m30s"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			argv := args(t, container(t, ds, "device-plugin"))
			checkArgs(t, argv, map[string]string{"--node-facts-resync-interval": "1h30m", "--kubelet-check-interval": "1500ms", "--resync-interval": "2m30s"})
		},
	}, {
		// helm upgrade --reuse-values from a chart older than the values
		// renders without them: the flags must be left out (the plugin's
		// defaults), not passed empty, which the plugin refuses at start.
		name: "device plugin intervals unset",
		values: []string{"--set", "devicePlugin.nodeFactsResyncInterval=null", "--set", "devicePlugin.kubeletCheckInterval=null",
			"--set", "devicePlugin.resyncInterval=null"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			argv := args(t, container(t, ds, "device-plugin"))
			checkArgsAbsent(t, argv, "--node-facts-resync-interval", "--kubelet-check-interval", "--resync-interval")
		},
	}, {
		name:   "DRA driver intervals default to the drivers own",
		values: []string{"--set", "driver=dra"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			dflt := dra.Default()
			checkDurationArgs(t, args(t, container(t, ds, "dra-driver")), map[string]time.Duration{
				"--health-resend-interval":     dflt.HealthResend,
				"--stale-claim-check-interval": dflt.StaleClaimCheck,
			})
		},
	}, {
		name:   "DRA driver intervals",
		values: []string{"--set", "driver=dra", "--set", "draDriver.healthResendInterval=2s", "--set", "draDriver.staleClaimCheckInterval=1h"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			argv := args(t, container(t, ds, "dra-driver"))
			checkArgs(t, argv, map[string]string{"--health-resend-interval": "2s", "--stale-claim-check-interval": "1h"})
		},
	}, {
		// As for the device plugin: unset after --reuse-values from an
		// older chart, the driver's defaults, not an empty value.
		name: "DRA driver intervals unset",
		values: []string{"--set", "driver=dra", "--set", "draDriver.healthResendInterval=null",
			"--set", "draDriver.staleClaimCheckInterval=null"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			argv := args(t, container(t, ds, "dra-driver"))
			checkArgsAbsent(t, argv, "--health-resend-interval", "--stale-claim-check-interval")
		},
	}, {
		name:   "software devices run everywhere",
		values: []string{"--set", "devicePlugin.softDevices=4"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			if v, ok := argValue(args(t, container(t, ds, "device-plugin")), "--soft-devices"); v != "4" || !ok {
				t.Errorf("--soft-devices = %q (present %v), want 4", v, ok)
			}
			if sel := podSpec(t, ds)["nodeSelector"]; !reflect.DeepEqual(sel, map[string]any{"kubernetes.io/os": "linux"}) {
				t.Errorf("software devices mode has nodeSelector %v, want every Linux node", sel)
			}
			if terms := requiredNodeTerms(podSpec(t, ds)); terms != nil {
				t.Errorf("software devices mode keeps the hardware node affinity %v", terms)
			}
		},
	}, {
		name:   "hardware plugin on labelled nodes only",
		values: []string{"--set", "devicePlugin.nodeLabel=" + presentLabel},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			if got, want := requiredNodeTerms(podSpec(t, ds)), []any{map[string]any{"matchExpressions": []any{presentExists}}}; !reflect.DeepEqual(got, want) {
				t.Errorf("required node affinity = %v, want %v: nodes labelled %s, whatever its value", got, want, presentLabel)
			}
			if v, ok := argValue(args(t, container(t, ds, "device-plugin")), "--soft-devices"); ok {
				t.Errorf("hardware mode passes --soft-devices=%s", v)
			}
		},
	}, {
		name:   "Node Feature Discovery - a NodeFeatureRule labels UB nodes and the plugin selects them",
		values: []string{"--set", "devicePlugin.nfd.nodeFeatureRule=true", "--set", "devicePlugin.nfd.pciDevices={a22a,a22b}", "-a", "nfd.k8s-sigs.io/v1alpha1"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			nfr := one(t, objs, "NodeFeatureRule")
			rules := fmt.Sprint(field(t, nfr, "spec", "rules"))
			for _, want := range []string{nfdLabel + ":true", "kernel.loadedmodule", "ubcore", "pci.device", "vendor:map[op:In value:[19e5]]", "device:map[op:In value:[a22a a22b]]"} {
				if !strings.Contains(rules, want) {
					t.Errorf("NodeFeatureRule rules %s lack %q", rules, want)
				}
			}
			want := []any{map[string]any{"matchExpressions": []any{map[string]any{"key": nfdLabel, "operator": "Exists"}}}}
			if got := requiredNodeTerms(podSpec(t, one(t, objs, "DaemonSet"))); !reflect.DeepEqual(got, want) {
				t.Errorf("node affinity %v, want the NodeFeatureRule's label %v", got, want)
			}
		},
	}, {
		name:   "Node Feature Discovery without PCI IDs - the module rule only",
		values: []string{"--set", "devicePlugin.nfd.nodeFeatureRule=true", "-a", "nfd.k8s-sigs.io/v1alpha1"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if rules := fmt.Sprint(field(t, one(t, objs, "NodeFeatureRule"), "spec", "rules")); strings.Contains(rules, "pci.device") {
				t.Errorf("a PCI rule without device IDs would match every device of the vendor: %s", rules)
			}
		},
	}, {
		name:   "NFD feature file - the hosts features.d is mounted",
		values: []string{"--set", "devicePlugin.nfd.featuresDir=/etc/kubernetes/node-feature-discovery/features.d", "--set", "devicePlugin.nodeLabels.enabled=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			if v, _ := argValue(args(t, container(t, ds, "device-plugin")), "--nfd-features-dir"); v != "/host/nfd/features.d" {
				t.Errorf("--nfd-features-dir = %q, want the mounted /host/nfd/features.d", v)
			}
			checkHostPaths(t, ds, map[string]hostMount{
				"/etc/kubernetes/node-feature-discovery/features.d": {mountPath: "/host/nfd/features.d", readOnly: false},
			})
			for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
				if found := ofKind(objs, kind); len(found) != 0 {
					t.Errorf("no node patching, yet %v rendered", names(found))
				}
			}
		},
	}, {
		name:   "priority class is a value",
		values: []string{"--set", "devicePlugin.priorityClassName=urma-node"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if got := podSpec(t, one(t, objs, "DaemonSet"))["priorityClassName"]; got != "urma-node" {
				t.Errorf("priorityClassName = %v, want urma-node", got)
			}
		},
	}, {
		name:   "no priority class where quotas refuse system-node-critical",
		values: []string{"--set", "devicePlugin.priorityClassName="},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if got, ok := podSpec(t, one(t, objs, "DaemonSet"))["priorityClassName"]; ok {
				t.Errorf("priorityClassName = %v, want none", got)
			}
		},
	}, {
		name:   "no admission policy before Kubernetes 1.30",
		values: []string{"--kube-version", "1.29.0"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if found := ofKind(objs, "ValidatingAdmissionPolicy"); len(found) != 0 {
				t.Errorf("rendered %v for a cluster that does not serve it", names(found))
			}
		},
	}, {
		name: "hardware node label added to the users node affinity",
		values: []string{"--set", "devicePlugin.nodeLabel=" + presentLabel,
			"--set", "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
			"--set", "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
			"--set", "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[1].matchFields[0].key=metadata.name",
			"--set", "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[1].matchFields[0].operator=In",
			"--set", "devicePlugin.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[1].matchFields[0].values[0]=node-a",
			"--set", "devicePlugin.nodeSelector.pool=ub",
		},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			spec := podSpec(t, one(t, objs, "DaemonSet"))
			want := []any{
				map[string]any{"matchExpressions": []any{map[string]any{"key": "pool", "operator": "Exists"}, presentExists}},
				map[string]any{
					"matchFields":      []any{map[string]any{"key": "metadata.name", "operator": "In", "values": []any{"node-a"}}},
					"matchExpressions": []any{presentExists},
				},
			}
			if got := requiredNodeTerms(spec); !reflect.DeepEqual(got, want) {
				t.Errorf("node selector terms = %v, want the label requirement in every term: %v", got, want)
			}
			if got := spec["nodeSelector"]; !reflect.DeepEqual(got, map[string]any{"pool": "ub", "kubernetes.io/os": "linux"}) {
				t.Errorf("nodeSelector = %v, want pool=ub on Linux", got)
			}
		},
	}, {
		name:   "software devices on selected nodes",
		values: []string{"--set", "devicePlugin.softDevices=2", "--set", "devicePlugin.softDevicesNodeSelector.pool=urma-soft"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			if got, want := podSpec(t, ds)["nodeSelector"], map[string]any{"pool": "urma-soft", "kubernetes.io/os": "linux"}; !reflect.DeepEqual(got, want) {
				t.Errorf("nodeSelector = %v, want %v", got, want)
			}
		},
	}, {
		name:   "plugin budget flags",
		values: []string{"--set", "devicePlugin.jettiesPerUnit=32", "--set", "devicePlugin.hostReserve=0"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			argv := args(t, container(t, one(t, objs, "DaemonSet"), "device-plugin"))
			for flag, want := range map[string]string{"--jetties-per-unit": "32", "--host-reserve": "0"} {
				if got, ok := argValue(argv, flag); !ok || got != want {
					t.Errorf("%s = %q (present %v), want %q; args %v", flag, got, ok, want, argv)
				}
			}
			// Before nodes publish facts the operator sizes pods' requests
			// in the plugin's units.
			opArgs := args(t, container(t, one(t, objs, "Deployment"), "operator"))
			if got, ok := argValue(opArgs, "--default-jetties-per-unit"); !ok || got != "32" {
				t.Errorf("operator --default-jetties-per-unit = %q (present %v), want the plugin's 32; args %v", got, ok, opArgs)
			}
		},
	}, {
		name:   "DRA - the operators unit is the drivers default request, not the device plugins",
		values: []string{"--set", "driver=dra", "--set", "devicePlugin.jettiesPerUnit=8", "--set", "draDriver.jettyRequest.default=32", "--set", "draDriver.jettyRequest.min=8", "--set", "draDriver.jettyRequest.step=8"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			// The driver's node facts give the default request as the unit
			// (internal/dra/slices): before they exist the operator must assume it.
			opArgs := args(t, container(t, one(t, objs, "Deployment"), "operator"))
			if got, ok := argValue(opArgs, "--default-jetties-per-unit"); !ok || got != "32" {
				t.Errorf("operator --default-jetties-per-unit = %q (present %v), want the DRA driver's default request 32; args %v", got, ok, opArgs)
			}
		},
	}, {
		name:   "CDI with the annotation strategy",
		values: []string{"--set", "devicePlugin.cdi.enabled=true", "--set", "devicePlugin.cdi.strategy=cdi-annotations"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			argv := args(t, container(t, one(t, objs, "DaemonSet"), "device-plugin"))
			for flag, want := range map[string]string{"--cdi": "", "--cdi-strategy": "cdi-annotations"} {
				if got, ok := argValue(argv, flag); !ok || got != want {
					t.Errorf("%s = %q (present %v), want %q; args %v", flag, got, ok, want, argv)
				}
			}
		},
	}, {
		name:   "shared memory between pods off",
		values: []string{"--set", "devicePlugin.shmDir="},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := one(t, objs, "DaemonSet")
			if got, _ := argValue(args(t, container(t, ds, "device-plugin")), "--shm-dir"); got != "" {
				t.Errorf("--shm-dir = %q, want empty", got)
			}
			for _, v := range podSpec(t, ds)["volumes"].([]any) {
				if v.(map[string]any)["name"] == "shm" {
					t.Errorf("shm volume rendered with shmDir empty: %v", v)
				}
			}
		},
	}, {
		name:   "no node labelling means no node RBAC and no token",
		values: []string{"--set", "devicePlugin.nodeLabels.enabled=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if r := named(objs, "ClusterRole", dpName); r != nil {
				t.Errorf("ClusterRole %s rendered without node labelling", dpName)
			}
			if got := podSpec(t, one(t, objs, "DaemonSet"))["automountServiceAccountToken"]; got != false {
				t.Errorf("automountServiceAccountToken = %v, want false", got)
			}
		},
	}, {
		name:   "cert-manager with its own self-signed issuer",
		values: []string{"--set", "webhook.certManager.enabled=true", "-a", "cert-manager.io/v1"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			cert := one(t, objs, "Certificate")
			issuer := one(t, objs, "Issuer")
			if got := field(t, cert, "spec", "issuerRef", "name"); got != issuer.GetName() {
				t.Errorf("Certificate issuerRef.name = %v, want the chart's Issuer %s", got, issuer.GetName())
			}
			if got := field(t, cert, "spec", "secretName"); got != certSecretName {
				t.Errorf("Certificate secretName = %v, want %s", got, certSecretName)
			}
			dns := fmt.Sprint(field(t, cert, "spec", "dnsNames"))
			if !strings.Contains(dns, webhookSvcName+"."+releaseNS+".svc") {
				t.Errorf("Certificate dnsNames %s do not name the webhook Service", dns)
			}
			cfg := one(t, objs, "MutatingWebhookConfiguration")
			if got, want := cfg.GetAnnotations()["cert-manager.io/inject-ca-from"], releaseNS+"/"+cert.GetName(); got != want {
				t.Errorf("inject-ca-from = %q, want %q", got, want)
			}
			if !secretMounted(t, one(t, objs, "Deployment"), certSecretName) {
				t.Errorf("the operator does not mount Secret %s", certSecretName)
			}
			argv := args(t, container(t, one(t, objs, "Deployment"), "operator"))
			if got, _ := argValue(argv, "--self-signed-certs"); got != "false" {
				t.Errorf("--self-signed-certs = %q with cert-manager, want false", got)
			}
			if got, ok := argValue(argv, "--cert-secret"); ok {
				t.Errorf("--cert-secret=%s passed although cert-manager writes the Secret", got)
			}
		},
	}, {
		name:   "cert-manager with an existing ClusterIssuer",
		values: []string{"--set", "webhook.certManager.enabled=true", "--set", "webhook.certManager.issuerRef.name=corp-ca", "--set", "webhook.certManager.issuerRef.kind=ClusterIssuer", "-a", "cert-manager.io/v1"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if found := ofKind(objs, "Issuer"); len(found) != 0 {
				t.Errorf("rendered %v although an existing issuer was given", names(found))
			}
			cert := one(t, objs, "Certificate")
			if got := field(t, cert, "spec", "issuerRef"); !reflect.DeepEqual(got, map[string]any{"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}) {
				t.Errorf("issuerRef = %v", got)
			}
		},
	}, {
		name:   "webhook off",
		values: []string{"--set", "webhook.enabled=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Certificate"} {
				if found := ofKind(objs, kind); len(found) != 0 {
					t.Errorf("webhook.enabled=false still renders %v", names(found))
				}
			}
			if named(objs, "Service", webhookSvcName) != nil {
				t.Errorf("webhook.enabled=false still renders the webhook Service")
			}
			if got, _ := argValue(args(t, container(t, one(t, objs, "Deployment"), "operator")), "--enable-webhooks"); got != "false" {
				t.Errorf("--enable-webhooks = %q, want false", got)
			}
		},
	}, {
		name:   "replicas and disruption budget",
		values: []string{"--set", "operator.replicas=3", "--set", "operator.podDisruptionBudget.enabled=true"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if got := field(t, one(t, objs, "Deployment"), "spec", "replicas"); got != int64(3) {
				t.Errorf("replicas = %v (%T), want 3", got, got)
			}
			one(t, objs, "PodDisruptionBudget")
		},
	}, {
		name:   "service monitors select metrics services",
		values: []string{"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=prom", "-a", "monitoring.coreos.com/v1"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			monitors := ofKind(objs, "ServiceMonitor")
			if len(monitors) != 2 {
				t.Fatalf("want a ServiceMonitor for the operator and one for the plugin, got %v", names(monitors))
			}
			op := named(objs, "ServiceMonitor", releaseName+"-urma-k8s-operator")
			if op == nil {
				t.Fatalf("no operator ServiceMonitor in %v", names(monitors))
			}
			ep := fmt.Sprint(field(t, op, "spec", "endpoints"))
			for _, want := range []string{"scheme:https", "bearerTokenFile:/var/run/secrets/kubernetes.io/serviceaccount/token"} {
				if !strings.Contains(ep, want) {
					t.Errorf("operator ServiceMonitor endpoints %s lack %s: /metrics needs HTTPS and a token", ep, want)
				}
			}
			for _, sm := range monitors {
				if sm.GetLabels()["release"] != "prom" {
					t.Errorf("%s lacks the extra label release=prom", sm.GetName())
				}
				sel, _ := field(t, sm, "spec", "selector", "matchLabels").(map[string]any)
				if !serviceWithMetricsPort(objs, sel) {
					t.Errorf("%s selects %v, which matches no Service with a port named metrics", sm.GetName(), sel)
				}
			}
		},
	}, {
		// Prometheus compares the two as durations, not as strings.
		name:   "scrape timeout up to the interval, in other units",
		values: []string{"--set", "metrics.serviceMonitor.enabled=true", "-a", "monitoring.coreos.com/v1", "--set", "metrics.serviceMonitor.interval=1m30s", "--set", "metrics.serviceMonitor.scrapeTimeout=90s"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, sm := range ofKind(objs, "ServiceMonitor") {
				if got := fmt.Sprint(field(t, sm, "spec", "endpoints")); !strings.Contains(got, "scrapeTimeout:90s") || !strings.Contains(got, "interval:1m30s") {
					t.Errorf("%s endpoints %s, want interval 1m30s and scrapeTimeout 90s", sm.GetName(), got)
				}
			}
		},
	}, {
		// With nothing to scrape no ServiceMonitor is rendered, and its
		// settings cannot be wrong.
		name: "scrape settings without a component to scrape",
		values: []string{"--set", "metrics.serviceMonitor.enabled=true", "-a", "monitoring.coreos.com/v1",
			"--set", "metrics.serviceMonitor.interval=1m", "--set", "metrics.serviceMonitor.scrapeTimeout=2m",
			"--set", "operator.enabled=false", "--set", "webhook.enabled=false", "--set", "devicePlugin.enabled=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if found := ofKind(objs, "ServiceMonitor"); len(found) != 0 {
				t.Errorf("ServiceMonitors %v rendered with no component to scrape", names(found))
			}
		},
	}, {
		// interval: null leaves the scrape interval to Prometheus' global
		// one, which the chart does not know: nothing to compare with.
		name:   "scrape interval left to Prometheus",
		values: []string{"--set", "metrics.serviceMonitor.enabled=true", "-a", "monitoring.coreos.com/v1", "--set", "metrics.serviceMonitor.interval=null"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			monitors := ofKind(objs, "ServiceMonitor")
			if len(monitors) == 0 {
				t.Fatalf("no ServiceMonitor in %v", names(objs))
			}
			for _, sm := range monitors {
				eps, _ := field(t, sm, "spec", "endpoints").([]any)
				for _, ep := range eps {
					m, _ := ep.(map[string]any)
					if m["interval"] != nil || m["scrapeTimeout"] != "10s" {
						t.Errorf("%s endpoint %v, want no interval and scrapeTimeout 10s", sm.GetName(), m)
					}
				}
			}
		},
	}, {
		name:   "CRDs managed elsewhere",
		values: []string{"--set", "crds.install=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if found := ofKind(objs, "CustomResourceDefinition"); len(found) != 0 {
				t.Errorf("crds.install=false still renders %v", names(found))
			}
		},
	}, {
		name:   "CRDs deleted on uninstall",
		values: []string{"--set", "crds.keep=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			crd := one(t, objs, "CustomResourceDefinition")
			if v, ok := crd.GetAnnotations()["helm.sh/resource-policy"]; ok {
				t.Errorf("crds.keep=false still annotates resource-policy=%s", v)
			}
		},
	}, {
		name:   "image digest wins over tag",
		values: []string{"--set", "operator.image.digest=sha256:" + strings.Repeat("ab", 32), "--set", "operator.image.tag=ignored"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			want := "ghcr.io/openeuler/urma-operator@sha256:" + strings.Repeat("ab", 32)
			if got := container(t, one(t, objs, "Deployment"), "operator")["image"]; got != want {
				t.Errorf("operator image = %v, want %s", got, want)
			}
		},
	}, {
		name:   "components can be left out",
		values: []string{"--set", "devicePlugin.enabled=false", "--set", "operator.enabled=false", "--set", "webhook.enabled=false"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, o := range objs {
				if o.GetKind() != "CustomResourceDefinition" {
					t.Errorf("with both components off the chart still renders %s/%s", o.GetKind(), o.GetName())
				}
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.check(t, render(t, tc.values...))
		})
	}
}

// presentExists is the hardware-mode node requirement.
var presentExists = map[string]any{"key": presentLabel, "operator": "Exists"}

// requiredNodeTerms returns the pod's required node affinity terms, or nil.
func requiredNodeTerms(spec map[string]any) []any {
	terms, _, _ := unstructured.NestedSlice(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
	return terms
}

type hostMount struct {
	mountPath string
	readOnly  bool
}

// checkHostPaths checks that each host path is a volume mounted where and how
// want says.
func checkHostPaths(t *testing.T, ds *unstructured.Unstructured, want map[string]hostMount) {
	t.Helper()
	spec := podSpec(t, ds)
	volumes, _ := spec["volumes"].([]any)
	volumeOf := map[string]string{} // host path -> volume name
	for _, v := range volumes {
		m, _ := v.(map[string]any)
		if hp, ok := m["hostPath"].(map[string]any); ok {
			volumeOf[fmt.Sprint(hp["path"])] = fmt.Sprint(m["name"])
		}
	}
	mounts := map[string]map[string]any{}
	for _, c := range spec["containers"].([]any) {
		vms, _ := c.(map[string]any)["volumeMounts"].([]any)
		for _, vm := range vms {
			m, _ := vm.(map[string]any)
			mounts[fmt.Sprint(m["name"])] = m
		}
	}
	for host, w := range want {
		vol, ok := volumeOf[host]
		if !ok {
			t.Errorf("no hostPath volume for %s (have %v)", host, volumeOf)
			continue
		}
		m, ok := mounts[vol]
		if !ok {
			t.Errorf("hostPath %s (volume %s) is not mounted", host, vol)
			continue
		}
		ro, _ := m["readOnly"].(bool)
		if m["mountPath"] != w.mountPath || ro != w.readOnly {
			t.Errorf("hostPath %s mounted at %v readOnly=%v, want %s readOnly=%v", host, m["mountPath"], ro, w.mountPath, w.readOnly)
		}
	}
}

// checkDurationArgs checks that each flag is rendered with a Go duration
// equal to want: the chart's default is the binary's own, whatever the
// spelling (5m or 5m0s).
func checkDurationArgs(t *testing.T, argv []string, want map[string]time.Duration) {
	t.Helper()
	for flag, w := range want {
		v, ok := argValue(argv, flag)
		if !ok {
			t.Errorf("%s not rendered, want %s", flag, w)
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Errorf("%s=%s, want a Go duration: %v", flag, v, err)
		} else if d != w {
			t.Errorf("%s=%s, want the binary's default %s", flag, v, w)
		}
	}
}

// checkArgs checks that each flag is rendered with its value.
func checkArgs(t *testing.T, argv []string, want map[string]string) {
	t.Helper()
	for flag, w := range want {
		if v, ok := argValue(argv, flag); v != w || !ok {
			t.Errorf("%s = %q (present %v), want %s", flag, v, ok, w)
		}
	}
}

// checkArgsAbsent checks that no flag is rendered: an unset value (helm
// upgrade --reuse-values from an older chart) leaves it to the binary.
func checkArgsAbsent(t *testing.T, argv []string, flags ...string) {
	t.Helper()
	for _, flag := range flags {
		if v, ok := argValue(argv, flag); ok {
			t.Errorf("%s=%q rendered for an unset value, want the flag left out", flag, v)
		}
	}
}

func checkNodeNameEnv(t *testing.T, c map[string]any) {
	t.Helper()
	env, _ := c["env"].([]any)
	for _, e := range env {
		m, _ := e.(map[string]any)
		if m["name"] != "NODE_NAME" {
			continue
		}
		want := map[string]any{"fieldRef": map[string]any{"fieldPath": "spec.nodeName"}}
		if !reflect.DeepEqual(m["valueFrom"], want) {
			t.Errorf("NODE_NAME valueFrom = %v, want the downward API spec.nodeName", m["valueFrom"])
		}
		return
	}
	t.Errorf("container %v has no NODE_NAME env", c["name"])
}

// checkWebhookTargetsService checks that every webhook calls the chart's
// webhook Service, whose target port is the operator's webhook port, and that
// pod webhooks only see pods carrying the endpoint label.
func checkWebhookTargetsService(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	svc := named(objs, "Service", webhookSvcName)
	if svc == nil {
		t.Fatalf("no webhook Service %s", webhookSvcName)
	}
	ports, _ := field(t, svc, "spec", "ports").([]any)
	if len(ports) != 1 {
		t.Fatalf("webhook Service ports = %v, want one", ports)
	}
	port, _ := ports[0].(map[string]any)
	dep := named(objs, "Deployment", operatorName)
	var containerPort any
	for _, p := range container(t, dep, "operator")["ports"].([]any) {
		if m, _ := p.(map[string]any); m["name"] == port["targetPort"] {
			containerPort = m["containerPort"]
		}
	}
	if containerPort == nil {
		t.Errorf("webhook Service targetPort %v is no port of the operator container", port["targetPort"])
	}
	if got, _ := argValue(args(t, container(t, dep, "operator")), "--webhook-port"); got != fmt.Sprint(containerPort) {
		t.Errorf("--webhook-port = %q, but the Service targets container port %v", got, containerPort)
	}
	cfgs := append(ofKind(objs, "MutatingWebhookConfiguration"), ofKind(objs, "ValidatingWebhookConfiguration")...)
	for _, cfg := range cfgs {
		for _, w := range field(t, cfg, "webhooks").([]any) {
			wh, _ := w.(map[string]any)
			ref, _ := wh["clientConfig"].(map[string]any)["service"].(map[string]any)
			if ref["name"] != webhookSvcName || ref["namespace"] != releaseNS || fmt.Sprint(ref["port"]) != fmt.Sprint(port["port"]) {
				t.Errorf("webhook %v calls service %v, want %s/%s port %v", wh["name"], ref, releaseNS, webhookSvcName, port["port"])
			}
			if !matchesPods(wh) {
				continue
			}
			want := map[string]any{"matchExpressions": []any{map[string]any{"key": endpointLabel, "operator": "Exists"}}}
			if !reflect.DeepEqual(wh["objectSelector"], want) {
				t.Errorf("pod webhook %v objectSelector = %v, want only pods labelled %s", wh["name"], wh["objectSelector"], endpointLabel)
			}
		}
	}
}

// matchesPods reports whether a webhook's rules include pods.
func matchesPods(wh map[string]any) bool {
	rules, _ := wh["rules"].([]any)
	for _, r := range rules {
		res, _ := r.(map[string]any)["resources"].([]any)
		if slices.Contains(res, any("pods")) {
			return true
		}
	}
	return false
}

func secretMounted(t *testing.T, dep *unstructured.Unstructured, secret string) bool {
	t.Helper()
	volumes, _ := podSpec(t, dep)["volumes"].([]any)
	for _, v := range volumes {
		m, _ := v.(map[string]any)
		if s, ok := m["secret"].(map[string]any); ok && s["secretName"] == secret {
			name := m["name"]
			for _, vm := range container(t, dep, "operator")["volumeMounts"].([]any) {
				if vm.(map[string]any)["name"] == name {
					return true
				}
			}
		}
	}
	return false
}

// serviceWithMetricsPort reports whether a rendered Service carries every
// selector label and has a port named metrics.
func serviceWithMetricsPort(objs []*unstructured.Unstructured, selector map[string]any) bool {
	for _, svc := range ofKind(objs, "Service") {
		labels := svc.GetLabels()
		match := len(selector) > 0
		for k, v := range selector {
			if labels[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		for _, p := range ports {
			if p.(map[string]any)["name"] == "metrics" {
				return true
			}
		}
	}
	return false
}

// TestDefaultImagesAreTheBuiltOnes checks that the chart's default images are
// the ones hack/images.sh builds by default, so `make images` output installs
// without overriding image values.
// Service names are DNS labels of at most 63 characters, whatever the
// release is called: the longest name prefix leaves room for the longest
// suffix.
func TestLongNamesFitServices(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		release string
		values  []string
	}{
		{"infrastructure-networking-platform", nil}, // 34 characters, without the chart's name
		{releaseName, []string{"--set", "fullnameOverride=" + strings.Repeat("a", 41)}},
	} {
		res := runHelm(t, append([]string{"template", tc.release, chartRelPath, "--namespace", releaseNS}, tc.values...)...)
		if res.err != nil {
			t.Fatalf("helm template %s %v: %v\n%s", tc.release, tc.values, res.err, res.stderr)
		}
		objs, err := decodeManifests(res.stdout)
		if err != nil {
			t.Fatal(err)
		}
		svcs := ofKind(objs, "Service")
		if len(svcs) == 0 {
			t.Fatalf("release %s renders no Service", tc.release)
		}
		for _, o := range svcs {
			if errs := validation.IsDNS1035Label(o.GetName()); len(errs) > 0 {
				t.Errorf("release %s %v: Service %q: %v", tc.release, tc.values, o.GetName(), errs)
			}
		}
	}
}

func TestDefaultImagesAreTheBuiltOnes(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	cmd := exec.Command("bash", filepath.Join(root, "hack", "images.sh"), "--print")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "REGISTRY=", "TAG=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/images.sh --print: %v", err)
	}
	built := map[string]bool{}
	for _, m := range regexp.MustCompile(` -t (\S+)`).FindAllStringSubmatch(string(out), -1) {
		built[m[1]] = true
	}
	objs := render(t)
	for _, w := range []struct{ kind, container string }{{"DaemonSet", "device-plugin"}, {"Deployment", "operator"}} {
		image := fmt.Sprint(container(t, one(t, objs, w.kind), w.container)["image"])
		if !built[image] {
			t.Errorf("%s image %s is not one hack/images.sh builds (%v)", w.kind, image, built)
		}
	}
}

// TestImageReferences checks how the chart names its images: one value for
// every image's registry and one for every tag, each overridable per image,
// a digest over any tag, and a repository that names its own registry host
// taken whole (the values of installs from before global.imageRegistry).
func TestImageReferences(t *testing.T) {
	t.Parallel()
	const app = "0.1.0" // Chart.yaml's appVersion, checked below
	digest := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		name   string
		values []string
		// want maps a component to its image: devicePlugin, operator,
		// draDriver (rendered with driver=dra).
		want map[string]string
	}{{
		name: "defaults",
		want: map[string]string{
			"devicePlugin": "ghcr.io/openeuler/urma-device-plugin:" + app,
			"operator":     "ghcr.io/openeuler/urma-operator:" + app,
			"draDriver":    "ghcr.io/openeuler/urma-dra-driver:" + app,
		},
	}, {
		name:   "one registry and one tag for every image",
		values: []string{"--set", "global.imageRegistry=registry.example.com:5000/urma", "--set", "global.imageTag=1.2.3-rc.1"},
		want: map[string]string{
			"devicePlugin": "registry.example.com:5000/urma/urma-device-plugin:1.2.3-rc.1",
			"operator":     "registry.example.com:5000/urma/urma-operator:1.2.3-rc.1",
			"draDriver":    "registry.example.com:5000/urma/urma-dra-driver:1.2.3-rc.1",
		},
	}, {
		name: "an images own registry, tag and digest win",
		values: []string{"--set", "global.imageRegistry=registry.example.com/urma", "--set", "global.imageTag=1.2.3",
			"--set", "devicePlugin.image.registry=mirror.example.com/dp", "--set", "operator.image.tag=hotfix",
			"--set", "draDriver.image.digest=" + digest, "--set", "draDriver.image.tag=ignored"},
		want: map[string]string{
			"devicePlugin": "mirror.example.com/dp/urma-device-plugin:1.2.3",
			"operator":     "registry.example.com/urma/urma-operator:hotfix",
			"draDriver":    "registry.example.com/urma/urma-dra-driver@" + digest,
		},
	}, {
		name: "a repository with a registry host is a full name",
		values: []string{"--set", "devicePlugin.image.repository=registry.example.com/urma/urma-device-plugin",
			"--set", "operator.image.repository=localhost/urma-operator", "--set", "draDriver.image.repository=localhost:5000/urma-dra-driver"},
		want: map[string]string{
			"devicePlugin": "registry.example.com/urma/urma-device-plugin:" + app,
			"operator":     "localhost/urma-operator:" + app,
			"draDriver":    "localhost:5000/urma-dra-driver:" + app,
		},
	}, {
		name:   "a path without a host stays below the registry",
		values: []string{"--set", "operator.image.repository=team/urma-operator"},
		want:   map[string]string{"operator": "ghcr.io/openeuler/team/urma-operator:" + app},
	}, {
		name:   "no registry at all",
		values: []string{"--set", "global.imageRegistry="},
		want:   map[string]string{"devicePlugin": "urma-device-plugin:" + app, "operator": "urma-operator:" + app},
	}}
	chart, err := os.ReadFile(filepath.Join(chartDir(t), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(chart), "\nappVersion: \""+app+"\"\n") {
		t.Fatalf("Chart.yaml's appVersion is not %s: update the test's app", app)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := map[string]string{}
			objs := render(t, tc.values...)
			got["devicePlugin"] = fmt.Sprint(container(t, named(objs, "DaemonSet", dpName), "device-plugin")["image"])
			got["operator"] = fmt.Sprint(container(t, named(objs, "Deployment", operatorName), "operator")["image"])
			if _, ok := tc.want["draDriver"]; ok {
				dra := render(t, append(tc.values, "--set", "driver=dra")...)
				got["draDriver"] = fmt.Sprint(container(t, one(t, dra, "DaemonSet"), "dra-driver")["image"])
			}
			for k, want := range tc.want {
				if got[k] != want {
					t.Errorf("%s image = %s, want %s", k, got[k], want)
				}
			}
		})
	}
}
