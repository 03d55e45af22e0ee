package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
	"github.com/openeuler/urma-k8s/hack/internal/proc"
)

// softDevice is the device the device plugin's --soft-devices advertises
// first, and the one the software provider creates.
const softDevice = "soft0"

// urma-perf's --json output, decoded with urma-perf's own types.
type (
	perfReport  = perfjson.Report
	perfLatency = perfjson.Latency
	perfConnRep = perfjson.ConnReport
	serverEvent = perfjson.ServerEvent
)

// parseServerEvent reads one line of the server's output; ok is false for
// lines that are not events.
func parseServerEvent(line string) (serverEvent, bool) {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "{") {
		return serverEvent{}, false
	}
	var e serverEvent
	if err := json.Unmarshal([]byte(line), &e); err != nil || e.Event == "" {
		return serverEvent{}, false
	}
	return e, true
}

// parsePerfReport reads a client's --json output and checks it describes a
// run that measured something.
func parsePerfReport(b []byte) (perfReport, error) {
	var r perfReport
	dec := json.NewDecoder(bytes.NewReader(bytes.TrimSpace(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		if len(bytes.TrimSpace(b)) == 0 {
			return perfReport{}, errors.New("no output")
		}
		return perfReport{}, fmt.Errorf("not urma-perf client's JSON report: %w", err)
	}
	switch {
	case len(r.Conns) == 0:
		return r, errors.New("the report lists no connection")
	case r.URMAConns+r.TCPConns+r.UnixConns != len(r.Conns):
		return r, fmt.Errorf("the report counts %d urma, %d tcp and %d unix connections but lists %d", r.URMAConns, r.TCPConns, r.UnixConns, len(r.Conns))
	case r.Requests == 0 || r.DurationSeconds <= 0:
		return r, fmt.Errorf("no request completed (%d requests in %.2fs)", r.Requests, r.DurationSeconds)
	}
	return r, nil
}

// runPerf runs urma-perf's echo server and two client runs against it, one
// over URMA (software provider) with the operator's flags and one over TCP,
// and prints them side by side.
func (d *demo) runPerf(ctx context.Context) error {
	if d.flagsFile == "" {
		return errors.New("no rendered flags file: the operator step did not run")
	}
	// What a pod given the endpoint's ConfigMap and a jetty allocation from a
	// --soft-devices node gets (the device plugin's Allocate, the operator's
	// webhook).
	env := []string{
		"URMA_FLAGS_FILE=" + d.flagsFile,
		"URMA_PROVIDER=soft",
		"URMA_DEVICE=" + softDevice,
		"URMA_JETTY_BUDGET=" + strconv.Itoa(demoJettyBudget),
	}
	fmt.Fprintf(d.out, "    environment of both processes (as the device plugin and the operator set it in a pod):\n%s\n", proc.Indent(strings.Join(env, "\n"), "      "))
	serverArgs := []string{"server", "--listen", "127.0.0.1:0", "--echo", "--json"}
	fmt.Fprintf(d.out, "    $ %s %s &\n", binPerf, strings.Join(serverArgs, " "))
	srv, err := d.start("perf-server", binPerf, serverArgs, env)
	if err != nil {
		return err
	}
	var listenFallback string
	addr, err := srv.WaitLine(ctx, 30*time.Second, "its listen address", func(l string) (string, bool) {
		e, ok := parseServerEvent(l)
		if !ok || e.Event != "listening" || e.Addr == "" {
			return "", false
		}
		listenFallback = e.FallbackReason
		return e.Addr, true
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "    server listening on %s\n", addr)
	if listenFallback != "" {
		fmt.Fprintf(d.out, "    WARNING: the server serves every connection over TCP: %s\n", listenFallback)
	}

	runs := []struct {
		label, mode string
	}{
		{"URMA (soft)", "auto"}, // auto, not urma: a fallback is reported with its reason rather than failing the run
		{"TCP", "tcp"},
	}
	reports := make([]perfReport, len(runs))
	for i, r := range runs {
		args := []string{"client", "--server", addr, "--size", strconv.Itoa(d.o.size),
			"--concurrency", strconv.Itoa(d.o.concurrency), "--duration", d.o.duration.String(), "--mode", r.mode, "--json"}
		fmt.Fprintf(d.out, "    $ %s %s\n", binPerf, strings.Join(args, " "))
		c, err := d.start("perf-client-"+r.mode, binPerf, args, env)
		if err != nil {
			return err
		}
		out, err := c.Wait(ctx, d.o.duration+time.Minute)
		if err != nil {
			return err
		}
		if reports[i], err = parsePerfReport(out); err != nil {
			return fmt.Errorf("read %s client's report: %w%s", r.label, err, c.LogTail())
		}
	}
	srv.Stop()
	serverModes := map[string]int{}
	lines := srv.Lines()
	for _, l := range lines {
		if e, ok := parseServerEvent(l); ok && e.Event == "conn" {
			serverModes[e.Mode]++
		}
	}

	fmt.Fprintf(d.out, "\n%s", proc.Indent(formatPerf(runs[0].label, reports[0], runs[1].label, reports[1]), "    ")+"\n")
	fmt.Fprintf(d.out, "    the server saw %s\n", describeModes(serverModes))
	if reports[0].URMAConns == 0 {
		return fmt.Errorf("no connection of the URMA run ran on URMA (reasons above); see docs/transport.md, troubleshooting")
	}
	return nil
}

// describeModes renders connection counts by mode: "4 urma and 4 tcp connections".
func describeModes(m map[string]int) string {
	if len(m) == 0 {
		return "no connection"
	}
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, " and ") + " connections"
}

// formatPerf renders the final report: each run's connections and their
// mode (with the fallback reason of any that fell back), QPS, throughput
// and latency, and URMA's throughput as a ratio of TCP's.
func formatPerf(urmaLabel string, u perfReport, tcpLabel string, t perfReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "RESULTS: %s requests, echoed, %d connection(s), %.1fs per run, both runs against the same server\n\n",
		formatBytes(float64(u.Size)), u.Concurrency, u.DurationSeconds)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "RUN\tCONNECTIONS\tREQUESTS\tQPS\tTHROUGHPUT\tP50\tP99\t")
	for _, r := range []struct {
		label string
		rep   perfReport
	}{{urmaLabel, u}, {tcpLabel, t}} {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s/s\t%s\t%s\t\n", r.label, connSummary(r.rep), r.rep.Requests, r.rep.QPS,
			formatBytes(r.rep.SentBytesPerSec), formatMicros(r.rep.LatencyMicros.P50), formatMicros(r.rep.LatencyMicros.P99))
	}
	tw.Flush()
	b.WriteString("\n")
	for _, r := range []struct {
		label string
		rep   perfReport
	}{{urmaLabel, u}, {tcpLabel, t}} {
		fmt.Fprintf(&b, "%s connections:\n", r.label)
		for i, c := range r.rep.Conns {
			fmt.Fprintf(&b, "  conn %d: %s", i, strings.ToUpper(c.Mode))
			if c.HandshakeVersion != 0 {
				fmt.Fprintf(&b, " (hello v%d)", c.HandshakeVersion)
			}
			if c.Fabric != "" {
				fmt.Fprintf(&b, " on %s", c.Fabric)
			}
			if c.FallbackReason != "" {
				fmt.Fprintf(&b, ", fell back: %s", c.FallbackReason)
			}
			fmt.Fprintf(&b, ", %d requests", c.Requests)
			if c.Error != "" {
				fmt.Fprintf(&b, ", error: %s", c.Error)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n")
	switch {
	case u.URMAConns == 0:
		fmt.Fprintf(&b, "no connection ran on URMA: nothing to compare with TCP\n")
	case t.SentBytesPerSec <= 0:
		fmt.Fprintf(&b, "the TCP run moved no bytes: no ratio\n")
	default:
		ratio := u.SentBytesPerSec / t.SentBytesPerSec
		fmt.Fprintf(&b, "URMA throughput is %.2fx TCP's (%s/s vs %s/s each way, same machine, same run)\n",
			ratio, formatBytes(u.SentBytesPerSec), formatBytes(t.SentBytesPerSec))
		if u.TCPConns > 0 {
			fmt.Fprintf(&b, "(the URMA run includes %d connection(s) that fell back to TCP)\n", u.TCPConns)
		}
	}
	return b.String()
}

// connSummary counts a run's connections by mode: "4 urma", "3 urma + 1 tcp".
func connSummary(r perfReport) string {
	switch {
	case r.TCPConns == 0:
		return fmt.Sprintf("%d urma", r.URMAConns)
	case r.URMAConns == 0:
		return fmt.Sprintf("%d tcp", r.TCPConns)
	}
	return fmt.Sprintf("%d urma + %d tcp", r.URMAConns, r.TCPConns)
}

// formatMicros prints a latency given in microseconds: "71µs", "1.25ms".
func formatMicros(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%.2fs", us/1e6)
	case us >= 1000:
		return fmt.Sprintf("%.2fms", us/1000)
	}
	return fmt.Sprintf("%.0fµs", us)
}
