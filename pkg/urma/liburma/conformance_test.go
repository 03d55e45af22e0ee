//go:build linux && cgo

package liburma

import (
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/openeuler/urma-k8s/pkg/urma/urmatest"
)

// newTestProvider loads the fake liburma; the provider closes with the test.
func newTestProvider(t testing.TB) *Provider {
	t.Helper()
	p, err := newProvider(Options{Logger: testr.NewWithInterface(t, testr.Options{})})
	if err != nil {
		t.Fatalf("load the fake liburma: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close provider: %v", err)
		}
	})
	return p
}

// The whole conformance suite, through cgo and the shim into the fake
// liburma: A on udma0 and B on udma1, as two hosts.
func TestConformance(t *testing.T) {
	urmatest.Run(t, func(t *testing.T) urmatest.Pair {
		a, b := newTestProvider(t), newTestProvider(t)
		pair := urmatest.Pair{
			A: a, B: b, DeviceA: "udma0", DeviceB: "udma1",
			KillB: func() {
				if err := b.killContexts(); err != nil {
					t.Errorf("kill B: %v", err)
				}
				_ = b.Close()
			},
			PeerGoneTimeout: 5 * time.Second,
		}
		if libraryUnderTest != "" {
			pair.KillB = nil // only the fake can make a device vanish
		}
		return pair
	})
}
