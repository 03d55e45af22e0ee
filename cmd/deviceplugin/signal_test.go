package main

import (
	"context"
	"os"
	"testing"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/deviceplugin"
	"github.com/openeuler/urma-k8s/internal/stopsignal/stopsignaltest"
)

// TestMain lets the test binary play urma-device-plugin serve, its
// shutdown held up, for TestSecondSignalEndsTheProcess.
func TestMain(m *testing.M) {
	if os.Getenv(stopsignaltest.EnvChild) == "1" {
		hold := func(ctx context.Context, log logr.Logger, _ deviceplugin.Config, _ deviceplugin.Deps) error {
			return stopsignaltest.HoldShutdown(ctx, log)
		}
		os.Exit(run(context.Background(), []string{"serve"}, noEnv, os.Stdout, os.Stderr, hold))
	}
	os.Exit(m.Run())
}

// A second SIGINT or SIGTERM used to be caught and dropped: a slow
// shutdown could not be cut short but by SIGKILL.
func TestSecondSignalEndsTheProcess(t *testing.T) {
	stopsignaltest.CheckSecondSignals(t)
}
