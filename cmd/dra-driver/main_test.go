package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/internal/dra"
)

// withNode is an environment that names the node and nothing else.
func withNode(k string) string {
	if k == "NODE_NAME" {
		return "node-1"
	}
	return ""
}

func TestRunRejectsBadInvocations(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
		code   int
		want   string
	}{
		{"help", []string{"-h"}, noEnv, 0, "-jetty-request-default"},
		{"unknown flag", []string{"--nope"}, withNode, 2, "nope"},
		{"bad number", []string{"--host-reserve", "-3"}, withNode, 2, "unsigned"},
		{"stray argument", []string{"serve"}, withNode, 2, "unexpected arguments"},
		{"no node name", nil, noEnv, 1, "NODE_NAME"},
		{"policy", []string{"--jetty-request-default", "3", "--jetty-request-min", "4"}, withNode, 1, "below the minimum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(context.Background(), tc.args, tc.getenv, &stderr, dra.Run)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// Bad values must be refused before the driver touches the host or the API
// server; the directories point into a temporary one in case they are not.
func TestRunRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		// Zero or negative used to become the default without a word.
		{"zero health resend", []string{"--health-resend-interval=0s"}, "--health-resend-interval 0s must be positive"},
		{"negative health resend", []string{"--health-resend-interval=-1s"}, "--health-resend-interval -1s must be positive"},
		// 3× these overflowed to a negative timeout, which kubelet reads
		// as "use the 30s default": health went Unknown between resends.
		{"health resend overflowing the timeout", []string{"--health-resend-interval=854016h"}, "--health-resend-interval 854016h0m0s must be positive and at most 1h0m0s"},
		{"largest Go duration as health resend", []string{"--health-resend-interval=2562047h"}, "--health-resend-interval 2562047h0m0s must be positive and at most 1h0m0s"},
		// Valid Go durations whose 3× lease vouches for a stopped driver's
		// devices for days.
		{"health resend of years", []string{"--health-resend-interval=100000h"}, "--health-resend-interval 100000h0m0s must be positive and at most 1h0m0s"},
		{"health resend just above the cap", []string{"--health-resend-interval=1h0m1s"}, "--health-resend-interval 1h0m1s must be positive and at most 1h0m0s"},
		{"zero stale claim check", []string{"--stale-claim-check-interval=0s"}, "--stale-claim-check-interval 0s must be positive"},
		{"negative stale claim check", []string{"--stale-claim-check-interval=-1m"}, "--stale-claim-check-interval -1m0s must be positive"},
		{"health address without a port", []string{"--health-address=localhost"}, `--health-address \"localhost\" must be host:port`},
		// Kubelet and the container runtime know nothing of the driver's
		// working directory: a relative path is never found. (The log is
		// JSON, so the quotes around the path are escaped.)
		{"relative plugin data dir", []string{"--plugin-data-dir=plugins/urma"}, `plugin data directory \"plugins/urma\" must be an absolute path`},
		{"relative registrar dir", []string{"--registrar-dir=plugins_registry"}, `registrar directory \"plugins_registry\" must be an absolute path`},
		{"relative CDI spec dir", []string{"--cdi-spec-dir=cdi"}, `CDI spec directory \"cdi\" must be an absolute path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{
				"--plugin-data-dir=" + dir + "/plugin", "--registrar-dir=" + dir + "/registry", "--cdi-spec-dir=" + dir + "/cdi",
				"--shm-dir=", "--sysfs-root=" + dir + "/sys", "--dev-root=" + dir + "/dev", "--kubeconfig=" + dir + "/no-kubeconfig",
			}, tc.args...)
			var stderr bytes.Buffer
			code := run(context.Background(), args, withNode, &stderr, dra.Run)
			if code != 1 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want 1 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}
