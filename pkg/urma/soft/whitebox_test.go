package soft

import (
	"math"

	"github.com/openeuler/urma-k8s/pkg/urma/soft/internal/shmring"
)

// What tests read of a Provider's insides: its connections and what their
// rings, sharing and RNR blocks hold. Only tests of this package, which
// check those insides on purpose, use them.

// conns lists a provider's live fabric connections.
func (p *Provider) conns() []*conn {
	var out []*conn
	for _, d := range p.devices {
		d.side.mu.Lock()
		for c := range d.side.conns {
			out = append(out, c)
		}
		d.side.mu.Unlock()
	}
	return out
}

func (p *Provider) addr() string { return p.devices[0].side.ln.Addr().String() }

// wakes is how many times side p's connections woke their peer.
func (p *Provider) wakes() uint64 {
	var n uint64
	for _, c := range p.conns() {
		n += c.io.(*shmIO).Wakes()
	}
	return n
}

// keepPollingMode makes p's shm connections, once a reader is in polling
// mode, stay in it however long the pollers pause: on a loaded machine a
// test goroutine descheduled for pollingEnd parks would end it otherwise.
func keepPollingMode(p *Provider) {
	for _, d := range p.devices {
		d.side.shm.pollingEnd = math.MaxInt
	}
}

// readerSleeps are the sleep words of the reader goroutines of p's shm
// connections: odd while one sleeps announced, one more with each
// announcement and each wake-up.
func readerSleeps(p *Provider) []uint64 {
	var out []uint64
	for _, c := range p.conns() {
		out = append(out, c.io.(*shmIO).Word(shmring.WordReaderSleeps).Load())
	}
	return out
}

// mappedSegments is how many of its peer's segments side p maps.
func (p *Provider) mappedSegments() int {
	n := 0
	for _, c := range p.conns() {
		s := c.io.(*shmIO)
		s.pull.mapMu.RLock()
		n += len(s.pull.mapped)
		s.pull.mapMu.RUnlock()
	}
	return n
}

// readyShares is how many of side p's segments its peers have mapped, as
// their answers told it.
func (p *Provider) readyShares() int {
	n := 0
	for _, c := range p.conns() {
		s := c.io.(*shmIO)
		s.pull.shareMu.Lock()
		for _, sh := range s.pull.shared {
			if sh.ready && !sh.failed {
				n++
			}
		}
		s.pull.shareMu.Unlock()
	}
	return n
}

// pulls is how many SENDs side p's connections sent by reference.
func (p *Provider) pulls() uint64 {
	var n uint64
	for _, c := range p.conns() {
		n += c.io.(*shmIO).pulls.Load()
	}
	return n
}

// blocks is how many RNR blocks side p's connections hold for their peers'
// senders; it takes each reader's token, which an idle shm reader leaves.
func (p *Provider) blocks() int {
	n := 0
	for _, c := range p.conns() {
		c.readMu.Lock()
		n += len(c.blocked)
		c.readMu.Unlock()
	}
	return n
}

// peerMappedBytes is how many bytes of its peers' segments p's
// connections map.
func peerMappedBytes(p *Provider) (n uint64) {
	for _, c := range p.conns() {
		s := c.io.(*shmIO)
		s.pull.mapMu.RLock()
		for _, b := range s.pull.mapped {
			n += uint64(len(b))
		}
		s.pull.mapMu.RUnlock()
	}
	return n
}

// connsOf counts the connections of each fabric side of p's device.
func connsOf(p *Provider) (shm, socket int) {
	d := p.devices[0]
	count := func(sd *fabricSide) int {
		if sd == nil {
			return 0
		}
		sd.mu.Lock()
		defer sd.mu.Unlock()
		return len(sd.conns)
	}
	return count(d.side), count(d.tcpSide)
}
