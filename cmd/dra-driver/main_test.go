package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunRejectsBadInvocations(t *testing.T) {
	noEnv := func(string) string { return "" }
	withNode := func(k string) string {
		if k == "NODE_NAME" {
			return "node-1"
		}
		return ""
	}
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
			code := run(context.Background(), tc.args, tc.getenv, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}
