// Package images holds the tests of the image build: every images/*.Dockerfile
// builds a static, non-root binary of an existing command on a minimal base,
// and hack/images.sh picks a usable container engine, builds from a clean
// context, and fails clearly when there is none. No container engine is
// needed: the tests run hack/images.sh against fake engines.
package images
