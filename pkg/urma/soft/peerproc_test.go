package soft

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// childRoleEnv tells a re-executed test binary which peer role to play; the
// peer tests skip unless it names them.
const childRoleEnv = "URMA_SOFT_TEST_ROLE"

// childStartTimeout bounds how long a child may take to say a line: it is a
// fresh, possibly -race, process on a loaded machine.
const childStartTimeout = 60 * time.Second

// peerProc is a peer process: this test binary re-executed to run one test
// function, talking line by line over its stdin and stdout.
type peerProc struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	seen  []string // the last lines skipped, to show when the child fails
}

// isChild reports whether this process plays role for a parent test.
func isChild(role string) bool { return os.Getenv(childRoleEnv) == role }

// startChild runs the test named run as role in a new process, with env
// added to its environment. The child is killed when the test ends.
func startChild(t testing.TB, run, role string, env ...string) *peerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), childRoleEnv+"="+role), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	mustOK(t, err, "child stdin")
	stdout, err := cmd.StdoutPipe()
	mustOK(t, err, "child stdout")
	mustOK(t, cmd.Start(), "start child")
	c := &peerProc{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// expect waits for a line starting with prefix and returns its fields after
// the prefix; other lines (test framework output) are skipped.
func (c *peerProc) expect(prefix string, timeout time.Duration) []string {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("child exited before saying %s; its last lines:\n%s", prefix, strings.Join(c.seen, "\n"))
			}
			if len(c.seen) == 20 {
				c.seen = c.seen[1:]
			}
			c.seen = append(c.seen, l)
			if strings.HasPrefix(l, prefix+" ") || l == prefix {
				return strings.Fields(l)[1:]
			}
			if strings.HasPrefix(l, "FAILED") {
				c.t.Fatalf("child failed while we waited for %s: %s", prefix, l)
			}
		case <-deadline:
			c.t.Fatalf("child did not say %s within %v", prefix, timeout)
		}
	}
}

// say writes one line to the child.
func (c *peerProc) say(format string, args ...any) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.stdin, format+"\n", args...); err != nil {
		c.t.Fatalf("write to child: %v", err)
	}
}

// parentLines reads the parent's lines in a child process.
type parentLines struct{ sc *bufio.Scanner }

func newParentLines() *parentLines {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &parentLines{sc: sc}
}

// expect reads the next line, which must start with prefix, and returns
// its fields after the prefix.
func (p *parentLines) expect(t testing.TB, prefix string) []string {
	t.Helper()
	if !p.sc.Scan() {
		t.Fatalf("parent closed stdin before saying %s", prefix)
	}
	f := strings.Fields(p.sc.Text())
	if len(f) == 0 || f[0] != prefix {
		t.Fatalf("parent said %q, want %s", p.sc.Text(), prefix)
	}
	return f[1:]
}

// waitEOF blocks until the parent closes stdin (or the child is killed).
func (p *parentLines) waitEOF() {
	for p.sc.Scan() {
	}
}
