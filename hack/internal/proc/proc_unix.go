//go:build unix

package proc

import "syscall"

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
