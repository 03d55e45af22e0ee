#!/usr/bin/env bash
# `make demo`: builds what the demo needs, then runs it (hack/demo, see
# docs/demo.md). Everything is built from source into bin/ and reused on
# later runs:
#
#   bin/k8s/{kube-apiserver,etcd}   the local control plane (hack/tools.sh, as hack/tools.mk)
#   bin/urma-operator               ./cmd/operator
#   bin/urma-device-plugin          ./cmd/deviceplugin
#   bin/urma-perf                   ./cmd/urma-perf
#   bin/urma-demo                   ./hack/demo (the program that runs the steps)
#
# Usage: hack/demo.sh [urma-demo flags...]     e.g. hack/demo.sh -keep -duration 5s
# (hack/demo.sh -h lists them). Exit status: the demo's (0 when every step
# worked, 1 when one failed, 130 when interrupted); 1 when a build failed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'hack/demo.sh: error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "go is not on PATH"

# The control plane. hack/tools.sh returns at once when it is already built
# and otherwise says what it builds; the first kube-apiserver build compiles
# most of Kubernetes.
if [[ ! -x bin/k8s/kube-apiserver || ! -x bin/k8s/etcd ]]; then
	log "building the local control plane (kube-apiserver, etcd) from source: the first time this takes several minutes (10 or more on 2 cores); later runs reuse bin/k8s"
fi
# Only the two binaries envtest runs: `make -f hack/tools.mk envtest-assets`
# would build kubectl too, which the demo does not need.
BIN="$ROOT/bin" ENVTEST_ASSETS="$ROOT/bin/k8s" hack/tools.sh kube-apiserver etcd

# The project's binaries. A binary whose package has not landed yet is
# skipped here; the demo then stops with a clear message at the step that
# needs it.
build() { # build NAME PKG
	local name=$1 pkg=$2 start=$SECONDS
	if ! compgen -G "${pkg#./}/*.go" >/dev/null; then
		rm -f "bin/$name"
		log "skipping $name: $pkg does not exist yet"
		return 0
	fi
	log "building $name ($pkg)"
	go build -o "bin/$name" "$pkg"
	if ((SECONDS - start > 5)); then log "built $name in $((SECONDS - start))s"; fi
}
build urma-operator ./cmd/operator
build urma-device-plugin ./cmd/deviceplugin
build urma-perf ./cmd/urma-perf
build urma-demo ./hack/demo

# exec: Ctrl-C reaches the demo directly, which stops its children and the
# control plane and removes its temporary files.
exec bin/urma-demo "$@"
