package main

import (
	"context"
	"os"
	"testing"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/dra"
	"github.com/openeuler/urma-k8s/internal/stopsignal/stopsignaltest"
)

// TestMain lets the test binary play urma-dra-driver, its shutdown held
// up, for TestSecondSignalEndsTheProcess.
func TestMain(m *testing.M) {
	if os.Getenv(stopsignaltest.EnvChild) == "1" {
		hold := func(ctx context.Context, log logr.Logger, _ dra.Config, _ dra.Deps) error {
			return stopsignaltest.HoldShutdown(ctx, log)
		}
		os.Exit(run(context.Background(), nil, withNode, os.Stderr, hold))
	}
	os.Exit(m.Run())
}

// A second SIGINT or SIGTERM used to be caught and dropped: a slow
// shutdown could not be cut short but by SIGKILL.
func TestSecondSignalEndsTheProcess(t *testing.T) {
	stopsignaltest.CheckSecondSignals(t)
}
