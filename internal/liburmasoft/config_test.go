package liburmasoft

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/transport"
)

func TestConfigFromEnv(t *testing.T) {
	defaultShm := filepath.Join(os.TempDir(), "urma-k8s-shm-"+itoa(os.Geteuid()))
	tests := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string
	}{
		{name: "nothing set", env: nil,
			want: Config{Fabric: FabricAuto, ShmDir: defaultShm, Devices: []string{"soft0"}}},
		{name: "a pod given a software device",
			env: map[string]string{EnvDevice: "soft0", EnvShmDir: "/var/run/urma-k8s/shm", EnvShmSocketDir: "/var/run/urma-k8s/shm/pod-a",
				EnvPodIP: "10.1.2.3", EnvSoftFabric: "shm"},
			want: Config{Fabric: FabricShm, ShmDir: "/var/run/urma-k8s/shm", ShmSocketDir: "/var/run/urma-k8s/shm/pod-a",
				Devices: []string{"soft0"}, ListenIP: netip.MustParseAddr("10.1.2.3")}},
		{name: "devices of URMA_DEVICES after URMA_DEVICE, once each",
			env:  map[string]string{EnvDevice: "b", EnvDevices: "a:64, b:32 ,c", EnvShmDir: "/s"},
			want: Config{Fabric: FabricAuto, ShmDir: "/s", Devices: []string{"b", "a", "c"}}},
		{name: "socket fabric, log level",
			env:  map[string]string{EnvSoftFabric: "Socket", EnvShmDir: "/s", EnvPodIP: "192.168.0.9", EnvLogLevel: "DEBUG"},
			want: Config{Fabric: FabricSocket, ShmDir: "/s", Devices: []string{"soft0"}, ListenIP: netip.MustParseAddr("192.168.0.9"), LogLevel: LevelDebug}},
		{name: "auto", env: map[string]string{EnvSoftFabric: "AUTO", EnvShmDir: "/s"},
			want: Config{Fabric: FabricAuto, ShmDir: "/s", Devices: []string{"soft0"}}},
		{name: "unknown fabric", env: map[string]string{EnvSoftFabric: "rdma"}, wantErr: "URMA_SOFT_FABRIC"},
		{name: "unknown log level", env: map[string]string{EnvLogLevel: "loud"}, wantErr: "URMA_LOG_LEVEL"},
		{name: "name too long", env: map[string]string{EnvDevice: strings.Repeat("d", MaxNameLen+1)}, wantErr: "longer than 63"},
		{name: "name with a space", env: map[string]string{EnvDevices: "ok:1,not ok:2"}, wantErr: "space"},
		{name: "name with a control character", env: map[string]string{EnvDevice: "a\x01"}, wantErr: "printable"},
		{name: "a bad jetty count", env: map[string]string{EnvDevices: "a:x"}, wantErr: "URMA_DEVICES"},
		{name: "too many devices", env: map[string]string{EnvDevices: manyDevices(MaxDevices + 1)}, wantErr: "more than 16 devices"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ConfigFromEnv(func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ConfigFromEnv = %+v, %v; want an error naming %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.want.ListenIP.IsValid() {
				tt.want.ListenIP = got.ListenIP // the host's own address: checked below
				if !got.ListenIP.Is4() {
					t.Errorf("listen address %v, want an IPv4 address", got.ListenIP)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ConfigFromEnv = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func manyDevices(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = "d" + itoa(i)
	}
	return strings.Join(names, ",")
}

func itoa(i int) string { return strconv.Itoa(i) }

// The library reads pkg/transport's own variables and values: one name for
// one thing (the drivers' are podenv's).
func TestEnvNamesAreTheTransports(t *testing.T) {
	for _, tc := range []struct{ ours, theirs string }{
		{EnvSoftFabric, transport.EnvSoftFabric},
		{FabricAuto, transport.FabricAuto},
		{FabricShm, transport.FabricShm},
		{FabricSocket, transport.FabricSocket},
		{EnvPodIP, transport.EnvPodIP},
	} {
		if tc.ours != tc.theirs {
			t.Errorf("%s here, %s in pkg/transport", tc.ours, tc.theirs)
		}
	}
}
