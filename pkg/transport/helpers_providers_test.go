package transport

import (
	"os"
	"sync"
	"testing"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/liburma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// envTestProvider selects the providers of fabricPair: unset, the software
// provider; "liburma", the liburma provider over the library URMA_LIBRARY
// names. make test runs this package a second time that way, over the fake
// liburma of pkg/urma/liburma/testdata, so the transport is proved against
// liburma's ABI too.
const envTestProvider = "URMA_TEST_PROVIDER"

// testProviders returns n liburma providers when envTestProvider asks for
// them; they all open the first device, as processes of one host would.
func testProviders(t testing.TB, n int) ([]urma.Provider, bool) {
	t.Helper()
	if os.Getenv(envTestProvider) != ProviderLiburma {
		return nil, false
	}
	ps := make([]urma.Provider, n)
	for i := range ps {
		p, err := liburma.New(liburma.Options{Logger: logr.Discard()})
		if err != nil {
			t.Fatalf("%s=%s: %v", envTestProvider, ProviderLiburma, err)
		}
		t.Cleanup(func() { _ = p.Close() })
		ps[i] = p
	}
	return ps, true
}

// testDevice is the device fabricPair's providers open first.
func testDevice() string {
	if os.Getenv(envTestProvider) == ProviderLiburma {
		return "udma0" // the fake liburma's first device
	}
	return soft.DefaultDevice
}

// isolatedProvider reaches none of fabricPair's providers: a software
// provider on a fabric of its own.
func isolatedProvider(t testing.TB) urma.Provider {
	t.Helper()
	p, err := soft.New(soft.Options{Fabric: soft.NewFabric(), Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// stubLiburma stands in for liburma: a software provider that says it is
// liburma, with devices of a chosen transport type, or a load failure.
type stubLiburma struct {
	urma.Provider
	mu      sync.Mutex
	closed  bool
	library string // what the transport asked to load
}

func (s *stubLiburma) Name() string { return "liburma" }

func (s *stubLiburma) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return s.Provider.Close()
}

func (s *stubLiburma) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
