package streamcopy

import (
	"bytes"
	"fmt"
	"testing"
)

// pattern fills b with bytes that differ from those of a neighbouring offset,
// so that a shifted or skipped block shows.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + byte(i>>8) + seed
	}
}

// checkCopy copies n bytes between buffers offset by dstOff and srcOff from
// their allocation, and checks the copy and that no byte around it changed.
func checkCopy(t *testing.T, n, dstOff, srcOff, dstLen int) {
	t.Helper()
	const guard = 80
	src := make([]byte, srcOff+n)
	pattern(src, 1)
	dstBuf := make([]byte, guard+dstOff+dstLen+guard)
	pattern(dstBuf, 99)
	want := bytes.Clone(dstBuf)
	dst := dstBuf[guard+dstOff : guard+dstOff+dstLen]
	got := Copy(dst, src[srcOff:])
	wantN := min(dstLen, n)
	if got != wantN {
		t.Fatalf("Copy returned %d, want %d", got, wantN)
	}
	copy(want[guard+dstOff:guard+dstOff+dstLen], src[srcOff:])
	if i := firstDiff(dstBuf, want); i >= 0 {
		t.Fatalf("byte %d (dst starts at %d, copies %d): got %d, want %d", i, guard+dstOff, wantN, dstBuf[i], want[i])
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func TestCopyMatchesTheBuiltin(t *testing.T) {
	sizes := []int{0, 1, 63, Threshold - 1, Threshold, Threshold + 1, Threshold + 63, Threshold + 64, 64 << 10, 64<<10 + 17, 1<<20 + 5}
	for _, n := range sizes {
		for _, dstOff := range []int{0, 1, 8, 15, 16, 33} {
			for _, srcOff := range []int{0, 3, 16} {
				t.Run(fmt.Sprintf("n=%d/dst+%d/src+%d", n, dstOff, srcOff), func(t *testing.T) {
					checkCopy(t, n, dstOff, srcOff, n)
				})
			}
		}
	}
}

func TestCopyStopsAtTheShorterSlice(t *testing.T) {
	tests := []struct {
		name      string
		n, dstLen int
	}{
		{"dst shorter, streamed", 64 << 10, 40<<10 + 9},
		{"src shorter, streamed", 40<<10 + 9, 64 << 10},
		{"dst shorter, below the threshold", Threshold - 1, 100},
		{"empty dst", 64 << 10, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkCopy(t, tt.n, 5, 1, tt.dstLen)
		})
	}
}

func FuzzCopy(f *testing.F) {
	f.Add(uint32(Threshold+100), uint8(3), uint8(7), uint32(Threshold+100))
	f.Add(uint32(Threshold), uint8(0), uint8(0), uint32(Threshold-1))
	f.Fuzz(func(t *testing.T, n uint32, dstOff, srcOff uint8, dstLen uint32) {
		n, dstLen = n%(256<<10), dstLen%(256<<10)
		checkCopy(t, int(n), int(dstOff%64), int(srcOff%64), int(dstLen))
	})
}

// The gain is in what the peer's core does not have to give back, which a
// single-process benchmark cannot show: urma-perf between two processes
// measures it (docs/transport.md). This shows the cost on one core, beside
// the built-in copy of the same run.
func BenchmarkCopy(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		src := make([]byte, size)
		// More destinations than fit in cache, as a connection's send
		// buffers rotate.
		dsts := make([][]byte, 64)
		for i := range dsts {
			dsts[i] = make([]byte, size)
			pattern(dsts[i], 0) // fault the pages in before timing
		}
		for _, impl := range []struct {
			name string
			copy func(dst, src []byte) int
		}{{"builtin", func(d, s []byte) int { return copy(d, s) }}, {"stream", Copy}} {
			b.Run(fmt.Sprintf("impl=%s/size=%dKiB", impl.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					impl.copy(dsts[i%len(dsts)], src)
				}
			})
		}
	}
}
