// Command benchreport reads `go test -bench` output on stdin and prints every
// benchmark beside the baselines measured in the same run, as ratios.
//
// Benchmarks are grouped by their size=... name component. For each size the
// baselines are the first benchmark whose name starts with each -baseline
// prefix (for example memcpy, TCP loopback and the raw provider); a figure is
// never compared with a baseline from another run or another size.
//
// It exits 1 when the output shows a failure (FAIL, --- FAIL, panic) or
// ends without go test's closing PASS, ok or FAIL line: make's pipe from go
// test ends with benchreport's status, so a run cut short must fail here.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
)

// result is one benchmark line.
type result struct {
	name        string
	size        string
	nsPerOp     float64
	mbPerSec    float64 // 0 when the benchmark did not call SetBytes
	allocsPerOp float64 // -1 when not reported
	bytesPerOp  float64 // -1 when not reported
}

type baseline struct {
	label, prefix string
}

type baselineFlags []baseline

func (b *baselineFlags) String() string { return fmt.Sprint(*b) }

func (b *baselineFlags) Set(v string) error {
	label, prefix, ok := strings.Cut(v, "=")
	if !ok || label == "" || prefix == "" {
		return fmt.Errorf("baseline %q: want label=BenchmarkNamePrefix", v)
	}
	*b = append(*b, baseline{label: label, prefix: prefix})
	return nil
}

var (
	benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)
	sizePart  = regexp.MustCompile(`(?:^|/)size=([^/]+)`)
)

func parse(r io.Reader) ([]result, []string, error) {
	var out []result
	var passthrough []string
	finished := false // go test's closing status was seen
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "PASS" || line == "FAIL" || strings.HasPrefix(line, "ok ") || strings.HasPrefix(line, "FAIL\t") {
			finished = true
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "panic") {
				passthrough = append(passthrough, line)
			}
			continue
		}
		res := result{name: m[1], allocsPerOp: -1, bytesPerOp: -1}
		if s := sizePart.FindStringSubmatch(res.name); s != nil {
			res.size = s[1]
		}
		fields := strings.Fields(m[2])
		for i := 0; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
			}
			switch fields[i+1] {
			case "ns/op":
				res.nsPerOp = v
			case "MB/s":
				res.mbPerSec = v
			case "allocs/op":
				res.allocsPerOp = v
			case "B/op":
				res.bytesPerOp = v
			}
		}
		out = append(out, res)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read benchmark output: %w", err)
	}
	if !finished {
		// go test was killed, or its output lost: what came is not a run.
		passthrough = append(passthrough, "the benchmark output ends without go test's PASS, ok or FAIL line: the run did not finish")
	}
	return out, passthrough, nil
}

// ratio compares two results: throughput when both have it, otherwise the
// inverse of time per op, so that above 1 always means "faster than baseline".
func ratio(r, base result) string {
	if r.name == base.name {
		return "baseline"
	}
	if r.mbPerSec > 0 && base.mbPerSec > 0 {
		return fmt.Sprintf("%.2fx", r.mbPerSec/base.mbPerSec)
	}
	if r.nsPerOp > 0 && base.nsPerOp > 0 {
		return fmt.Sprintf("%.2fx", base.nsPerOp/r.nsPerOp)
	}
	return "-"
}

func report(w io.Writer, results []result, baselines []baseline) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := []string{"benchmark", "ns/op", "MB/s", "allocs/op", "B/op"}
	for _, b := range baselines {
		header = append(header, "vs "+b.label)
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range results {
		row := []string{r.name, fmt.Sprintf("%.0f", r.nsPerOp), num(r.mbPerSec, "%.1f"), num(r.allocsPerOp, "%.0f"), num(r.bytesPerOp, "%.0f")}
		for _, b := range baselines {
			base, ok := find(results, b.prefix, r.size)
			if !ok {
				row = append(row, "-")
				continue
			}
			row = append(row, ratio(r, base))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
}

func num(v float64, format string) string {
	if v < 0 || (v == 0 && format == "%.1f") {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

func find(results []result, prefix, size string) (result, bool) {
	for _, r := range results {
		if strings.HasPrefix(r.name, prefix) && r.size == size {
			return r, true
		}
	}
	return result{}, false
}

func main() {
	var baselines baselineFlags
	flag.Var(&baselines, "baseline", "label=BenchmarkNamePrefix of a baseline, matched per size= (repeatable)")
	flag.Parse()
	results, failures, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	report(os.Stdout, results, baselines)
	for _, f := range failures {
		fmt.Fprintln(os.Stderr, f)
	}
	if len(failures) > 0 {
		os.Exit(1)
	}
}
