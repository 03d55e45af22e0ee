//go:build !linux || !cgo

package liburma

import (
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// New reports that this binary has no liburma provider: it was built
// without cgo (CGO_ENABLED=0) or for another system than Linux.
func New(opts Options) (urma.Provider, error) {
	return nil, urma.Errorf("urma_init", urma.CodeNoSupport, "the liburma provider needs a Linux build with cgo; this binary has none")
}
