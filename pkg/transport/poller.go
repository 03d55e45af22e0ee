package transport

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// pollerGroup is polling mode (--urma_use_polling): urma_poller_num
// goroutines that poll the completion queues of the connections assigned to
// them, round robin, instead of waiting for completion events. A poller
// with no connection sleeps; one with connections spins, yielding the
// processor after every empty round when urma_poller_yield is set (and its
// thread once the rounds have been empty for a while, pollerBackoff), and
// otherwise after spinYieldRounds empty rounds: unlike brpc's dedicated
// polling threads, a poller shares the Go scheduler's few processors with
// the very goroutines that read and write, and must not starve them.
type pollerGroup struct {
	yield bool

	mu    sync.Mutex
	sets  [][]*urmaConn
	gens  []atomic.Uint64 // bumped when a poller's set changes
	wakes []chan struct{}
	next  int
}

func newPollerGroup(n int, yield bool) *pollerGroup {
	g := &pollerGroup{yield: yield, sets: make([][]*urmaConn, n), gens: make([]atomic.Uint64, n), wakes: make([]chan struct{}, n)}
	for i := range g.wakes {
		g.wakes[i] = make(chan struct{}, 1)
	}
	return g
}

// start runs the pollers until done closes.
func (g *pollerGroup) start(wg *sync.WaitGroup, done <-chan struct{}) {
	for i := range g.sets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.run(i, done)
		}()
	}
}

// add assigns c to a poller and returns its index.
func (g *pollerGroup) add(c *urmaConn) int {
	g.mu.Lock()
	i := g.next % len(g.sets)
	g.next++
	g.sets[i] = append(g.sets[i], c)
	g.gens[i].Add(1)
	g.mu.Unlock()
	notify(g.wakes[i])
	return i
}

// remove takes c off poller i. The poller may still be polling c once more
// from its old snapshot; the connection's pollOff flag covers that.
func (g *pollerGroup) remove(c *urmaConn, i int) {
	g.mu.Lock()
	set := g.sets[i]
	for k, x := range set {
		if x == c {
			set[k] = set[len(set)-1]
			set[len(set)-1] = nil
			g.sets[i] = set[:len(set)-1]
			break
		}
	}
	g.gens[i].Add(1)
	g.mu.Unlock()
}

func (g *pollerGroup) run(i int, done <-chan struct{}) {
	var conns []*urmaConn
	seen := ^uint64(0)
	backoff := pollerBackoff{yield: g.yield, threadAfter: threadYieldAfter}
	for {
		select {
		case <-done:
			return
		default:
		}
		if gen := g.gens[i].Load(); gen != seen {
			g.mu.Lock()
			conns = append(conns[:0], g.sets[i]...)
			seen = g.gens[i].Load()
			g.mu.Unlock()
		}
		if len(conns) == 0 {
			select {
			case <-done:
				return
			case <-g.wakes[i]:
			}
			continue
		}
		progress := 0
		for _, c := range conns {
			progress += c.poll()
		}
		if progress > 0 {
			backoff.progress()
			continue
		}
		goroutines, thread := backoff.idle(time.Now)
		if goroutines {
			runtime.Gosched()
		}
		if thread {
			yieldThread()
		}
	}
}

// spinYieldRounds is how many empty rounds a poller without
// urma_poller_yield spins before it yields once.
const spinYieldRounds = 64

// threadYieldAfter is how long a poller with urma_poller_yield finds
// nothing before it also yields its thread to the kernel (sched_yield), as
// brpc's poller does on every empty round. runtime.Gosched only lets this
// process's goroutines run: the thread stays on its core, and on a small
// machine the peer process copying a large message waits for it. Every
// empty round was too often: two processes' pollers handed the core back
// and forth, and a 64 B round trip took 105-112 µs instead of 5. After
// 50 µs of nothing, no reply within a round trip is coming; the peer is
// copying, and the core is worth more to it (polling mode, two processes:
// 1 MiB 4251 MB/s to 7553, 64 KiB 3359 to 4639, p99s from 5.9-11.8 ms to
// 0.8-1.7 ms, the 64 B round trip's p50 unchanged).
const threadYieldAfter = 50 * time.Microsecond

// threadYieldRounds is how often, in empty rounds, the poller reads the
// clock to see whether it has found nothing for threadYieldAfter.
const threadYieldRounds = 8

// pollerBackoff decides how a poller gives way after rounds that found
// nothing: without urma_poller_yield it lets other goroutines run every
// spinYieldRounds empty rounds; with it, every round, and once the rounds
// have been empty for threadAfter, it gives up its thread as well.
type pollerBackoff struct {
	yield       bool
	threadAfter time.Duration
	empty       int       // empty rounds in a row
	emptySince  time.Time // when the first of them was
}

// progress records a round that found something.
func (b *pollerBackoff) progress() { b.empty = 0 }

// idle records an empty round and reports whether the poller yields to the
// other goroutines (runtime.Gosched) and whether it yields its thread too
// (yieldThread). now is read on the first empty round and then only every
// threadYieldRounds.
func (b *pollerBackoff) idle(now func() time.Time) (goroutines, thread bool) {
	b.empty++
	if !b.yield {
		return b.empty%spinYieldRounds == 0, false
	}
	if b.empty == 1 {
		b.emptySince = now()
	} else if b.empty%threadYieldRounds == 0 {
		thread = now().Sub(b.emptySince) >= b.threadAfter
	}
	return true, thread
}

// yieldThread gives the thread's core to another thread, of any process,
// that is ready to run; the goroutine keeps its processor.
func yieldThread() { _, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
