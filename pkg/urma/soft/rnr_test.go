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
