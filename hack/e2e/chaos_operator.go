//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	urmav1 "github.com/openeuler/urma-k8s/api/v1alpha1"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

// leaseName is the operator's leader election Lease (cmd/operator).
const leaseName = "urma-operator.urma.openeuler.org"

// admission is what the API server answered a labelled pod.
type admission int

const (
	admittedMutated   admission = iota // the webhook answered
	admittedUnmutated                  // admitted without the webhook (failurePolicy Ignore)
	refusedByWebhook                   // the webhook could not be called (failurePolicy Fail)
)

// probes counts the answers to dry-run pods during a step.
type probes struct {
	counts       [3]int
	firstRefusal string
}

func (p probes) String() string {
	return fmt.Sprintf("%d admitted by the webhook, %d admitted without it, %d refused", p.counts[admittedMutated], p.counts[admittedUnmutated], p.counts[refusedByWebhook])
}

// probeAdmission creates a labelled pod (server-side dry run) and says how
// the API server answered: an error other than the webhook's is returned.
func (r *run) probeAdmission(ctx context.Context) (admission, string, error) {
	pod := perfPod("admission-probe", endpointName, nil)
	got, err := r.cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err != nil && strings.Contains(err.Error(), "failed calling webhook"):
		return refusedByWebhook, err.Error(), nil
	case err != nil:
		return 0, "", fmt.Errorf("a labelled pod (dry run): %w", err)
	}
	if webhookMutated(got) {
		return admittedMutated, "", nil
	}
	return admittedUnmutated, "", nil
}

// webhookMutated reports whether the webhook gave a pod the endpoint's
// flags file (and, with the device plugin, its jetty request).
func webhookMutated(p *corev1.Pod) bool {
	c := p.Spec.Containers[0]
	units := c.Resources.Requests[corev1.ResourceName(nodefacts.ResourceName)]
	return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == podenv.FlagsFile }) &&
		(units.Value() > 0 || len(c.Resources.Claims) > 0)
}

// podWebhookPolicy is the failurePolicy of the operator's pod webhook.
func (r *run) podWebhookPolicy(ctx context.Context) (admissionv1.FailurePolicyType, error) {
	l, err := r.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
	if err != nil {
		return "", fmt.Errorf("list the operator's MutatingWebhookConfigurations: %w", err)
	}
	for _, cfg := range l.Items {
		for _, wh := range cfg.Webhooks {
			for _, rule := range wh.Rules {
				if slices.Contains(rule.Resources, "pods") && wh.FailurePolicy != nil {
					return *wh.FailurePolicy, nil
				}
			}
		}
	}
	return "", errors.New("the operator has no mutating webhook for pods")
}

// endpointConfigMap is the endpoint's ConfigMap as it is now.
func (r *run) endpointConfigMap(ctx context.Context, c client.Client, name string) (*corev1.ConfigMap, error) {
	var ep urmav1.UrmaEndpoint
	if err := c.Get(ctx, client.ObjectKey{Namespace: testNS, Name: name}, &ep); err != nil {
		return nil, fmt.Errorf("get UrmaEndpoint %s: %w", name, err)
	}
	if ep.Status.ConfigMapName == "" {
		return nil, fmt.Errorf("UrmaEndpoint %s names no ConfigMap", name)
	}
	cm, err := r.cs.CoreV1().ConfigMaps(testNS).Get(ctx, ep.Status.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get ConfigMap %s: %w", ep.Status.ConfigMapName, err)
	}
	return cm, nil
}

// chaosDeployment is a Deployment of labelled perf servers.
func chaosDeployment(name string, replicas int32) *appsv1.Deployment {
	tmpl := perfPod("", endpointName, nil)
	tmpl.Labels["app"] = name
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels}, Spec: tmpl.Spec},
		},
	}
}

// deploymentPods are the running, webhook-mutated pods of a Deployment.
func (r *run) deploymentPods(ctx context.Context, name string) (running, unmutated int, err error) {
	l, err := r.cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		return 0, 0, err
	}
	for i := range l.Items {
		p := &l.Items[i]
		if !webhookMutated(p) {
			unmutated++
		}
		if podReady(p) {
			running++
		}
	}
	return running, unmutated, nil
}

// deleteDeploymentAndWait deletes a Deployment of testNS and waits until
// its pods are gone.
func (r *run) deleteDeploymentAndWait(ctx context.Context, name string) error {
	if err := r.cs.AppsV1().Deployments(testNS).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Deployment %s: %w", name, err)
	}
	return r.poll(ctx, 2*time.Minute, "the pods of Deployment "+name+" to be gone", func(ctx context.Context) (bool, error) {
		l, err := r.cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		return err == nil && len(l.Items) == 0, nil
	})
}

// ---- chaos 4: the operator's pod

func (r *run) chaosOperatorPod(ctx context.Context) error {
	return r.withStream(ctx, streamPod, func(ctx context.Context) error {
		policy, err := r.podWebhookPolicy(ctx)
		if err != nil {
			return err
		}
		c, err := r.ctrlClient()
		if err != nil {
			return err
		}
		cmBefore, err := r.endpointConfigMap(ctx, c, endpointName)
		if err != nil {
			return err
		}
		old, err := r.onlyPod(ctx, "operator")
		if err != nil {
			return err
		}
		const deployment = "chaos-admit"
		start := time.Now()
		if err := r.cs.CoreV1().Pods(releaseNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete the operator's pod %s: %w", old.Name, err)
		}
		// Created in the gap: its ReplicaSet creates its pods as soon as
		// it can, and they are admitted only once the webhook answers.
		if _, err := r.cs.AppsV1().Deployments(testNS).Create(ctx, chaosDeployment(deployment, 2), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Deployment %s: %w", deployment, err)
		}
		r.say("deleted the operator's pod %s (failurePolicy %s) and created Deployment %s (2 labelled pods)", old.Name, policy, deployment)
		// Labelled pods, one a tick, until the new operator serves.
		var seen probes
		var back time.Duration
		err = r.poll(ctx, 3*time.Minute, "a new operator pod to be ready and its webhook to answer", func(ctx context.Context) (bool, error) {
			a, msg, err := r.probeAdmission(ctx)
			if err != nil {
				return false, err
			}
			seen.counts[a]++
			if a == refusedByWebhook && seen.firstRefusal == "" {
				seen.firstRefusal = msg
			}
			pods, err := r.componentPods(ctx, "operator")
			if err != nil {
				return false, nil
			}
			ready := slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.UID != old.UID && podReady(&p) })
			if ready && a == admittedMutated && back == 0 {
				back = time.Since(start)
			}
			return back > 0, nil
		})
		if err != nil {
			return fmt.Errorf("%w (labelled pods meanwhile: %s)", err, seen)
		}
		switch policy {
		case admissionv1.Fail:
			if n := seen.counts[admittedUnmutated]; n > 0 {
				return fmt.Errorf("failurePolicy Fail, yet %d labelled pods were admitted without the webhook (%s)", n, seen)
			}
		case admissionv1.Ignore:
			if n := seen.counts[refusedByWebhook]; n > 0 {
				return fmt.Errorf("failurePolicy Ignore, yet %d labelled pods were refused (%s): %s", n, seen, seen.firstRefusal)
			}
		}
		var running, unmutated int
		err = r.poll(ctx, 3*time.Minute, "Deployment "+deployment+"'s pods to be admitted and run", func(ctx context.Context) (bool, error) {
			running, unmutated, err = r.deploymentPods(ctx, deployment)
			if err != nil {
				return false, nil
			}
			if policy == admissionv1.Fail && unmutated > 0 {
				return false, fmt.Errorf("%d pods of Deployment %s were not mutated by the webhook, under failurePolicy Fail", unmutated, deployment)
			}
			return running == 2, nil
		})
		if err != nil {
			return fmt.Errorf("%w\n%s", err, r.podsReport(ctx, testNS))
		}
		r.recovered(time.Since(start))
		cmAfter, err := r.endpointConfigMap(ctx, c, endpointName)
		if err != nil {
			return err
		}
		if cmAfter.ResourceVersion != cmBefore.ResourceVersion {
			return fmt.Errorf("ConfigMap %s was written while the operator restarted: resourceVersion %s, was %s", cmAfter.Name, cmAfter.ResourceVersion, cmBefore.ResourceVersion)
		}
		refusal := "none refused"
		if seen.firstRefusal != "" {
			refusal = fmt.Sprintf("the first refused with %q", firstLine(seen.firstRefusal))
		}
		r.note("chaos 4: operator back (webhook answering) %s after its pod was deleted; labelled pods meanwhile: %s (failurePolicy %s), %s; Deployment %s's 2 pods admitted by the webhook and running %s after; ConfigMap %s unchanged (resourceVersion %s)",
			back.Round(100*time.Millisecond), seen, policy, refusal, deployment, r.recovery.Round(100*time.Millisecond), cmAfter.Name, cmAfter.ResourceVersion)
		appendLog(filepath.Join(r.o.logs, "chaos.log"), fmt.Sprintf("chaos 4: first refusal: %s\n", seen.firstRefusal))
		return r.deleteDeploymentAndWait(ctx, deployment)
	})
}

// firstLine cuts s at its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// ---- chaos 5: two operator replicas, the leader deleted

// leader is the pod that holds the operator's Lease, "" if none does.
func (r *run) leader(ctx context.Context) (string, error) {
	l, err := r.cs.CoordinationV1().Leases(releaseNS).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get Lease %s: %w", leaseName, err)
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	pod, _, _ := strings.Cut(holder, "_")
	return pod, nil
}

func (r *run) chaosOperatorLeader(ctx context.Context) error {
	return r.withStream(ctx, streamPod, func(ctx context.Context) error {
		chart := filepath.Join(r.o.root, "charts", "urma-k8s")
		sets := []string{"operator.replicas=2", "operator.leaderElection.enabled=true"}
		r.say("$ helm upgrade %s charts/urma-k8s -n %s --reuse-values --set %s", releaseName, releaseNS, strings.Join(sets, " --set "))
		if _, err := r.helm(ctx, "upgrade", releaseName, chart, "--namespace", releaseNS, "--reuse-values",
			"--set", sets[0], "--set", sets[1], "--wait", "--timeout", "3m"); err != nil {
			return err
		}
		if _, err := r.waitReplaced(ctx, "operator", nil, 2); err != nil {
			return err
		}
		var leaderPod string
		err := r.poll(ctx, time.Minute, "a leader among the operator's replicas", func(ctx context.Context) (bool, error) {
			p, err := r.leader(ctx)
			leaderPod = p
			return err == nil && p != "", nil
		})
		if err != nil {
			return err
		}
		old, err := r.cs.CoreV1().Pods(releaseNS).Get(ctx, leaderPod, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("the leader %s: %w", leaderPod, err)
		}
		c, err := r.ctrlClient()
		if err != nil {
			return err
		}
		const endpoint = "chaos-ha"
		start := time.Now()
		if err := r.cs.CoreV1().Pods(releaseNS).Delete(ctx, leaderPod, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete the leader %s: %w", leaderPod, err)
		}
		// A reconcile that only a leader can do, asked for at once.
		ep := &urmav1.UrmaEndpoint{
			ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: endpoint},
			Spec: urmav1.UrmaEndpointSpec{JettyBudget: 16, Profile: urmav1.TrafficProfile{
				MessageSize: resource.MustParse("1Ki"), ConnectionsPerPod: 2, InflightPerConnection: 16, Objective: urmav1.ObjectiveLatency,
			}},
		}
		if err := c.Create(ctx, ep); err != nil {
			return fmt.Errorf("create UrmaEndpoint %s: %w", endpoint, err)
		}
		r.say("deleted the leader %s and created UrmaEndpoint %s", leaderPod, endpoint)
		var seen probes
		var newLeader string
		var led, reconciled time.Duration
		err = r.poll(ctx, 3*time.Minute, "another leader and UrmaEndpoint "+endpoint+" reconciled", func(ctx context.Context) (bool, error) {
			a, msg, err := r.probeAdmission(ctx)
			if err != nil {
				return false, err
			}
			seen.counts[a]++
			if a != admittedMutated && seen.firstRefusal == "" {
				seen.firstRefusal = msg
				if msg == "" {
					seen.firstRefusal = "admitted without the webhook"
				}
			}
			if led == 0 {
				if p, err := r.leader(ctx); err == nil && p != "" && p != leaderPod {
					newLeader, led = p, time.Since(start)
				}
			}
			if reconciled == 0 {
				var got urmav1.UrmaEndpoint
				if c.Get(ctx, client.ObjectKeyFromObject(ep), &got) == nil && got.Status.ObservedGeneration == got.Generation &&
					meta.IsStatusConditionTrue(got.Status.Conditions, urmav1.ConditionReady) && got.Status.ConfigMapName != "" {
					reconciled = time.Since(start)
				}
			}
			return led > 0 && reconciled > 0, nil
		})
		if err != nil {
			return fmt.Errorf("%w (labelled pods meanwhile: %s)", err, seen)
		}
		r.recovered(max(led, reconciled))
		if n := seen.counts[admittedUnmutated] + seen.counts[refusedByWebhook]; n > 0 {
			return fmt.Errorf("with two replicas, %d of the labelled pods created while the leader went were not admitted by the webhook (%s): %s", n, seen, firstLine(seen.firstRefusal))
		}
		if _, err := r.waitReplaced(ctx, "operator", []types.UID{old.UID}, 2); err != nil {
			return err
		}
		r.note("chaos 5: leader %s deleted; %s leads after %s; UrmaEndpoint %s reconciled after %s; labelled pods meanwhile: %s",
			leaderPod, newLeader, led.Round(100*time.Millisecond), endpoint, reconciled.Round(100*time.Millisecond), seen)
		if err := c.Delete(ctx, ep); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete UrmaEndpoint %s: %w", endpoint, err)
		}
		return nil
	})
}
