package chart_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// TestNodeAgentsReadiness checks the node agents' readiness probes: each
// asks its agent's /readyz (ready once kubelet has registered it) on the
// port the agent is told to serve it on, so that a pod created on the node
// or a rollout moving to the next one waits for kubelet, and probes often,
// so that the wait is kubelet's, not the probe's period.
func TestNodeAgentsReadiness(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		values    []string
		container string
		flag      string // the agent's flag naming the address
		port      int    // 0: no probe, no flag
	}{
		{"device plugin", nil, "device-plugin", "--metrics-address", 9400},
		{"device plugin, other port", []string{"--set", "devicePlugin.metrics.port=9500"}, "device-plugin", "--metrics-address", 9500},
		{"DRA driver", []string{"--set", "driver=dra"}, "dra-driver", "--health-address", 9401},
		{"DRA driver, other port", []string{"--set", "driver=dra", "--set", "draDriver.healthProbePort=9555"}, "dra-driver", "--health-address", 9555},
		// Unset only after `helm upgrade --reuse-values` from a chart
		// older than the value: no probe rather than one on no port.
		{"DRA driver, port unset", []string{"--set", "driver=dra", "--set", "draDriver.healthProbePort=null"}, "dra-driver", "--health-address", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := container(t, one(t, render(t, tc.values...), "DaemonSet"), tc.container)
			addr, hasFlag := argValue(args(t, c), tc.flag)
			probe, hasProbe := c["readinessProbe"].(map[string]any)
			if tc.port == 0 {
				if hasFlag || hasProbe {
					t.Fatalf("%s=%q and readinessProbe %v, want neither", tc.flag, addr, probe)
				}
				return
			}
			if want := fmt.Sprintf(":%d", tc.port); addr != want {
				t.Errorf("%s = %q, want %q", tc.flag, addr, want)
			}
			if !hasProbe {
				t.Fatalf("%s has no readinessProbe", tc.container)
			}
			get, _ := probe["httpGet"].(map[string]any)
			if get["path"] != "/readyz" {
				t.Errorf("readinessProbe path = %v, want /readyz", get["path"])
			}
			if got := containerPort(t, c, get["port"]); got != tc.port {
				t.Errorf("readinessProbe port %v is %d, want %d, where %s serves /readyz", get["port"], got, tc.port, tc.flag)
			}
			if fmt.Sprint(probe["initialDelaySeconds"]) != "1" || fmt.Sprint(probe["periodSeconds"]) != "2" {
				t.Errorf("readinessProbe %v, want initialDelaySeconds 1 and periodSeconds 2", probe)
			}
		})
	}
}

// containerPort resolves a probe's port (a number, or the name of one of
// the container's ports) to its number.
func containerPort(t *testing.T, c map[string]any, port any) int {
	t.Helper()
	if name, ok := port.(string); ok {
		if n, err := strconv.Atoi(name); err == nil {
			return n
		}
		ports, _ := c["ports"].([]any)
		for _, p := range ports {
			pm, _ := p.(map[string]any)
			if pm["name"] == name {
				n, err := strconv.Atoi(fmt.Sprint(pm["containerPort"]))
				if err != nil || !strings.EqualFold(fmt.Sprint(pm["protocol"]), "TCP") {
					t.Fatalf("port %s: %v", name, pm)
				}
				return n
			}
		}
		t.Fatalf("the container has no port named %q: %v", name, ports)
	}
	n, err := strconv.Atoi(fmt.Sprint(port))
	if err != nil {
		t.Fatalf("probe port %v: %v", port, err)
	}
	return n
}
