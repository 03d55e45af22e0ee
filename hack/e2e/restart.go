//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

func (r *run) checkKubeletRestart(ctx context.Context) error {
	r.mu.Lock()
	old := r.children["kubelet"]
	r.mu.Unlock()
	if old == nil {
		return errors.New("kubelet is not running")
	}
	old.Stop()
	r.say("kubelet stopped (%s); starting it again", old.ExitStatus())
	start := time.Now()
	kubelet, err := r.startKubelet("kubelet-restarted")
	if err != nil {
		return err
	}
	// The new kubelet knows the plugin's devices only once the plugin
	// re-registered and sent its list: watch for the registration in its
	// log, then kubelet's own account, which must also give the running
	// pods back the units they had.
	var last jettyDevices
	err = r.poll(ctx, 3*time.Minute, "the device plugin to re-register with the restarted kubelet", func(ctx context.Context) (bool, error) {
		if kubelet.Exited() {
			return false, fmt.Errorf("kubelet exited (%s)%s", kubelet.ExitStatus(), kubelet.LogTail())
		}
		log, err := os.ReadFile(kubelet.LogPath())
		if err != nil || !bytes.Contains(log, []byte(`"Got registration request from device plugin with resource" resourceName="`+nodefacts.ResourceName+`"`)) {
			return false, nil
		}
		j, err := r.kubeletJetties(ctx)
		if err != nil {
			return false, nil
		}
		last = j
		return int64(j.allocatable) == r.expectedUnits && j.allocated() == r.assigned, nil
	})
	if err != nil {
		return fmt.Errorf("%w (the new kubelet lists %d allocatable device IDs, want %d, and %d assigned, want %d)", err, last.allocatable, r.expectedUnits, last.allocated(), r.assigned)
	}
	reregistered := time.Since(start)
	var q resource.Quantity
	err = r.poll(ctx, 2*time.Minute, "node capacity to come back", func(ctx context.Context) (bool, error) {
		n, err := r.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q = n.Status.Allocatable[corev1.ResourceName(nodefacts.ResourceName)]
		return nodeReady(n) && q.Value() == r.expectedUnits, nil
	})
	if err != nil {
		return fmt.Errorf("%w (allocatable %s)", err, q.String())
	}
	r.note("kubelet restart: plugin re-registered within %s; node allocatable %s back at %d; the running pods keep their %d units",
		reregistered.Round(100*time.Millisecond), nodefacts.ResourceName, q.Value(), last.allocated())

	// A pod asking for more than the node has stays Pending, and the
	// scheduler says why.
	greedy := perfPod("too-many-jetties", "", nil)
	delete(greedy.Labels, "urma.openeuler.org/endpoint")
	want := *resource.NewQuantity(r.expectedUnits+1, resource.DecimalSI)
	greedy.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceName(nodefacts.ResourceName): want},
		Limits:   corev1.ResourceList{corev1.ResourceName(nodefacts.ResourceName): want},
	}
	if _, err := r.cs.CoreV1().Pods(testNS).Create(ctx, greedy, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", greedy.Name, err)
	}
	var msg string
	err = r.poll(ctx, 2*time.Minute, "pod "+greedy.Name+" to be reported unschedulable", func(ctx context.Context) (bool, error) {
		p, err := r.cs.CoreV1().Pods(testNS).Get(ctx, greedy.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s asking for %s %s was bound to %s", p.Name, want.String(), nodefacts.ResourceName, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				msg = c.Message
				return p.Status.Phase == corev1.PodPending && strings.Contains(c.Message, "Insufficient "+nodefacts.ResourceName), nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last message %q)", err, msg)
	}
	r.note("pod asking for %s %s (node has %d): Pending, scheduler: %q", want.String(), nodefacts.ResourceName, r.expectedUnits, msg)
	return r.cs.CoreV1().Pods(testNS).Delete(ctx, greedy.Name, metav1.DeleteOptions{})
}

// crdName is the CRD the chart installs and keeps on uninstall.
const crdName = "urmaendpoints.urma.openeuler.org"

func (r *run) checkUninstall(ctx context.Context) error {
	manifest, err := r.helm(ctx, "get", "manifest", releaseName, "--namespace", releaseNS)
	if err != nil {
		return err
	}
	objs, err := parseManifest(manifest)
	if err != nil {
		return fmt.Errorf("read the release's manifest: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(r.rest)
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(r.rest)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	type ref struct {
		res       dynamic.ResourceInterface
		kind, key string
	}
	var owned []ref
	keptCRD := false
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("map %s: %w", gvk, err)
		}
		var res dynamic.ResourceInterface = dyn.Resource(m.Resource)
		key := o.GetName()
		if m.Scope.Name() == "namespace" {
			ns := o.GetNamespace()
			if ns == "" {
				ns = releaseNS
			}
			res = dyn.Resource(m.Resource).Namespace(ns)
			key = ns + "/" + key
		}
		if gvk.Kind == "CustomResourceDefinition" && o.GetName() == crdName {
			keptCRD = true
			continue
		}
		owned = append(owned, ref{res: res, kind: gvk.Kind, key: key})
	}
	if !keptCRD {
		return fmt.Errorf("the release's manifest has no CRD %s (crds.install is the default)", crdName)
	}
	if _, err := r.helm(ctx, "uninstall", releaseName, "--namespace", releaseNS, "--wait", "--timeout", "3m"); err != nil {
		return err
	}
	var left []string
	err = r.poll(ctx, 2*time.Minute, "every object of the release to be gone", func(ctx context.Context) (bool, error) {
		left = left[:0]
		for _, o := range owned {
			_, err := o.res.Get(ctx, lastPart(o.key), metav1.GetOptions{})
			if err == nil || !apierrors.IsNotFound(err) {
				left = append(left, o.kind+" "+o.key)
			}
		}
		pods, err := r.cs.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			left = append(left, "Pod "+releaseNS+"/"+p.Name)
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w: still there: %s", err, strings.Join(left, ", "))
	}
	crd := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crd).Get(ctx, crdName, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("CRD %s after helm uninstall: %w (the chart keeps it: crds.keep)", crdName, err)
	}
	ep := schema.GroupVersionResource{Group: "urma.openeuler.org", Version: "v1alpha1", Resource: "urmaendpoints"}
	eps, err := dyn.Resource(ep).Namespace(testNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list UrmaEndpoints after helm uninstall: %w", err)
	}
	r.note("helm uninstall removed all %d objects of the release and their pods; CRD %s kept with %d UrmaEndpoint(s)", len(owned), crdName, len(eps.Items))
	return nil
}

func lastPart(key string) string { return key[strings.LastIndex(key, "/")+1:] }

// parseManifest splits a multi-document YAML manifest into objects.
func parseManifest(manifest string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	rd := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var u unstructured.Unstructured
		if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
			return nil, err
		}
		if len(u.Object) == 0 {
			continue
		}
		out = append(out, &u)
	}
}
