//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/hack/internal/proc"
)

func TestReadPidsRefusesDamagedLines(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pids")
	if got, err := readPids(file); err != nil || len(got) != 0 {
		t.Fatalf("readPids of a missing file = %v, %v; want nothing", got, err)
	}
	content := "etcd 100 5\nkubelet x 6\nshort 7\ncontainerd 1 8\nkube-apiserver 101 9\n"
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readPids(file)
	want := []recordedProc{{"etcd", 100, 5}, {"kube-apiserver", 101, 9}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("readPids = %v, want the good lines %v", got, want)
	}
	for _, w := range []string{"line 2", "line 3", "line 4", file} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v does not name %s", err, w)
		}
	}
}

// What one process records, another stops: kubelet first when asked, the
// rest last started first; a pid whose start time differs from the record
// (reused by another process) is left alone.
func TestStopRecordedStopsWhatAnotherRunStarted(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pids")
	start := func(name string) *proc.Child {
		t.Helper()
		c, err := proc.StartDetached(dir, name, "/bin/sh", []string{"-c", "exec sleep 600"}, nil)
		if err != nil {
			t.Skipf("no /bin/sh: %v", err)
		}
		t.Cleanup(c.Stop)
		if err := recordPid(file, name, c.Pid()); err != nil {
			t.Fatal(err)
		}
		return c
	}
	etcd, kubelet := start("etcd"), start("kubelet")
	reused := start("reused")
	// Rewrite the last record's start time: its pid now stands for another
	// process.
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	lines[2] = fmt.Sprintf("reused %d 1", reused.Pid())
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	n, err := stopRecorded(file, func(name string) bool { return name == "kubelet" })
	if err != nil || n != 1 {
		t.Fatalf("stopRecorded(kubelet) = %d, %v; want 1", n, err)
	}
	<-kubelet.Done()
	if etcd.Exited() {
		t.Fatal("etcd stopped when only kubelet was asked for")
	}
	n, err = stopRecorded(file, func(string) bool { return true })
	if err != nil || n != 1 {
		t.Fatalf("stopRecorded(all) = %d, %v; want 1 (etcd; kubelet is gone, reused is not the recorded process)", n, err)
	}
	<-etcd.Done()
	if reused.Exited() {
		t.Fatal("a process whose start time differs from the record was stopped")
	}
}
