package main

import (
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/openeuler/urma-k8s/api/v1alpha1"
)

// TestDeployManifest decodes every object of deploy.yaml strictly into its
// Go type, so a misspelled field fails here rather than on a user's cluster,
// and checks that the pieces name each other: both pod templates carry the
// endpoint label of the UrmaEndpoint, and the client dials the Service.
func TestDeployManifest(t *testing.T) {
	raw, err := os.ReadFile("deploy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var (
		ep     *v1alpha1.UrmaEndpoint
		dep    *appsv1.Deployment
		svc    *corev1.Service
		job    *batchv1.Job
		kinds  []string
		decode = func(doc string, into any) {
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				t.Fatalf("decode %T: %v", into, err)
			}
		}
	)
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("decode kind: %v", err)
		}
		kinds = append(kinds, tm.Kind)
		switch tm.Kind {
		case "UrmaEndpoint":
			ep = &v1alpha1.UrmaEndpoint{}
			decode(doc, ep)
		case "Deployment":
			dep = &appsv1.Deployment{}
			decode(doc, dep)
		case "Service":
			svc = &corev1.Service{}
			decode(doc, svc)
		case "Job":
			job = &batchv1.Job{}
			decode(doc, job)
		default:
			t.Fatalf("unexpected kind %q", tm.Kind)
		}
	}
	if ep == nil || dep == nil || svc == nil || job == nil {
		t.Fatalf("want an UrmaEndpoint, a Deployment, a Service and a Job; got %v", kinds)
	}
	if ep.APIVersion != v1alpha1.GroupVersion.String() {
		t.Errorf("UrmaEndpoint apiVersion %q, want %q", ep.APIVersion, v1alpha1.GroupVersion)
	}
	for name, labels := range map[string]map[string]string{
		"Deployment": dep.Spec.Template.Labels, "Job": job.Spec.Template.Labels,
	} {
		if got := labels[v1alpha1.LabelEndpoint]; got != ep.Name {
			t.Errorf("%s pod template label %s=%q, want the endpoint %q", name, v1alpha1.LabelEndpoint, got, ep.Name)
		}
	}
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selects %s=%s, which the server pods lack", k, v)
		}
	}
	// --require-urma needs the shm fast path off UB hardware: the client
	// must land on the server's node.
	if !coLocated(job.Spec.Template.Spec.Affinity, dep.Spec.Template.Labels) {
		t.Errorf("the client Job has no required pod affinity to the server pods on the same node (%+v)", job.Spec.Template.Spec.Affinity)
	}
	args := strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")
	want := "--server " + svc.Name + ":50051"
	if !strings.Contains(args, want) || svc.Spec.Ports[0].Port != 50051 {
		t.Errorf("client args %q do not dial the Service (%s, port %d)", args, want, svc.Spec.Ports[0].Port)
	}
}

// coLocated reports whether a required pod affinity term places the pod on
// the node of a pod labelled server.
func coLocated(a *corev1.Affinity, server map[string]string) bool {
	if a == nil || a.PodAffinity == nil {
		return false
	}
	for _, term := range a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err == nil && term.TopologyKey == corev1.LabelHostname && !sel.Empty() && sel.Matches(labels.Set(server)) {
			return true
		}
	}
	return false
}
