# urma-k8s. `make demo` runs the whole stack on the software provider;
# `make test` runs every test. Tools come from hack/ and are cached in bin/.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

-include hack/tools.mk

GO ?= go
GOTEST_FLAGS ?= -race -count=1
PKGS ?= ./...

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-12s %s\n", $$1, $$2}'

.PHONY: build
build: ## build every binary into bin/
	$(GO) build -o bin/ ./cmd/...

.PHONY: vet
vet: ## go vet and gofmt check
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: test
test: vet ## run all tests with -race (builds envtest binaries and helm on first run)
	$(GO) test $(GOTEST_FLAGS) $(PKGS)

.PHONY: bench
bench: ## run the benchmarks and print them beside their baselines
	@echo "bench: nothing to benchmark yet"

.PHONY: lint
lint: ## golangci-lint (installed into bin/ on first use)
	@echo "lint: not wired yet"

.PHONY: demo
demo: ## run the stack end to end on the software provider
	@echo "demo: not there yet"
