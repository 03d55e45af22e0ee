package memcopy

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
func checkCopy(t *testing.T, impl func(dst, src []byte) int, n, dstOff, srcOff, dstLen int) {
	t.Helper()
	const guard = 80
	src := make([]byte, srcOff+n)
	pattern(src, 1)
	dstBuf := make([]byte, guard+dstOff+dstLen+guard)
	pattern(dstBuf, 99)
	want := bytes.Clone(dstBuf)
	dst := dstBuf[guard+dstOff : guard+dstOff+dstLen]
	got := impl(dst, src[srcOff:])
	wantN := min(dstLen, n)
	if got != wantN {
		t.Fatalf("copied %d, want %d", got, wantN)
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

// impls are the package's copies, each checked against the built-in one.
var impls = []struct {
	name string
	copy func(dst, src []byte) int
}{{"stream", Stream}, {"cached", Cached}}

func TestCopiesMatchTheBuiltin(t *testing.T) {
	sizes := []int{0, 1, 63, StreamThreshold - 1, StreamThreshold, StreamThreshold + 1, StreamThreshold + 63, StreamThreshold + 64,
		64 << 10, 64<<10 + 17, cachedChunk - 1, cachedChunk, cachedChunk + 1, 1<<20 + 5}
	for _, impl := range impls {
		for _, n := range sizes {
			for _, dstOff := range []int{0, 1, 8, 15, 16, 33} {
				for _, srcOff := range []int{0, 3, 16} {
					t.Run(fmt.Sprintf("%s/n=%d/dst+%d/src+%d", impl.name, n, dstOff, srcOff), func(t *testing.T) {
						checkCopy(t, impl.copy, n, dstOff, srcOff, n)
					})
				}
			}
		}
	}
}

func TestCopiesStopAtTheShorterSlice(t *testing.T) {
	tests := []struct {
		name      string
		n, dstLen int
	}{
		{"dst shorter, large", 64 << 10, 40<<10 + 9},
		{"src shorter, large", 40<<10 + 9, 64 << 10},
		{"dst shorter, small", StreamThreshold - 1, 100},
		{"dst shorter, beyond a cached chunk", 1 << 20, cachedChunk + 5},
		{"src shorter, beyond a cached chunk", cachedChunk + 5, 1 << 20},
		{"empty dst", 64 << 10, 0},
	}
	for _, impl := range impls {
		for _, tt := range tests {
			t.Run(impl.name+"/"+tt.name, func(t *testing.T) {
				checkCopy(t, impl.copy, tt.n, 5, 1, tt.dstLen)
			})
		}
	}
}

func FuzzCopies(f *testing.F) {
	f.Add(uint32(StreamThreshold+100), uint8(3), uint8(7), uint32(StreamThreshold+100))
	f.Add(uint32(StreamThreshold), uint8(0), uint8(0), uint32(StreamThreshold-1))
	f.Fuzz(func(t *testing.T, n uint32, dstOff, srcOff uint8, dstLen uint32) {
		n, dstLen = n%(640<<10), dstLen%(640<<10)
		for _, impl := range impls {
			checkCopy(t, impl.copy, int(n), int(dstOff%64), int(srcOff%64), int(dstLen))
		}
	})
}

// copiers are the ways of filling a buffer, compared in one run.
var copiers = []struct {
	name string
	copy func(dst, src []byte) int
}{{"builtin", func(d, s []byte) int { return copy(d, s) }}, {"stream", Stream}, {"cached", Cached}}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// buffers are n buffers of size bytes, their pages faulted in before any
// timing.
func buffers(n, size int) [][]byte {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
		pattern(bufs[i], 0)
	}
	return bufs
}

// BenchmarkCopy is the cost on one core, where the gain cannot show: the
// buffers rotate, more of them than fit in cache, as a connection's send
// buffers do.
func BenchmarkCopy(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		src, dsts := make([]byte, size), buffers(64, size)
		for _, impl := range copiers {
			b.Run(fmt.Sprintf("impl=%s/size=%s", impl.name, sizeName(size)), func(b *testing.B) {
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					impl.copy(dsts[i%len(dsts)], src)
				}
			})
		}
	}
}

// BenchmarkCopyToReader is what streaming is for: a writer fills rotating
// buffers that a reader goroutine, running on another processor when
// there is one, copies out, as the shm fabric's peer does. A buffer goes
// back to the writer once read.
func BenchmarkCopyToReader(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		src, bufs := make([]byte, size), buffers(32, size)
		for _, impl := range copiers {
			b.Run(fmt.Sprintf("impl=%s/size=%s", impl.name, sizeName(size)), func(b *testing.B) {
				full := make(chan int, len(bufs))
				free := make(chan int, len(bufs))
				for i := range bufs {
					free <- i
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					out := make([]byte, size)
					for i := range full {
						copy(out, bufs[i])
						free <- i
					}
				}()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					i := <-free
					impl.copy(bufs[i], src)
					full <- i
				}
				close(full)
				<-done
			})
		}
	}
}

// BenchmarkCopyThenRead is what Cached is for: the goroutine that fills the
// buffer reads it next, as a Read's caller does.
func BenchmarkCopyThenRead(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		src, dst, out := make([]byte, size), make([]byte, size), make([]byte, size)
		pattern(dst, 0)
		pattern(out, 0)
		for _, impl := range copiers {
			b.Run(fmt.Sprintf("impl=%s/size=%s", impl.name, sizeName(size)), func(b *testing.B) {
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					impl.copy(dst, src)
					copy(out[:size/2], dst[:size/2]) // below Go's streaming size: a plain read of it
					copy(out[size/2:], dst[size/2:])
				}
			})
		}
	}
}
