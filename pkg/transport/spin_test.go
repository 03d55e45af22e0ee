package transport

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/internal/eventually"
)

// TestEventSpinTakesCompletions: in event mode a reader with nothing to
// read polls the completion queue itself for urma_event_spin. With the
// completion events muted, only that poll can deliver a message: a
// spinning reader gets it, a reader that does not spin never does.
func TestEventSpinTakesCompletions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spin     time.Duration
		wantRead bool
	}{
		{name: "spinning reader takes the message itself", spin: 10 * time.Millisecond, wantRead: true},
		{name: "no spin, only the muted event could", spin: 0, wantRead: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := fabricPair(t)
			fp := newFaultProvider(a)
			fl := smallFlags()
			fl.EventSpin = tc.spin
			p := connect(t, cfgWith(fp, fl), cfgWith(b, fl))
			// The server's event loop polls once when it starts, then
			// waits: mute it only once it waits.
			eventually.Holds(t, "the server's event loop to wait", 10*time.Second, func() bool { return fp.f.waitCalls() > 0 })
			fp.f.set(func(c *faultConfig) { c.muteEvents = true })
			// Close waits for the flush record, which takes an event.
			t.Cleanup(func() { fp.f.set(func(c *faultConfig) { c.muteEvents = false }) })
			if _, err := p.client.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			if !tc.wantRead {
				// A read that never slept would prove nothing: it must
				// sleep having found nothing, and no one may wake it with
				// the message in the 75 ms it then has (as long as the
				// three 25 ms reads this case took before).
				d := readSilentPeer(t, p.server, 75*time.Millisecond)
				if d.SpinReads != 0 || d.SpinMisses != 0 {
					t.Errorf("SpinReads=%d SpinMisses=%d with urma_event_spin=0", d.SpinReads, d.SpinMisses)
				}
				return
			}
			// Each Read spins once, then sleeps until its deadline: retry
			// until the message has landed in the completion queue.
			buf := make([]byte, 8)
			got := ""
			for i := 0; i < 200 && got == ""; i++ {
				_ = p.server.SetReadDeadline(time.Now().Add(25 * time.Millisecond))
				n, err := p.server.Read(buf)
				if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("read: %v", err)
				}
				got = string(buf[:n])
			}
			d := p.server.Debug()
			if got != "ping" {
				t.Fatalf("read %q after 200 tries, want ping (debug: %s)", got, d)
			}
			if d.SpinReads == 0 {
				t.Errorf("SpinReads = 0 after a read that spun")
			}
		})
	}
}

// TestEventSpinMisses: a spin that finds nothing gives up within its
// budget, is counted, and the read then waits for the event as before.
// Polling mode never spins in the reader.
func TestEventSpinMisses(t *testing.T) {
	for _, tc := range []struct {
		name       string
		polling    bool
		wantMisses bool
	}{
		{name: "event mode", wantMisses: true},
		{name: "polling mode", polling: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := fabricPair(t)
			fl := smallFlags()
			fl.EventSpin = time.Millisecond
			fl.UsePolling = tc.polling
			p := connect(t, cfgWith(a, fl), cfgWith(b, fl))
			d := readSilentPeer(t, p.server, 0)
			if tc.wantMisses && (d.SpinReads != 1 || d.SpinMisses != 1) {
				t.Fatalf("SpinReads=%d SpinMisses=%d, want 1 and 1", d.SpinReads, d.SpinMisses)
			}
			if !tc.wantMisses && d.SpinReads != 0 {
				t.Fatalf("SpinReads=%d in polling mode, want 0", d.SpinReads)
			}
			_ = p.server.SetReadDeadline(time.Time{})
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, 4)
				_, err := p.server.Read(buf)
				if err == nil && string(buf) != "pong" {
					err = errors.New("read " + string(buf))
				}
				done <- err
			}()
			if _, err := p.client.Write([]byte("pong")); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEventSpinLimit: at most the engine's spinLimit readers spin at once;
// a reader that finds the limit reached sleeps at once, and spins again
// once no one else does.
func TestEventSpinLimit(t *testing.T) {
	a, b := fabricPair(t)
	fl := smallFlags()
	fl.EventSpin = 10 * time.Millisecond
	ln, d := listenAndDialer(t, cfgWith(a, fl), cfgWith(b, fl))
	p1, p2 := dialAccept(t, ln, d), dialAccept(t, ln, d)
	s1, ok := p1.server.(*urmaConn)
	if !ok || p2.server.Mode() != ModeURMA {
		t.Fatalf("servers on %s and %s, want URMA", p1.server.Mode(), p2.server.Mode())
	}
	if want := int32(max(1, runtime.GOMAXPROCS(0)/2)); s1.e.spinLimit != want {
		t.Fatalf("spinLimit %d, want half the processors, at least 1: %d", s1.e.spinLimit, want)
	}
	s1.e.spinLimit = 1 // both server connections share the listener's engine
	s2, ok := p2.server.(*urmaConn)
	if !ok {
		t.Fatalf("server 2 is %T, want a URMA connection", p2.server)
	}
	buf := make([]byte, 1)
	// While s1 spins (for 10 ms, its peer silent), s2 must not: its spin
	// returns at once, found nothing and counted nothing. s2's spin is
	// called directly, not through a Read, so that no read deadline can
	// have passed before it tries. A try in which s1's spin ended before
	// s2's did proves nothing: retry.
	decided := false
	for try := 0; try < 50 && !decided; try++ {
		reads, misses := p1.server.Debug().SpinReads, p1.server.Debug().SpinMisses
		done := make(chan error, 1)
		go func() {
			_ = p1.server.SetReadDeadline(time.Now().Add(15 * time.Millisecond))
			_, err := p1.server.Read(buf)
			done <- err
		}()
		// A read that starts past its 15 ms deadline (descheduled on a
		// loaded machine) ends without spinning: wait for either.
		s1Spun := false
		eventually.Holds(t, "s1 to spin or its read to end", 10*time.Second, func() bool {
			s1Spun = p1.server.Debug().SpinReads > reads
			return s1Spun || len(done) > 0
		})
		if !s1Spun {
			if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("s1 read from a silent peer: %v", err)
			}
			continue // no spin to overlap with: proves nothing
		}
		before := p2.server.Debug().SpinReads
		found := s2.spinRead()
		stillSpinning := p1.server.Debug().SpinMisses == misses
		spun := p2.server.Debug().SpinReads - before
		if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("s1 read from a silent peer: %v", err)
		}
		if stillSpinning {
			if spun != 0 || found {
				t.Fatalf("s2 spun (%d, found %v) while s1 spun, with a limit of 1", spun, found)
			}
			decided = true
		}
	}
	if !decided {
		t.Fatal("s1's 10 ms spin never outlasted s2's attempt in 50 tries")
	}
	// Alone, s2 spins.
	before := p2.server.Debug().SpinReads
	if readSilentPeer(t, p2.server, 0).SpinReads != before+1 {
		t.Fatalf("s2 did not spin with no one else spinning")
	}
}

// TestEventSpinByFabric: readers on the shm fabric spin; readers on the
// socket fabric never do, whatever urma_event_spin says, since their poll
// cannot deliver a message (readerSpin).
func TestEventSpinByFabric(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		fabric    string
		wantSpins uint64
	}{
		{fabric: FabricShm, wantSpins: 1},
		{fabric: FabricSocket, wantSpins: 0},
	} {
		t.Run(tc.fabric, func(t *testing.T) {
			cfg := fabricCfg(tc.fabric, dir, nil)
			cfg.Flags.EventSpin = time.Millisecond
			p := connect(t, cfg, fabricCfg(tc.fabric, dir, nil))
			if got := p.server.Debug().Fabric; got != tc.fabric {
				t.Fatalf("fabric %q, want %q", got, tc.fabric)
			}
			if d := readSilentPeer(t, p.server, 0); d.SpinReads != tc.wantSpins || d.SpinMisses != tc.wantSpins {
				t.Fatalf("SpinReads=%d SpinMisses=%d, want %d and %d", d.SpinReads, d.SpinMisses, tc.wantSpins, tc.wantSpins)
			}
		})
	}
}

// readSilentPeer reads from c, whose peer is silent (or heard only in a
// way that must not reach the read), and returns c's counters once the
// read has ended at its deadline, set hold after the read went to sleep
// for a message (readSleeps moved). Only then has the read settled
// whether it spins: a read that ends before it sleeps (a deadline that
// passed before a descheduled read started, a read that returns early)
// proves nothing of a spin it did not take, and fails the test; so does
// a read that gets a byte.
func readSilentPeer(t *testing.T, c Conn, hold time.Duration) DebugInfo {
	t.Helper()
	uc, ok := c.(*urmaConn)
	if !ok {
		t.Fatalf("%T, want a URMA connection", c)
	}
	_ = c.SetReadDeadline(time.Time{}) // none left over: only ours ends it
	sleeps := uc.readSleeps.Load()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := c.Read(make([]byte, 1))
		done <- result{n, err}
	}()
	eventually.Holds(t, "the read to sleep for a message, or to end", 10*time.Second, func() bool {
		return uc.readSleeps.Load() > sleeps || len(done) > 0
	})
	if uc.readSleeps.Load() == sleeps {
		r := <-done
		t.Fatalf("read from a silent peer ended before it slept (%d bytes, %v): whether it spins is not shown", r.n, r.err)
	}
	_ = c.SetReadDeadline(time.Now().Add(hold))
	if r := <-done; r.n != 0 || !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("read from a silent peer: %d bytes, %v, want the deadline", r.n, r.err)
	}
	return c.Debug()
}
