#!/usr/bin/env bash
# Regenerates the operator's generated files from Go types and markers:
#
#   api/v1alpha1/zz_generated.deepcopy.go   DeepCopy methods      (object)
#   config/crd/bases/*.yaml                 CRDs with CEL rules   (crd)
#   config/rbac/role.yaml                   ClusterRole and Roles (rbac, from +kubebuilder:rbac markers)
#   config/webhook/manifests.yaml           webhook configurations (webhook, from +kubebuilder:webhook markers)
#
# Usage: hack/generate.sh [TREE]
#   TREE is the repository checkout to generate in (default: this one);
#   hack/verify-generated.sh passes a temporary copy.
# Environment: CONTROLLER_GEN (default <repo>/bin/controller-gen, built by
#   hack/tools.sh controller-gen when missing).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TREE=$(cd "${1:-$ROOT}" && pwd)
CONTROLLER_GEN=${CONTROLLER_GEN:-$ROOT/bin/controller-gen}

if [[ ! -x "$CONTROLLER_GEN" ]]; then
	"$ROOT/hack/tools.sh" controller-gen
fi

cd "$TREE"
# Packages that carry markers. Listed, not ./..., so that other packages
# being edited do not break generation.
MARKER_PATHS=(paths=./api/... paths=./controllers/... paths=./internal/operator/...)

"$CONTROLLER_GEN" object:headerFile=hack/boilerplate.go.txt paths=./api/...

# CRDs of removed kinds must not linger: bases/ holds generated files only.
rm -f config/crd/bases/*.yaml
"$CONTROLLER_GEN" \
	crd \
	rbac:roleName=urma-operator \
	webhook \
	"${MARKER_PATHS[@]}" \
	output:crd:artifacts:config=config/crd/bases \
	output:rbac:artifacts:config=config/rbac \
	output:webhook:artifacts:config=config/webhook
