#!/usr/bin/env bash
# Mutation testing of the core packages with gremlins (bin/gremlins, pinned in
# hack/versions.env): every covered arithmetic, comparison, boundary,
# increment and negation in a package is broken one at a time, and the
# package's own tests must fail. Prints, per package, the test efficacy
# (killed / (killed + lived)) and mutator coverage beside the goal, then each
# surviving mutant; hack/mutation-equivalent.txt explains the ones that cannot
# change behaviour. See docs/contributing.md for when to run it.
#
# Usage: hack/mutation.sh [PKG...]    default: the core packages below
#   PKG is a package directory (./internal/operator/tuning) or a pattern (./internal/deviceplugin/...);
#   each package is mutated on its own, against its own tests.
#
# Environment:
#   MUTATION_WORKERS              parallel mutants (default: nproc)
#   MUTATION_TIMEOUT_COEFFICIENT  a mutant's tests time out after this many times the
#                                 package's unmutated test run (default 5)
#   MUTATION_GOAL                 efficacy goal in percent (default 90)
#   MUTATION_SINCE                a git ref: mutate only the files of each package changed
#                                 since its merge base with the ref (committed or not), e.g. main
#   MUTATION_OUT                  results directory (default .mutation/, git-ignored)
#   GREMLINS                      the gremlins binary (default bin/gremlins)
#
# Exit status 1 when a package misses the goal or has an unexplained survivor.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

CORE_PKGS=(
	./pkg/transport
	./pkg/transport/handshake
	./pkg/urma/soft
	./pkg/urma/sysfs
	# The node core both drivers share (not internal/node/shmdir, which
	# only creates a directory), then the device plugin's own packages.
	./internal/node/budget
	./internal/node/devpath
	./internal/node/discover
	./internal/node/health
	./internal/node/inventory
	./internal/node/metrics
	./internal/node/selection
	./internal/node/watch
	./internal/deviceplugin/...
	./internal/operator/tuning
	./internal/operator/webhook/...
	./internal/operator/plan
	# The DRA driver's logic (issue 13), as internal/deviceplugin/... is the
	# device plugin's; not internal/dra itself, which only wires them (like cmd/)
	# and whose tests need kube-apiserver.
	./internal/dra/checkpoint
	./internal/dra/claimspec
	./internal/dra/plugin
	./internal/dra/slices
)

GREMLINS=${GREMLINS:-$ROOT/bin/gremlins}
OUT=${MUTATION_OUT:-$ROOT/.mutation}
WORKERS=${MUTATION_WORKERS:-$(nproc)}
COEFFICIENT=${MUTATION_TIMEOUT_COEFFICIENT:-5}
GOAL=${MUTATION_GOAL:-90}
SINCE=${MUTATION_SINCE:-}

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'hack/mutation.sh: error: %s\n' "$*" >&2; exit 2; }

# test_flags DIR: go test flags for a package's runs under mutation, passed
# through GOFLAGS because gremlins has no flag for them. They apply to the
# coverage run as well, so a mutant that only the left-out tests reach is
# reported NOT COVERED, never LIVED or KILLED.
test_flags() {
	case $1 in
	pkg/urma/soft)
		# A steady-state allocation count over many round trips (most of the
		# package's test time); it sees allocations, not behaviour, and runs in
		# `make test`'s non-race step.
		echo '-skip=^TestSteadyStateAllocs$'
		;;
	esac
}

# changed_files DIR: the package's non-test Go files changed since SINCE's
# merge base, committed or not, and new untracked ones; one base name a line.
changed_files() {
	{
		git diff --name-only --merge-base "$SINCE" -- "$1"
		git ls-files --others --exclude-standard -- "$1"
	} | grep -E "^$1/[^/]+\.go\$" | grep -v '_test\.go$' | xargs -r -n1 basename | sort -u
}

# exclude_flags DIR: gremlins walks the directory tree, and subpackages are
# measured on their own ('/'); with SINCE, the files not changed are left out
# too (gremlins' own --diff matches no file when run on a subdirectory).
exclude_flags() {
	local dir=$1 changed f
	echo "--exclude-files=/"
	[[ -n "$SINCE" ]] || return 0
	changed=$(changed_files "$dir")
	for f in "$dir"/*.go; do
		f=$(basename "$f")
		[[ $f == *_test.go ]] && continue
		grep -qxF "$f" <<<"$changed" || echo "--exclude-files=^${f//./\\.}\$"
	done
}

[[ -x "$GREMLINS" ]] || die "$GREMLINS is missing: run 'make gremlins' (hack/tools.sh gremlins)"
[[ $# -gt 0 ]] || set -- "${CORE_PKGS[@]}"

# Expand patterns to the packages that have tests of their own.
pkgs=()
for pattern in "$@"; do
	found=$(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.Dir}}{{end}}' "$pattern") ||
		die "go list $pattern failed"
	for dir in $found; do
		pkgs+=("${dir#"$ROOT"/}")
	done
done
[[ ${#pkgs[@]} -gt 0 ]] || die "no package with tests in: $*"

mkdir -p "$OUT"
results=()
for pkg in "${pkgs[@]}"; do
	name=${pkg//\//_}
	json=$OUT/$name.json
	rm -f "$json"
	if [[ -n "$SINCE" && -z "$(changed_files "$pkg")" ]]; then
		log "$pkg: no Go file changed since $SINCE; skipped"
		continue
	fi
	mapfile -t excludes < <(exclude_flags "$pkg")
	start=$SECONDS
	log "$pkg: mutating with $WORKERS workers${SINCE:+, files changed since $SINCE} (log: ${OUT#"$ROOT"/}/$name.log)"
	# -count=1: a cached coverage run would make the timeout (a multiple of its
	# duration) far too short.
	GOFLAGS="$(go env GOFLAGS) -count=1 $(test_flags "$pkg")" \
		"$GREMLINS" unleash \
		--workers "$WORKERS" \
		--timeout-coefficient "$COEFFICIENT" \
		"${excludes[@]}" \
		--output "$json" \
		"$ROOT/$pkg" >"$OUT/$name.log" 2>&1 || {
		tail -20 "$OUT/$name.log" >&2
		die "gremlins failed on $pkg (full log: $OUT/$name.log)"
	}
	if [[ ! -f "$json" ]]; then
		# A package without a single mutation point writes no result; an
		# interrupted run writes none either, and must not pass as empty.
		grep -q 'No results to report' "$OUT/$name.log" ||
			die "gremlins wrote no result for $pkg (interrupted?); log: $OUT/$name.log"
		echo '{"files":[]}' >"$json"
	fi
	grep -E 'Test efficacy|Mutator coverage' "$OUT/$name.log" | sed "s|^|    |" >&2 || true
	log "$pkg: done in $((SECONDS - start))s"
	results+=("$pkg=$json")
done

if [[ ${#results[@]} -eq 0 ]]; then
	log "nothing to mutate"
	exit 0
fi
echo
go build -o "$OUT/mutationreport" ./hack/mutationreport
"$OUT/mutationreport" -goal "$GOAL" -equivalent hack/mutation-equivalent.txt -root "$ROOT" "${results[@]}"
