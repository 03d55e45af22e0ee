package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
)

// envFake makes the test binary play urma-perf (fakeURMAPerf); envFailSize
// is the --size its client then fails on; envFabric, when set, is the
// fabric its urma connections report; envArgsLog is a file each run of it
// appends its arguments to, one line per run.
const (
	envFake     = "PERFCOMPARE_TEST_FAKE_URMA_PERF"
	envFailSize = "PERFCOMPARE_TEST_FAIL_SIZE"
	envFabric   = "PERFCOMPARE_TEST_FABRIC"
	envArgsLog  = "PERFCOMPARE_TEST_ARGS_LOG"
)

func TestMain(m *testing.M) {
	if os.Getenv(envFake) == "1" {
		os.Exit(fakeURMAPerf(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeURMAPerf answers as urma-perf would, in no time: a server that says
// it listens and waits for its signal; a client that prints a report of
// its --mode, or fails on the --size envFailSize names. Its throughput
// tells the socket fabric's modes apart: 100 MB/s, 80 on the socket
// fabric, 90 there reading in place, 95 with requests built in place too.
func fakeURMAPerf(args []string) int {
	if len(args) == 0 {
		return 2
	}
	if log := os.Getenv(envArgsLog); log != "" {
		f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return 3
		}
		_, err = fmt.Fprintln(f, strings.Join(args, " "))
		if f.Close() != nil || err != nil {
			return 3
		}
	}
	switch args[0] {
	case "server":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		fmt.Println(`{"event":"listening","addr":"127.0.0.1:1"}`)
		<-ctx.Done()
		return 0
	case "client":
		mode, size := "", 0
		for i := 1; i+1 < len(args); i++ {
			switch args[i] {
			case "--mode":
				mode = args[i+1]
			case "--size":
				size, _ = strconv.Atoi(args[i+1])
			}
		}
		if fail := os.Getenv(envFailSize); fail != "" && fail == strconv.Itoa(size) {
			fmt.Fprintln(os.Stderr, "urma-perf client: a connection failed: read: connection reset by peer")
			return 1
		}
		c := perfjson.ConnReport{Mode: mode}
		tput := 100e6
		if mode == "urma" {
			c.Fabric = "shm"
			if slices.Contains(args, socketFabric) {
				c.Fabric = "socket"
				tput = 80e6
				if slices.Contains(args, "--recv-zerocopy") {
					tput = 90e6
				}
				if slices.Contains(args, "--send-zerocopy") {
					tput = 95e6
				}
			}
			if f := os.Getenv(envFabric); f != "" {
				c.Fabric = f
			}
		}
		b, _ := json.Marshal(perfjson.Report{Size: size, Requests: 1000, QPS: 1000, SentBytesPerSec: tput,
			LatencyMicros: perfjson.Latency{P50: 10, P99: 20}, Conns: []perfjson.ConnReport{c}})
		fmt.Println(string(b))
		return 0
	}
	return 2
}

// TestRunFailureKeepsMeasuredRows: when a later figure fails, the rows
// measured before it are printed with the error, not lost in the table's
// buffer.
func TestRunFailureKeepsMeasuredRows(t *testing.T) {
	t.Setenv(envFake, "1")
	t.Setenv(envFailSize, "4096")
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err = run(context.Background(), &out, bin, []int{64, 4096}, measurement{duration: time.Millisecond, rounds: 1})
	if err == nil || !strings.Contains(err.Error(), "size 4096") || !strings.Contains(err.Error(), "connection reset by peer") {
		t.Fatalf("run error %v, want the 4096-byte figure's failure", err)
	}
	var rows []string
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "64B" {
			rows = append(rows, f[1])
		}
	}
	if !slices.Equal(rows, []string{"event", "polling"}) {
		t.Fatalf("rows of 64B printed: %v, want event and polling; output:\n%s", rows, out.String())
	}
}

func TestParseSizes(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		ok   bool
	}{
		{"64,4096, 65536", []int{64, 4096, 65536}, true},
		{"1048576", []int{1 << 20}, true},
		{"64,,4096", nil, false},
		{"0", nil, false},
		{"-5", nil, false},
		{"4k", nil, false},
		{"67108864", []int{64 << 20}, true},
		{"64,67108865", nil, false}, // beyond urma-perf's --size
		{"99999999999999999999", nil, false},
	}
	for _, tc := range tests {
		got, err := parseSizes(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parseSizes(%q): error %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("parseSizes(%q) = %v, want %v", tc.in, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("parseSizes(%q) = %v, want %v", tc.in, got, tc.want)
			}
		}
	}
}

func TestSizeNameAndRatio(t *testing.T) {
	for n, want := range map[int]string{64: "64B", 4096: "4KiB", 65536: "64KiB", 1 << 20: "1MiB", 1500: "1500B", 3 << 20: "3MiB"} {
		if got := sizeName(n); got != want {
			t.Errorf("sizeName(%d) = %q, want %q", n, got, want)
		}
	}
	for _, tc := range []struct {
		a, b float64
		want string
	}{{300, 100, "3.00x"}, {50, 200, "0.25x"}, {0, 100, "-"}, {100, 0, "-"}} {
		if got := ratio(tc.a, tc.b); got != tc.want {
			t.Errorf("ratio(%v, %v) = %q, want %q", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestTail(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{{"a\nb\nc\n", 2, "b\nc"}, {"a\nb", 5, "a\nb"}, {"", 3, ""}} {
		if got := tail(tc.in, tc.n); got != tc.want {
			t.Errorf("tail(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// TestPrintGRPC: the gRPC table puts each completion mode's figures beside
// TCP's as ratios: calls per second faster above 1, latencies below.
func TestPrintGRPC(t *testing.T) {
	fig := func(tcp, urma float64) figures {
		return figures{
			mbps: map[string]float64{"tcp": tcp, "unix": tcp, "urma": urma},
			p50:  map[string]float64{"tcp": 1e6 / tcp, "unix": 1e6 / tcp, "urma": 1e6 / urma},
			p99:  map[string]float64{"tcp": 4e6 / tcp, "unix": 4e6 / tcp, "urma": 4e6 / urma},
		}
	}
	var b strings.Builder
	if err := printGRPC(&b, fig(1000, 4000), fig(1000, 500)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a title, a header and two rows, got:\n%s", b.String())
	}
	for _, tc := range []struct {
		line int
		want []string
	}{
		{2, []string{"event", "4000", "4.00x", "0.25x"}},
		{3, []string{"polling", "500", "0.50x", "2.00x"}},
	} {
		f := strings.Fields(lines[tc.line])
		for _, w := range tc.want {
			if !slices.Contains(f, w) {
				t.Errorf("row %q lacks %q", lines[tc.line], w)
			}
		}
	}
}

// TestPollingRunsMeasureOnlyTheTransport: a polling run leaves out TCP and
// the Unix socket, which do not poll, and shows the event run's figures
// for them instead.
func TestPollingRunsMeasureOnlyTheTransport(t *testing.T) {
	if got := modesOf(modes, false); !slices.Equal(got, modes) {
		t.Errorf("event run measures %v, want %v", got, modes)
	}
	if got, want := modesOf(modes, true), []string{"urma", urma1Copy}; !slices.Equal(got, want) {
		t.Errorf("polling run measures %v, want %v", got, want)
	}
	if got, want := modesOf(grpcModes, true), []string{"urma"}; !slices.Equal(got, want) {
		t.Errorf("polling gRPC run measures %v, want %v", got, want)
	}
	if len(modes) != 4 || modes[0] != "tcp" {
		t.Fatalf("modesOf changed the list it was given: %v", modes)
	}
	event := figures{mbps: map[string]float64{"tcp": 1, "unix": 2, "urma": 3}, p50: map[string]float64{"tcp": 4, "unix": 5}, p99: map[string]float64{"tcp": 6, "unix": 7}}
	polling := figures{mbps: map[string]float64{"urma": 9}, p50: map[string]float64{}, p99: map[string]float64{}}
	polling.takeBaselines(event)
	if polling.mbps["tcp"] != 1 || polling.mbps["unix"] != 2 || polling.mbps["urma"] != 9 || polling.p50["unix"] != 5 || polling.p99["tcp"] != 6 {
		t.Errorf("polling figures after takeBaselines: %+v", polling)
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{3, 1, 2}, 2},
		{[]float64{9000, 1, 5}, 5}, // an outlier round does not move it
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tc := range tests {
		in := slices.Clone(tc.in)
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("median reordered its input: %v, was %v", tc.in, in)
		}
	}
}

func TestSamplesMedians(t *testing.T) {
	s := newSamples()
	for _, round := range []struct{ tcp, urma float64 }{{100, 900}, {300, 200}, {200, 400}} {
		s.mbps["tcp"] = append(s.mbps["tcp"], round.tcp)
		s.mbps["urma"] = append(s.mbps["urma"], round.urma)
		s.p50["tcp"] = append(s.p50["tcp"], round.tcp/10)
		s.p99["urma"] = append(s.p99["urma"], round.urma*2)
	}
	f := s.medians()
	want := map[string]float64{"mbps tcp": 200, "mbps urma": 400, "p50 tcp": 20, "p99 urma": 800}
	got := map[string]float64{"mbps tcp": f.mbps["tcp"], "mbps urma": f.mbps["urma"], "p50 tcp": f.p50["tcp"], "p99 urma": f.p99["urma"]}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
	if _, ok := f.p50["urma"]; ok {
		t.Errorf("a figure without samples got a median: %v", f.p50)
	}
}

// TestSocketFabricTable: the socket fabric's table measures each size from
// a server on the socket fabric, and puts the copying API's, the in-place
// reader's and the zero-copy API's throughput beside TCP's as ratios.
func TestSocketFabricTable(t *testing.T) {
	t.Setenv(envFake, "1")
	log := filepath.Join(t.TempDir(), "args")
	t.Setenv(envArgsLog, log)
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := measureSocketFabric(context.Background(), &out, bin, []int{65536, 1 << 20}, measurement{duration: time.Millisecond, rounds: 1}); err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 && (f[0] == "64KiB" || f[0] == "1MiB") {
			rows[f[0]] = f
		}
	}
	want := []string{"100", "80", "0.80x", "90", "0.90x", "95", "0.95x"}
	for _, size := range []string{"64KiB", "1MiB"} {
		if got := rows[size]; len(got) != 8 || !slices.Equal(got[1:], want) {
			t.Errorf("row %s = %v, want %v; output:\n%s", size, got, want, out.String())
		}
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	servers := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "server ") {
			servers++
			if !strings.Contains(l, socketFabric) {
				t.Errorf("server run without %s: %s", socketFabric, l)
			}
		}
	}
	if servers != 2 {
		t.Errorf("%d servers started, want one per size:\n%s", servers, b)
	}
}

// TestClientChecksFabric: a connection that is not on its mode's fabric
// fails the figure, which would otherwise measure something else.
func TestClientChecksFabric(t *testing.T) {
	t.Setenv(envFake, "1")
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		mode, fabric string // fabric: what the connection reports; "" as the fake does
		ok           bool
	}{
		{mode: "urma", ok: true},
		{mode: "urma", fabric: "socket"},
		{mode: urma1Copy, fabric: "socket"},
		{mode: urmaSocket, ok: true},
		{mode: urmaSocket1Copy, ok: true},
		{mode: urmaSocket, fabric: "shm"},
		{mode: urmaSocket1Copy, fabric: "shm"},
		{mode: urmaSocket0Copy, ok: true},
		{mode: urmaSocket0Copy, fabric: "shm"},
		{mode: "tcp", fabric: "socket", ok: true},
	}
	for _, tc := range tests {
		t.Run(tc.mode+"/"+tc.fabric, func(t *testing.T) {
			t.Setenv(envFabric, tc.fabric)
			args := append([]string{"client", "--size", "64"}, modeSpecs[tc.mode].args...)
			_, err := client(context.Background(), bin, tc.mode, args...)
			if (err == nil) != tc.ok {
				t.Fatalf("client error %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestRunPrintsEveryTable: a run that succeeds prints the shm table, the
// socket fabric's and the gRPC table, in that order.
func TestRunPrintsEveryTable(t *testing.T) {
	t.Setenv(envFake, "1")
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run(context.Background(), &out, bin, []int{64}, measurement{duration: time.Millisecond, rounds: 1}); err != nil {
		t.Fatal(err)
	}
	o := out.String()
	at := -1
	for _, title := range []string{"urma-perf, two processes", "the socket fabric", "gRPC unary"} {
		i := strings.Index(o, title)
		if i <= at {
			t.Fatalf("%q missing or out of order in:\n%s", title, o)
		}
		at = i
	}
	if _, socketTable, _ := strings.Cut(o, "the socket fabric"); !strings.Contains(socketTable, "0.80x") {
		t.Errorf("the socket fabric's table has no row for 64B:\n%s", o)
	}
}

// Every mode a table measures has its client flags.
func TestEveryModeHasASpec(t *testing.T) {
	for _, list := range [][]string{modes, socketModes, grpcModes} {
		for _, m := range list {
			if len(modeSpecs[m].args) == 0 {
				t.Errorf("mode %q has no client flags", m)
			}
		}
	}
}
