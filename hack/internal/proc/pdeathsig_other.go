//go:build unix && !linux

package proc

import "syscall"

func setParentDeathSignal(*syscall.SysProcAttr) {}
