package chart_test

import (
	"strings"
	"testing"
)

// TestBadValuesRejected checks that wrong values fail `helm template` (and so
// `helm install`) with a message that names the value.
func TestBadValuesRejected(t *testing.T) {
	t.Parallel()
	type row struct {
		name   string
		values []string
		want   []string // every string must appear in helm's error
	}
	tests := []row{
		{"negative replicas", []string{"--set", "operator.replicas=-1"}, []string{"'/operator/replicas'", "minimum"}},
		{"replicas not a number", []string{"--set-string", "operator.replicas=two"}, []string{"'/operator/replicas'", "want integer"}},
		{"unknown pull policy", []string{"--set", "devicePlugin.image.pullPolicy=Sometimes"}, []string{"'/devicePlugin/image/pullPolicy'"}},
		{"negative soft devices", []string{"--set", "devicePlugin.softDevices=-1"}, []string{"'/devicePlugin/softDevices'", "minimum"}},
		{"too many soft devices", []string{"--set", "devicePlugin.softDevices=1000"}, []string{"'/devicePlugin/softDevices'", "maximum"}},
		{"soft devices not a number", []string{"--set-string", "devicePlugin.softDevices=four"}, []string{"'/devicePlugin/softDevices'", "want integer"}},
		{"misspelt value", []string{"--set", "devicePlugin.softDevice=4"}, []string{"'/devicePlugin'", "'softDevice' not allowed"}},
		{"boolean node selector value", []string{"--set", "devicePlugin.nodeSelector.urma\\.openeuler\\.org/present=true"}, []string{"'/devicePlugin/nodeSelector/urma.openeuler.org~1present'", "want string"}},
		{"bad node label key", []string{"--set", "devicePlugin.nodeLabel=not a label"}, []string{"'/devicePlugin/nodeLabel'", "does not match pattern"}},
		{"relative host path", []string{"--set", "devicePlugin.kubeletSocketDir=var/lib/kubelet"}, []string{"'/devicePlugin/kubeletSocketDir'"}},
		{"port out of range", []string{"--set", "operator.metrics.port=70000"}, []string{"'/operator/metrics/port'", "maximum"}},
		{"unknown failure policy", []string{"--set", "webhook.failurePolicy=Sometimes"}, []string{"'/webhook/failurePolicy'"}},
		{"webhook timeout too long", []string{"--set", "webhook.timeoutSeconds=31"}, []string{"'/webhook/timeoutSeconds'", "maximum"}},
		{"bad digest", []string{"--set", "operator.image.digest=latest"}, []string{"'/operator/image/digest'"}},
		{"registry with a trailing slash", []string{"--set", "global.imageRegistry=registry.example.com/urma/"}, []string{"'/global/imageRegistry'", "does not match pattern"}},
		{"registry with a scheme", []string{"--set", "devicePlugin.image.registry=https://registry.example.com"}, []string{"'/devicePlugin/image/registry'", "does not match pattern"}},
		{"tag with a slash", []string{"--set", "global.imageTag=v1/x"}, []string{"'/global/imageTag'", "does not match pattern"}},
		{"tag with a colon", []string{"--set", "draDriver.image.tag=1.0:x"}, []string{"'/draDriver/image/tag'", "does not match pattern"}},
		{"repository with a tag", []string{"--set", "operator.image.repository=urma-operator:1.0"}, []string{"'/operator/image/repository'", "does not match pattern"}},
		{"repository with a port that is no number", []string{"--set", "operator.image.repository=urma-operator:1.0/x"}, []string{"'/operator/image/repository'", "does not match pattern"}},
		{"upper-case repository", []string{"--set", "operator.image.repository=URMA-operator"}, []string{"'/operator/image/repository'", "does not match pattern"}},
		{"bad certificate duration", []string{"--set", "webhook.certManager.duration=90 days"}, []string{"'/webhook/certManager/duration'"}},
		{"crds.install not a boolean", []string{"--set-string", "crds.install=yes"}, []string{"'/crds/install'", "want boolean"}},
		{"device plugin surge", []string{"--set", "devicePlugin.updateStrategy.rollingUpdate.maxSurge=1"}, []string{"'/devicePlugin/updateStrategy/rollingUpdate/maxSurge'"}},
		{"device plugin surge percentage", []string{"--set-string", "devicePlugin.updateStrategy.rollingUpdate.maxSurge=10%"}, []string{"'/devicePlugin/updateStrategy/rollingUpdate/maxSurge'"}},
		{"device plugin updates none at once", []string{"--set", "devicePlugin.updateStrategy.rollingUpdate.maxUnavailable=0"}, []string{"'/devicePlugin/updateStrategy/rollingUpdate/maxUnavailable'"}},
		{"misspelt rolling update field", []string{"--set", "devicePlugin.updateStrategy.rollingUpdate.maxUnavailible=2"}, []string{"'maxUnavailible' not allowed"}},
		// Combinations the schema cannot express, checked by the templates.
		{"replicas without leader election", []string{"--set", "operator.replicas=2", "--set", "operator.leaderElection.enabled=false"}, []string{"operator.replicas", "operator.leaderElection.enabled"}},
		{"operator metrics and webhook on one port", []string{"--set", "webhook.port=8443"}, []string{"operator.metrics.port=8443 and webhook.port=8443", "address already in use"}},
		{"operator probes and metrics on one port", []string{"--set", "operator.healthProbePort=8443"}, []string{"operator.metrics.port=8443 and operator.healthProbePort=8443"}},
		{"operator on the default ServiceAccount", []string{"--set", "operator.serviceAccount.create=false"}, []string{"operator.serviceAccount.create=false needs operator.serviceAccount.name", "default ServiceAccount"}},
		{"labelling plugin on the default ServiceAccount", []string{"--set", "devicePlugin.serviceAccount.create=false"}, []string{"devicePlugin.serviceAccount.create=false needs devicePlugin.serviceAccount.name"}},
		{"DRA driver on the default ServiceAccount", []string{"--set", "driver=dra", "--set", "draDriver.serviceAccount.create=false"}, []string{"draDriver.serviceAccount.create=false needs draDriver.serviceAccount.name"}},
		{"webhook without operator", []string{"--set", "operator.enabled=false"}, []string{"webhook.enabled", "operator.enabled"}},
		{"no operator pods behind a failing webhook", []string{"--set", "operator.replicas=0"}, []string{"operator.replicas=0", "webhook.failurePolicy"}},
		{"scrape timeout above the interval", []string{"--set", "metrics.serviceMonitor.enabled=true", "-a", "monitoring.coreos.com/v1", "--set", "metrics.serviceMonitor.interval=1m", "--set", "metrics.serviceMonitor.scrapeTimeout=1m500ms"}, []string{"metrics.serviceMonitor.scrapeTimeout=1m500ms exceeds metrics.serviceMonitor.interval=1m"}},
		{"NFD feature file through extraArgs", []string{"--set", "devicePlugin.extraArgs={--nfd-features-dir=/x}"}, []string{"devicePlugin.nfd.featuresDir", "--nfd-features-dir"}},
		{"bad PCI device ID", []string{"--set", "devicePlugin.nfd.pciDevices={0xa22a}"}, []string{"'/devicePlugin/nfd/pciDevices/0'"}},
		// Values the node agents would refuse at start: a failed install
		// instead of a crash-looping DaemonSet.
		{"shm directory with a trailing slash", []string{"--set", "devicePlugin.shmDir=/var/run/urma-k8s/shm/"}, []string{"'/devicePlugin/shmDir'", "does not match pattern"}},
		{"shm directory with ..", []string{"--set", "devicePlugin.shmDir=/var/run/../shm"}, []string{"'/devicePlugin/shmDir'", "does not match pattern"}},
		{"DRA shm directory at the root", []string{"--set", "draDriver.shmDir=/"}, []string{"'/draDriver/shmDir'", "does not match pattern"}},
		{"DRA shm directory with //", []string{"--set", "draDriver.shmDir=/var//shm"}, []string{"'/draDriver/shmDir'", "does not match pattern"}},
		{"shm directory in /: its parent is mounted", []string{"--set", "devicePlugin.shmDir=/shm"}, []string{"'/devicePlugin/shmDir'", "does not match pattern"}},
		{"DRA shm directory in /: its parent is mounted", []string{"--set", "draDriver.shmDir=/shm"}, []string{"'/draDriver/shmDir'", "does not match pattern"}},
		{"jetty request minimum above the default", []string{"--set", "driver=dra", "--set", "draDriver.jettyRequest.min=32"}, []string{"draDriver.jettyRequest.default=16 is below draDriver.jettyRequest.min=32"}},
		{"jetty request default off the steps", []string{"--set", "driver=dra", "--set", "draDriver.jettyRequest.min=8", "--set", "draDriver.jettyRequest.step=16"}, []string{"draDriver.jettyRequest.default=16", "draDriver.jettyRequest.step=16"}},
		{"operator budget keeping its only replica", []string{"--set", "operator.podDisruptionBudget.enabled=true"}, []string{"operator.podDisruptionBudget.minAvailable=1 keeps all 1 operator replicas", "node drains block"}},
		{"operator budget percentage rounding up to every replica", []string{"--set", "operator.podDisruptionBudget.enabled=true", "--set", "operator.replicas=2", "--set-string", "operator.podDisruptionBudget.minAvailable=51%"}, []string{"minAvailable=51% keeps all 2 operator replicas"}},
		{"name prefix too long for the Services", []string{"--set", "fullnameOverride=" + strings.Repeat("a", 42)}, []string{"'/fullnameOverride'", "maxLength"}},
		// Optional APIs the cluster must serve: a clear failure, not an
		// object the API server rejects halfway through an install.
		{"cert-manager without its CRDs", []string{"--set", "webhook.certManager.enabled=true"}, []string{"webhook.certManager.enabled=true needs the cert-manager.io/v1 API", "install cert-manager", "--api-versions cert-manager.io/v1"}},
		{"ServiceMonitor without its CRD", []string{"--set", "metrics.serviceMonitor.enabled=true"}, []string{"metrics.serviceMonitor.enabled=true needs the monitoring.coreos.com/v1 API", "Prometheus Operator"}},
		// helm template's own API list has resource.k8s.io/v1 whatever
		// --kube-version says; the cluster version decides offline.
		{"DRA before Kubernetes 1.34", []string{"--set", "driver=dra", "--kube-version", "1.33.0"}, []string{"driver=dra needs the resource.k8s.io/v1 API", "set driver=devicePlugin", "--api-versions resource.k8s.io/v1 and --kube-version 1.34"}},
		{"NodeFeatureRule without NFD", []string{"--set", "devicePlugin.nfd.nodeFeatureRule=true"}, []string{"devicePlugin.nfd.nodeFeatureRule=true needs the nfd.k8s-sigs.io/v1alpha1 API", "Node Feature Discovery"}},
	}
	// Intervals the node agents refuse at start (zero, negative) or cannot
	// parse (no unit, not a duration); a number is not a string.
	for _, v := range []string{
		"devicePlugin.nodeFactsResyncInterval", "devicePlugin.kubeletCheckInterval", "devicePlugin.resyncInterval",
		"draDriver.healthResendInterval", "draDriver.staleClaimCheckInterval",
	} {
		path := "'/" + strings.ReplaceAll(v, ".", "/") + "'"
		for _, bad := range []struct {
			name, flag, value, want string
		}{
			{"not a duration", "--set", "5 minutes", "does not match pattern"},
			{"without a unit", "--set-string", "300", "does not match pattern"},
			{"zero", "--set", "0m0s", ""},
			{"zero with a fraction", "--set", "0.0s", ""},
			{"negative", "--set", "-1m", "does not match pattern"},
			{"not a string", "--set", "300", "want string"},
		} {
			want := []string{path}
			if bad.want != "" {
				want = append(want, bad.want)
			}
			tests = append(tests, row{v + " " + bad.name, []string{bad.flag, v + "=" + bad.value}, want})
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runHelm(t, templateArgs(tc.values...)...)
			if res.err == nil {
				t.Fatalf("helm template %s succeeded, want it rejected", strings.Join(tc.values, " "))
			}
			for _, w := range tc.want {
				if !strings.Contains(res.stderr, w) {
					t.Errorf("helm's error does not name %q:\n%s", w, res.stderr)
				}
			}
		})
	}
}
