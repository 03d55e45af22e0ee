//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The pids of the components a run started are recorded in -work, one
// "<name> <pid> <start time>" line each, in start order: a -keep run's
// cluster outlives the process that knows them, and -cleanup, a later
// process, stops them from this record (kubelet first, the rest last
// started first). The start time (field 22 of /proc/<pid>/stat, in clock
// ticks since boot) tells a recorded process from a later one that reuses
// its pid.

func (r *run) pidsFile() string { return filepath.Join(r.o.work, "pids") }

// recordedProc is one line of the pids file.
type recordedProc struct {
	name      string
	pid       int
	startTime uint64
}

// recordPid appends a started component to the pids file.
func recordPid(file, name string, pid int) error {
	st, err := procStartTime(pid)
	if err != nil {
		return fmt.Errorf("record the pid of %s: %w", name, err)
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("record the pid of %s: %w", name, err)
	}
	_, werr := fmt.Fprintf(f, "%s %d %d\n", name, pid, st)
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("record the pid of %s in %s: %w", name, file, err)
	}
	return nil
}

// readPids reads the pids file; a missing file is an empty record, and a
// line that does not parse is an error naming it (the file is the run's
// own, so that means it was damaged, and guessing would stop the wrong
// process).
func readPids(file string) ([]recordedProc, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	var out []recordedProc
	var errs []error
	for i, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			errs = append(errs, fmt.Errorf("%s line %d %q: want <name> <pid> <start time>", file, i+1, line))
			continue
		}
		pid, perr := strconv.Atoi(f[1])
		st, serr := strconv.ParseUint(f[2], 10, 64)
		if perr != nil || serr != nil || pid <= 1 {
			errs = append(errs, fmt.Errorf("%s line %d %q: the pid must be a number above 1 and the start time a number", file, i+1, line))
			continue
		}
		out = append(out, recordedProc{name: f[0], pid: pid, startTime: st})
	}
	return out, errors.Join(errs...)
}

// procStartTime reads a process's start time from /proc/<pid>/stat.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses and may
	// hold anything: state is field 3, starttime field 22.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name, want at least 20", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// stopRecorded stops the recorded processes whose name match accepts, last
// started first: SIGTERM to the process group each leads, SIGKILL after a
// grace period. A process that is gone, or whose pid now belongs to another
// process, is skipped. It returns how many it stopped.
func stopRecorded(file string, match func(string) bool) (int, error) {
	procs, err := readPids(file)
	n := 0
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		if !match(p.name) {
			continue
		}
		if st, serr := procStartTime(p.pid); serr != nil || st != p.startTime || !processAlive(p.pid) {
			continue
		}
		signalGroupOf(p.pid, syscall.SIGTERM)
		if !waitExit(p.pid, 5*time.Second) {
			signalGroupOf(p.pid, syscall.SIGKILL)
			waitExit(p.pid, 5*time.Second)
		}
		n++
	}
	return n, err
}

// signalGroupOf signals the process group pid leads, as every component
// does (proc starts each in a group or session of its own); the process
// alone should it lead none.
func signalGroupOf(pid int, sig syscall.Signal) {
	if syscall.Kill(-pid, sig) != nil {
		_ = syscall.Kill(pid, sig)
	}
}
