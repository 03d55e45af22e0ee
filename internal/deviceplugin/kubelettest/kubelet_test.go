package kubelettest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestRegisterValidatesLikeKubelet(t *testing.T) {
	dir, cleanup, err := SocketDir()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	k, err := Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, SocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pluginapi.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tests := []struct {
		req  *pluginapi.RegisterRequest
		want string
	}{
		{&pluginapi.RegisterRequest{Version: "v1alpha", Endpoint: "p.sock", ResourceName: "example.com/x"}, "unsupported version"},
		{&pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: "x"}, "invalid resource name"},
		{&pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: "kubernetes.io/x"}, "invalid resource name"},
		{&pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "../p.sock", ResourceName: "example.com/x"}, "invalid endpoint"},
		{&pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "", ResourceName: "example.com/x"}, "invalid endpoint"},
	}
	for _, tt := range tests {
		_, err := c.Register(ctx, tt.req)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Register(%v) = %v, want %q", tt.req, err, tt.want)
		}
	}
	if s, _ := k.State(); len(s.Registrations) != 0 {
		t.Errorf("rejected registrations counted: %v", s.Registrations)
	}
}

func TestCleanupSocketsRemovesOnlySockets(t *testing.T) {
	dir, cleanup, err := SocketDir()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	lis, err := net.Listen("unix", filepath.Join(dir, "plugin.sock"))
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	defer lis.Close()
	if err := os.WriteFile(filepath.Join(dir, "kubelet_internal_checkpoint"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CleanupSockets(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "plugin.sock")); !os.IsNotExist(err) {
		t.Errorf("socket survived: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kubelet_internal_checkpoint")); err != nil {
		t.Errorf("checkpoint file removed: %v", err)
	}
}
