//go:build unix

package proc

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// procAttr puts a child in a process group of its own, and on Linux asks the
// kernel to kill it should the parent itself die without cleaning up. A
// detached child gets a session of its own instead (which makes it the
// leader of a new process group too) and no such signal.
func procAttr(detached bool) *syscall.SysProcAttr {
	if detached {
		return &syscall.SysProcAttr{Setsid: true}
	}
	a := &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(a)
	return a
}

// signalGroup sends sig to the process group led by pid; errors (the group
// is already gone) are of no interest to a caller that is stopping it.
func signalGroup(pid int, sig syscall.Signal) {
	_ = syscall.Kill(-pid, sig)
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec.
// Go opens its own descriptors so, but one this process inherited without
// the flag stays open in every child it starts: the lock of the
// `flock LOCK make e2e` the run was started under, make's jobserver pipe.
// A child that outlives this process would hold them for as long as it
// lives (a -keep cluster kept the e2e lock, and every later run waited).
func closeInheritedOnExec() error {
	entries, err := os.ReadDir("/dev/fd")
	if err != nil {
		return fmt.Errorf("list this process's open descriptors: %w", err)
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			// The descriptor ReadDir itself used is closed by now: EBADF
			// for it is expected.
			syscall.CloseOnExec(fd)
		}
	}
	return nil
}
