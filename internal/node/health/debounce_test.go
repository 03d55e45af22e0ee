package health

import (
	"testing"
	"time"
)

var (
	up   = Verdict{Healthy: true}
	down = Verdict{Reason: "no usable port (port0 DOWN)"}
)

type step struct {
	v           Verdict
	at          time.Duration // since the test's epoch
	want        bool          // committed health after the step
	wantReason  string
	wantRecheck time.Duration // 0 = none
}

func TestTracker(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Debounce
		steps []step
	}{
		{"first verdict commits at once", Debounce{Observations: 3, Hold: time.Minute}, []step{
			{v: down, want: false, wantReason: down.Reason},
		}},
		{"no debounce flips at once both ways", Debounce{}, []step{
			{v: up, want: true}, {v: down, at: 1, want: false, wantReason: down.Reason}, {v: up, at: 2, want: true},
		}},
		{"count: flip needs K observations", Debounce{Observations: 3}, []step{
			{v: up, want: true},
			{v: down, at: 1, want: true}, {v: down, at: 2, want: true}, {v: down, at: 3, want: false, wantReason: down.Reason},
		}},
		{"count: recovery also needs K", Debounce{Observations: 2}, []step{
			{v: down, want: false, wantReason: down.Reason},
			{v: up, at: 1, want: false, wantReason: down.Reason}, {v: up, at: 2, want: true},
		}},
		{"blip resets the count", Debounce{Observations: 2}, []step{
			{v: up, want: true},
			{v: down, at: 1, want: true}, {v: up, at: 2, want: true},
			{v: down, at: 3, want: true}, {v: down, at: 4, want: false, wantReason: down.Reason},
		}},
		{"hold: flip waits for the duration and asks for a recheck", Debounce{Observations: 1, Hold: 10 * time.Second}, []step{
			{v: up, want: true},
			{v: down, at: time.Second, want: true, wantRecheck: 11 * time.Second},
			{v: down, at: 5 * time.Second, want: true, wantRecheck: 11 * time.Second},
			{v: down, at: 11 * time.Second, want: false, wantReason: down.Reason},
		}},
		{"hold and count both required", Debounce{Observations: 3, Hold: time.Second}, []step{
			{v: up, want: true},
			{v: down, at: 0, want: true, wantRecheck: time.Second},
			{v: down, at: 2 * time.Second, want: true},
			{v: down, at: 3 * time.Second, want: false, wantReason: down.Reason},
		}},
		{"new reason while unhealthy is taken at once", Debounce{Observations: 5}, []step{
			{v: down, want: false, wantReason: down.Reason},
			{v: Verdict{Reason: "no EID"}, at: 1, want: false, wantReason: "no EID"},
		}},
		{"committed reason is the latest pending one", Debounce{Observations: 2}, []step{
			{v: up, want: true},
			{v: Verdict{Reason: "a"}, at: 1, want: true},
			{v: Verdict{Reason: "b"}, at: 2, want: false, wantReason: "b"},
		}},
	}
	epoch := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(tt.cfg)
			for i, s := range tt.steps {
				got, recheck := tr.Observe("udma0", s.v, epoch.Add(s.at))
				if got.Healthy != s.want || got.Reason != s.wantReason {
					t.Fatalf("step %d: committed %+v, want healthy=%v reason=%q", i, got, s.want, s.wantReason)
				}
				var wantRecheck time.Time
				if s.wantRecheck != 0 {
					wantRecheck = epoch.Add(s.wantRecheck)
				}
				if !recheck.Equal(wantRecheck) {
					t.Fatalf("step %d: recheck %v, want %v", i, recheck, wantRecheck)
				}
			}
		})
	}
}

func TestTrackerKeepsDevicesApart(t *testing.T) {
	tr := NewTracker(Debounce{Observations: 2})
	now := time.Now()
	tr.Observe("a", up, now)
	tr.Observe("b", up, now)
	tr.Observe("a", down, now)
	if !tr.Pending("a") || tr.Pending("b") {
		t.Fatalf("pending a=%v b=%v, want true false", tr.Pending("a"), tr.Pending("b"))
	}
	if got, _ := tr.Observe("b", down, now); !got.Healthy {
		t.Fatal("b flipped after one observation; a's count leaked into b")
	}
}

func TestForget(t *testing.T) {
	tr := NewTracker(Debounce{Observations: 10})
	now := time.Now()
	tr.Observe("a", up, now)
	tr.Forget("a")
	if got, _ := tr.Observe("a", down, now); got.Healthy {
		t.Fatal("a forgotten device should take its next verdict at once")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		d  Debounce
		ok bool
	}{{Debounce{}, true}, {Debounce{Observations: 2, Hold: time.Second}, true}, {Debounce{Observations: -1}, false}, {Debounce{Hold: -1}, false}} {
		if err := tc.d.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.d, err, tc.ok)
		}
	}
}
