// Command perfcompare runs urma-perf as two processes, server and client,
// and prints the transport over shared memory (urma, the shm fabric) beside
// the two baselines of the same run: TCP loopback and a Unix domain socket.
// For each message size and completion mode (event, polling) it measures
// throughput (a pipelined one-way stream, MB/s) and round-trip latency
// (request/response of the same size, p50 and p99), and prints urma/tcp as
// a ratio; beside it the throughput of urma-1copy, the transport copying
// each byte as often as TCP does (see urma1Copy). A second table holds the
// socket fabric's throughput (urma_soft_fabric=socket on both sides, which
// emulates two UB hosts) beside TCP's of the same run, with the copying
// API and with the zero-copy API (socketModes). `make bench` runs
// it; see docs/benchmarks.md.
//
//	perfcompare -urma-perf bin/urma-perf [-duration 1s] [-rounds 1] [-sizes 64,4096,65536,1048576]
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
)

// modes are what a figure is measured over: the client's --mode, and
// urma1Copy, the transport as it copies least (below).
var modes = []string{"tcp", "unix", "urma", urma1Copy}

// urma1Copy is the transport with each byte copied as often as over TCP,
// twice: the client's Write copies it into the connection's own send
// buffers, which the server maps (urma_shm_send_buffers, the default), so
// the SEND crosses by reference and the server copies it once into its
// receive buffer, where it takes it in place (--recv-zerocopy, the
// zero-copy API) instead of copying it out with Read as urma does. Only its
// throughput is measured: a round trip of the copying API is urma's.
const urma1Copy = "urma-1copy"

// socketModes are what the socket fabric's table measures: TCP, and the
// transport on the socket fabric with the copying API (urmaSocket),
// reading in place (urmaSocket1Copy, the server's flags as urma1Copy's),
// and with the zero-copy API on both sides (urmaSocket0Copy): the client
// builds its requests in the transport's buffers (--send-zerocopy), so
// the bytes are copied twice, by the kernel, as over TCP.
var socketModes = []string{"tcp", urmaSocket, urmaSocket1Copy, urmaSocket0Copy}

const (
	urmaSocket      = "urma-socket"
	urmaSocket1Copy = "urma-socket-1copy"
	urmaSocket0Copy = "urma-socket-zerocopy"
)

// socketFabric is the flag that puts a server or client on the socket
// fabric.
const socketFabric = "--urma_soft_fabric=socket"

// modeSpec is how a mode's client runs and what its connections must show.
type modeSpec struct {
	args           []string // the client's flags
	fabric         string   // the fabric its connections must report; "" for the baselines, which have none
	throughputOnly bool     // its round trip is not measured
}

// modeSpecs hold every mode a table measures. Only the throughput of the
// 1-copy modes is measured, since their round trip is the copying API's,
// and only that of the socket fabric, whose target is its throughput.
var modeSpecs = map[string]modeSpec{
	"tcp":           {args: []string{"--mode", "tcp"}},
	"unix":          {args: []string{"--mode", "unix"}},
	"urma":          {args: []string{"--mode", "urma"}, fabric: "shm"},
	urma1Copy:       {args: []string{"--mode", "urma", "--recv-zerocopy"}, fabric: "shm", throughputOnly: true},
	urmaSocket:      {args: []string{"--mode", "urma", socketFabric}, fabric: "socket", throughputOnly: true},
	urmaSocket1Copy: {args: []string{"--mode", "urma", socketFabric, "--recv-zerocopy"}, fabric: "socket", throughputOnly: true},
	urmaSocket0Copy: {args: []string{"--mode", "urma", socketFabric, "--recv-zerocopy", "--send-zerocopy"}, fabric: "socket", throughputOnly: true},
}

func main() {
	bin := flag.String("urma-perf", "bin/urma-perf", "the urma-perf binary")
	duration := flag.Duration("duration", time.Second, "how long each figure is measured")
	rounds := flag.Int("rounds", 1, "measure every mode this many times, the modes taking turns, and print each figure's median: robust to the machine drifting during a run")
	sizeList := flag.String("sizes", "64,4096,65536,1048576", "message sizes in bytes, comma-separated")
	flag.Parse()
	sizes, err := parseSizes(*sizeList)
	if err == nil && (*rounds < 1 || *rounds > 99) {
		err = fmt.Errorf("-rounds %d is outside 1..99", *rounds)
	}
	if err == nil {
		err = run(context.Background(), os.Stdout, *bin, sizes, measurement{duration: *duration, rounds: *rounds})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "perfcompare:", err)
		os.Exit(1)
	}
}

func parseSizes(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("size %q is not a positive integer", f)
		}
		if n > perfjson.MaxSize {
			// urma-perf would refuse it, after every smaller size was measured.
			return nil, fmt.Errorf("size %d is above urma-perf's largest request, %d", n, perfjson.MaxSize)
		}
		out = append(out, n)
	}
	return out, nil
}

// figures are one row: throughput and latency per mode.
type figures struct {
	mbps     map[string]float64
	p50, p99 map[string]float64
}

// measurement is how each figure is measured: for how long, and how many
// times (its median is printed).
type measurement struct {
	duration time.Duration
	rounds   int
}

// samples collect each round's figures, per mode.
type samples struct {
	mbps, p50, p99 map[string][]float64
}

func newSamples() samples {
	return samples{mbps: map[string][]float64{}, p50: map[string][]float64{}, p99: map[string][]float64{}}
}

// medians is the row the samples make.
func (s samples) medians() figures {
	f := figures{mbps: map[string]float64{}, p50: map[string]float64{}, p99: map[string]float64{}}
	for _, m := range []struct {
		from map[string][]float64
		to   map[string]float64
	}{{s.mbps, f.mbps}, {s.p50, f.p50}, {s.p99, f.p99}} {
		for mode, xs := range m.from {
			m.to[mode] = median(xs)
		}
	}
	return f
}

// median is the middle of xs, or the mean of the two middle values.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func run(ctx context.Context, w io.Writer, bin string, sizes []int, d measurement) error {
	per := d.duration.String()
	if d.rounds > 1 {
		per = fmt.Sprintf("%s per figure, the median of %d rounds in which the modes take turns", d.duration, d.rounds)
	} else {
		per += " per figure"
	}
	fmt.Fprintf(w, "urma-perf, two processes on this host (%s): urma = the transport on shared memory; 1-copy = the same with each byte copied as often as over TCP (the server reads in place: --recv-zerocopy); tcp, unix = loopback baselines of the same run\n", per)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tcompletion\tMB/s tcp\tunix\turma\turma/tcp\t1-copy\t1-copy/tcp\t\tRTT p50 µs tcp\tunix\turma\turma/tcp\t\tp99 µs tcp\tunix\turma\turma/tcp\t")
	for _, size := range sizes {
		var base figures
		for _, polling := range []bool{false, true} {
			f, err := measureSize(ctx, bin, size, polling, d, modesOf(modes, polling))
			if err != nil {
				// Print the rows measured so far: they are the run's, and
				// took long to get.
				return errors.Join(fmt.Errorf("size %d: %w", size, err), tw.Flush())
			}
			if !polling {
				base = f
			} else {
				f.takeBaselines(base)
			}
			comp := "event"
			if polling {
				comp = "polling"
			}
			fmt.Fprintf(os.Stderr, "measured %s %s\n", sizeName(size), comp)
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%s\t%.0f\t%s\t\t%.1f\t%.1f\t%.1f\t%s\t\t%.1f\t%.1f\t%.1f\t%s\t\n", sizeName(size), comp,
				f.mbps["tcp"], f.mbps["unix"], f.mbps["urma"], ratio(f.mbps["urma"], f.mbps["tcp"]), f.mbps[urma1Copy], ratio(f.mbps[urma1Copy], f.mbps["tcp"]),
				f.p50["tcp"], f.p50["unix"], f.p50["urma"], ratio(f.p50["urma"], f.p50["tcp"]),
				f.p99["tcp"], f.p99["unix"], f.p99["urma"], ratio(f.p99["urma"], f.p99["tcp"]))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := measureSocketFabric(ctx, w, bin, sizes, d); err != nil {
		return err
	}
	event, err := measureGRPC(ctx, bin, false, d, modesOf(grpcModes, false))
	if err != nil {
		return fmt.Errorf("gRPC, event: %w", err)
	}
	fmt.Fprintln(os.Stderr, "measured gRPC event")
	polling, err := measureGRPC(ctx, bin, true, d, modesOf(grpcModes, true))
	if err != nil {
		return fmt.Errorf("gRPC, polling: %w", err)
	}
	fmt.Fprintln(os.Stderr, "measured gRPC polling")
	polling.takeBaselines(event)
	return printGRPC(w, event, polling)
}

// baselines are the modes that do not poll: TCP and the Unix socket.
var baselines = []string{"tcp", "unix"}

// modesOf is what a run measures of ms: everything in event mode; in
// polling mode only the transport, since the baselines would measure the
// same as in the event run, which they take from (takeBaselines).
func modesOf(ms []string, polling bool) []string {
	if !polling {
		return ms
	}
	return slices.DeleteFunc(slices.Clone(ms), func(m string) bool { return slices.Contains(baselines, m) })
}

// takeBaselines fills f's baseline figures with the event run's.
func (f figures) takeBaselines(event figures) {
	for _, m := range baselines {
		f.mbps[m], f.p50[m], f.p99[m] = event.mbps[m], event.p50[m], event.p99[m]
	}
}

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// urmaFlags size the transport for messages of n bytes, as the transport
// benchmarks do: one buffer holds a message, and the pool holds both
// queues' worth with room to spare; polling pollers yield when idle.
func urmaFlags(n int, polling bool) []string {
	buf := 8 << 10
	for buf < n {
		buf *= 2
	}
	q := 64
	if n >= 1<<20 {
		q = 16
	}
	return []string{
		"--urma_buffer_size=" + strconv.Itoa(buf), "--urma_buffer_count=" + strconv.Itoa(4*2*q),
		"--urma_sq_size=" + strconv.Itoa(q), "--urma_rq_size=" + strconv.Itoa(q),
		"--urma_prepared_jetty_cnt=1", "--urma_use_polling=" + strconv.FormatBool(polling),
		// A poller that spins without yielding starves the goroutines it
		// serves on a machine with few cores (docs/benchmarks.md).
		"--urma_poller_yield=" + strconv.FormatBool(polling),
	}
}

// pipeline is how many requests a throughput run keeps outstanding.
func pipeline(n int) int {
	if n >= 1<<20 {
		return 8
	}
	return 32
}

// server is a running `urma-perf server`.
type server struct {
	addr, sock string // its TCP address and Unix socket
	cmd        *exec.Cmd
	stderr     bytes.Buffer // read once it exited, shown when something failed
	dir        string
}

// startServer runs `urma-perf server` with args, listening on loopback TCP
// and on a Unix socket, and waits until it listens.
func startServer(ctx context.Context, bin string, args ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "perfcompare")
	if err != nil {
		return nil, err
	}
	s := &server{sock: filepath.Join(dir, "perf.sock"), dir: dir}
	s.cmd = exec.CommandContext(ctx, bin, append([]string{"server", "--listen", "127.0.0.1:0", "--unix", s.sock, "--json"}, args...)...)
	s.cmd.Stderr = &s.stderr
	out, err := s.cmd.StdoutPipe()
	if err == nil {
		err = s.cmd.Start()
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start server: %w", err)
	}
	sc := bufio.NewScanner(out)
	var ev perfjson.ServerEvent
	switch {
	case !sc.Scan():
		err = errors.New("the server said nothing")
	case json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Event != "listening":
		err = fmt.Errorf("the server said %q, not that it listens", sc.Text())
	}
	if err != nil {
		return nil, s.stop(err)
	}
	s.addr = ev.Addr
	go func() { // keep reading its events, or it blocks writing them
		for sc.Scan() {
		}
	}()
	return s, nil
}

// stop ends the server and returns err with what the server said, if err
// is not nil.
func (s *server) stop(err error) error {
	_ = s.cmd.Process.Signal(os.Interrupt)
	werr := s.cmd.Wait()
	_ = os.RemoveAll(s.dir)
	if err == nil {
		return nil
	}
	status := "exited"
	if werr != nil {
		status = werr.Error()
	}
	return fmt.Errorf("%w\nserver (%s) said:\n%s", err, status, tail(s.stderr.String(), 20))
}

// target is the --server of a client in mode m.
func (s *server) target(m string) string {
	if m == "unix" {
		return s.sock
	}
	return s.addr
}

// measureSocketFabric prints the socket fabric's table: for each size, the
// throughput of socketModes in event mode, from a server on the socket
// fabric.
func measureSocketFabric(ctx context.Context, w io.Writer, bin string, sizes []int, d measurement) error {
	fmt.Fprintln(w, "the socket fabric (urma_soft_fabric=socket on both sides; emulates two UB hosts over TCP), event mode, MB/s: urma = the copying API; 1-copy = the server reads in place; zero-copy = the client also builds its requests in place (the zero-copy API on both sides); tcp = the loopback baseline of the same run")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tMB/s tcp\turma\turma/tcp\t1-copy\t1-copy/tcp\tzero-copy\tzero-copy/tcp\t")
	for _, size := range sizes {
		f, err := measureSize(ctx, bin, size, false, d, socketModes, socketFabric)
		if err != nil {
			return errors.Join(fmt.Errorf("socket fabric, size %d: %w", size, err), tw.Flush())
		}
		fmt.Fprintf(os.Stderr, "measured %s on the socket fabric\n", sizeName(size))
		row := fmt.Sprintf("%s\t%.0f\t", sizeName(size), f.mbps["tcp"])
		for _, m := range socketModes[1:] { // each beside TCP, the first
			row += fmt.Sprintf("%.0f\t%s\t", f.mbps[m], ratio(f.mbps[m], f.mbps["tcp"]))
		}
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}

// measureSize starts a server for one size and completion mode, with
// serverArgs besides, and measures each of ms against it.
func measureSize(ctx context.Context, bin string, size int, polling bool, d measurement, ms []string, serverArgs ...string) (_ figures, err error) {
	s := newSamples()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv, err := startServer(ctx, bin, append(append([]string{"--echo"}, urmaFlags(size, polling)...), serverArgs...)...)
	if err != nil {
		return figures{}, err
	}
	defer func() { err = srv.stop(err) }()
	for range d.rounds {
		for _, m := range ms {
			server := srv.target(m)
			args := append(append([]string{"client", "--server", server, "--size", strconv.Itoa(size), "--duration", d.duration.String(), "--json"}, modeSpecs[m].args...), urmaFlags(size, polling)...)
			tput, err := client(ctx, bin, m, append(args, "--ack", "--pipeline", strconv.Itoa(pipeline(size)))...)
			if err != nil {
				return figures{}, fmt.Errorf("%s throughput: %w", m, err)
			}
			s.mbps[m] = append(s.mbps[m], tput.SentBytesPerSec/1e6)
			if modeSpecs[m].throughputOnly {
				continue
			}
			rtt, err := client(ctx, bin, m, args...)
			if err != nil {
				return figures{}, fmt.Errorf("%s round trip: %w", m, err)
			}
			s.p50[m] = append(s.p50[m], rtt.LatencyMicros.P50)
			s.p99[m] = append(s.p99[m], rtt.LatencyMicros.P99)
		}
	}
	return s.medians(), nil
}

// grpcModes are what gRPC calls are measured over.
var grpcModes = []string{"tcp", "unix", "urma"}

// measureGRPC starts a gRPC server for one completion mode and times
// unary health checks, one at a time, over each of ms: calls per second in
// mbps's place.
func measureGRPC(ctx context.Context, bin string, polling bool, d measurement, ms []string) (_ figures, err error) {
	s := newSamples()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	flags := urmaFlags(64, polling)
	srv, err := startServer(ctx, bin, append([]string{"--grpc"}, flags...)...)
	if err != nil {
		return figures{}, err
	}
	defer func() { err = srv.stop(err) }()
	for range d.rounds {
		for _, m := range ms {
			args := append(append([]string{"client", "--grpc", "--server", srv.target(m), "--duration", d.duration.String(), "--json"}, modeSpecs[m].args...), flags...)
			r, err := client(ctx, bin, m, args...)
			if err != nil {
				return figures{}, fmt.Errorf("gRPC over %s: %w", m, err)
			}
			s.mbps[m] = append(s.mbps[m], r.QPS)
			s.p50[m] = append(s.p50[m], r.LatencyMicros.P50)
			s.p99[m] = append(s.p99[m], r.LatencyMicros.P99)
		}
	}
	return s.medians(), nil
}

// printGRPC prints the gRPC figures of both completion modes.
func printGRPC(w io.Writer, event, polling figures) error {
	fmt.Fprintln(w, "gRPC unary health checks over urma-perf --grpc, one call at a time (calls/s; round trip p50 and p99 µs):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "completion\tcalls/s tcp\tunix\turma\turma/tcp\t\tp50 µs tcp\tunix\turma\turma/tcp\t\tp99 µs tcp\tunix\turma\turma/tcp\t")
	for _, row := range []struct {
		name string
		f    figures
	}{{"event", event}, {"polling", polling}} {
		f := row.f
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t\t%.1f\t%.1f\t%.1f\t%s\t\t%.1f\t%.1f\t%.1f\t%s\t\n", row.name,
			f.mbps["tcp"], f.mbps["unix"], f.mbps["urma"], ratio(f.mbps["urma"], f.mbps["tcp"]),
			f.p50["tcp"], f.p50["unix"], f.p50["urma"], ratio(f.p50["urma"], f.p50["tcp"]),
			f.p99["tcp"], f.p99["unix"], f.p99["urma"], ratio(f.p99["urma"], f.p99["tcp"]))
	}
	return tw.Flush()
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// client runs one urma-perf client in mode and checks that its connection
// ran as the mode says (urma: on the mode's fabric, not a fallback).
func client(ctx context.Context, bin, mode string, args ...string) (*perfjson.Report, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var r perfjson.Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("client output %q: %w", b, err)
	}
	if fabric := modeSpecs[mode].fabric; fabric != "" {
		for _, c := range r.Conns {
			if c.Mode != "urma" || c.Fabric != fabric {
				return nil, fmt.Errorf("the connection runs mode=%s fabric=%s (%s), not urma over %s", c.Mode, c.Fabric, c.FallbackReason, fabric)
			}
		}
	}
	return &r, nil
}
