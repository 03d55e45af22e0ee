# urma-k8s. `make demo` runs the whole stack on the software provider;
# `make test` runs every test. Tools come from hack/ and are cached in bin/.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help

-include hack/tools.mk

GO ?= go
GOTEST_FLAGS ?= -race -count=1
PKGS ?= ./...
# Several test packages start their own kube-apiserver; on a loaded 2-core
# machine its first start can take well over envtest's 20 s default.
ENVTEST_START_TIMEOUT ?= 180s

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-12s %s\n", $$1, $$2}'

.PHONY: build
build: ## build every binary into bin/ (urma-device-plugin, urma-dra-driver, urma-operator, urma-perf, liburma.so.0)
	$(GO) build -o bin/urma-device-plugin ./cmd/deviceplugin
	$(GO) build -o bin/urma-dra-driver ./cmd/dra-driver
	$(GO) build -o bin/urma-operator ./cmd/operator
	$(GO) build -o bin/urma-perf ./cmd/urma-perf
	GO="$(GO)" hack/build-liburma-soft.sh bin/liburma.so.0

.PHONY: vet
vet: ## go vet and gofmt check
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# liburma.so.0 over the software provider is built once per run, into a
# temporary directory, for every test that loads it (test/liburma, and
# hack/test-liburma.sh's run of pkg/urma/liburma against it).
.PHONY: test
test: vet verify-generated envtest-assets helm ## run all tests with -race (first run builds kube-apiserver, etcd and helm into bin/)
	hack/sync-chart-crds.sh --check
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	GO="$(GO)" hack/build-liburma-soft.sh "$$tmp/liburma.so.0" && \
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) HELM=$(HELM) \
	KUBEBUILDER_CONTROLPLANE_START_TIMEOUT=$(ENVTEST_START_TIMEOUT) \
	URMA_TEST_LIBURMA_SOFT="$$tmp/liburma.so.0" \
	$(GO) test $(GOTEST_FLAGS) $(PKGS) && \
	if [ "$(PKGS)" = "./..." ]; then \
		GO="$(GO)" GOTEST_FLAGS="$(GOTEST_FLAGS)" URMA_TEST_LIBURMA_SOFT="$$tmp/liburma.so.0" hack/test-liburma.sh; fi
	@$(MAKE) --no-print-directory test-allocs

# Allocation tests skip under -race (the detector allocates on its own), so
# `test` runs them again without it, and only them, to keep CI short. A name
# that matches no test, or a test that skips, fails the step: an allocation
# test renamed away must not stop being run.
ALLOC_TESTS := ^(TestSteadyStateAllocs|TestZeroCopyDoesNotAllocate)$$
ALLOC_PKGS := ./pkg/urma/soft/ ./pkg/transport/
.PHONY: test-allocs
test-allocs: ## the allocation tests without -race (part of `test`)
	@out=$$($(GO) test -count=1 -v -run '$(ALLOC_TESTS)' $(ALLOC_PKGS) 2>&1) && rc=0 || rc=$$?; \
	echo "$$out" | grep -E '^(--- |ok|FAIL|panic)' || true; \
	if [ $$rc -ne 0 ]; then echo "$$out"; exit $$rc; fi; \
	if echo "$$out" | grep -qE 'no tests to run|^\s*--- SKIP'; then \
		echo "test-allocs: an allocation test did not run (renamed? skipped?); ALLOC_TESTS in the Makefile lists them"; exit 1; fi

.PHONY: verify-generated
verify-generated: controller-gen ## fail when generated CRDs, RBAC, webhooks or deepcopy are stale
	CONTROLLER_GEN=$(CONTROLLER_GEN) hack/verify-generated.sh

.PHONY: manifests
manifests: controller-gen ## regenerate deepcopy, CRDs, RBAC and webhook manifests, and the chart's CRD copy
	CONTROLLER_GEN=$(CONTROLLER_GEN) hack/generate.sh
	hack/sync-chart-crds.sh

BENCH ?= .
TRANSPORT_BASELINES := -baseline memcpy=BenchmarkTransport/mode=memcpy -baseline tcp=BenchmarkTransport/mode=tcp -baseline raw=BenchmarkTransport/mode=raw -baseline grpc-tcp=BenchmarkGRPCUnary/mode=tcp -baseline tcp-connect=BenchmarkConnect/mode=tcp
PERFTIME ?= 1s
PERFROUNDS ?= 1
BENCHTIME ?= 1s
.PHONY: bench
bench: ## run the benchmarks; each figure is printed beside its same-run baselines
	@mkdir -p bin
	@echo "==> raw software provider (pkg/urma/soft) vs memcpy and TCP loopback"
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem ./pkg/urma/soft/ | tee bin/bench-soft.txt | $(GO) run ./hack/benchreport -baseline memcpy=BenchmarkMemcpy -baseline tcp=BenchmarkTCPLoopback/ -baseline tcp-rtt=BenchmarkTCPLoopbackRTT -baseline raw-socket=BenchmarkRaw/fabric=socket/completion=event
	@echo "==> streaming and cached copies vs the built-in copy (internal/memcopy)"
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem ./internal/memcopy/ | tee bin/bench-memcopy.txt | $(GO) run ./hack/benchreport -baseline builtin=BenchmarkCopy/impl=builtin -baseline builtin-to-reader=BenchmarkCopyToReader/impl=builtin -baseline builtin-then-read=BenchmarkCopyThenRead/impl=builtin
	@echo "==> liburma provider (cgo into the fake liburma) vs the software provider and bare cgo calls"
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem ./pkg/urma/liburma/ | tee bin/bench-liburma.txt | $(GO) run ./hack/benchreport -baseline soft=BenchmarkMessage/path=soft/ -baseline cgo=BenchmarkMessage/path=cgo-nop/
	@echo "==> transport vs raw provider vs TCP loopback vs memcpy"
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem ./pkg/transport/ | tee bin/bench-transport.txt | $(GO) run ./hack/benchreport $(TRANSPORT_BASELINES)
	@echo "==> urma-perf as two processes: the transport on shared memory, then on the socket fabric, vs TCP and Unix socket loopback"
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(GO) build -o "$$tmp/urma-perf" ./cmd/urma-perf && \
		$(GO) run ./hack/perfcompare -urma-perf "$$tmp/urma-perf" -duration $(PERFTIME) -rounds $(PERFROUNDS) | tee bin/bench-perfcompare.txt

.PHONY: fuzz
FUZZTIME ?= 30s
fuzz: ## run every fuzz target for FUZZTIME each
	hack/fuzz.sh $(FUZZTIME)

.PHONY: mutation
mutation: gremlins ## mutation testing of the core packages, not part of `test` (slow: docs/contributing.md); PKGS=./internal/operator/tuning narrows it
	GREMLINS=$(GREMLINS) hack/mutation.sh $(if $(filter-out ./...,$(PKGS)),$(PKGS))

.PHONY: lint
lint: golangci-lint ## golangci-lint (built into bin/ on first use)
	$(GOLANGCI_LINT) run ./...

.PHONY: images
images: ## build container images with docker or podman, where an engine runs
	hack/images.sh

# The images without a container engine: static binaries packed by the
# project's own OCI writer, one archive per image in bin/images/, named as
# the chart's defaults (REGISTRY=, TAG= and ARCH= change that).
REGISTRY ?= ghcr.io/openeuler
TAG ?=
ARCH ?= $(shell $(GO) env GOARCH)
.PHONY: image-archives
image-archives: ## the images as OCI archives in bin/images/, no container engine needed (REGISTRY=, TAG=, ARCH=)
	$(GO) run ./hack/imagearchives -registry '$(REGISTRY)' -tag '$(TAG)' -arch '$(ARCH)'

.PHONY: e2e
e2e: ## the whole product on a real one-node Kubernetes, as root (not part of test; see docs/e2e.md)
	hack/e2e.sh $(E2E_FLAGS)

.PHONY: demo
demo: ## run the stack end to end on the software provider (see docs/demo.md)
	hack/demo.sh
