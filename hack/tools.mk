# Makefile fragment: the project's tools, built from source by hack/tools.sh
# and cached under bin/ (versions: hack/versions.env).
#
# Use from the top-level Makefile:
#
#     include hack/tools.mk
#
#     generate: controller-gen
#     	$(CONTROLLER_GEN) object paths=./...
#     test: envtest-assets
#     	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) go test ./...
#     lint: golangci-lint
#     	$(GOLANGCI_LINT) run
#
# or on its own: make -f hack/tools.mk tools
#
# The targets are phony and always call hack/tools.sh, which returns at once
# when the pinned version is already built (bin/.stamp-<tool>-<version>).

TOOLS_MK_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
TOOLS_REPO_ROOT := $(abspath $(TOOLS_MK_DIR)/..)

# Defines KUBERNETES_VERSION, ETCD_VERSION, CONTROLLER_TOOLS_VERSION,
# HELM_VERSION, GOLANGCI_LINT_VERSION, GREMLINS_VERSION.
include $(TOOLS_MK_DIR)/versions.env

BIN := $(TOOLS_REPO_ROOT)/bin
ENVTEST_ASSETS := $(BIN)/k8s
KUBE_APISERVER := $(ENVTEST_ASSETS)/kube-apiserver
ETCD := $(ENVTEST_ASSETS)/etcd
KUBECTL := $(ENVTEST_ASSETS)/kubectl
CONTROLLER_GEN := $(BIN)/controller-gen
HELM := $(BIN)/helm
GOLANGCI_LINT := $(BIN)/golangci-lint
GREMLINS := $(BIN)/gremlins

TOOLS_SH := BIN='$(BIN)' ENVTEST_ASSETS='$(ENVTEST_ASSETS)' $(TOOLS_REPO_ROOT)/hack/tools.sh

.PHONY: tools envtest-assets kubectl controller-gen helm golangci-lint gremlins tools-sync

tools: ## build every tool into bin/ (first run takes a while, then instant)
	@$(TOOLS_SH) all

envtest-assets: ## kube-apiserver and etcd into bin/k8s (KUBEBUILDER_ASSETS)
	@$(TOOLS_SH) envtest-assets

kubectl: ## bin/k8s/kubectl (optional: envtest does not need it)
	@$(TOOLS_SH) kubectl

controller-gen: ## bin/controller-gen
	@$(TOOLS_SH) controller-gen

helm: ## bin/helm
	@$(TOOLS_SH) helm

golangci-lint: ## bin/golangci-lint
	@$(TOOLS_SH) golangci-lint

gremlins: ## bin/gremlins (mutation testing, `make mutation`)
	@$(TOOLS_SH) gremlins

tools-sync: ## regenerate hack/tools/*/go.{mod,sum} after editing hack/versions.env
	@$(TOOLS_SH) sync
