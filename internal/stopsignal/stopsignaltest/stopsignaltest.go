// Package stopsignaltest checks, in a subprocess, that a binary's run
// function ends the process at once on a second stop signal while its
// shutdown is held up.
package stopsignaltest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/stopsignal"
)

// EnvChild, set to "1", tells a test binary's TestMain to play the binary:
// to run its run function with HoldShutdown as the service, and exit.
const EnvChild = "URMA_STOPSIGNAL_TEST_CHILD"

// Serving is what HoldShutdown logs once it serves.
const Serving = "held-shutdown service serving"

// waitLimit bounds each wait on the child; reached only when it fails.
const waitLimit = 30 * time.Second

// HoldShutdown serves until ctx ends, then holds its shutdown up until its
// stdin closes: the slow shutdown that a second signal must cut short.
func HoldShutdown(ctx context.Context, log logr.Logger) error {
	log.Info(Serving)
	<-ctx.Done()
	if _, err := io.Copy(io.Discard, os.Stdin); err != nil {
		return err
	}
	return nil
}

// CheckSecondSignals runs CheckSecondSignalEnds for each pair of the
// binaries' stop signals: a second SIGINT or SIGTERM, whichever came first,
// ends the process.
func CheckSecondSignals(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second syscall.Signal
	}{
		{"SIGTERM twice", syscall.SIGTERM, syscall.SIGTERM},
		{"SIGINT then SIGTERM", syscall.SIGINT, syscall.SIGTERM},
		{"SIGTERM then SIGINT", syscall.SIGTERM, syscall.SIGINT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			CheckSecondSignalEnds(t, tc.first, tc.second)
		})
	}
}

// CheckSecondSignalEnds runs this test binary with EnvChild=1, sends it
// first once it serves and second once it logs that it is stopping, and
// fails t unless second ends it (killed by that signal) while its shutdown
// is still held up.
func CheckSecondSignalEnds(t *testing.T, first, second syscall.Signal) {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), EnvChild+"=1")
	stdin, err := cmd.StdinPipe() // open until the end: the shutdown waits on it
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var said []string
	// drain reads the rest of stderr, and then waits for the child: Wait
	// closes the pipe, so it must come after the last read.
	drain := func() error {
		for l := range lines {
			said = append(said, l)
		}
		return cmd.Wait()
	}
	fail := func(format string, args ...any) {
		t.Helper()
		_ = cmd.Process.Kill()
		_ = drain()
		t.Fatalf(format+"; the child said:\n%s", append(args, strings.Join(said, "\n"))...)
	}
	waitFor := func(what string) {
		t.Helper()
		timeout := time.After(waitLimit)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					fail("the child ended before it logged %q", what)
				}
				said = append(said, l)
				if strings.Contains(l, what) {
					return
				}
			case <-timeout:
				fail("the child did not log %q within %v", what, waitLimit)
			}
		}
	}

	waitFor(Serving)
	if err := cmd.Process.Signal(first); err != nil {
		fail("send %v: %v", first, err)
	}
	waitFor(stopsignal.StoppingMessage)
	if err := cmd.Process.Signal(second); err != nil {
		fail("send %v: %v", second, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- drain() }()
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-time.After(waitLimit):
		// The second signal was swallowed: let the shutdown finish to see
		// how the child ends.
		_ = stdin.Close()
		waitErr = <-exited
		t.Fatalf("%v during the shutdown did not end the child within %v; once its shutdown was let finish: %v; the child said:\n%s",
			second, waitLimit, waitErr, strings.Join(said, "\n"))
	}
	_ = stdin.Close()
	var ee *exec.ExitError
	if !errors.As(waitErr, &ee) {
		t.Fatalf("child ended with %v, want killed by %v; it said:\n%s", waitErr, second, strings.Join(said, "\n"))
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != second {
		t.Fatalf("child ended with %v, want killed by %v; it said:\n%s", waitErr, second, strings.Join(said, "\n"))
	}
}
