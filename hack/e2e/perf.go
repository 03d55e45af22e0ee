//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
	"github.com/openeuler/urma-k8s/hack/internal/proc"
)

// perfRun is one urma-perf client run and what it reported.
type perfRun struct {
	label, mode string
	report      perfjson.Report
	fabrics     []string // per connection, "" where the report names none
}

// providerRE finds the provider urma-perf logs once URMA is up, e.g.
// "URMA ready" ... "provider"="soft-socket".
var providerRE = regexp.MustCompile(`"URMA ready".*"provider"="([^"]+)"`)

// parsePerfRun decodes a client's --json report (stdout) and its log
// (stderr) and names what carried each connection: the connection's own
// "fabric" when urma-perf reports one, else its provider ("soft-shm",
// "soft-socket", "liburma": the software provider's name carries its
// fabric), else the provider the process logged when URMA came up.
func parsePerfRun(stdout, stderr string) (perfjson.Report, []string, error) {
	out := []byte(strings.TrimSpace(stdout))
	var rep perfjson.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		return rep, nil, fmt.Errorf("not urma-perf client's JSON report: %w", err)
	}
	var raw struct {
		Conns []map[string]any `json:"conns"`
	}
	if err := json.Unmarshal(out, &raw); err != nil {
		return rep, nil, fmt.Errorf("not urma-perf client's JSON report: %w", err)
	}
	provider := ""
	if m := providerRE.FindStringSubmatch(stderr); m != nil {
		provider = "provider " + m[1]
	}
	fabrics := make([]string, len(rep.Conns))
	for i, c := range rep.Conns {
		fabrics[i] = provider
		if c.Provider != "" {
			fabrics[i] = "provider " + c.Provider
		}
		if i < len(raw.Conns) {
			if f, ok := raw.Conns[i]["fabric"].(string); ok && f != "" {
				fabrics[i] = "fabric " + f
			}
		}
	}
	switch {
	case len(rep.Conns) == 0:
		return rep, fabrics, errors.New("the report lists no connection")
	case rep.Requests == 0:
		return rep, fabrics, errors.New("no request completed")
	}
	return rep, fabrics, nil
}

func (r *run) checkPerf(ctx context.Context) error {
	if r.serverIP == "" {
		return errors.New("no server pod IP: step 3 did not run")
	}
	return r.perfBetweenPods(ctx, "urma-perf pod to pod", clientPod, r.serverIP, "")
}

// perfBetweenPods runs urma-perf from pod client to the server at serverIP
// (perfRuns), requires URMA connections in the URMA run, on a fabric whose
// name holds fabric unless that is "", and notes the figures: the URMA run
// beside the TCP one, as a ratio.
func (r *run) perfBetweenPods(ctx context.Context, what, client, serverIP, fabric string) error {
	runs, err := r.perfRuns(ctx, client, serverIP)
	if err != nil {
		return err
	}
	u, t := runs[0].report, runs[1].report
	if u.URMAConns == 0 {
		return errors.New("no connection of the URMA run ran on URMA (fallback reasons above)")
	}
	for i, c := range u.Conns {
		if fabric != "" && c.Mode == "urma" && !strings.Contains(runs[0].fabrics[i], fabric) {
			return fmt.Errorf("URMA connection %d ran on %q, not the %s fabric", i, runs[0].fabrics[i], fabric)
		}
	}
	ratio := 0.0
	if t.SentBytesPerSec > 0 {
		ratio = u.SentBytesPerSec / t.SentBytesPerSec
	}
	r.note("%s: %d/%d connections on URMA (%s), %.1f MiB/s vs TCP %.1f MiB/s (%.2fx)",
		what, u.URMAConns, len(u.Conns), fabricSummary(runs[0]), u.SentBytesPerSec/(1<<20), t.SentBytesPerSec/(1<<20), ratio)
	return nil
}

// perfRuns runs urma-perf client in pod client against the server at
// serverIP, once over URMA (--mode auto), once over TCP, and prints both.
func (r *run) perfRuns(ctx context.Context, client, serverIP string) ([]*perfRun, error) {
	server := net.JoinHostPort(serverIP, strconv.Itoa(perfPort))
	runs := []*perfRun{{label: "URMA", mode: "auto"}, {label: "TCP", mode: "tcp"}}
	for _, pr := range runs {
		args := []string{"-n", testNS, "exec", client, "--", "/usr/local/bin/urma-perf", "client",
			"--server", server, "--size", "4096", "--concurrency", "4", "--duration", r.o.perfTime.String(),
			"--mode", pr.mode, "--json"}
		r.say("$ kubectl %s", strings.Join(args, " "))
		stdout, stderr, err := r.kubectl(ctx, args...)
		appendLog(filepath.Join(r.o.logs, client+"-"+pr.mode+".log"), stderr+stdout)
		if err != nil {
			return nil, err
		}
		if pr.report, pr.fabrics, err = parsePerfRun(stdout, stderr); err != nil {
			return nil, fmt.Errorf("%s run: %w\n%s%s", pr.label, err, stderr, stdout)
		}
	}
	r.say("%s", "\n"+proc.Indent(formatPerfRuns(runs), "    "))
	return runs, nil
}

// fabricSummary names the fabrics the URMA connections used.
func fabricSummary(pr *perfRun) string {
	seen := map[string]int{}
	for i, c := range pr.report.Conns {
		if c.Mode != "urma" {
			continue
		}
		f := pr.fabrics[i]
		if f == "" {
			f = "not reported"
		}
		seen[f]++
	}
	var parts []string
	for f, n := range seen {
		parts = append(parts, fmt.Sprintf("%s x%d", f, n))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// formatPerfRuns renders the runs side by side, then each connection.
func formatPerfRuns(runs []*perfRun) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tCONNS (urma/tcp)\tREQUESTS\tQPS\tMiB/s\tP50 µs\tP99 µs")
	for _, pr := range runs {
		rep := pr.report
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%.0f\t%.1f\t%.0f\t%.0f\n", pr.label, rep.URMAConns, rep.TCPConns, rep.Requests, rep.QPS,
			rep.SentBytesPerSec/(1<<20), rep.LatencyMicros.P50, rep.LatencyMicros.P99)
	}
	tw.Flush()
	for _, pr := range runs {
		for i, c := range pr.report.Conns {
			fabric := pr.fabrics[i]
			switch {
			case c.Mode != "urma":
				fabric = "-"
			case fabric == "":
				fabric = "not reported"
			}
			fmt.Fprintf(&b, "%s conn %d: %s, %s, %d requests", pr.label, i, strings.ToUpper(c.Mode), fabric, c.Requests)
			if c.FallbackReason != "" {
				fmt.Fprintf(&b, ", fell back: %s", c.FallbackReason)
			}
			if c.Error != "" {
				fmt.Fprintf(&b, ", error: %s", c.Error)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
