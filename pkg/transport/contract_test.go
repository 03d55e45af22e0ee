package transport

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openeuler/urma-k8s/internal/deviceplugin/server"
	"github.com/openeuler/urma-k8s/internal/dra/claimspec"
	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
	"github.com/openeuler/urma-k8s/internal/node/metrics"
	"github.com/openeuler/urma-k8s/internal/podenv"
)

// The one test of this package that imports the node drivers: it crosses
// the boundary internal/podenv defines, feeding what each driver writes
// into a container's environment to this package's Config, so that a
// change on one side that the other does not read fails here.

// allocateEnv is the device plugin's Allocate answer for three units on
// two software devices (two of soft1, one of soft0, 16 jetties a unit).
func allocateEnv(t *testing.T, shmDir string) map[string]string {
	t.Helper()
	inv := inventory.New(16)
	inv.Publish(inventory.Snapshot{
		JettiesPerUnit: 16,
		Devices:        inventory.SoftDevices(inventory.Config{Budget: budget.Default(), SoftDevices: 2, SoftJetties: 64}),
	})
	srv := server.New(server.Config{ShmDir: shmDir}, inv, testr.New(t), metrics.New())
	resp, err := srv.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"soft1-0", "soft0-0", "soft1-1"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.ContainerResponses[0].Envs
}

// cdiEnv is the environment the DRA driver's CDI spec gives a container of
// a claim with the same shares.
func cdiEnv(t *testing.T, shmDir string) map[string]string {
	t.Helper()
	w, err := claimspec.New(claimspec.Config{Dir: t.TempDir(), Kind: claimspec.DefaultKind, ShmDir: shmDir})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := w.Build("claim-uid", []claimspec.Device{
		{Name: "soft0", URMADevice: "soft0", Jetties: 16, Software: true},
		{Name: "soft1", URMADevice: "soft1", Jetties: 32, Software: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range append(spec.ContainerEdits.Env, spec.Devices[0].ContainerEdits.Env...) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

func TestConfigReadsWhatTheDriversWrite(t *testing.T) {
	for _, driver := range []struct {
		name string
		env  func(*testing.T, string) map[string]string
	}{
		{"device plugin", allocateEnv},
		{"DRA driver", cdiEnv},
	} {
		t.Run(driver.name, func(t *testing.T) {
			shm := t.TempDir()
			env := driver.env(t, shm)
			if env[podenv.Devices] != "soft1:32,soft0:16" {
				t.Fatalf("%s=%q, want soft1:32,soft0:16 (the format this test feeds the transport)", podenv.Devices, env[podenv.Devices])
			}
			for _, c := range []struct {
				name string
				drop string // a variable the driver sets, left out
			}{
				{name: "as written"},
				// Both drivers set URMA_DEVICE; URMA_DEVICES alone must
				// still name a device, not "soft1:32".
				{name: "without URMA_DEVICE", drop: podenv.Device},
			} {
				t.Run(c.name, func(t *testing.T) {
					lookup := func(k string) (string, bool) {
						if k == c.drop {
							return "", false
						}
						v, ok := env[k]
						return v, ok
					}
					s, err := Config{LookupEnv: lookup}.resolve()
					if err != nil {
						t.Fatalf("resolve %v: %v", env, err)
					}
					if s.device != "soft1" {
						t.Errorf("device %q, want soft1 (env %v)", s.device, env)
					}
					if s.budget.Limit() != 32 {
						t.Errorf("jetty budget %d, want 32 (env %v)", s.budget.Limit(), env)
					}
					if s.providerName != ProviderSoft {
						t.Errorf("provider %q, want %s (env %v)", s.providerName, ProviderSoft, env)
					}
					if s.fabric.shmDir != shm {
						t.Errorf("shm directory %q, want %s (env %v)", s.fabric.shmDir, shm, env)
					}
				})
			}
		})
	}
}
