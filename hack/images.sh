#!/usr/bin/env bash
# Builds the container images, one per binary, from images/<name>.Dockerfile:
#
#   urma-device-plugin   ./cmd/deviceplugin
#   urma-dra-driver      ./cmd/dra-driver
#   urma-operator        ./cmd/operator
#   urma-perf            ./cmd/urma-perf
#
# with Docker (BuildKit) or Podman, whichever is installed and usable
# (`<engine> info` succeeds). The build context is a temporary copy of the
# files git tracks (plus untracked, not ignored ones), so bin/ and other
# ignored files never reach the engine.
#
# Usage: hack/images.sh [--print] [--push] [NAME...]     (default: every image)
#   --print   print the build commands instead of running them (needs no engine)
#   --push    push each image after building it
#
# Environment:
#   REGISTRY            image name prefix (default ghcr.io/openeuler, as the chart's values)
#   TAG                 image tag (default: appVersion of charts/urma-k8s/Chart.yaml, as the chart)
#   CONTAINER_ENGINES   engines to try, in order (default "docker podman"); names or paths
#   PLATFORM            target platform passed as --platform, e.g. linux/arm64 (default: the engine's)
#   ALLOW_NO_ENGINE=1   exit 0 instead of 1 when no engine is usable (for CI jobs that
#                       build images only where they can)
#
# Exit status: 0 when every image was built (or printed); 1 when no engine is
# usable (unless ALLOW_NO_ENGINE=1) or a build failed; 2 on a usage error.
# `make images` is an explicit request for images, so a missing engine is an error there.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=hack/images.sh

die() {
	printf '%s: error: %s\n' "$PROG" "$*" >&2
	exit 1
}
usage_error() {
	printf '%s: %s\n' "$PROG" "$*" >&2
	printf 'usage: %s [--print] [--push] [NAME...]; NAME is one of: %s\n' "$PROG" "$(available | tr '\n' ' ')" >&2
	exit 2
}

# available: image names, from images/<name>.Dockerfile.
available() {
	local f
	for f in "$ROOT"/images/*.Dockerfile; do
		[[ -f $f ]] || continue
		f=${f##*/}
		printf '%s\n' "${f%.Dockerfile}"
	done
}

chart_app_version() {
	awk -F'"' '/^appVersion:/ { print $2; exit }' "$ROOT/charts/urma-k8s/Chart.yaml"
}

print_only=false
push=false
names=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--print) print_only=true ;;
	--push) push=true ;;
	-h | --help)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
		exit 0
		;;
	-*) usage_error "unknown option: $1" ;;
	*) names+=("$1") ;;
	esac
	shift
done

if [[ ${#names[@]} -eq 0 ]]; then
	mapfile -t names < <(available)
fi
[[ ${#names[@]} -gt 0 ]] || die "no images/*.Dockerfile found"
for n in "${names[@]}"; do
	[[ -f $ROOT/images/$n.Dockerfile ]] || usage_error "unknown image: $n"
done

REGISTRY=${REGISTRY:-ghcr.io/openeuler}
REGISTRY=${REGISTRY%/}
TAG=${TAG:-$(chart_app_version)}
[[ -n $TAG ]] || die "no TAG given and no appVersion in charts/urma-k8s/Chart.yaml"

# pick_engine: sets ENGINE to the first usable engine, or explains why none is.
ENGINE=
why=()
pick_engine() {
	local e
	for e in ${CONTAINER_ENGINES:-docker podman}; do
		if ! command -v "$e" >/dev/null 2>&1; then
			why+=("$e: not installed")
		elif ! "$e" info >/dev/null 2>&1; then
			why+=("$e: installed, but '$e info' failed (is its daemon or socket running, and may this user use it?)")
		else
			ENGINE=$e
			return 0
		fi
	done
	return 1
}

build_args() { # build_args NAME CONTEXT: the engine arguments for one image
	local n=$1 ctx=$2
	printf '%s\n' build -f "$ctx/images/$n.Dockerfile" -t "$REGISTRY/$n:$TAG" --build-arg "VERSION=$TAG"
	[[ -z ${PLATFORM:-} ]] || printf '%s\n' --platform "$PLATFORM"
	printf '%s\n' "$ctx"
}

if $print_only; then
	engine=${CONTAINER_ENGINES:-docker}
	engine=${engine%% *}
	for n in "${names[@]}"; do
		mapfile -t args < <(build_args "$n" .)
		printf '%s' "$engine"
		printf ' %q' "${args[@]}"
		printf '\n'
		if $push; then
			printf '%s push %q\n' "$engine" "$REGISTRY/$n:$TAG"
		fi
	done
	exit 0
fi

if ! pick_engine; then
	{
		printf '%s: no usable container engine, so no images were built.\n' "$PROG"
		printf '  %s\n' "${why[@]}"
		printf '  Install Docker (with BuildKit) or Podman, or see the commands with: %s --print\n' "$PROG"
	} >&2
	if [[ ${ALLOW_NO_ENGINE:-} == 1 ]]; then
		printf '%s: ALLOW_NO_ENGINE=1: skipping the image build.\n' "$PROG" >&2
		exit 0
	fi
	exit 1
fi

# A clean build context: only files git knows about (tracked, or untracked and
# not ignored), so neither bin/ nor editor litter is sent to the engine.
ctx=$(mktemp -d "${TMPDIR:-/tmp}/urma-images.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
		while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
		tar --null -T - -cf -) | tar -C "$ctx" -xf -
else
	(cd "$ROOT" && tar --exclude=./bin --exclude=./.git -cf - .) | tar -C "$ctx" -xf -
fi

for n in "${names[@]}"; do
	mapfile -t args < <(build_args "$n" "$ctx")
	printf '==> %s: building %s/%s:%s\n' "$ENGINE" "$REGISTRY" "$n" "$TAG" >&2
	if [[ ${ENGINE##*/} == docker ]]; then
		DOCKER_BUILDKIT=1 "$ENGINE" "${args[@]}" || die "building $n failed"
	else
		"$ENGINE" "${args[@]}" || die "building $n failed"
	fi
	if $push; then
		"$ENGINE" push "$REGISTRY/$n:$TAG" || die "pushing $REGISTRY/$n:$TAG failed"
	fi
done
printf '==> built: %s\n' "${names[*]}" >&2
