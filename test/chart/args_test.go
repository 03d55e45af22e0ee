package chart_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestRenderedArgsAcceptedByBinaries builds the operator, the device plugin
// and the DRA driver
// and runs each with the arguments the chart renders (default and every
// ci/*-values.yaml) followed by -h. The Go flag parser reads the arguments in
// order and stops at -h with exit status 0, so any flag the binary does not
// define, or a value it cannot parse, fails here instead of in a crash-looping
// pod.
func TestRenderedArgsAcceptedByBinaries(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	binDir := t.TempDir()
	binaries := []struct {
		kind, container, pkg, bin string
	}{
		{"Deployment", "operator", "./cmd/operator", "urma-operator"},
		{"DaemonSet", "device-plugin", "./cmd/deviceplugin", "urma-device-plugin"},
		{"DaemonSet", "dra-driver", "./cmd/dra-driver", "urma-dra-driver"},
	}
	for _, b := range binaries {
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, b.bin), b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}

	variants := map[string][]string{"default": nil}
	for _, f := range ciValuesFiles(t) {
		variants[filepath.Base(f)] = ciValuesArgs(f)
	}
	for name, values := range variants {
		objs := render(t, values...)
		for _, b := range binaries {
			var workloads []*unstructured.Unstructured
			for _, w := range ofKind(objs, b.kind) {
				if w.GetLabels()["app.kubernetes.io/component"] == b.container {
					workloads = append(workloads, w)
				}
			}
			if len(workloads) == 0 {
				continue // component disabled in this variant
			}
			argv := append(args(t, container(t, workloads[0], b.container)), "-h")
			t.Run(name+"/"+b.bin, func(t *testing.T) {
				cmd := exec.Command(filepath.Join(binDir, b.bin), argv...)
				// No cluster: the binary must stop at -h before it needs one.
				cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(t.TempDir(), "none"), "NODE_NAME=test-node", "POD_NAMESPACE="+releaseNS)
				var out bytes.Buffer
				cmd.Stdout = &out
				cmd.Stderr = &out
				if err := cmd.Run(); err != nil {
					t.Errorf("%s %s: %v\n%s", b.bin, strings.Join(argv, " "), err, out.String())
				}
			})
		}
	}
}
