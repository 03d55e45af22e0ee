// Package deps holds the test of the module's dependency rules, the ones
// docs/architecture.md states: which tree may import which, what each
// binary links, and which packages stay free of Kubernetes. Its table of
// trees is the one source of both the check and the page's table.
package deps
