package chart_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/openeuler/urma-k8s/internal/deviceplugin/nodelabel"
	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

// nodeNameExtra is where the API server puts the node of a pod-bound
// ServiceAccount token (Kubernetes 1.30+, ServiceAccountTokenPodNodeInfo).
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// TestNodePolicyOnTheAPIServer installs the chart's device plugin RBAC and
// ValidatingAdmissionPolicy into a real kube-apiserver (envtest) and acts as
// the plugin with a real token. What works, found here: envtest's API server
// signs ServiceAccount tokens, and a TokenRequest bound to a pod that is
// bound to a node yields a token whose user carries the node's name in
// extra[authentication.kubernetes.io/node-name], exactly as kubelet's
// projected token does. No impersonation is needed (impersonating the
// ServiceAccount with that extra works too, but would not show that real
// tokens carry it).
func TestNodePolicyOnTheAPIServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg, admin := policyServer(ctx, t)
	for _, name := range []string{"node-a", "node-b"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:      map[string]string{"team": "storage", nodefacts.LabelPresent: "false"},
			Annotations: map[string]string{"example.com/owner": "ops"},
		}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The plugin's pod on node-a, and the token kubelet would project into it.
	pod, err := admin.CoreV1().Pods(releaseNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "urma-device-plugin-x", Namespace: releaseNS},
		Spec: corev1.PodSpec{ServiceAccountName: dpName, NodeName: "node-a",
			Containers: []corev1.Container{{Name: "device-plugin", Image: "example.invalid/urma-device-plugin"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound := tokenFor(ctx, t, admin, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	plugin := clientWithToken(t, cfg, bound)

	review, err := plugin.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := review.Status.UserInfo.Extra[nodeNameExtra]; !slices.Equal(got, []string{"node-a"}) {
		t.Fatalf("the pod-bound token's user has %s=%v, want [node-a]: the policy cannot tell the plugin's node", nodeNameExtra, got)
	}

	// Policies take effect once the API server has loaded them: wait until
	// the plugin is refused another node.
	eventually.Succeeds(t, "the policy to refuse another node", time.Minute, func() error {
		err := patchNode(ctx, plugin, "node-b", map[string]any{"labels": map[string]any{nodefacts.LabelPresent: "true"}})
		if err == nil {
			return fmt.Errorf("patching node-b was allowed")
		}
		if !strings.Contains(err.Error(), "may change only its own node") {
			return fmt.Errorf("patching node-b failed otherwise: %w", err)
		}
		return nil
	})

	cases := []struct {
		name  string
		node  string
		patch map[string]any
		spec  map[string]any
		deny  string // "" = allowed
	}{
		{name: "its own nodes urma label", node: "node-a", patch: map[string]any{"labels": map[string]any{nodefacts.LabelPresent: "true"}}},
		{name: "its own nodes urma annotation", node: "node-a", patch: map[string]any{"annotations": map[string]any{nodefacts.AnnotationMaxJFSDepth: "4096"}}},
		{name: "removing its own urma annotation", node: "node-a", patch: map[string]any{"annotations": map[string]any{nodefacts.AnnotationMaxJFSDepth: nil}}},
		{name: "another node", node: "node-b", patch: map[string]any{"annotations": map[string]any{nodefacts.AnnotationDeviceCount: "1"}}, deny: "may change only its own node"},
		{name: "another label", node: "node-a", patch: map[string]any{"labels": map[string]any{"team": "compute"}}, deny: "only urma.openeuler.org/ labels"},
		{name: "a new label", node: "node-a", patch: map[string]any{"labels": map[string]any{"node-role.kubernetes.io/control-plane": ""}}, deny: "only urma.openeuler.org/ labels"},
		{name: "removing a label", node: "node-a", patch: map[string]any{"labels": map[string]any{"team": nil}}, deny: "only urma.openeuler.org/ labels"},
		{name: "another annotation", node: "node-a", patch: map[string]any{"annotations": map[string]any{"example.com/owner": "me"}}, deny: "only urma.openeuler.org/ annotations"},
		{name: "a taint", node: "node-a", spec: map[string]any{"taints": []any{map[string]any{"key": "evil", "effect": "NoSchedule"}}}, deny: "may not change a node's spec"},
		{name: "cordoning", node: "node-a", spec: map[string]any{"unschedulable": true}, deny: "may not change a node's spec"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{}
			if tc.patch != nil {
				body["metadata"] = tc.patch
			}
			if tc.spec != nil {
				body["spec"] = tc.spec
			}
			err := mergePatch(ctx, plugin, tc.node, body)
			switch {
			case tc.deny == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.deny != "" && (err == nil || !strings.Contains(err.Error(), tc.deny)):
				t.Errorf("error %v, want a denial saying %q", err, tc.deny)
			}
		})
	}

	t.Run("the plugins own publisher", func(t *testing.T) {
		pub := nodelabel.New(nodelabel.Config{NodeName: "node-a"}, plugin, testr.New(t), nil)
		facts := nodefacts.Facts{DeviceCount: 2, MaxJFSDepth: 4096, MaxJFRDepth: 4096, MaxJFCDepth: 8192,
			MaxMsgSize: 1 << 20, JettiesPerDevice: 1008, JettiesPerUnit: 16}
		if err := pub.Apply(ctx, facts); err != nil {
			t.Fatalf("the plugin's node patch was refused: %v", err)
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := nodefacts.Parse(n.Annotations); err != nil || got != facts {
			t.Errorf("node-a facts %+v, %v; want %+v", got, err, facts)
		}
		if n.Labels["team"] != "storage" || n.Annotations["example.com/owner"] != "ops" {
			t.Errorf("unrelated metadata changed: %v %v", n.Labels, n.Annotations)
		}
		if err := nodelabel.New(nodelabel.Config{NodeName: "node-b"}, plugin, testr.New(t), nil).Apply(ctx, facts); err == nil {
			t.Error("the plugin published facts onto another node")
		}
	})

	t.Run("a token that names no node", func(t *testing.T) {
		unbound := clientWithToken(t, cfg, tokenFor(ctx, t, admin, nil))
		err := patchNode(ctx, unbound, "node-a", map[string]any{"labels": map[string]any{nodefacts.LabelPresent: "true"}})
		if err == nil || !strings.Contains(err.Error(), "names no node") {
			t.Errorf("error %v, want a denial saying the token names no node", err)
		}
	})

	// A long-lived Secret token's user has no extra at all, unlike the
	// unbound token above; impersonation without extras stands in for it.
	t.Run("a user without any extra", func(t *testing.T) {
		err := patchNode(ctx, asServiceAccount(t, cfg, dpName, ""), "node-a", map[string]any{"labels": map[string]any{nodefacts.LabelPresent: "true"}})
		if err == nil || !strings.Contains(err.Error(), "names no node") {
			t.Errorf("error %v, want a denial saying the token names no node", err)
		}
	})

	t.Run("other users are not affected", func(t *testing.T) {
		if err := mergePatch(ctx, admin, "node-b", map[string]any{"spec": map[string]any{"unschedulable": true}}); err != nil {
			t.Errorf("the admin's cordon was refused: %v", err)
		}
	})

	t.Run("the operator watches its webhook configurations by name only", func(t *testing.T) {
		cs := asServiceAccount(t, cfg, operatorName, "")
		hooks := cs.AdmissionregistrationV1().MutatingWebhookConfigurations()
		w, err := hooks.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + webhookCfgName})
		if err != nil {
			t.Fatalf("watching %s by name: %v", webhookCfgName, err)
		}
		w.Stop()
		if _, err := hooks.List(ctx, metav1.ListOptions{}); err == nil {
			t.Error("the operator may list every MutatingWebhookConfiguration; want only its own, by name")
		}
		vw, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=urma-operator-validating"})
		if err != nil {
			t.Fatalf("watching urma-operator-validating by name: %v", err)
		}
		vw.Stop()
	})
}

// asServiceAccount is a client that acts as the release's ServiceAccount sa
// (impersonated); node is the node claim of its token, "" for a token
// without extras (a long-lived Secret token's user has none).
func asServiceAccount(t *testing.T, cfg *rest.Config, sa, node string) kubernetes.Interface {
	t.Helper()
	rc := rest.CopyConfig(cfg)
	rc.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + releaseNS + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNS, "system:authenticated"},
	}
	if node != "" {
		rc.Impersonate.Extra = map[string][]string{nodeNameExtra: {node}}
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// policyServer starts a kube-apiserver (envtest) with the release's
// namespace and the chart's ServiceAccounts, RBAC and admission policies,
// rendered with values, applied for real; it returns the server's admin
// config and an admin client.
func policyServer(ctx context.Context, t *testing.T, values ...string) (*rest.Config, *kubernetes.Clientset) {
	t.Helper()
	cfg := startEnvtest(t, &envtest.Environment{})
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, o := range render(t, values...) {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			apply(ctx, t, c, o)
		}
	}
	return cfg, admin
}

// apply server-side applies one rendered object for real.
func apply(ctx context.Context, t *testing.T, c client.Client, o *unstructured.Unstructured) {
	t.Helper()
	obj := o.DeepCopy()
	if obj.GetKind() == "ServiceAccount" {
		obj.SetNamespace(releaseNS)
	}
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner("urma-chart-test"), client.ForceOwnership); err != nil {
		t.Fatalf("apply %s/%s: %v", obj.GetKind(), obj.GetName(), err)
	}
}

// tokenFor requests a token of the device plugin's ServiceAccount, bound to
// obj when it is not nil.
func tokenFor(ctx context.Context, t *testing.T, admin kubernetes.Interface, obj *authenticationv1.BoundObjectReference) string {
	t.Helper()
	tr, err := admin.CoreV1().ServiceAccounts(releaseNS).CreateToken(ctx, dpName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: obj}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", dpName, err)
	}
	return tr.Status.Token
}

func clientWithToken(t *testing.T, cfg *rest.Config, token string) kubernetes.Interface {
	t.Helper()
	rc := &rest.Config{Host: cfg.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func patchNode(ctx context.Context, cs kubernetes.Interface, node string, metadata map[string]any) error {
	return mergePatch(ctx, cs, node, map[string]any{"metadata": metadata})
}

func mergePatch(ctx context.Context, cs kubernetes.Interface, node string, body map[string]any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{})
	return err
}
