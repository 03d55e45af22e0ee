package proc

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestLineBuffer(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		limit  int
		want   []string
	}{
		{name: "whole lines", writes: []string{"a\nb\n"}, limit: 100, want: []string{"a", "b"}},
		{name: "split across writes", writes: []string{"ad", "dr 1", "27.0.0.1:5\n", "x"}, limit: 100, want: []string{"addr 127.0.0.1:5", "x"}},
		{name: "CRLF", writes: []string{"a\r\n"}, limit: 100, want: []string{"a"}},
		{name: "past the limit lines are counted, not kept", writes: []string{"12345\n", "678\n", "9\n"}, limit: 6, want: []string{"12345", "678", ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newLineBuffer(tc.limit)
			for _, w := range tc.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			b.close()
			got, _, closed := b.since(0)
			if !closed || strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("lines %q (closed %v), want %q", got, closed, tc.want)
			}
			if len(b.bytes()) > tc.limit {
				t.Fatalf("kept %d bytes over the limit %d", len(b.bytes()), tc.limit)
			}
		})
	}
}

func TestLineBufferWakesWaiters(t *testing.T) {
	b := newLineBuffer(100)
	_, changed, _ := b.since(0)
	b.Write([]byte("partial"))
	select {
	case <-changed:
		t.Fatal("a partial line woke the waiter")
	default:
	}
	b.Write([]byte(" line\n"))
	select {
	case <-changed:
	default:
		t.Fatal("a complete line did not wake the waiter")
	}
	lines, _, _ := b.since(0)
	if len(lines) != 1 || lines[0] != "partial line" {
		t.Fatalf("lines %q", lines)
	}
	if more, _, _ := b.since(1); len(more) != 0 {
		t.Fatalf("since(1) = %q", more)
	}
}

func shPath(t *testing.T) string {
	t.Helper()
	p := "/bin/sh"
	if _, err := os.Stat(p); err != nil {
		t.Skip("no /bin/sh")
	}
	return p
}

// alive reports whether a process runs: it exists (signal 0 probes without
// sending) and is not a zombie waiting for a reaper that may never come (in a
// container, PID 1 may not reap orphans).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true // no procfs: trust kill
	}
	// The state follows the command name in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestChildWaitLineAndStopKillsTheGroup(t *testing.T) {
	sh := shPath(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "grandchild.pid")
	// The child starts a grandchild that ignores SIGTERM, prints a line,
	// then waits: stop must take both down.
	script := `trap '' TERM; sleep 600 & echo $! > ` + pidFile + `; echo "listening on 127.0.0.1:4242"; wait`
	c, err := Start(dir, "sh", sh, []string{"-c", script}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	addr, err := c.WaitLine(ctx, 10*time.Second, "its address", func(l string) (string, bool) {
		a, ok := strings.CutPrefix(l, "listening on ")
		return a, ok
	})
	if err != nil || addr != "127.0.0.1:4242" {
		t.Fatalf("waitLine = %q, %v", addr, err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	gpid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !alive(gpid) {
		t.Fatalf("grandchild %q not running: %v", b, err)
	}
	c.Stop()
	if !c.Exited() {
		t.Fatal("child still running after stop")
	}
	// The grandchild was killed with the group; it is reaped by init, so
	// give the kernel a bounded moment.
	deadline := time.Now().Add(5 * time.Second)
	for alive(gpid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(gpid) {
		syscall.Kill(gpid, syscall.SIGKILL)
		t.Fatal("grandchild survived stop")
	}
	c.Stop() // idempotent
	if _, err := os.Stat(filepath.Join(dir, "sh.log")); err != nil {
		t.Fatalf("no log file: %v", err)
	}
}

func TestChildFailures(t *testing.T) {
	sh := shPath(t)
	match := func(l string) (string, bool) { return l, strings.HasPrefix(l, "ready") }
	tests := []struct {
		name    string
		script  string
		run     func(ctx context.Context, c *Child) error
		wantErr []string
	}{
		{
			name:   "exits before the line",
			script: `echo "something went wrong" >&2; exit 3`,
			run: func(ctx context.Context, c *Child) error {
				_, err := c.WaitLine(ctx, 10*time.Second, "ready", match)
				return err
			},
			wantErr: []string{"exited", "exit status 3", "before printing ready", "something went wrong"},
		},
		{
			name:   "exits cleanly before the line",
			script: `echo starting`,
			run: func(ctx context.Context, c *Child) error {
				_, err := c.WaitLine(ctx, 10*time.Second, "ready", match)
				return err
			},
			wantErr: []string{"exited (exit status 0) before printing ready", "starting"},
		},
		{
			name:   "line never comes",
			script: `echo starting; exec sleep 600`,
			run: func(ctx context.Context, c *Child) error {
				_, err := c.WaitLine(ctx, 200*time.Millisecond, "ready", match)
				return err
			},
			wantErr: []string{"did not print ready within 200ms", "starting"},
		},
		{
			name:   "non-zero exit",
			script: `echo partial; echo "bad flag --foo" >&2; exit 2`,
			run: func(ctx context.Context, c *Child) error {
				out, err := c.Wait(ctx, 10*time.Second)
				if string(out) != "partial\n" {
					return errors.New("stdout not kept: " + string(out))
				}
				return err
			},
			wantErr: []string{"failed", "exit status 2", "bad flag --foo"},
		},
		{
			name:   "runs too long",
			script: `exec sleep 600`,
			run: func(ctx context.Context, c *Child) error {
				_, err := c.Wait(ctx, 100*time.Millisecond)
				if !c.Exited() {
					return errors.New("child not stopped after the timeout")
				}
				return err
			},
			wantErr: []string{"did not finish within 100ms"},
		},
		{
			name:   "context cancelled",
			script: `exec sleep 600`,
			run: func(ctx context.Context, c *Child) error {
				ctx, cancel := context.WithCancelCause(ctx)
				cancel(errors.New("interrupt signal received"))
				_, err := c.Wait(ctx, time.Minute)
				if !c.Exited() {
					return errors.New("child not stopped on cancel")
				}
				return err
			},
			wantErr: []string{"interrupt signal received"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Start(t.TempDir(), "sh", sh, []string{"-c", tc.script}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Stop()
			err = tc.run(context.Background(), c)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestStartChildMissingBinary(t *testing.T) {
	_, err := Start(t.TempDir(), "urma-perf", filepath.Join(t.TempDir(), "urma-perf"), nil, nil)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "start urma-perf") {
		t.Fatalf("error %v should name the child and wrap fs.ErrNotExist", err)
	}
}

func TestStartChildPassesEnv(t *testing.T) {
	sh := shPath(t)
	c, err := Start(t.TempDir(), "sh", sh, []string{"-c", `echo "$URMA_PROVIDER/$URMA_JETTY_BUDGET"`}, []string{"URMA_PROVIDER=soft", "URMA_JETTY_BUDGET=32"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Wait(context.Background(), 10*time.Second)
	if err != nil || string(out) != "soft/32\n" {
		t.Fatalf("child saw %q, %v", out, err)
	}
}

func TestIndentAndLastLines(t *testing.T) {
	tests := []struct{ got, want string }{
		{Indent("a\n\nb\n", "  "), "  a\n\n  b"},
		{LastLines("1\n2\n3\n4\n", 2), "3\n4"},
		{LastLines("1", 5), "1"},
	}
	for i, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("case %d: got %q, want %q", i, tc.got, tc.want)
		}
	}
}
