package chart_test

import (
	"reflect"
	"testing"
)

// Both node agents get the flags of liburma injection and the mounts
// through which they find the host's liburma (read-only, under /host) and,
// with software devices, the directory they copy their own into.
func TestLiburmaInjection(t *testing.T) {
	type mount struct {
		Path     string
		HostPath string
		ReadOnly bool
	}
	host := mount{"/host/usr", "/usr", true}
	for _, tc := range []struct {
		name      string
		values    []string
		container string
		args      map[string]string
		absent    []string
		mounts    []mount
	}{
		{name: "device plugin, defaults", container: "device-plugin",
			args: map[string]string{"--inject-liburma": "true", "--liburma-host-root": "/host", "--liburma-host-dir": "/usr/lib64",
				"--liburma-provider-dir": "/usr/lib64/urma", "--liburma-library-path": "true"},
			absent: []string{"--liburma-soft-dir"}, mounts: []mount{host}},
		{name: "device plugin, software devices", container: "device-plugin",
			values: []string{"--set", "devicePlugin.softDevices=2", "--set", "liburma.softDir=/srv/urma/lib"},
			args:   map[string]string{"--inject-liburma": "true", "--liburma-soft-dir": "/srv/urma/lib"},
			mounts: []mount{host, {"/srv/urma/lib", "/srv/urma/lib", false}}},
		{name: "DRA driver, providers elsewhere, mounts only", container: "dra-driver",
			values: []string{"--set", "driver=dra", "--set", "liburma.hostProviderDir=/opt/umdk/urma", "--set", "liburma.setLibraryPath=false"},
			args:   map[string]string{"--inject-liburma": "true", "--liburma-provider-dir": "/opt/umdk/urma", "--liburma-library-path": "false"},
			mounts: []mount{host, {"/host/opt/umdk", "/opt/umdk", true}}},
		{name: "off", container: "device-plugin", values: []string{"--set", "liburma.inject=false"},
			args:   map[string]string{"--inject-liburma": "false"},
			absent: []string{"--liburma-host-root", "--liburma-host-dir", "--liburma-soft-dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.values...)
			var ds map[string]any
			var c map[string]any
			for _, d := range ofKind(objs, "DaemonSet") {
				if d.GetLabels()["app.kubernetes.io/component"] == tc.container {
					c, ds = container(t, d, tc.container), podSpec(t, d)
				}
			}
			if c == nil {
				t.Fatalf("no %s DaemonSet rendered", tc.container)
			}
			argv := args(t, c)
			checkArgs(t, argv, tc.args)
			checkArgsAbsent(t, argv, tc.absent...)
			hostPaths := map[string]string{}
			vols, _ := ds["volumes"].([]any)
			for _, v := range vols {
				m, _ := v.(map[string]any)
				if hp, ok := m["hostPath"].(map[string]any); ok {
					hostPaths[m["name"].(string)] = hp["path"].(string)
				}
			}
			var got []mount
			vms, _ := c["volumeMounts"].([]any)
			for _, v := range vms {
				m, _ := v.(map[string]any)
				name, _ := m["name"].(string)
				if len(name) < 7 || name[:7] != "liburma" {
					continue
				}
				ro, _ := m["readOnly"].(bool)
				got = append(got, mount{m["mountPath"].(string), hostPaths[name], ro})
			}
			if !reflect.DeepEqual(got, tc.mounts) {
				t.Errorf("liburma mounts %+v, want %+v", got, tc.mounts)
			}
		})
	}
}
