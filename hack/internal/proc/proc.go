// Package proc runs the helper programs of make demo and make e2e as
// children in process groups of their own, each with a log file, and waits
// on what they print rather than on time. A child dies with this process
// (Start), or outlives it (StartDetached: make e2e's -keep).
package proc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a child gets to exit after SIGTERM before its whole
// process group is killed.
const stopGrace = 5 * time.Second

// maxKeptOutput bounds what a child's stdout keeps in memory; the full output
// is always in its log file.
const maxKeptOutput = 4 << 20

// Child is a program started in its own process group, so that stopping it
// also stops anything it started, and so that a Ctrl-C typed at the terminal
// reaches the parent only: the parent then stops its children in order
// instead of having them die under it.
type Child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	out     *lineBuffer
	// detached: started by StartDetached; its stdout is only in its log.
	detached bool

	done    chan struct{} // closed when the process has exited and its output is drained
	waitErr error         // set before done is closed
}

// Start starts path with args and env added to this process's environment.
// stdout is kept in memory (and copied to the log); stderr goes to the log
// only. The log lives in logDir as <name>.log. On Linux the child is killed
// should this process die without stopping it.
func Start(logDir, name, path string, args, env []string) (*Child, error) {
	return start(logDir, name, path, args, env, false)
}

// StartDetached starts a child that outlives this process: in a session of
// its own (no terminal's hangup reaches it, nor a signal to this process's
// group), without the parent-death signal, and with stdout and stderr
// written straight into its log file. Through a pipe to this process the
// child's next write after this process ended would fail (a Go program
// dies of SIGPIPE on its stdout), so nothing of its output passes through
// this process: Lines is empty and WaitLine fails. Nor does it inherit
// the descriptors this process inherited (see closeInheritedOnExec). Wait
// and Stop work as for Start while this process runs.
func StartDetached(logDir, name, path string, args, env []string) (*Child, error) {
	if err := closeInheritedOnExec(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return start(logDir, name, path, args, env, true)
}

func start(logDir, name, path string, args, env []string, detached bool) (*Child, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: create its log: %w", name, err)
	}
	fmt.Fprintf(logFile, "# %s %s\n", path, strings.Join(args, " "))
	c := &Child{name: name, logPath: logPath, logFile: logFile, out: newLineBuffer(maxKeptOutput), done: make(chan struct{}), detached: detached}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	if detached {
		// An *os.File is handed to the child as it is: no copying.
		cmd.Stdout, cmd.Stderr = logFile, logFile
	} else {
		cmd.Stdout = io.MultiWriter(c.out, &lockedWriter{w: logFile})
		cmd.Stderr = &lockedWriter{w: logFile}
	}
	cmd.SysProcAttr = procAttr(detached)
	// Output copying must not outlive the process by much, even if it
	// started grandchildren that keep the pipe open.
	cmd.WaitDelay = stopGrace
	c.cmd = cmd
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		c.waitErr = cmd.Wait()
		c.out.close()
		c.logFile.Close()
		close(c.done)
	}()
	return c, nil
}

// Name is the name the child was started with (its log is <name>.log).
func (c *Child) Name() string { return c.name }

// LogPath is the file holding the child's stdout and stderr.
func (c *Child) LogPath() string { return c.logPath }

// Pid is the child's process id (and its process group's; a detached
// child's session's too).
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Done is closed when the child has exited and its output is drained.
func (c *Child) Done() <-chan struct{} { return c.done }

// Lines returns every line the child printed on stdout so far.
func (c *Child) Lines() []string {
	lines, _, _ := c.out.since(0)
	return lines
}

// Exited reports whether the child has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// ExitStatus describes how the child ended; call it after done is closed.
func (c *Child) ExitStatus() string {
	if c.waitErr == nil {
		return "exit status 0"
	}
	return c.waitErr.Error()
}

// Wait waits for the child to exit by itself, up to timeout, and returns its
// stdout. A non-zero exit, a timeout or ctx ending is an error that carries
// the end of the child's log.
func (c *Child) Wait(ctx context.Context, timeout time.Duration) ([]byte, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.done:
	case <-ctx.Done():
		c.Stop()
		return nil, fmt.Errorf("%s: %w", c.name, context.Cause(ctx))
	case <-t.C:
		c.Stop()
		return nil, fmt.Errorf("%s did not finish within %s%s", c.name, timeout, c.LogTail())
	}
	if c.waitErr != nil {
		return c.out.bytes(), fmt.Errorf("%s failed: %w%s", c.name, c.waitErr, c.LogTail())
	}
	return c.out.bytes(), nil
}

// WaitLine waits until the child prints a stdout line for which match
// returns ok, and returns match's value. It fails when the child exits
// first, on timeout, and when ctx ends.
func (c *Child) WaitLine(ctx context.Context, timeout time.Duration, what string, match func(string) (string, bool)) (string, error) {
	if c.detached {
		return "", fmt.Errorf("waiting for %s to print %s: it was started detached, so its output is only in %s", c.name, what, c.logPath)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	seen := 0
	for {
		lines, changed, closed := c.out.since(seen)
		for _, l := range lines {
			if v, ok := match(l); ok {
				return v, nil
			}
		}
		seen += len(lines)
		if closed {
			<-c.done
			return "", fmt.Errorf("%s exited (%s) before printing %s%s", c.name, c.ExitStatus(), what, c.LogTail())
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for %s to print %s: %w", c.name, what, context.Cause(ctx))
		case <-t.C:
			return "", fmt.Errorf("%s did not print %s within %s%s", c.name, what, timeout, c.LogTail())
		}
	}
}

// Stop ends the child's process group: SIGTERM, then SIGKILL after
// stopGrace. It is safe to call more than once and after the child exited.
func (c *Child) Stop() {
	if c.Exited() {
		return
	}
	signalGroup(c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(stopGrace):
		signalGroup(c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

// LogTail is the end of the child's log, indented, for error messages.
func (c *Child) LogTail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	return fmt.Sprintf("\n    last lines of %s:\n%s", c.logPath, Indent(LastLines(string(b), 15), "      "))
}

// LastLines returns the last n lines of s.
func LastLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Indent prefixes every non-empty line of s with prefix and drops trailing
// newlines.
func Indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "\n")
}

// lockedWriter serialises writes from the stdout and stderr copiers into one
// log file.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// lineBuffer keeps a child's stdout and lets readers wait for new lines.
// Beyond its limit it keeps counting lines but drops their text, so that a
// chatty child cannot exhaust the parent's memory.
type lineBuffer struct {
	mu      sync.Mutex
	limit   int
	buf     bytes.Buffer
	partial []byte
	lines   []string
	// lineBytes is the text kept in lines; past limit, lines are kept empty.
	lineBytes int
	changed   chan struct{} // closed and replaced whenever lines grows or the buffer closes
	closed    bool
}

func newLineBuffer(limit int) *lineBuffer {
	return &lineBuffer{limit: limit, changed: make(chan struct{})}
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() < b.limit {
		b.buf.Write(p[:min(len(p), b.limit-b.buf.Len())])
	}
	grew := false
	rest := p
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			if len(b.partial) < b.limit {
				b.partial = append(b.partial, rest[:min(len(rest), b.limit-len(b.partial))]...)
			}
			break
		}
		line := strings.TrimRight(string(append(b.partial, rest[:i]...)), "\r")
		b.partial = nil
		if b.lineBytes >= b.limit {
			line = ""
		}
		b.lineBytes += len(line)
		b.lines = append(b.lines, line)
		grew = true
		rest = rest[i+1:]
	}
	if grew {
		b.notify()
	}
	return len(p), nil
}

// close marks the end of output; a last line without newline counts.
func (b *lineBuffer) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.partial) > 0 {
		b.lines = append(b.lines, string(b.partial))
		b.partial = nil
	}
	b.closed = true
	b.notify()
}

func (b *lineBuffer) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// since returns the lines after the first n, a channel closed at the next
// change, and whether the output has ended.
func (b *lineBuffer) since(n int) ([]string, <-chan struct{}, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	if n < len(b.lines) {
		out = append(out, b.lines[n:]...)
	}
	return out, b.changed, b.closed
}

func (b *lineBuffer) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
