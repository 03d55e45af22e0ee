package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary plays three roles (TestMain dispatches on roleEnv): the
// test itself; a parent that starts a child with Start or StartDetached,
// prints its pid and exits without stopping it; and that child, which
// waits on a pidfd for its parent to end and then says so on its stdout.
const (
	roleEnv      = "PROC_TEST_ROLE"
	parentPIDEnv = "PROC_TEST_PARENT_PID"
	logDirEnv    = "PROC_TEST_LOG_DIR"

	roleParentAttached = "parent-attached"
	roleParentDetached = "parent-detached"
	roleChild          = "child"

	// childAfterParent is what the child prints once its parent is gone.
	childAfterParent = "parent gone, child running"
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case roleParentAttached, roleParentDetached:
		os.Exit(parentRole(os.Getenv(roleEnv) == roleParentDetached))
	case roleChild:
		os.Exit(childRole())
	}
	os.Exit(m.Run())
}

func parentRole(detached bool) int {
	startChild := Start
	if detached {
		startChild = StartDetached
	}
	env := []string{roleEnv + "=" + roleChild, parentPIDEnv + "=" + strconv.Itoa(os.Getpid())}
	c, err := startChild(os.Getenv(logDirEnv), "child", os.Args[0], nil, env)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(c.Pid())
	return 0 // without stopping the child
}

// childRole waits for the parent to end (its pidfd becomes readable), then
// prints on stdout and reports its session: a write to a pipe whose reader
// is gone would kill it with SIGPIPE.
func childRole() int {
	ppid, err := strconv.Atoi(os.Getenv(parentPIDEnv))
	if err != nil {
		return 2
	}
	fd, err := unix.PidfdOpen(ppid, 0)
	switch {
	case errors.Is(err, unix.ESRCH): // gone and reaped already
	case err != nil:
		return 3
	default:
		for {
			_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
	}
	sid, _ := unix.Getsid(0)
	var open []string
	entries, _ := os.ReadDir("/proc/self/fd")
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil {
			open = append(open, e.Name()+"="+target)
		}
	}
	fmt.Printf("%s: pid %d session %d fds %s\n", childAfterParent, os.Getpid(), sid, strings.Join(open, " "))
	return 0
}

// runParent runs the parent role and returns its child's pid, once the
// parent has exited. The test is the child subreaper meanwhile, so the
// orphaned child becomes its child and can be waited for. The parent
// inherits inherited (as fd 3, without close-on-exec), as urma-e2e
// inherits the lock of the flock it runs under.
func runParent(t *testing.T, role, logDir string, inherited *os.File) int {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("cannot become a child subreaper: %v", err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"="+role, logDirEnv+"="+logDir)
	cmd.ExtraFiles = []*os.File{inherited}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("parent %s: %v", role, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("parent %s printed %q, not its child's pid", role, out)
	}
	return pid
}

// waitOrphan waits for the orphaned child, now the test's, to end, and
// returns how it ended. reapedByParent says the child was not the test's to
// wait for: it ended while its parent was still exiting (the parent-death
// signal comes when the thread that started the child ends, which may be
// before the whole parent has), and the parent reaped it.
func waitOrphan(t *testing.T, pid int) (ws unix.WaitStatus, reapedByParent bool) {
	t.Helper()
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD) && errors.Is(unix.Kill(pid, 0), unix.ESRCH):
			return ws, true
		case err != nil:
			t.Fatalf("wait for the orphaned child %d: %v", pid, err)
		}
		return ws, false
	}
}

// A child of Start dies with its parent; a child of StartDetached lives on
// after it, in a session of its own, can still write its output, and holds
// none of the descriptors its parent inherited.
func TestChildLifetimeAfterTheParentExits(t *testing.T) {
	for _, tc := range []struct {
		role     string
		survives bool
	}{
		{roleParentAttached, false},
		{roleParentDetached, true},
	} {
		t.Run(tc.role, func(t *testing.T) {
			logDir := t.TempDir()
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			defer pw.Close()
			var st unix.Stat_t
			if err := unix.Fstat(int(pw.Fd()), &st); err != nil {
				t.Fatal(err)
			}
			inherited := fmt.Sprintf("pipe:[%d]", st.Ino)
			pid := runParent(t, tc.role, logDir, pw)
			ws, reapedByParent := waitOrphan(t, pid)
			log, err := os.ReadFile(filepath.Join(logDir, "child.log"))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.survives {
				killed := reapedByParent || (ws.Signaled() && ws.Signal() == syscall.SIGKILL)
				if !killed || strings.Contains(string(log), childAfterParent) {
					t.Fatalf("child of Start outlived its parent: wait status %v, log:\n%s", ws, log)
				}
				return
			}
			want := fmt.Sprintf("%s: pid %d session %d fds ", childAfterParent, pid, pid)
			if reapedByParent || !ws.Exited() || ws.ExitStatus() != 0 || !strings.Contains(string(log), want) {
				t.Fatalf("detached child: wait status %v, want exit 0 after printing %q; log:\n%s", ws, want, log)
			}
			if strings.Contains(string(log), inherited) {
				t.Fatalf("detached child holds %s, which its parent inherited: it would hold it as long as it lives; log:\n%s", inherited, log)
			}
		})
	}
}

func TestDetachedChildHasNoLines(t *testing.T) {
	sh := shPath(t)
	dir := t.TempDir()
	c, err := StartDetached(dir, "sh", sh, []string{"-c", `echo ready; echo oops >&2`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if _, err := c.WaitLine(t.Context(), time.Minute, "ready", func(l string) (string, bool) { return l, l == "ready" }); err == nil || !strings.Contains(err.Error(), "detached") {
		t.Fatalf("WaitLine on a detached child = %v, want an error saying it is detached", err)
	}
	<-c.Done()
	log, err := os.ReadFile(filepath.Join(dir, "sh.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "ready\n") || !strings.Contains(string(log), "oops\n") || len(c.Lines()) != 0 {
		t.Fatalf("log %q, lines %q: want stdout and stderr in the log only", log, c.Lines())
	}
}
