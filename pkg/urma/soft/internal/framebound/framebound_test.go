package framebound

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// The bound is the peer timeout for a frame of which nothing came, and
// grows by a peer timeout for every Grace bytes that came.
func TestForGrowsWithWhatArrived(t *testing.T) {
	const to = 100 * time.Millisecond
	cases := []struct {
		arrived uint64
		want    time.Duration
	}{
		{0, to},
		{Grace / 2, to + to/2},
		{Grace, 2 * to},
		{16 * Grace, 17 * to},
	}
	for _, c := range cases {
		if got := For(to, c.arrived); got != c.want {
			t.Errorf("For(%v, %d) = %v, want %v", to, c.arrived, got, c.want)
		}
	}
}

// An overdue frame is a stall, and says how long this side waited and
// what the bound was.
func TestOverdueIsAStall(t *testing.T) {
	err := Overdue(1500*time.Millisecond, time.Second)
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("Overdue: %v, want ErrStalled under it", err)
	}
	for _, want := range []string{"waited 1.5s", "past its bound 1s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Overdue: %q does not say %q", err, want)
		}
	}
}
