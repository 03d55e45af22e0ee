package kubeclient_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/internal/kubeclient"
)

func TestNew(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := kubeclient.New(kubeconfig, "test-agent"); err != nil || c == nil {
		t.Fatalf("New with a kubeconfig: %v", err)
	}
	if _, err := kubeclient.New(filepath.Join(t.TempDir(), "missing"), "test-agent"); err == nil || !strings.Contains(err.Error(), "client config") {
		t.Fatalf("New with a missing kubeconfig = %v", err)
	}
	// Outside a pod there is no in-cluster config.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := kubeclient.New("", "test-agent"); err == nil {
		t.Fatal("New without a kubeconfig outside a cluster succeeded")
	}
}
