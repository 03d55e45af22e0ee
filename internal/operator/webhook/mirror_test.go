package webhook

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// A kubelet creates a mirror pod to show a static pod in the API. What
// runs is the static pod from the node's manifest; a patch to the mirror
// pod reaches no container. Mutating it would make the mirror pod claim
// flags (the hash annotation), jetty units (counted by the scheduler
// against the node) or DRA claims the static pod never has.
func TestPodInjectorLeavesMirrorPodsAlone(t *testing.T) {
	ep := endpoint()
	s := scheme(t)
	objs := []client.Object{ep, ownedConfigMap(ep, "h1"), hwNode("n1", 4096)}
	cl := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	for _, driver := range []string{"devicePlugin", "dra"} {
		t.Run(driver, func(t *testing.T) {
			h := &PodInjector{Reader: cl, APIReader: cl, Decoder: admission.NewDecoder(s)}
			if driver == "dra" {
				h.Driver = "dra"
			}
			p := basePod()
			p.Spec.NodeName = "n1"
			p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "3f2c", "kubernetes.io/config.source": "file"}
			resp := h.Handle(context.Background(), podRequest(t, p))
			if !resp.Allowed {
				t.Fatalf("mirror pod refused: %+v", resp.Result)
			}
			if len(resp.Patches) > 0 {
				t.Errorf("mirror pod mutated: %+v", resp.Patches)
			}
			if resp.Result == nil || !strings.Contains(resp.Result.Message, "mirror pod") {
				t.Errorf("result %+v does not say why the pod was left alone", resp.Result)
			}
		})
	}
}
