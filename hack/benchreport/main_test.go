package main

import (
	"slices"
	"strings"
	"testing"
)

func TestReportComparesWithinSize(t *testing.T) {
	in := `goos: linux
BenchmarkMemcpy/size=4KiB-2         	 1000000	      100 ns/op	40000.00 MB/s	       0 B/op	       0 allocs/op
BenchmarkMemcpy/size=64KiB-2        	  100000	     2000 ns/op	32000.00 MB/s	       0 B/op	       0 allocs/op
BenchmarkRaw/fabric=inproc/size=4KiB-2 	  100000	     1000 ns/op	 4000.00 MB/s	      16 B/op	       1 allocs/op
BenchmarkRaw/fabric=inproc/size=64KiB-2	   10000	    20000 ns/op	 3200.00 MB/s	       0 B/op	       0 allocs/op
PASS
`
	results, failures, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(failures) != 0 || len(results) != 4 {
		t.Fatalf("got %d results, %d failures; want 4, 0", len(results), len(failures))
	}
	var b strings.Builder
	report(&b, results, []baseline{{label: "memcpy", prefix: "BenchmarkMemcpy"}})
	rows := map[string][]string{}
	for _, line := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = f[1:]
		}
	}
	tests := []struct {
		name string
		want string
	}{
		{"BenchmarkMemcpy/size=4KiB", "100 40000.0 0 0 baseline"},
		{"BenchmarkRaw/fabric=inproc/size=4KiB", "1000 4000.0 1 16 0.10x"},
		{"BenchmarkRaw/fabric=inproc/size=64KiB", "20000 3200.0 0 0 0.10x"},
	}
	for _, tt := range tests {
		if got := strings.Join(rows[tt.name], " "); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestParseKeepsFailures(t *testing.T) {
	_, failures, err := parse(strings.NewReader("--- FAIL: BenchmarkX\nFAIL\tpkg\t0.1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(failures) != 2 {
		t.Fatalf("failures = %q, want both FAIL lines", failures)
	}
}

func TestRatioFallsBackToTime(t *testing.T) {
	got := ratio(result{name: "a", nsPerOp: 50}, result{name: "b", nsPerOp: 100})
	if got != "2.00x" {
		t.Fatalf("ratio = %s, want 2.00x (half the time is twice as fast)", got)
	}
}

// TestParseNoticesAnUnfinishedRun: output without go test's closing status
// (PASS, ok or FAIL) is a run that was cut short, say go test killed or its
// output lost in the pipe: a failure, never an empty or partial report that
// passes.
func TestParseNoticesAnUnfinishedRun(t *testing.T) {
	const bench = "BenchmarkX/size=4KiB-2   \t 1000\t      100 ns/op\n"
	tests := []struct {
		name       string
		in         string
		unfinished bool
	}{
		{"ok", "goos: linux\n" + bench + "PASS\nok  \tpkg\t1.2s\n", false},
		{"test binary run alone", bench + "PASS\n", false},
		{"no benchmark matched", "PASS\nok  \tpkg\t0.1s\n", false},
		{"failed", bench + "--- FAIL: BenchmarkY\nFAIL\nFAIL\tpkg\t1.0s\n", false},
		{"cut short after a benchmark", "goos: linux\n" + bench, true},
		{"nothing at all", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, failures, err := parse(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			got := slices.ContainsFunc(failures, func(f string) bool { return strings.Contains(f, "did not finish") })
			if got != tc.unfinished {
				t.Fatalf("failures %q: unfinished %v, want %v", failures, got, tc.unfinished)
			}
		})
	}
}
