#!/usr/bin/env bash
# Runs the Helm chart's tests (test/chart) on their own: builds helm and the
# envtest binaries into bin/ if needed (hack/tools.sh; the first run takes
# several minutes), checks the chart's copies of config/, then runs the Go tests.
# `make test` runs the same tests as part of ./...
#
# Usage: hack/chart-test.sh [go test flags...]     e.g. hack/chart-test.sh -run TestHelmLint -v
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BIN=${BIN:-$ROOT/bin}
export HELM=${HELM:-$BIN/helm}
export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$BIN/k8s}

BIN=$BIN ENVTEST_ASSETS=$KUBEBUILDER_ASSETS hack/tools.sh helm envtest-assets
hack/sync-chart-crds.sh --check
exec go test -count=1 "$@" ./test/chart/
