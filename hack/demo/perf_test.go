package main

import (
	"strings"
	"testing"
)

func TestParseServerEvent(t *testing.T) {
	tests := []struct {
		line   string
		want   serverEvent
		wantOK bool
	}{
		{line: `{"event":"listening","addr":"127.0.0.1:33225","echo":true}`, want: serverEvent{Event: "listening", Addr: "127.0.0.1:33225", Echo: true}, wantOK: true},
		{line: `  {"event":"conn","remote":"127.0.0.1:4","mode":"tcp","fallbackReason":"peer_not_urma"}  `, want: serverEvent{Event: "conn", Remote: "127.0.0.1:4", Mode: "tcp", FallbackReason: "peer_not_urma"}, wantOK: true},
		{line: `"level"=0 "msg"="WARNING: RLIMIT_MEMLOCK is below the registered buffer pools"`},
		{line: `listening on 127.0.0.1:1 echo=true urma=true`},
		{line: `{"addr":"127.0.0.1:1"}`}, // no event
		{line: `{"event":`},
		{line: ``},
	}
	for _, tc := range tests {
		got, ok := parseServerEvent(tc.line)
		if ok != tc.wantOK || got != tc.want {
			t.Errorf("parseServerEvent(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.wantOK)
		}
	}
}

const urmaReportJSON = `{
  "server": "127.0.0.1:33225",
  "size": 4096,
  "responseSize": 4096,
  "concurrency": 2,
  "durationSeconds": 3.001,
  "requests": 9000,
  "qps": 2999.0,
  "sentBytesPerSec": 12283904,
  "receivedBytesPerSec": 12283904,
  "latencyMicros": {"avg": 600, "min": 80, "p50": 541.2, "p99": 1900, "p999": 4000, "max": 9000},
  "urmaConns": 1,
  "tcpConns": 1,
  "conns": [
    {"mode": "urma", "fabric": "shm", "handshakeVersion": 2, "local": "127.0.0.1:1", "requests": 6000},
    {"mode": "tcp", "fallbackReason": "jetty_budget_exhausted: 32 of 32 jetties in use", "local": "127.0.0.1:2", "requests": 3000}
  ]
}
`

func TestParsePerfReport(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{name: "report", in: urmaReportJSON},
		{name: "empty", in: "\n", wantErr: "no output"},
		{name: "text output", in: "urma-perf client: server=127.0.0.1:1 size=4096", wantErr: "not urma-perf client's JSON report"},
		{name: "unknown field, format changed", in: `{"qps": 1, "bandwidth": 2}`, wantErr: `unknown field "bandwidth"`},
		{name: "no connections", in: `{"requests": 5, "durationSeconds": 1, "conns": []}`, wantErr: "no connection"},
		{name: "counts disagree", in: `{"requests": 5, "durationSeconds": 1, "urmaConns": 2, "conns": [{"mode":"urma"}]}`, wantErr: "counts 2 urma, 0 tcp and 0 unix connections but lists 1"},
		{name: "nothing measured", in: `{"requests": 0, "durationSeconds": 3, "urmaConns": 1, "conns": [{"mode":"urma"}]}`, wantErr: "no request completed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parsePerfReport([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Size != 4096 || r.Concurrency != 2 || r.Requests != 9000 || r.SentBytesPerSec != 12283904 ||
				r.LatencyMicros.P50 != 541.2 || r.LatencyMicros.P99 != 1900 || len(r.Conns) != 2 ||
				r.Conns[1].FallbackReason == "" || r.Conns[0].HandshakeVersion != 2 {
				t.Fatalf("read %+v", r)
			}
		})
	}
}

func TestFormatPerf(t *testing.T) {
	urma, err := parsePerfReport([]byte(urmaReportJSON))
	if err != nil {
		t.Fatal(err)
	}
	tcp := perfReport{Size: 4096, Concurrency: 2, DurationSeconds: 3, Requests: 30000, QPS: 10000, SentBytesPerSec: 4096 * 10000,
		LatencyMicros: perfLatency{P50: 125, P99: 1250}, TCPConns: 2,
		Conns: []perfConnRep{{Mode: "tcp", FallbackReason: "urma_disabled: TCP-only", Requests: 15000}, {Mode: "tcp", FallbackReason: "urma_disabled: TCP-only", Requests: 15000, Error: "read: EOF"}}}

	tests := []struct {
		name    string
		u, t    perfReport
		want    []string
		notWant []string
	}{
		{
			name: "URMA with one fallback against TCP",
			u:    urma, t: tcp,
			want: []string{
				"4 KiB requests, echoed, 2 connection(s)",
				"1 urma + 1 tcp", "2999", "11.7 MiB/s", "541µs", "1.90ms",
				"2 tcp", "10000", "39.1 MiB/s", "125µs", "1.25ms",
				"conn 0: URMA (hello v2) on shm, 6000 requests",
				"conn 1: TCP, fell back: jetty_budget_exhausted: 32 of 32 jetties in use, 3000 requests",
				"error: read: EOF",
				"URMA throughput is 0.30x TCP's",
				"includes 1 connection(s) that fell back",
			},
		},
		{
			name:    "no URMA connection",
			u:       perfReport{Size: 64, TCPConns: 1, Conns: []perfConnRep{{Mode: "tcp", FallbackReason: "device_missing: no device soft0"}}, Requests: 1, DurationSeconds: 1},
			t:       tcp,
			want:    []string{"no connection ran on URMA", "fell back: device_missing: no device soft0"},
			notWant: []string{"throughput is"},
		},
		{
			name:    "TCP run moved nothing",
			u:       perfReport{Size: 64, URMAConns: 1, SentBytesPerSec: 10, Conns: []perfConnRep{{Mode: "urma"}}},
			t:       perfReport{TCPConns: 1, Conns: []perfConnRep{{Mode: "tcp"}}},
			want:    []string{"the TCP run moved no bytes"},
			notWant: []string{"throughput is", "Inf"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := formatPerf("URMA (soft)", tc.u, "TCP", tc.t)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("report lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("report should not contain %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestSmallFormatters(t *testing.T) {
	tests := []struct{ got, want string }{
		{formatMicros(71.4), "71µs"},
		{formatMicros(1250), "1.25ms"},
		{formatMicros(2.5e6), "2.50s"},
		{formatBytes(0), "0 B"},
		{formatBytes(1023), "1023 B"},
		{formatBytes(4096), "4 KiB"},
		{formatBytes(1536), "1.5 KiB"},
		{formatBytes(1 << 32), "4 GiB"},
		{formatBytes(5 << 40), "5 TiB"},
		{formatBytes(3 << 50), "3072 TiB"},
		{connSummary(perfReport{URMAConns: 4}), "4 urma"},
		{connSummary(perfReport{TCPConns: 4}), "4 tcp"},
		{connSummary(perfReport{URMAConns: 3, TCPConns: 1}), "3 urma + 1 tcp"},
		{describeModes(nil), "no connection"},
		{describeModes(map[string]int{"urma": 4, "tcp": 2}), "2 tcp and 4 urma connections"},
	}
	for i, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("case %d: got %q, want %q", i, tc.got, tc.want)
		}
	}
}
