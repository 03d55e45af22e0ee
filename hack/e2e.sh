#!/usr/bin/env bash
# `make e2e`: the whole product on a real one-node Kubernetes on this
# machine (see docs/e2e.md). Installs and builds what it needs, then runs
# hack/e2e (bin/e2e/urma-e2e), which starts the cluster, runs the checks and
# tears everything down:
#
#   runc, nftables, iptables, ip    Debian's packages (apt-get, when missing)
#   bin/k8s/*                       etcd, kube-apiserver, kubectl, kubelet,
#                                   kube-controller-manager, kube-scheduler,
#                                   kube-proxy at KUBERNETES_VERSION (hack/tools.sh)
#   bin/cni/*                       bridge, host-local, loopback CNI plugins
#   bin/containerd/*                containerd, its runc shim and ctr at
#                                   CONTAINERD_VERSION (2.x: CDI, for the DRA driver)
#   bin/helm
#   bin/e2e/{urma-device-plugin,urma-dra-driver,urma-operator,urma-perf,pause}
#                                   the project's binaries, static (CGO_ENABLED=0),
#                                   which urma-e2e packs into OCI images
#   bin/e2e/liburma.so.0            liburma over the software provider, which
#                                   the node agents' images carry
#   bin/e2e/urma-cperf              a C program linked against it (-lurma),
#                                   imaged with only its C library (step 9)
#
# Usage: hack/e2e.sh [urma-e2e flags...]   e.g. hack/e2e.sh -keep; hack/e2e.sh -cleanup
# (hack/e2e.sh -h lists them). Must run as root on Linux. Exit status: urma-e2e's
# (0 when every check passed, 1 when one failed, 130 when interrupted).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'hack/e2e.sh: error: %s\n' "$*" >&2; exit 1; }

[[ $(uname -s) == Linux ]] || die "make e2e runs a kubelet: Linux only"
[[ $(id -u) == 0 ]] || die "make e2e must run as root (kubelet, containerd, device nodes, mounts)"
command -v go >/dev/null 2>&1 || die "go is not on PATH"

# Debian's runc and network tools. Installed only when missing, as a fresh
# machine or CI needs. containerd is built by hack/tools.sh below (Debian's
# 1.6 has no CDI); urma-e2e runs it with its own socket and state under -work.
missing=()
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if ((${#missing[@]})); then
	command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them: install them by hand"
	log "installing ${missing[*]} from Debian's packages"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Kubernetes at the pinned version, the CNI plugins, containerd and helm. The
# first build takes long on 2 cores (see docs/e2e.md); later runs reuse bin/.
log "Kubernetes binaries, CNI plugins, containerd, helm (hack/tools.sh e2e; built once, then cached in bin/)"
BIN="$ROOT/bin" ENVTEST_ASSETS="$ROOT/bin/k8s" nice -n 19 hack/tools.sh e2e

# The project's binaries, static, for the images.
mkdir -p bin/e2e
build() { # build NAME PKG
	local name=$1 pkg=$2 start=$SECONDS
	CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "bin/e2e/$name" "$pkg"
	if ((SECONDS - start > 5)); then log "built $name in $((SECONDS - start))s"; fi
}
log "building the project's binaries (static) into bin/e2e"
build urma-device-plugin ./cmd/deviceplugin
build urma-dra-driver ./cmd/dra-driver
build urma-operator ./cmd/operator
build urma-perf ./cmd/urma-perf
build pause ./hack/e2e/pause
start=$SECONDS
hack/build-liburma-soft.sh bin/e2e/liburma.so.0
if ((SECONDS - start > 5)); then log "built liburma.so.0 in $((SECONDS - start))s"; fi
command -v gcc >/dev/null 2>&1 || die "gcc is not on PATH (the C workload of step 9, and liburma.so.0)"
ln -sf liburma.so.0 bin/e2e/liburma.so
gcc -O2 -Wall -Wextra -Werror -o bin/e2e/urma-cperf hack/e2e/cperf/cperf.c \
	-I pkg/urma/liburma -L bin/e2e -lurma -ldl
go build -o bin/e2e/urma-e2e ./hack/e2e

# exec: Ctrl-C reaches urma-e2e directly, which tears the cluster down.
exec bin/e2e/urma-e2e "$@"
