//go:build !linux || !cgo

package liburma

import (
	"errors"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Without cgo there is no liburma provider, and New says so.
func TestNewWithoutCgo(t *testing.T) {
	p, err := New(Options{})
	if p != nil || !errors.Is(err, urma.ErrNoSupport) {
		t.Fatalf("New() = %v, %v; want ErrNoSupport", p, err)
	}
}
