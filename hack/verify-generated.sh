#!/usr/bin/env bash
# Fails when the committed generated files (deepcopy, CRDs, RBAC, webhook
# manifests) differ from what hack/generate.sh produces from the current
# sources. It regenerates into a temporary copy, so the checkout is untouched.
#
# Usage: hack/verify-generated.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GENERATED=(api/v1alpha1/zz_generated.deepcopy.go config/crd/bases config/rbac/role.yaml config/webhook/manifests.yaml)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Copy what generation reads (module files, Go sources, boilerplate) and the
# current generated files, nothing large.
(cd "$ROOT" && tar --exclude=./bin --exclude=./.git --exclude='*/testdata' -cf - \
	go.mod go.sum hack api controllers pkg internal cmd config) | tar -C "$tmp" -xf -

"$ROOT/hack/generate.sh" "$tmp" >/dev/null

stale=0
for f in "${GENERATED[@]}"; do
	if [[ ! -e "$ROOT/$f" ]]; then
		echo "missing generated file: $f" >&2
		stale=1
		continue
	fi
	if ! diff -ruN "$ROOT/$f" "$tmp/$f" >&2; then
		stale=1
	fi
done
if [[ $stale -ne 0 ]]; then
	echo >&2
	echo "hack/verify-generated.sh: generated files are stale (diff above: committed -> expected)." >&2
	echo "Run 'make manifests' (or hack/generate.sh) and commit the result." >&2
	exit 1
fi
echo "generated files are up to date"
