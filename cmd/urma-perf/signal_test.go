package main

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/openeuler/urma-k8s/internal/stopsignal/stopsignaltest"
)

// TestMain lets the test binary play urma-perf with its shutdown held up,
// for TestSecondSignalEndsTheProcess.
func TestMain(m *testing.M) {
	if os.Getenv(stopsignaltest.EnvChild) == "1" {
		hold := func(ctx context.Context, _ []string, _, stderr io.Writer) int {
			if err := stopsignaltest.HoldShutdown(ctx, (&common{}).logger(stderr)); err != nil {
				return 1
			}
			return 0
		}
		os.Exit(runWithSignals(nil, os.Stdout, os.Stderr, hold))
	}
	os.Exit(m.Run())
}

// A second SIGINT or SIGTERM used to be caught and dropped
// (signal.NotifyContext keeps catching until stop): a server waiting for
// its connections to close could not be cut short but by SIGKILL.
func TestSecondSignalEndsTheProcess(t *testing.T) {
	stopsignaltest.CheckSecondSignals(t)
}
