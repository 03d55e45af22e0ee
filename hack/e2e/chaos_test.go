//go:build linux

package main

import (
	"errors"
	"os"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/openeuler/urma-k8s/cmd/urma-perf/perfjson"
	"github.com/openeuler/urma-k8s/internal/dra/checkpoint"
)

func TestLastStreamLine(t *testing.T) {
	out := `{"time":"2026-12-03T10:00:01Z","requests":5}
{"time":"2026-12-03T10:00:02Z","requests":9,"dials":2}
{"time":"2026-12-03T10:00:03Z","req`
	l, err := lastStreamLine(out)
	if err != nil || l.Requests != 9 || l.Dials != 2 {
		t.Fatalf("lastStreamLine = %+v, %v; want the last whole report (9 requests)", l, err)
	}
	if _, err := lastStreamLine("urma-perf stream: --server is required\n"); err == nil {
		t.Fatal("a log without a report gave one")
	}
}

func TestCheckStream(t *testing.T) {
	before := perfjson.StreamReport{Requests: 100, Dials: 4, URMADials: 4}
	for _, tc := range []struct {
		name  string
		after perfjson.StreamReport
		want  []string // "" for none
	}{
		{"went on", perfjson.StreamReport{Requests: 200, Dials: 6, URMADials: 6}, nil},
		{"stalled", perfjson.StreamReport{Requests: 100, Dials: 6, URMADials: 6}, []string{"no request answered (100 before, 100 after)"}},
		{"failed", perfjson.StreamReport{Requests: 200, Dials: 7, URMADials: 7, Errors: 2, Reconnects: 1, LastError: "read: EOF"},
			[]string{"2 errors (the last: read: EOF) and 1 reconnects"}},
		{"fell back", perfjson.StreamReport{Requests: 200, Dials: 6, URMADials: 5, TCPDials: 1, LastFallbackReason: "no_fast_path"},
			[]string{"1 connections fell back to TCP (the last: no_fast_path)"}},
	} {
		err := checkStream("perf-stream", before, tc.after)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		for _, w := range append(tc.want, "perf-stream") {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want %q", tc.name, err, w)
			}
		}
	}
}

func TestCorruptFailsOnlyTheChecksum(t *testing.T) {
	path := t.TempDir() + "/" + checkpoint.FileName
	if err := checkpoint.Save(path, checkpoint.Claims{"uid-1": {Namespace: "ns", Name: "c"}}); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := corrupt(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Load(path); !errors.Is(err, checkpoint.ErrUnusable) || !strings.Contains(err.Error(), "fails its checksum") {
		t.Fatalf("Load of the corrupted checkpoint = %v, want a checksum failure", err)
	}
	if _, err := corrupt([]byte(`{"version": 1}`)); err == nil {
		t.Fatal("corrupt of a file without a checksum succeeded")
	}
}

func TestSameSlices(t *testing.T) {
	slice := func(name string, devices ...string) resourcev1.ResourceSlice {
		s := resourcev1.ResourceSlice{}
		s.Name = name
		for _, d := range devices {
			s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: d})
		}
		return s
	}
	before := map[string]resourcev1.ResourceSlice{"a": slice("a", "udma0", "udma1")}
	if err := sameSlices(before, map[string]resourcev1.ResourceSlice{"a": slice("a", "udma0", "udma1")}); err != nil {
		t.Errorf("the same slices differ: %v", err)
	}
	err := sameSlices(before, map[string]resourcev1.ResourceSlice{"a": slice("a", "udma0"), "b": slice("b", "udma1")})
	for _, w := range []string{"slice a publishes other devices", "slice b is new"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v, want %q", err, w)
		}
	}
	if err := sameSlices(before, nil); err == nil || !strings.Contains(err.Error(), "slice a is gone") {
		t.Errorf("error %v, want slice a is gone", err)
	}
}

func TestCountLines(t *testing.T) {
	path := t.TempDir() + "/kubelet.log"
	log := `I1207 "Connection changed" driverName="urma.openeuler.org" connected=true
I1207 "Connection changed" driverName="urma.openeuler.org" connected=false
I1207 "Connection changed" driverName="gpu.example.com" connected=true
I1207 "Connection changed" driverName="urma.openeuler.org" endpoint="/x" connected=true
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := countLines(path, draRegistered...); n != 2 {
		t.Errorf("countLines = %d, want the 2 lines holding all of %q", n, draRegistered)
	}
	if n := countLines(path+".missing", "x"); n != 0 {
		t.Errorf("countLines of a missing file = %d", n)
	}
}
