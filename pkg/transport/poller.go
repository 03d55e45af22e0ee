package transport

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// pollerGroup is polling mode (--urma_use_polling): urma_poller_num
// goroutines that poll the completion queues of the connections assigned to
// them, round robin, instead of waiting for completion events. A poller
// with no connection sleeps; one with connections spins, yielding the
// processor after every empty round when urma_poller_yield is set, and
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
	empty := 0
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
			empty = 0
			continue
		}
		empty++
		if g.yield || empty%spinYieldRounds == 0 {
			runtime.Gosched()
		}
	}
}

// spinYieldRounds is how many empty rounds a poller without
// urma_poller_yield spins before it yields once.
const spinYieldRounds = 64
