#!/usr/bin/env bash
# Build liburma.so.0 over the software provider (cmd/liburma-soft) into
# $1 (default bin/liburma.so.0). `make build` and the tests that load the
# library call this, so that both get the same library:
#  - -buildmode=c-shared, SONAME liburma.so.0, as UMDK's;
#  - only liburma's urma_* symbols exported (exports.map): the Go half's
#    own exports and the runtime's stay internal to the library;
#  - asynchronous preemption off (runtime.godebugDefault): the runtime
#    would signal threads with SIGURG, a signal C programs such as brpc's
#    bthread take over. GODEBUG in the environment still overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bin/liburma.so.0}
GO=${GO:-go}
map=$PWD/cmd/liburma-soft/exports.map
CGO_ENABLED=1 "$GO" build -buildmode=c-shared -trimpath \
	-ldflags="-X=runtime.godebugDefault=asyncpreemptoff=1 -extldflags '-Wl,--version-script=$map -Wl,-soname,liburma.so.0'" \
	-o "$out" ./cmd/liburma-soft
# c-shared writes a header of the Go exports beside the library; nothing
# includes it.
rm -f "${out%.*}.h"
