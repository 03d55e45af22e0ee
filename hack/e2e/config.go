//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"sigs.k8s.io/yaml"
)

// writeFile writes content to path, creating its directory.
func writeFile(path string, content []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	if err := os.WriteFile(path, content, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeContainerdConfig writes the configuration of containerd 2.x (built
// into <bin>/containerd by hack/tools.sh): everything under -work, runc
// through our v2 shim with cgroupfs, our pause image as the sandbox image,
// the bridge CNI, and the run's own CDI directory, where the DRA driver
// writes its claims' specs (steps 7 and 8).
func (r *run) writeContainerdConfig() error {
	p := r.paths
	q := strconv.Quote
	cfg := `version = 3
root = ` + q(filepath.Join(p.containerd, "root")) + `
state = ` + q(filepath.Join(p.containerd, "state")) + `
# Snapshotters this host cannot or need not use; their probing only adds noise.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = ` + q(p.containerdSock) + `

[ttrpc]
  address = ` + q(p.containerdSock+".ttrpc") + `

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = ` + q(imageName("pause")) + `

[plugins."io.containerd.cri.v1.runtime"]
  # The sandbox may not lower oom_score_adj (no CAP_SYS_RESOURCE here):
  # without this runc fails with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  cdi_spec_dirs = [` + q(p.cdi) + `]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # Our shim, not one of another containerd's on PATH.
      runtime_path = ` + q(r.bin("containerd/containerd-shim-runc-v2")) + `
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [` + q(r.bin("cni")) + `]
    conf_dir = ` + q(p.cniConf) + `

# On by default in 2.x: it would unlink and take over /var/run/nri/nri.sock
# (another runtime's, on a shared host), start the host's /opt/nri/plugins,
# and leave its socket behind. The run needs no NRI.
[plugins."io.containerd.nri.v1.nri"]
  disable = true

# It creates <path>/{bin,lib} and puts them first on containerd's PATH:
# keep them under -work, which teardown removes, not /opt/containerd.
[plugins."io.containerd.internal.v1.opt"]
  path = ` + q(filepath.Join(p.containerd, "opt")) + `
`
	return writeFile(filepath.Join(p.config, "containerd.toml"), []byte(cfg))
}

// writeCNIConfig writes the pod network: one bridge on this host with
// host-local addresses, no masquerading (pods reach nothing beyond the node).
func (r *run) writeCNIConfig() error {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "urma-e2e",
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      bridgeName,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": podCIDR}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": r.paths.cniIPAM,
			},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the CNI configuration: %w", err)
	}
	return writeFile(filepath.Join(r.paths.cniConf, "10-urma-e2e.conflist"), b)
}

func (r *run) writeKubeProxyConfig() error {
	cfg := map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"clientConnection":   map[string]any{"kubeconfig": r.kubeconfigPath("kube-proxy")},
		"hostnameOverride":   nodeName,
		"mode":               "nftables",
		"clusterCIDR":        podCIDR,
		"healthzBindAddress": "127.0.0.1:" + strconv.Itoa(r.ports.proxyHealthz),
		"metricsBindAddress": "127.0.0.1:" + strconv.Itoa(r.ports.proxyMetrics),
		// NodePorts on the node's address only, not on every interface.
		"nodePortAddresses": []string{r.nodeIP + "/32"},
		// Leave the host's conntrack sysctls alone: it is a shared machine.
		"conntrack": map[string]any{"maxPerCore": 0, "min": 0},
	}
	return writeYAML(filepath.Join(r.paths.config, "kube-proxy.yaml"), cfg)
}

func (r *run) writeKubeletConfig() error {
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// This host mounts cgroup v1 hierarchies; kubelet 1.35+ refuses them
		// unless told otherwise.
		"failCgroupV1": false,
		// containerd 2.x tells kubelet its cgroup driver (the CRI
		// RuntimeConfig call: cgroupfs, from SystemdCgroup = false above);
		// this matches it for a runtime that cannot say.
		"cgroupDriver":             "cgroupfs",
		"containerRuntimeEndpoint": "unix://" + r.paths.containerdSock,
		"address":                  r.nodeIP,
		"port":                     r.ports.kubelet,
		"readOnlyPort":             0,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              r.ports.kubeletHealthz,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": filepath.Join(r.paths.pki, "ca.crt")},
		},
		"authorization": map[string]any{"mode": "Webhook"},
		"podLogsDir":    r.paths.podLogs,
		"failSwapOn":    false,
		"clusterDomain": "cluster.local",
		"resolvConf":    "/etc/resolv.conf",
		"maxPods":       30,
		// A shared development machine: evict only when it is really full,
		// and never garbage-collect the imported images (there is no
		// registry to pull them from again).
		"evictionHard": map[string]string{
			"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%",
		},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
	}
	return writeYAML(filepath.Join(r.paths.config, "kubelet.yaml"), cfg)
}

func writeYAML(path string, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return writeFile(path, b)
}
