// Package quickstart_test checks the manifests of docs/quick-start.md, which
// make e2e also runs: what a reader applies must decode, name the same
// endpoint and images as the rest of the quick start, and keep the two
// urma-perf pods on one node.
package quickstart_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/openeuler/urma-k8s/api/v1alpha1"
)

// podsOf decodes pods.yaml into its pods, by name.
func podsOf(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	raw, err := os.ReadFile("pods.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		p := &corev1.Pod{}
		if err := yaml.UnmarshalStrict([]byte(doc), p); err != nil {
			t.Fatalf("pods.yaml: %v", err)
		}
		if p.Kind != "Pod" || p.APIVersion != "v1" {
			t.Fatalf("pods.yaml holds a %s/%s, want only v1 Pods", p.APIVersion, p.Kind)
		}
		pods[p.Name] = p
	}
	return pods
}

// TestPodsShareANode checks that the scheduler can only put perf-client on
// perf-server's node: a required pod affinity on the node's hostname whose
// selector matches perf-server, and not perf-client itself (a pod that
// matches its own affinity may be placed anywhere when no other pod does).
func TestPodsShareANode(t *testing.T) {
	pods := podsOf(t)
	server, client := pods["perf-server"], pods["perf-client"]
	if server == nil || client == nil || len(pods) != 2 {
		t.Fatalf("pods.yaml has pods %v, want perf-server and perf-client", keys(pods))
	}
	if client.Spec.Affinity == nil || client.Spec.Affinity.PodAffinity == nil {
		t.Fatal("perf-client has no pod affinity: on a cluster of several nodes it may land away from perf-server")
	}
	terms := client.Spec.Affinity.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if len(terms) != 1 {
		t.Fatalf("perf-client has %d required pod affinity terms, want 1 (a preferred one would let the scheduler split the pods)", len(terms))
	}
	term := terms[0]
	if term.TopologyKey != corev1.LabelHostname {
		t.Errorf("the affinity's topologyKey is %q, want %s: only one node shares memory", term.TopologyKey, corev1.LabelHostname)
	}
	if len(term.Namespaces) != 0 || term.NamespaceSelector != nil {
		t.Errorf("the affinity looks beyond the pods' namespace (%v, %v)", term.Namespaces, term.NamespaceSelector)
	}
	sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
	if err != nil {
		t.Fatalf("the affinity's selector: %v", err)
	}
	if sel.Empty() || !sel.Matches(labels.Set(server.Labels)) {
		t.Errorf("the affinity's selector %s does not match perf-server's labels %v", sel, server.Labels)
	}
	if sel.Matches(labels.Set(client.Labels)) {
		t.Errorf("the affinity's selector %s matches perf-client itself, which lets the first of them go anywhere", sel)
	}
	if server.Spec.Affinity != nil || server.Spec.NodeSelector != nil || server.Spec.NodeName != "" || client.Spec.NodeName != "" {
		t.Error("perf-server has scheduling constraints of its own, or a pod names its node: the quick start runs on any node")
	}
}

// TestPodsNameTheQuickStartsPieces checks that the pods run the images the
// quick start builds and the endpoint it declares, and listen where the
// client is pointed.
func TestPodsNameTheQuickStartsPieces(t *testing.T) {
	var ep v1alpha1.UrmaEndpoint
	raw, err := os.ReadFile("endpoint.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, &ep); err != nil {
		t.Fatalf("endpoint.yaml: %v", err)
	}
	if ep.Spec.JettyBudget <= 0 || ep.Spec.JettyBudget%16 != 0 {
		t.Errorf("endpoint.yaml's jettyBudget %d is not a whole number of the device plugin's units of 16 jetties", ep.Spec.JettyBudget)
	}
	chart, err := os.ReadFile(filepath.Join("..", "..", "charts", "urma-k8s", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion: "([^"]+)"$`).FindSubmatch(chart)
	if m == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	wantImage := "ghcr.io/openeuler/urma-perf:" + string(m[1])
	for name, p := range podsOf(t) {
		if got := p.Labels[v1alpha1.LabelEndpoint]; got != ep.Name {
			t.Errorf("%s is labelled for endpoint %q, endpoint.yaml declares %q", name, got, ep.Name)
		}
		if len(p.Spec.Containers) != 1 {
			t.Fatalf("%s has %d containers, want 1", name, len(p.Spec.Containers))
		}
		c := p.Spec.Containers[0]
		if c.Image != wantImage {
			t.Errorf("%s runs %s, want %s (the name make image-archives and make images give it)", name, c.Image, wantImage)
		}
		if len(c.Ports) != 1 || strings.Join(c.Args, " ") != "server --listen 0.0.0.0:7000 --echo" || c.Ports[0].ContainerPort != 7000 {
			t.Errorf("%s: args %q, ports %v: want an echo server on port 7000, which the quick start's client dials", name, c.Args, c.Ports)
		}
		if _, ok := c.Resources.Requests["urma.openeuler.org/jetty"]; ok {
			t.Errorf("%s requests jetties itself: the webhook adds the endpoint's", name)
		}
	}
	var values struct {
		DevicePlugin struct {
			SoftDevices int `json:"softDevices"`
		} `json:"devicePlugin"`
	}
	raw, err = os.ReadFile("values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	if values.DevicePlugin.SoftDevices <= 0 {
		t.Errorf("values.yaml sets devicePlugin.softDevices=%d: without UB hardware the quick start needs software devices", values.DevicePlugin.SoftDevices)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
