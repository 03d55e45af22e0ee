package plan

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/nodefacts/slicefacts"
)

// Driver is the node agent that offers URMA devices to pods, and so where
// nodes' device facts come from and how a pod asks for jetties.
type Driver string

// Drivers (the chart's driver value).
const (
	// DriverDevicePlugin: facts from the device plugin's node annotations;
	// pods request urma.openeuler.org/jetty units.
	DriverDevicePlugin Driver = "devicePlugin"
	// DriverDRA: facts from the DRA driver's ResourceSlices; pods get a
	// ResourceClaim for their jetties.
	DriverDRA Driver = "dra"
)

// ParseDriver accepts "devicePlugin" and "dra"; "" is the device plugin.
func ParseDriver(s string) (Driver, error) {
	switch Driver(s) {
	case "", DriverDevicePlugin:
		return DriverDevicePlugin, nil
	case DriverDRA:
		return DriverDRA, nil
	}
	return "", fmt.Errorf("jetty driver %q: want devicePlugin or dra", s)
}

// Observation is what the cluster says about one endpoint right now.
//
// Read from a cache, Pods and Input.Nodes' Labels share their maps, slices
// and pointers with the cache's objects (Observe lists without deep copies,
// see Observe): read them, never write to them; DeepCopy a pod to change it.
type Observation struct {
	Input Input
	// Pods are the endpoint's pods that are neither finished nor terminating.
	Pods []corev1.Pod
	// ConfigMap is the endpoint's ConfigMap as the reader sees it; nil when
	// absent (the operator's cache only holds ConfigMaps it manages).
	ConfigMap *corev1.ConfigMap
	// LastKnownErr is set when the ConfigMap's recorded limits are unreadable.
	LastKnownErr error
}

// NodeListGVK lets callers list nodes as metadata only (the device facts are
// annotations; node status is large and changes every few seconds).
func NodeList() *metav1.PartialObjectMetadataList {
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	return l
}

// ObservedTypes are the kinds Observe reads for driver, as the objects a
// cache keeps them in (nodes as metadata only): a caller that serves Observe
// from a cache starts these informers up front.
func ObservedTypes(driver Driver) []client.Object {
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	objs := []client.Object{&corev1.Pod{}, node, &corev1.ConfigMap{}}
	if driver == DriverDRA {
		objs = append(objs, &resourceapi.ResourceSlice{})
	}
	return objs
}

// Observe reads the pods, nodes (with their facts as driver publishes
// them) and ConfigMap that Make needs.
//
// It runs on every pod admission, so its Lists pass
// client.UnsafeDisableDeepCopy: a cache would otherwise deep-copy every
// node, ResourceSlice and pod of the endpoint each time. That is safe
// because nothing here, in Make or in its callers writes to what is
// listed (see Observation); a reader that is not a cache ignores the
// option.
func Observe(ctx context.Context, c client.Reader, ep *v1alpha1.UrmaEndpoint, driver Driver) (Observation, error) {
	obs := Observation{Input: Input{Spec: ep.Spec}}

	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ep.Namespace),
		client.MatchingLabels{v1alpha1.LabelEndpoint: ep.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return Observation{}, fmt.Errorf("list pods of endpoint %s/%s: %w", ep.Namespace, ep.Name, err)
	}
	seen := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		obs.Pods = append(obs.Pods, p)
		if n := p.Spec.NodeName; n != "" && !seen[n] {
			seen[n] = true
			obs.Input.PodNodes = append(obs.Input.PodNodes, n)
		}
	}

	nodes := NodeList()
	if err := c.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return Observation{}, fmt.Errorf("list nodes: %w", err)
	}
	var perNode map[string][]resourceapi.ResourceSlice
	if driver == DriverDRA {
		var list resourceapi.ResourceSliceList
		if err := c.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
			return Observation{}, fmt.Errorf("list ResourceSlices: %w", err)
		}
		perNode = map[string][]resourceapi.ResourceSlice{}
		for _, s := range list.Items {
			if s.Spec.NodeName != nil {
				perNode[*s.Spec.NodeName] = append(perNode[*s.Spec.NodeName], s)
			}
		}
	}
	for _, n := range nodes.Items {
		if driver != DriverDRA {
			obs.Input.Nodes = append(obs.Input.Nodes, NodeFromAnnotations(n.Name, n.Labels, n.Annotations))
			continue
		}
		f, err := slicefacts.Facts(perNode[n.Name])
		// A pool being published is a driver (re)starting, not malformed
		// facts: the node has none yet, as while it publishes nothing.
		if errors.Is(err, slicefacts.ErrPoolIncomplete) || err == nil && !f.Present() {
			err = nodefacts.ErrNoFacts
		}
		obs.Input.Nodes = append(obs.Input.Nodes, NodeFromFacts(n.Name, n.Labels, f, err))
	}

	if err := ObserveConfigMap(ctx, c, ep, &obs); err != nil {
		return Observation{}, err
	}
	return obs, nil
}

// ObserveConfigMap (re)reads the endpoint's ConfigMap into obs: ConfigMap,
// and the limits it records (LastKnown, LastKnownErr) when the endpoint
// controls it. Observe calls it; the reconciler calls it again with an
// uncached reader when its cache has not yet seen the ConfigMap.
func ObserveConfigMap(ctx context.Context, c client.Reader, ep *v1alpha1.UrmaEndpoint, obs *Observation) error {
	obs.ConfigMap, obs.Input.LastKnown, obs.LastKnownErr = nil, nil, nil
	var cm corev1.ConfigMap
	err := c.Get(ctx, client.ObjectKey{Namespace: ep.Namespace, Name: v1alpha1.ConfigMapName(ep.Name)}, &cm)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("get ConfigMap %s/%s: %w", ep.Namespace, v1alpha1.ConfigMapName(ep.Name), err)
	default:
		obs.ConfigMap = &cm
		if s, ok := cm.Annotations[v1alpha1.AnnotationDeviceLimits]; ok && metav1.IsControlledBy(&cm, ep) {
			l, err := DecodeLimits(s)
			if err != nil {
				obs.LastKnownErr = err
			} else {
				obs.Input.LastKnown = &l
			}
		}
	}
	return nil
}
