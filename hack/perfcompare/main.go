// Command perfcompare runs urma-perf as two processes, server and client,
// and prints the transport over shared memory (urma, the shm fabric) beside
// the two baselines of the same run: TCP loopback and a Unix domain socket.
// For each message size and completion mode (event, polling) it measures
// throughput (a pipelined one-way stream, MB/s) and round-trip latency
// (request/response of the same size, p50 and p99), and prints urma/tcp as
// a ratio; beside it the throughput of urma-1copy, the transport copying
// each byte as often as TCP does (see urma1Copy). `make bench` runs it; see
// docs/transport.md.
//
//	perfcompare -urma-perf bin/urma-perf [-duration 1s] [-sizes 64,4096,65536,1048576]
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

// modeArgs are the client flags of a mode.
func modeArgs(m string) []string {
	if m == urma1Copy {
		return []string{"--mode", "urma", "--recv-zerocopy"}
	}
	return []string{"--mode", m}
}

func main() {
	bin := flag.String("urma-perf", "bin/urma-perf", "the urma-perf binary")
	duration := flag.Duration("duration", time.Second, "how long each figure is measured")
	sizeList := flag.String("sizes", "64,4096,65536,1048576", "message sizes in bytes, comma-separated")
	flag.Parse()
	sizes, err := parseSizes(*sizeList)
	if err == nil {
		err = run(context.Background(), os.Stdout, *bin, sizes, *duration)
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
		out = append(out, n)
	}
	return out, nil
}

// figures are one row: throughput and latency per mode.
type figures struct {
	mbps     map[string]float64
	p50, p99 map[string]float64
}

func run(ctx context.Context, w io.Writer, bin string, sizes []int, d time.Duration) error {
	fmt.Fprintf(w, "urma-perf, two processes on this host (%s per figure): urma = the transport on shared memory; 1-copy = the same with each byte copied as often as over TCP (the server reads in place: --recv-zerocopy); tcp, unix = loopback baselines of the same run\n", d)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tcompletion\tMB/s tcp\tunix\turma\turma/tcp\t1-copy\t1-copy/tcp\t\tRTT p50 µs tcp\tunix\turma\turma/tcp\t\tp99 µs tcp\tunix\turma\turma/tcp\t")
	for _, size := range sizes {
		var base figures
		for _, polling := range []bool{false, true} {
			f, err := measureSize(ctx, bin, size, polling, d)
			if err != nil {
				return fmt.Errorf("size %d: %w", size, err)
			}
			if !polling {
				base = f
			} else {
				// The baselines do not poll: the event run's stand.
				for _, m := range []string{"tcp", "unix"} {
					f.mbps[m], f.p50[m], f.p99[m] = base.mbps[m], base.p50[m], base.p99[m]
				}
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
	return tw.Flush()
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
		// serves on a machine with few cores (docs/transport.md).
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

// measureSize starts a server for one size and completion mode and
// measures every mode against it.
func measureSize(ctx context.Context, bin string, size int, polling bool, d time.Duration) (_ figures, err error) {
	f := figures{mbps: map[string]float64{}, p50: map[string]float64{}, p99: map[string]float64{}}
	dir, err := os.MkdirTemp("", "perfcompare")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "perf.sock")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := exec.CommandContext(ctx, bin, append([]string{"server", "--listen", "127.0.0.1:0", "--unix", sock, "--echo", "--json"}, urmaFlags(size, polling)...)...)
	var srvErr bytes.Buffer // read once the server exited, shown when something failed
	srv.Stderr = &srvErr
	out, err := srv.StdoutPipe()
	if err != nil {
		return f, err
	}
	if err := srv.Start(); err != nil {
		return f, fmt.Errorf("start server: %w", err)
	}
	defer func() {
		_ = srv.Process.Signal(os.Interrupt)
		werr := srv.Wait()
		if err != nil {
			status := "exited"
			if werr != nil {
				status = werr.Error()
			}
			err = fmt.Errorf("%w\nserver (%s) said:\n%s", err, status, tail(srvErr.String(), 20))
		}
	}()
	sc := bufio.NewScanner(out)
	var ev perfjson.ServerEvent
	if !sc.Scan() {
		return f, errors.New("the server said nothing")
	}
	if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
		return f, fmt.Errorf("the server said %q: %w", sc.Text(), err)
	}
	if ev.Event != "listening" {
		return f, fmt.Errorf("the server said %q, not that it listens", sc.Text())
	}
	go func() { // keep reading its events, or it blocks writing them
		for sc.Scan() {
		}
	}()
	for _, m := range modes {
		server := ev.Addr
		if m == "unix" {
			server = sock
		}
		args := append(append([]string{"client", "--server", server, "--size", strconv.Itoa(size), "--duration", d.String(), "--json"}, modeArgs(m)...), urmaFlags(size, polling)...)
		tput, err := client(ctx, bin, m, append(args, "--ack", "--pipeline", strconv.Itoa(pipeline(size)))...)
		if err != nil {
			return f, fmt.Errorf("%s throughput: %w", m, err)
		}
		f.mbps[m] = tput.SentBytesPerSec / 1e6
		if m == urma1Copy {
			continue
		}
		rtt, err := client(ctx, bin, m, args...)
		if err != nil {
			return f, fmt.Errorf("%s round trip: %w", m, err)
		}
		f.p50[m], f.p99[m] = rtt.LatencyMicros.P50, rtt.LatencyMicros.P99
	}
	return f, nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// client runs one urma-perf client in mode and checks that its connection
// ran as the mode says (urma: on the shm fabric, not a fallback).
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
	for _, c := range r.Conns {
		if (mode == "urma" || mode == urma1Copy) && (c.Mode != "urma" || c.Fabric != "shm") {
			return nil, fmt.Errorf("the connection runs mode=%s fabric=%s (%s), not urma over shm", c.Mode, c.Fabric, c.FallbackReason)
		}
	}
	return &r, nil
}
