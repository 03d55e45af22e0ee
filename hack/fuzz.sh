#!/usr/bin/env bash
# Runs every Fuzz* target in the module for a while each (go test -fuzz takes
# one target per run). Corpus entries that find bugs land in the package's
# testdata/fuzz/ and must be committed with the fix.
#
# Usage: hack/fuzz.sh [FUZZTIME]     default 30s per target
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzztime=${1:-30s}
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r file; do
	pkg=./$(dirname "${file#./}")
	for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | cut -d' ' -f2); do
		printf '==> %s %s (%s)\n' "$pkg" "$target" "$fuzztime"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
	done
done
