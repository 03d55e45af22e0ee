// Package chart holds the tests of the Helm chart in charts/urma-k8s: helm lint,
// helm template with default and non-default values, values-schema rejections,
// the chart's copies of the generated manifests in config/, a server-side
// dry-run of every rendered object against a real kube-apiserver (envtest),
// and `helm install --dry-run=server` against envtest API servers with and
// without the DRA API (capability checks and NOTES.txt).
//
// The tests need helm (env HELM, default bin/helm) and the envtest binaries
// (env KUBEBUILDER_ASSETS, default bin/k8s); `make test` builds both. Without
// them the tests fail rather than skip.
package chart
