// Package benchbase holds what the benchmarks of pkg/urma/soft and
// pkg/transport share so that their figures line up in `make bench`: the
// message sizes, and the memcpy ceiling every figure is compared with.
package benchbase

import (
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// Size is one benchmarked message size; Name is the size= label.
type Size struct {
	Name string
	N    int
}

// Sizes are the message sizes every throughput benchmark runs at.
func Sizes() []Size {
	return []Size{{"64B", 64}, {"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}}
}

// Memcpy measures copying n bytes between two mmap'd regions, the memory
// the providers register: the ceiling for any data path.
func Memcpy(b *testing.B, n int) {
	src, err := urma.AllocMemory(n)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = src.Free() }()
	dst, err := urma.AllocMemory(n)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = dst.Free() }()
	copy(dst.Bytes(), src.Bytes()) // fault the pages in, as the provider benchmarks do
	b.ReportAllocs()
	b.SetBytes(int64(n))
	for b.Loop() {
		copy(dst.Bytes(), src.Bytes())
	}
}
