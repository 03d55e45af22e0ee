// Package metrics holds the Prometheus collectors of pkg/transport. They are
// registered on a Registerer the caller supplies (never the global one), and
// a nil *Metrics is valid and records nothing, so the data path never checks.
package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values. Modes and directions are fixed sets; fallback reasons are
// the transport's Reason codes, also a fixed set.
const (
	ModeURMA = "urma"
	ModeTCP  = "tcp"

	RoleClient = "client"
	RoleServer = "server"

	DirSent     = "sent"
	DirReceived = "received"

	WindowSQ       = "send_queue"
	WindowRemoteRQ = "remote_receive_queue"
	WindowPool     = "buffer_pool"

	ResultURMA     = "urma"
	ResultFallback = "fallback"
	ResultError    = "error"
)

// Metrics are the transport's collectors.
type Metrics struct {
	connsOpen      *prometheus.GaugeVec
	connsTotal     *prometheus.CounterVec
	fallbacks      *prometheus.CounterVec
	bytes          *prometheus.CounterVec
	messages       *prometheus.CounterVec
	windowStalls   *prometheus.CounterVec
	protocolErrors prometheus.Counter
	foreign        *prometheus.CounterVec
	tokenless      *prometheus.CounterVec
	handshake      *prometheus.HistogramVec
	resources      *resourceCollector
	fabricConns    *prometheus.CounterVec
}

// New creates the collectors and registers them on reg. A collector that is
// already registered (a second Listener on the same registry) is reused, so
// several Listeners and Dialers can share one registry.
func New(reg prometheus.Registerer) (*Metrics, error) {
	const ns, sub = "urma", "transport"
	m := &Metrics{
		connsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "conns",
			Help: "Open connections by data-plane mode (urma or tcp) and role.",
		}, []string{"mode", "role"}),
		connsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "conns_total",
			Help: "Connections established, by data-plane mode and role.",
		}, []string{"mode", "role"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "fallbacks_total",
			Help: "Connections that fell back to TCP, by reason.",
		}, []string{"reason", "role"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "bytes_total",
			Help: "Payload bytes moved by connections, by direction and mode.",
		}, []string{"direction", "mode"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "messages_total",
			Help: "URMA data messages (send work requests) by direction.",
		}, []string{"direction"}),
		windowStalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "window_stalls_total",
			Help: "Times a writer had to wait because a window or the buffer pool was empty.",
		}, []string{"window"}),
		protocolErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "protocol_errors_total",
			Help: "Connections closed because the peer broke the data-plane protocol (bad credit, bad completion).",
		}),
		foreign: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "foreign_messages_total",
			Help: "URMA messages a connection dropped, by role, because they came from a jetty other than its peer's: another client's, or one whose connection ended.",
		}, []string{"role"}),
		tokenless: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "tokenless_connections_total",
			Help: "URMA connections whose jetty takes messages without a token: peers that cannot present one (brpc), or Config.NoToken.",
		}, []string{"role"}),
		handshake: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "handshake_seconds",
			Help:    "Duration of the TCP control-plane handshake, by result (urma, fallback, error) and role.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"result", "role"}),
		resources: newResourceCollector(ns, sub),
		fabricConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "fabric_conns_total",
			Help: "URMA connections established, by what carries their bytes (shm or socket for the software provider, else the provider's name) and role.",
		}, []string{"fabric", "role"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if err := m.adopt(c, are.ExistingCollector); err != nil {
					return nil, err
				}
				continue
			}
			return nil, fmt.Errorf("register transport metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.connsOpen, m.connsTotal, m.fallbacks, m.bytes, m.messages, m.windowStalls,
		m.protocolErrors, m.foreign, m.tokenless, m.handshake, m.resources, m.fabricConns,
	}
}

// adopt swaps our fresh collector c for the one already registered.
func (m *Metrics) adopt(c, existing prometheus.Collector) error {
	ok := true
	swap := func(dst any) {
		switch d := dst.(type) {
		case **prometheus.GaugeVec:
			*d, ok = existing.(*prometheus.GaugeVec)
		case **prometheus.CounterVec:
			*d, ok = existing.(*prometheus.CounterVec)
		case **prometheus.HistogramVec:
			*d, ok = existing.(*prometheus.HistogramVec)
		case *prometheus.Gauge:
			*d, ok = existing.(prometheus.Gauge)
		case *prometheus.Counter:
			*d, ok = existing.(prometheus.Counter)
		case **resourceCollector:
			*d, ok = existing.(*resourceCollector)
		}
	}
	switch c {
	case m.connsOpen:
		swap(&m.connsOpen)
	case m.connsTotal:
		swap(&m.connsTotal)
	case m.fallbacks:
		swap(&m.fallbacks)
	case m.bytes:
		swap(&m.bytes)
	case m.messages:
		swap(&m.messages)
	case m.windowStalls:
		swap(&m.windowStalls)
	case m.protocolErrors:
		swap(&m.protocolErrors)
	case m.foreign:
		swap(&m.foreign)
	case m.tokenless:
		swap(&m.tokenless)
	case m.handshake:
		swap(&m.handshake)
	case m.resources:
		swap(&m.resources)
	case m.fabricConns:
		swap(&m.fabricConns)
	}
	if !ok {
		return fmt.Errorf("register transport metrics: a different collector already uses the name of %v", c)
	}
	return nil
}

// ConnOpened counts an established connection in mode for role.
func (m *Metrics) ConnOpened(mode, role string) {
	if m == nil {
		return
	}
	m.connsOpen.WithLabelValues(mode, role).Inc()
	m.connsTotal.WithLabelValues(mode, role).Inc()
}

// FabricConn counts an established URMA connection by its fabric.
func (m *Metrics) FabricConn(fabric, role string) {
	if m == nil {
		return
	}
	m.fabricConns.WithLabelValues(fabric, role).Inc()
}

// ConnClosed counts a connection going away.
func (m *Metrics) ConnClosed(mode, role string) {
	if m == nil {
		return
	}
	m.connsOpen.WithLabelValues(mode, role).Dec()
}

// Fallback counts a connection that fell back to TCP for reason.
func (m *Metrics) Fallback(reason, role string) {
	if m == nil {
		return
	}
	m.fallbacks.WithLabelValues(reason, role).Inc()
}

// Handshake observes a handshake's duration in seconds.
func (m *Metrics) Handshake(result, role string, seconds float64) {
	if m == nil {
		return
	}
	m.handshake.WithLabelValues(result, role).Observe(seconds)
}

// TokenlessConn counts a URMA connection established for role whose jetty
// takes messages without a token.
func (m *Metrics) TokenlessConn(role string) {
	if m == nil {
		return
	}
	m.tokenless.WithLabelValues(role).Inc()
}

// ForeignMessages counts n messages a connection of role dropped because
// they did not come from its peer's jetty.
func (m *Metrics) ForeignMessages(role string, n int) {
	if m == nil {
		return
	}
	m.foreign.WithLabelValues(role).Add(float64(n))
}

// ProtocolError counts a connection closed for a protocol violation.
func (m *Metrics) ProtocolError() {
	if m == nil {
		return
	}
	m.protocolErrors.Inc()
}

// DataCounters are the per-direction counters a connection bumps on its
// data path; resolved once per connection so the hot path does no label
// lookups.
type DataCounters struct {
	BytesSent, BytesReceived       prometheus.Counter
	MessagesSent, MessagesReceived prometheus.Counter
	StallSQ, StallRemoteRQ         prometheus.Counter
	StallPool                      prometheus.Counter
}

// discard is a counter that goes nowhere, for a nil *Metrics.
type discard struct{ prometheus.Counter }

func (discard) Inc()        {}
func (discard) Add(float64) {}

// Data returns the data-path counters for a connection in mode.
func (m *Metrics) Data(mode string) DataCounters {
	if m == nil {
		d := discard{}
		return DataCounters{d, d, d, d, d, d, d}
	}
	return DataCounters{
		BytesSent:        m.bytes.WithLabelValues(DirSent, mode),
		BytesReceived:    m.bytes.WithLabelValues(DirReceived, mode),
		MessagesSent:     m.messages.WithLabelValues(DirSent),
		MessagesReceived: m.messages.WithLabelValues(DirReceived),
		StallSQ:          m.windowStalls.WithLabelValues(WindowSQ),
		StallRemoteRQ:    m.windowStalls.WithLabelValues(WindowRemoteRQ),
		StallPool:        m.windowStalls.WithLabelValues(WindowPool),
	}
}

// AddResourceSource adds a source of resource gauges (one per Listener or
// Dialer); the gauges report the sum over every source on the registry. The
// returned func removes it, once no call of f is in flight: after it the
// owner may tear down what f reads. f must not call into the Metrics.
func (m *Metrics) AddResourceSource(f func() ResourceStats) (remove func()) {
	if m == nil {
		return func() {}
	}
	return m.resources.add(f)
}

// Memlock records the RLIMIT_MEMLOCK soft limit (-1: unlimited) and returns
// what must fit under it: the bytes the resource sources on the registry
// have registered together (ResourceStats.PoolBytes), and how many sources
// registered any. The shortfall gauge is computed from the same sum at
// scrape time, so that a source that goes away no longer counts.
func (m *Metrics) Memlock(limit int64) (poolBytes int64, pools int) {
	if m == nil {
		return 0, 0
	}
	return m.resources.setMemlockLimit(limit)
}
