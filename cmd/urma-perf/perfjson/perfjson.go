// Package perfjson is urma-perf's --json output format: the client's Report
// and the server's event lines. It is a package of its own so that readers
// of that output (hack/demo) decode the very types urma-perf writes.
package perfjson

// MaxSize is the largest request urma-perf sends or serves (client
// --size), so Report.Size never exceeds it; programs that drive urma-perf
// check their sizes against it before they start.
const MaxSize = 64 << 20

// ConnReport describes one client connection.
type ConnReport struct {
	Mode string `json:"mode"`
	// Provider and Device say what carries a URMA connection: provider
	// "liburma" is UB hardware, "soft-*" the software provider.
	Provider string `json:"provider,omitempty"`
	Device   string `json:"device,omitempty"`
	// Fabric is what carries the bytes: "shm" or "socket" for the software
	// provider's fabrics, else the provider's name.
	Fabric           string `json:"fabric,omitempty"`
	FallbackReason   string `json:"fallbackReason,omitempty"`
	HandshakeVersion int    `json:"handshakeVersion,omitempty"`
	Local            string `json:"local"`
	Requests         uint64 `json:"requests"`
	Error            string `json:"error,omitempty"`
}

// Latency is in microseconds.
type Latency struct {
	Avg  float64 `json:"avg"`
	Min  float64 `json:"min"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// Report is the client's result; --json prints it as is.
type Report struct {
	Server string `json:"server"`
	// Protocol is "grpc" for gRPC health checks (client --grpc); empty
	// for urma-perf's own requests.
	Protocol     string `json:"protocol,omitempty"`
	Size         int    `json:"size"`
	ResponseSize int    `json:"responseSize"`
	Concurrency  int    `json:"concurrency"`
	Pipeline     int    `json:"pipeline"` // requests outstanding per connection
	Ack          bool   `json:"ack,omitempty"`
	// SendZeroCopy: the client built its requests in the transport's
	// buffers (--send-zerocopy) instead of writing them from a slice.
	SendZeroCopy        bool         `json:"sendZeroCopy,omitempty"`
	DurationSeconds     float64      `json:"durationSeconds"`
	Requests            uint64       `json:"requests"`
	QPS                 float64      `json:"qps"`
	SentBytesPerSec     float64      `json:"sentBytesPerSec"`
	ReceivedBytesPerSec float64      `json:"receivedBytesPerSec"`
	LatencyMicros       Latency      `json:"latencyMicros"`
	URMAConns           int          `json:"urmaConns"`
	TCPConns            int          `json:"tcpConns"`  // transport connections that fell back to TCP, or --mode tcp
	UnixConns           int          `json:"unixConns"` // --mode unix: plain Unix domain sockets, not the transport
	Conns               []ConnReport `json:"conns"`
}

// ServerEvent is one line of the server's output (JSON with --json).
type ServerEvent struct {
	Event          string `json:"event"` // listening, conn, closed
	Addr           string `json:"addr,omitempty"`
	Unix           string `json:"unix,omitempty"` // the --unix socket, if any
	Remote         string `json:"remote,omitempty"`
	Mode           string `json:"mode,omitempty"`
	Provider       string `json:"provider,omitempty"` // as ConnReport's
	Device         string `json:"device,omitempty"`
	Fabric         string `json:"fabric,omitempty"`
	FallbackReason string `json:"fallbackReason,omitempty"`
	Echo           bool   `json:"echo,omitempty"`
	Protocol       string `json:"protocol,omitempty"` // perf, plain or grpc
	// RecvZeroCopy says the server took this connection's requests in
	// place (the client's --recv-zerocopy, on a transport connection).
	RecvZeroCopy bool   `json:"recvZeroCopy,omitempty"`
	BytesIn      uint64 `json:"bytesIn,omitempty"`
	BytesOut     uint64 `json:"bytesOut,omitempty"`
	// MessagesIn and DirectReads are a transport connection's messages
	// received, and of them those placed straight into a Read's slice
	// (urma_read_direct).
	MessagesIn  uint64 `json:"messagesIn,omitempty"`
	DirectReads uint64 `json:"directReads,omitempty"`
	Error       string `json:"error,omitempty"`
}

// StreamReport is one line of `urma-perf stream`: the counts since the
// stream started, printed every interval and once more at the end (Final).
// A program watching a workload through a disruption compares two lines.
type StreamReport struct {
	Time           string  `json:"time"` // RFC 3339, UTC, nanoseconds
	ElapsedSeconds float64 `json:"elapsedSeconds"`
	// Requests answered in all, and since the line before.
	Requests         uint64 `json:"requests"`
	IntervalRequests uint64 `json:"intervalRequests"`
	// Open is the connections open now, of Concurrency.
	Open        int `json:"open"`
	Concurrency int `json:"concurrency"`
	// Dials are the connections made (header exchanged); of them URMADials
	// ran on URMA and TCPDials fell back (or --mode tcp). Redials are the
	// planned ones (--redial), Reconnects those after a failure.
	Dials      uint64 `json:"dials"`
	URMADials  uint64 `json:"urmaDials"`
	TCPDials   uint64 `json:"tcpDials"`
	Redials    uint64 `json:"redials"`
	Reconnects uint64 `json:"reconnects"`
	// Errors counts failed dials and connections that failed in use; the
	// last one is LastError.
	Errors             uint64 `json:"errors"`
	LastError          string `json:"lastError,omitempty"`
	LastFallbackReason string `json:"lastFallbackReason,omitempty"`
	// Fabric is what carried the last URMA connection made ("shm",
	// "socket", or the provider's name).
	Fabric string `json:"fabric,omitempty"`
	Final  bool   `json:"final,omitempty"`
}
