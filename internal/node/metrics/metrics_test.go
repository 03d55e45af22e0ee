package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/openeuler/urma-k8s/internal/node/budget"
	"github.com/openeuler/urma-k8s/internal/node/inventory"
)

func TestObserveSnapshot(t *testing.T) {
	m := New()
	if got := testutil.ToFloat64(m.noDevices); got != 1 {
		t.Fatalf("no_devices at start = %v, want 1", got)
	}
	m.ObserveSnapshot(&inventory.Snapshot{
		Devices: []inventory.Device{
			{Name: "udma0", Healthy: true, Budget: budget.Budget{Units: 60}},
			{Name: "udma1", Reason: "no EID", Budget: budget.Budget{Units: 10}},
		},
		Missing: []string{"/dev/ummu"},
	})
	checks := []struct {
		name string
		got  float64
		want float64
	}{
		{"units udma0", testutil.ToFloat64(m.units.WithLabelValues("udma0")), 60},
		{"healthy units udma0", testutil.ToFloat64(m.healthyUnits.WithLabelValues("udma0")), 60},
		{"healthy units udma1", testutil.ToFloat64(m.healthyUnits.WithLabelValues("udma1")), 0},
		{"units udma1", testutil.ToFloat64(m.units.WithLabelValues("udma1")), 10},
		{"device healthy udma1", testutil.ToFloat64(m.deviceHealthy.WithLabelValues("udma1")), 0},
		{"reason udma1", testutil.ToFloat64(m.unhealthyReason.WithLabelValues("udma1", "no EID")), 1},
		{"devices", testutil.ToFloat64(m.devices), 2},
		{"no devices", testutil.ToFloat64(m.noDevices), 0},
		{"waiting", testutil.ToFloat64(m.waiting.WithLabelValues("/dev/ummu")), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	// A removed device disappears from the series.
	m.ObserveSnapshot(&inventory.Snapshot{Devices: []inventory.Device{{Name: "udma0", Healthy: true, Budget: budget.Budget{Units: 60}}}})
	if n := testutil.CollectAndCount(m.units); n != 1 {
		t.Errorf("units series = %d, want 1 after udma1 left", n)
	}
	if n := testutil.CollectAndCount(m.unhealthyReason); n != 0 {
		t.Errorf("unhealthy reason series = %d, want 0", n)
	}
}

func TestCounters(t *testing.T) {
	m := New()
	m.ObserveAllocation("udma0", 3)
	m.ObserveAllocation("udma0", 2)
	m.AllocateRefused()
	m.ObserveRegistration(errors.New("no kubelet"))
	if got := testutil.ToFloat64(m.registered); got != 0 {
		t.Errorf("registered after failure = %v", got)
	}
	m.ObserveRegistration(nil)
	if got := testutil.ToFloat64(m.registered); got != 1 {
		t.Errorf("registered after success = %v", got)
	}
	m.SetUnregistered()
	m.ObserveScan(map[string]int{"udma0": 2}, nil)
	m.ObserveScan(nil, errors.New("boom"))
	m.ObserveNodeUpdate(nil)
	m.ObserveNodeUpdate(nil)
	m.ObserveNodeUpdate(errors.New("forbidden"))
	checks := []struct {
		name      string
		got, want float64
	}{
		{"allocations", testutil.ToFloat64(m.allocations.WithLabelValues("udma0")), 2},
		{"allocated units", testutil.ToFloat64(m.allocatedUnits.WithLabelValues("udma0")), 5},
		{"refused", testutil.ToFloat64(m.allocateRefused), 1},
		{"registered", testutil.ToFloat64(m.registered), 0},
		{"registrations ok", testutil.ToFloat64(m.registrations.WithLabelValues("ok")), 1},
		{"registrations error", testutil.ToFloat64(m.registrations.WithLabelValues("error")), 1},
		{"scans", testutil.ToFloat64(m.scans), 2},
		{"discovery errors", testutil.ToFloat64(m.discoveryErrors), 1},
		{"problems kept after failed scan", testutil.ToFloat64(m.problems.WithLabelValues("udma0")), 2},
		{"node ok", testutil.ToFloat64(m.nodeUpdates.WithLabelValues("ok")), 2},
		{"node error", testutil.ToFloat64(m.nodeUpdates.WithLabelValues("error")), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestNilIsSafe(t *testing.T) {
	var m *Metrics
	m.ObserveSnapshot(&inventory.Snapshot{})
	m.ObserveScan(nil, nil)
	m.ObserveAllocation("x", 1)
	m.AllocateRefused()
	m.ObserveRegistration(nil)
	m.SetUnregistered()
	m.ObserveNodeUpdate(nil)
}

func TestHandlerServesNames(t *testing.T) {
	m := New()
	m.ObserveSnapshot(&inventory.Snapshot{Devices: []inventory.Device{{Name: "udma0", Healthy: true, Budget: budget.Budget{Units: 4}}}})
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, name := range []string{"urma_deviceplugin_units{device=\"udma0\"} 4", "urma_deviceplugin_registered 0", "go_goroutines"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
	if problems, err := testutil.GatherAndLint(m.Registry()); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
