package transport

import (
	"testing"
	"time"
)

// A poller gives way by its backoff: without urma_poller_yield to the
// other goroutines every spinYieldRounds empty rounds, never its thread;
// with it, to the goroutines every round and, once the rounds have been
// empty for threadAfter, its thread too, until a round finds something.
// The clock is read on the first empty round and every threadYieldRounds.
func TestPollerBackoff(t *testing.T) {
	const after = 50 * time.Microsecond
	type round struct {
		progress       bool          // the round found something
		at             time.Duration // the clock, from the start
		wantGoroutines bool
		wantThread     bool
	}
	empty := func(n int, at time.Duration, goroutines, thread bool) []round {
		rs := make([]round, n)
		for i := range rs {
			rs[i] = round{at: at, wantGoroutines: goroutines, wantThread: thread}
		}
		return rs
	}
	concat := func(parts ...[]round) []round {
		var all []round
		for _, p := range parts {
			all = append(all, p...)
		}
		return all
	}
	tests := []struct {
		name   string
		yield  bool
		rounds []round
	}{
		{name: "no yield flag, every 64th empty round", rounds: concat(
			empty(63, time.Second, false, false),
			[]round{{at: time.Second, wantGoroutines: true}},
			empty(63, time.Hour, false, false),
			[]round{{at: time.Hour, wantGoroutines: true}},
		)},
		{name: "no yield flag, progress restarts count", rounds: concat(
			empty(40, 0, false, false),
			[]round{{progress: true}},
			empty(63, 0, false, false),
			[]round{{wantGoroutines: true}},
		)},
		{name: "yield flag, thread after the empty time", yield: true, rounds: concat(
			empty(7, 0, true, false),
			[]round{{at: after - time.Nanosecond, wantGoroutines: true}}, // 8th round: the clock is read, too early
			empty(7, after, true, false),                                 // not a round that reads the clock
			[]round{{at: after, wantGoroutines: true, wantThread: true}}, // 16th: read, long enough
			[]round{{at: after, wantGoroutines: true}},
		)},
		{name: "yield flag, progress restarts empty time", yield: true, rounds: concat(
			empty(15, 0, true, false),
			[]round{{at: after, wantGoroutines: true, wantThread: true}},
			[]round{{progress: true, at: after}},
			empty(15, after, true, false), // its first round reads the clock: the new streak starts at 'after'
			[]round{{at: 2*after - time.Nanosecond, wantGoroutines: true}},
			empty(7, 2*after, true, false),
			[]round{{at: 2 * after, wantGoroutines: true, wantThread: true}},
		)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			b := pollerBackoff{yield: tc.yield, threadAfter: after}
			for i, r := range tc.rounds {
				if r.progress {
					b.progress()
					continue
				}
				goroutines, thread := b.idle(func() time.Time { return start.Add(r.at) })
				if goroutines != r.wantGoroutines || thread != r.wantThread {
					t.Fatalf("round %d: yields goroutines %v, thread %v; want %v, %v", i, goroutines, thread, r.wantGoroutines, r.wantThread)
				}
			}
		})
	}
}
