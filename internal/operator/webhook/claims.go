package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

func requestsJetties(c *corev1.Container) bool {
	_, req := c.Resources.Requests[nodefacts.ResourceName]
	_, lim := c.Resources.Limits[nodefacts.ResourceName]
	return req || lim
}

// claimJetties gives container c its own pod claim from template (see
// ClaimName), unless it already asks for units or lists a URMA claim (the
// user's own placement wins, as with units). Claims for other devices do
// not count: a GPU and URMA container is the common case.
func claimJetties(pod *corev1.Pod, c *corev1.Container, template string, jettyClaims map[string]bool) {
	if requestsJetties(c) || jettyClaim(c, jettyClaims) != "" {
		return
	}
	name := ClaimName(c.Name)
	if !slices.ContainsFunc(pod.Spec.ResourceClaims, func(r corev1.PodResourceClaim) bool { return r.Name == name }) {
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, corev1.PodResourceClaim{
			Name: name, ResourceClaimTemplateName: &template,
		})
	}
	c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: name})
}

// shareClaim lists claim in init container c, unless c already asks for
// units or lists a URMA claim. An init container that is not a sidecar
// runs alone, before the app containers start: a claim of its own would
// hold its jetties for the pod's whole life (DRA allocates a pod's claims
// until it ends), where kubelet hands a device plugin's init units on to
// the app containers. So it shares the first app container's jetty claim,
// or, in a pod whose app containers have none, the first such init
// container's.
func shareClaim(c *corev1.Container, claim string, jettyClaims map[string]bool) {
	if requestsJetties(c) || jettyClaim(c, jettyClaims) != "" {
		return
	}
	c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: claim})
}

// jettyClaim is the first URMA claim container c lists: one named urma-*,
// or one of jettyClaims; "" when none.
func jettyClaim(c *corev1.Container, jettyClaims map[string]bool) string {
	for _, rc := range c.Resources.Claims {
		if strings.HasPrefix(rc.Name, "urma-") || jettyClaims[rc.Name] {
			return rc.Name
		}
	}
	return ""
}

// isSidecar reports whether init container c is a sidecar (restartPolicy
// Always): it runs beside the app containers, so its jetties add up.
func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// jettyClaims finds the pod's claims that already ask for URMA jetties:
// those from the endpoint's template, and those from a template of the
// pod's namespace with a request of the URMA DeviceClass, read from the API
// server when the cache does not have it yet. A claim the pod
// names directly (resourceClaimName) is not read, since the operator may
// not read ResourceClaims: name its pod entry urma-* for it to count.
func (p *PodInjector) jettyClaims(ctx context.Context, ns string, pod *corev1.Pod, own string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, rc := range pod.Spec.ResourceClaims {
		t := rc.ResourceClaimTemplateName
		if t == nil {
			continue
		}
		if *t == own {
			out[rc.Name] = true
			continue
		}
		// A template applied with the pod's workload may not be in the
		// cache yet: read it from the API server then.
		var tmpl resourceapi.ResourceClaimTemplate
		key := client.ObjectKey{Namespace: ns, Name: *t}
		err := p.Reader.Get(ctx, key, &tmpl)
		found := err == nil
		if apierrors.IsNotFound(err) {
			found, err = p.uncached(ctx, "ResourceClaimTemplate", key, &tmpl)
		}
		if err != nil {
			return nil, fmt.Errorf("get ResourceClaimTemplate %s of pod claim %s: %w", key, rc.Name, err)
		}
		if !found {
			continue // the pod cannot start without it, whatever it asks for
		}
		out[rc.Name] = requestsJettyClass(&tmpl.Spec.Spec)
	}
	return out, nil
}

// requestsJettyClass reports whether a claim asks for a device of the URMA
// DeviceClass, in a request or any of its alternatives.
func requestsJettyClass(s *resourceapi.ResourceClaimSpec) bool {
	for _, r := range s.Devices.Requests {
		if r.Exactly != nil && r.Exactly.DeviceClassName == slicefacts.DriverName {
			return true
		}
		for _, sub := range r.FirstAvailable {
			if sub.DeviceClassName == slicefacts.DriverName {
				return true
			}
		}
	}
	return false
}

// ClaimName is the pod claim of a container's jetties: "urma-<container>",
// or "urma-" and a hash of the name when that would not be a DNS label.
func ClaimName(container string) string {
	if name := "urma-" + container; len(name) <= validation.DNS1123LabelMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(container))
	return "urma-" + hex.EncodeToString(sum[:8])
}
