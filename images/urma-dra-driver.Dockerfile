# syntax=docker/dockerfile:1
# urma-dra-driver: URMA DRA driver, publishes UB jetty budgets as ResourceSlices
#
# Build context is the repository root. hack/images.sh (make images) builds it
# from a clean copy of the tracked sources:
#   hack/images.sh urma-dra-driver
# or by hand, with Docker BuildKit or Podman (sends bin/ too, which is large):
#   docker build -f images/urma-dra-driver.Dockerfile -t urma-dra-driver:dev .

# Go toolchain of the builder stage; match go.mod's go line.
ARG GO_VERSION=1.26.8
# Final stage: static distroless base, no shell, no package manager, user 65532.
ARG BASE_IMAGE=gcr.io/distroless/static:nonroot

# The builder runs on the build host's platform and cross-compiles (no emulation).
FROM --platform=$BUILDPLATFORM docker.io/library/golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /src
# Dependencies first, so that source edits reuse the module download layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# CGO_ENABLED=0: a static binary that needs no libc in the final image.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH:-$(go env GOARCH)} GOFLAGS=-buildvcs=false \
    go build -trimpath -ldflags="-s -w -buildid=" -o /out/urma-dra-driver ./cmd/dra-driver

# liburma.so.0 over the software provider (cmd/liburma-soft), which the agent
# copies to the host for containers given a software device
# (docs/liburma-soft.md): a C shared library, so a cgo build on the target
# platform, emulated when it is not the build host's.
FROM docker.io/library/golang:${GO_VERSION} AS liburma
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOFLAGS=-buildvcs=false hack/build-liburma-soft.sh /out/liburma.so.0

FROM ${BASE_IMAGE}
ARG VERSION=dev
LABEL org.opencontainers.image.title="urma-dra-driver" \
      org.opencontainers.image.description="URMA DRA driver, publishes UB jetty budgets as ResourceSlices" \
      org.opencontainers.image.source="https://github.com/openeuler/urma-k8s" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/urma-dra-driver /usr/local/bin/urma-dra-driver
COPY --from=liburma /out/liburma.so.0 /usr/lib/urma-k8s/liburma.so.0
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/urma-dra-driver"]
