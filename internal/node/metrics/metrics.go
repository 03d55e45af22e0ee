// Package metrics is the device plugin's Prometheus instrumentation. Every
// method is safe on a nil *Metrics, so components can run uninstrumented in
// tests.
package metrics

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/openeuler/urma-k8s/internal/node/inventory"
)

const ns = "urma_deviceplugin_"

// Metrics holds the collectors, registered on a private registry.
type Metrics struct {
	reg *prometheus.Registry

	mu              sync.Mutex // serializes snapshot updates (reset + set)
	units           *prometheus.GaugeVec
	healthyUnits    *prometheus.GaugeVec
	deviceHealthy   *prometheus.GaugeVec
	unhealthyReason *prometheus.GaugeVec
	devices         prometheus.Gauge
	noDevices       prometheus.Gauge
	waiting         *prometheus.GaugeVec
	problems        *prometheus.GaugeVec
	discoveryErrors prometheus.Counter
	scans           prometheus.Counter
	allocations     *prometheus.CounterVec
	allocatedUnits  *prometheus.CounterVec
	allocateRefused prometheus.Counter
	registered      prometheus.Gauge
	registrations   *prometheus.CounterVec
	nodeUpdates     *prometheus.CounterVec
}

// New creates the collectors and registers them, with the Go and process
// collectors, on a fresh registry.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		units: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ns + "units",
			Help: "Budget units advertised per device (one unit = jetties_per_unit jetties)."}, []string{"device"}),
		healthyUnits: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ns + "healthy_units",
			Help: "Budget units advertised as Healthy per device."}, []string{"device"}),
		deviceHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ns + "device_healthy",
			Help: "1 when the device is healthy (after debounce), else 0."}, []string{"device"}),
		unhealthyReason: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ns + "device_unhealthy_reason",
			Help: "1 for each unhealthy device, labeled with why."}, []string{"device", "reason"}),
		devices: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "devices",
			Help: "Devices advertised (hardware and software)."}),
		noDevices: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "no_devices",
			Help: "1 while no device is advertised (driver not loaded, nothing selected): the plugin is up but offers nothing."}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ns + "waiting_for",
			Help: "1 for each thing discovery is waiting for (class directory, device node directory)."}, []string{"what"}),
		problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ns + "discovery_problems",
			Help: "Malformed or unreadable sysfs files per discovered device (see the log for each)."}, []string{"device"}),
		discoveryErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "discovery_errors_total",
			Help: "Scans that failed as a whole (the previous device set was kept)."}),
		scans: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "scans_total",
			Help: "Discovery scans run."}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "allocations_total",
			Help: "Containers allocated units of the device."}, []string{"device"}),
		allocatedUnits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "allocated_units_total",
			Help: "Units allocated from the device, summed over allocations."}, []string{"device"}),
		allocateRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "allocate_refused_total",
			Help: "Allocate calls refused (unknown or unhealthy unit IDs)."}),
		registered: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "registered",
			Help: "1 while the plugin is registered with kubelet."}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "registrations_total",
			Help: "Registration attempts with kubelet by result."}, []string{"result"}),
		nodeUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "node_updates_total",
			Help: "Node label/annotation (or NFD feature file) updates by result."}, []string{"result"}),
	}
	m.reg.MustRegister(m.units, m.healthyUnits, m.deviceHealthy, m.unhealthyReason, m.devices,
		m.noDevices, m.waiting, m.problems, m.discoveryErrors, m.scans, m.allocations,
		m.allocatedUnits, m.allocateRefused, m.registered, m.registrations, m.nodeUpdates,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.noDevices.Set(1)
	return m
}

// Registry is the registry the collectors live on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// ObserveSnapshot sets the per-device gauges from a published snapshot;
// devices no longer listed disappear from the metrics.
func (m *Metrics) ObserveSnapshot(s *inventory.Snapshot) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range []*prometheus.GaugeVec{m.units, m.healthyUnits, m.deviceHealthy, m.unhealthyReason, m.waiting} {
		v.Reset()
	}
	for _, d := range s.Devices {
		m.units.WithLabelValues(d.Name).Set(float64(d.Budget.Units))
		healthy := 0.0
		if d.Healthy {
			healthy = 1
			m.healthyUnits.WithLabelValues(d.Name).Set(float64(d.Budget.Units))
		} else {
			m.healthyUnits.WithLabelValues(d.Name).Set(0)
			m.unhealthyReason.WithLabelValues(d.Name, d.Reason).Set(1)
		}
		m.deviceHealthy.WithLabelValues(d.Name).Set(healthy)
	}
	for _, w := range s.Missing {
		m.waiting.WithLabelValues(w).Set(1)
	}
	m.devices.Set(float64(len(s.Devices)))
	if len(s.Devices) == 0 {
		m.noDevices.Set(1)
	} else {
		m.noDevices.Set(0)
	}
}

// ObserveScan counts a scan and records each discovered device's number of
// problems (all discovered devices, advertised or not); err non-nil counts a
// failed scan.
func (m *Metrics) ObserveScan(problems map[string]int, err error) {
	if m == nil {
		return
	}
	m.scans.Inc()
	if err != nil {
		m.discoveryErrors.Inc()
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.problems.Reset()
	for dev, n := range problems {
		m.problems.WithLabelValues(dev).Set(float64(n))
	}
}

// ObserveAllocation counts one container's allocation of units on a device.
func (m *Metrics) ObserveAllocation(device string, units int) {
	if m == nil {
		return
	}
	m.allocations.WithLabelValues(device).Inc()
	m.allocatedUnits.WithLabelValues(device).Add(float64(units))
}

// AllocateRefused counts a refused Allocate.
func (m *Metrics) AllocateRefused() {
	if m == nil {
		return
	}
	m.allocateRefused.Inc()
}

// ObserveRegistration records a registration attempt's outcome and the
// registered state that follows.
func (m *Metrics) ObserveRegistration(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.registrations.WithLabelValues("error").Inc()
		m.registered.Set(0)
		return
	}
	m.registrations.WithLabelValues("ok").Inc()
	m.registered.Set(1)
}

// SetUnregistered records that the registration is known lost (kubelet
// restarted, our socket removed, shutting down).
func (m *Metrics) SetUnregistered() {
	if m == nil {
		return
	}
	m.registered.Set(0)
}

// ObserveNodeUpdate records a node facts update's outcome.
func (m *Metrics) ObserveNodeUpdate(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.nodeUpdates.WithLabelValues("error").Inc()
		return
	}
	m.nodeUpdates.WithLabelValues("ok").Inc()
}
