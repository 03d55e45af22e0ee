package logtest

import (
	"sync"
	"testing"
)

func TestLinesCountsWhatWasLogged(t *testing.T) {
	var l Lines
	log := l.Logger(nil).WithName("plugin")
	log.Info("device advertised", "device", "udma0")
	log.V(1).Info("device not advertised", "device", "udma1")
	log.V(2).Info("too verbose to keep")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { log.Info("device advertised", "device", "udma2") })
	}
	wg.Wait()
	tests := []struct {
		sub  string
		want int
	}{
		{`"msg"="device advertised"`, 5},
		{`"device"="udma0"`, 1},
		{"device not advertised", 1},
		{"too verbose", 0},
		{"plugin", 6},
	}
	for _, tt := range tests {
		if got := l.Count(tt.sub); got != tt.want {
			t.Errorf("Count(%q) = %d, want %d in:\n%s", tt.sub, got, tt.want, l.String())
		}
	}
	if all := l.All(); len(all) != 6 || all[0] != `plugin "level"=0 "msg"="device advertised" "device"="udma0"` {
		t.Errorf("All = %q, want 6 lines, the first as funcr renders it", all)
	}
	if !l.Contains("udma1") || l.Contains("udma9") {
		t.Errorf("Contains disagrees with the lines:\n%s", l.String())
	}
}
