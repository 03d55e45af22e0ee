package soft

import (
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A send to a receiver that never posts is tried once and then retried
// exactly RNRRetry times before it completes with RNR_RETRY_CNT_EXC
// (urma_jfs_cfg_t.rnr_retry counts the retries after the first try).
func TestRNRRetryCountsTransmissions(t *testing.T) {
	for _, retries := range []uint8{0, 1, 3} {
		fab := NewFabric()
		pa, pb := newProvider(t, Options{Fabric: fab}), newProvider(t, Options{Fabric: fab})
		a := newSide(t, pa, urma.JettyConfig{RNRRetry: retries}, 64)
		b := newSide(t, pb, urma.JettyConfig{}, 64)
		target := a.importJetty(b)
		mustOK(t, a.send(target, 1, 0, 64, 0), "send") // b posts nothing: RNR
		if c := pollN(t, a.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusRNRRetryCntExc {
			t.Fatalf("retry=%d: send completed as %+v, want RNR_RETRY_CNT_EXC", retries, c)
		}
		j := a.jetty.(*jetty)
		j.mu.Lock()
		tx := j.slot(0).tx
		j.mu.Unlock()
		if tx != uint32(retries)+1 {
			t.Errorf("retry=%d: the send was transmitted %d times, want %d", retries, tx, retries+1)
		}
	}
}

// The wait before an RNR retry: min_rnr_timer t sets the base, 10µs << t/2,
// times 1.5 for odd t; each retry doubles it, up to max(base, 10ms).
func TestRNRDelay(t *testing.T) {
	for _, tc := range []struct {
		timer, retry uint8
		want         time.Duration
	}{
		{0, 1, 10 * time.Microsecond},
		{1, 1, 15 * time.Microsecond},
		{2, 1, 20 * time.Microsecond},
		{3, 1, 30 * time.Microsecond},
		{0, 2, 20 * time.Microsecond},
		{0, 3, 40 * time.Microsecond},
		{0, 10, 5120 * time.Microsecond},
		{0, 11, 10 * time.Millisecond}, // 10.24ms, capped
		{0, 255, 10 * time.Millisecond},
		{31, 1, 10 * time.Microsecond << 15 * 3 / 2}, // the base is above 10ms: no backoff
		{31, 5, 10 * time.Microsecond << 15 * 3 / 2},
	} {
		if got := rnrDelay(tc.timer, tc.retry); got != tc.want {
			t.Errorf("rnrDelay(%d, %d) = %v, want %v", tc.timer, tc.retry, got, tc.want)
		}
	}
}
