#!/usr/bin/env bash
# Copies the operator's generated manifests into the Helm chart, which cannot
# read files outside its own directory:
#
#   config/crd/bases/*.yaml        -> charts/urma-k8s/files/crds/
#   config/rbac/role.yaml          -> charts/urma-k8s/files/rbac/role.yaml
#   config/webhook/manifests.yaml  -> charts/urma-k8s/files/webhook/manifests.yaml
#
# Run it after `make manifests`. test/chart (TestChartCopiesInSync) fails when
# a copy differs from its source.
#
# Usage: hack/sync-chart-crds.sh [--check]
#   --check   change nothing; list stale copies and exit 1 if there are any.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHART=$ROOT/charts/urma-k8s
check=false
case ${1:-} in
--check) check=true ;;
"") ;;
-h | --help)
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
	exit 0
	;;
*)
	echo "hack/sync-chart-crds.sh: unknown argument: $1 (want --check or nothing)" >&2
	exit 2
	;;
esac

stale=0
# sync_file SRC DST
sync_file() {
	local src=$1 dst=$2
	if [[ ! -f $src ]]; then
		echo "hack/sync-chart-crds.sh: missing ${src#"$ROOT"/}: run 'make manifests' first" >&2
		exit 1
	fi
	if cmp -s "$src" "$dst"; then
		return 0
	fi
	if $check; then
		echo "stale: ${dst#"$ROOT"/} differs from ${src#"$ROOT"/}" >&2
		stale=1
		return 0
	fi
	mkdir -p "$(dirname "$dst")"
	cp "$src" "$dst"
	echo "updated ${dst#"$ROOT"/}"
}

shopt -s nullglob
crds=("$ROOT"/config/crd/bases/*.yaml)
if [[ ${#crds[@]} -eq 0 ]]; then
	echo "hack/sync-chart-crds.sh: no CRDs in config/crd/bases: run 'make manifests' first" >&2
	exit 1
fi
for src in "${crds[@]}"; do
	sync_file "$src" "$CHART/files/crds/$(basename "$src")"
done
# CRDs that were removed from config/crd/bases must leave the chart too.
for dst in "$CHART"/files/crds/*.yaml; do
	if [[ ! -f $ROOT/config/crd/bases/$(basename "$dst") ]]; then
		if $check; then
			echo "stale: ${dst#"$ROOT"/} has no source in config/crd/bases" >&2
			stale=1
		else
			rm -f "$dst"
			echo "removed ${dst#"$ROOT"/}"
		fi
	fi
done
sync_file "$ROOT/config/rbac/role.yaml" "$CHART/files/rbac/role.yaml"
sync_file "$ROOT/config/webhook/manifests.yaml" "$CHART/files/webhook/manifests.yaml"

if [[ $stale -ne 0 ]]; then
	echo "run hack/sync-chart-crds.sh to update the chart's copies" >&2
	exit 1
fi
