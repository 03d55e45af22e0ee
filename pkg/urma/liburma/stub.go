package liburma

import (
	"github.com/openeuler/urma-k8s/pkg/urma"
)

// New loads liburma and initialises it. This build has no liburma provider
// yet: New always fails with urma.ErrNoSupport.
func New(opts Options) (urma.Provider, error) {
	return nil, urma.Errorf("urma_init", urma.CodeNoSupport, "the liburma provider is not built into this binary")
}
