#!/usr/bin/env bash
# The liburma provider's second round, run by `make test` after the main one:
#  - pkg/transport's tests again, with the liburma provider over the fake
#    liburma (pkg/urma/liburma/testdata/fakeurma), so the transport is proved
#    against liburma's ABI through cgo;
#  - pkg/urma/liburma (the conformance suite among its tests) once more with
#    GOEXPERIMENT=cgocheck2: every store the cgo calls make is checked for Go
#    pointers left in C memory, which the default check (GODEBUG=cgocheck=1,
#    arguments only) cannot see;
#  - pkg/urma/liburma built without cgo: the stub must say ErrNoSupport;
#  - pkg/urma/liburma's tests against cmd/liburma-soft's liburma.so.0
#    ($URMA_TEST_LIBURMA_SOFT, built here when unset): the provider against
#    a real implementation of liburma, not only the fake. The test binary
#    then holds two Go runtimes (its own, and the library's), which Go does
#    not support (golang/go#18976) but which works on linux with glibc:
#    each runtime keeps its own TLS slot and signal handlers that pass on
#    the other's signals, and the library's sends none (asyncpreemptoff).
#    It runs in a process of its own, so that it can only fail itself.
#    The tests that need the fake's hooks skip.
# (pkg/urma/liburma's own tests, the conformance suite among them, build the
# fake themselves and ran in the main round.)
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
GOTEST_FLAGS=${GOTEST_FLAGS:--race -count=1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${CC:-gcc}" -shared -fPIC -O2 -Wall -Werror -pthread -o "$tmp/libfakeurma.so" pkg/urma/liburma/testdata/fakeurma/fakeurma.c
echo "==> pkg/transport over the liburma provider (fake liburma)"
# shellcheck disable=SC2086 # GOTEST_FLAGS is a list of flags
URMA_TEST_PROVIDER=liburma URMA_LIBRARY="$tmp/libfakeurma.so" "$GO" test $GOTEST_FLAGS ./pkg/transport/
echo "==> pkg/urma/liburma with GOEXPERIMENT=cgocheck2"
# Not with -race: the experiment rebuilds the standard library, and one
# more variant of it in the build cache is enough.
GOEXPERIMENT=cgocheck2 "$GO" test -count=1 ./pkg/urma/liburma/
echo "==> pkg/urma/liburma without cgo"
CGO_ENABLED=0 "$GO" test -count=1 ./pkg/urma/liburma/
lib=${URMA_TEST_LIBURMA_SOFT:-}
if [ -z "$lib" ]; then
	lib=$tmp/liburma.so.0
	GO="$GO" hack/build-liburma-soft.sh "$lib"
fi
echo "==> pkg/urma/liburma against cmd/liburma-soft's liburma.so.0"
# shellcheck disable=SC2086 # GOTEST_FLAGS is a list of flags
URMA_TEST_LIBURMA="$lib" URMA_DEVICES=udma0,udma1 URMA_SOFT_FABRIC=shm URMA_SHM_DIR="$tmp/shm" \
	"$GO" test $GOTEST_FLAGS ./pkg/urma/liburma/
