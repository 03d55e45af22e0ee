//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tomlValues flattens a TOML file of tables and key = value lines (what
// writeContainerdConfig and `containerd config dump` write) into
// "table.key" -> value, quotes dropped, so that both spellings of a table
// name ("a"."b" and 'a'.'b') look the same.
func tomlValues(b []byte) map[string]string {
	unquote := strings.NewReplacer(`"`, "", "'", "")
	out := map[string]string{}
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			table = unquote.Replace(strings.Trim(line, "[]")) + "."
		default:
			k, v, ok := strings.Cut(line, "=")
			if ok {
				out[table+strings.TrimSpace(k)] = unquote.Replace(strings.TrimSpace(v))
			}
		}
	}
	return out
}

// The run's containerd must leave the host alone. containerd 2.x turns NRI
// on by default: it unlinks and takes over /var/run/nri/nri.sock (another
// runtime's on a shared host), launches the host's /opt/nri/plugins, and
// leaves the socket behind; and its opt plugin creates /opt/containerd/{bin,lib}
// and puts them first on its PATH. Both must be off or under -work.
func TestContainerdConfigKeepsOffTheHost(t *testing.T) {
	work := t.TempDir()
	bin, err := filepath.Abs(filepath.Join("..", "..", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{o: options{work: work, binDir: bin}, paths: newPaths(work, filepath.Join(work, "logs"))}
	if err := r.writeContainerdConfig(); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(r.paths.config, "containerd.toml")
	written, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, cfg map[string]string) {
		t.Helper()
		if got := cfg["plugins.io.containerd.nri.v1.nri.disable"]; got != "true" {
			t.Errorf("NRI disable = %q, want true", got)
		}
		if got := cfg["plugins.io.containerd.internal.v1.opt.path"]; !strings.HasPrefix(got, work+"/") {
			t.Errorf("opt plugin path = %q, want one under -work %s", got, work)
		}
	}
	t.Run("as written", func(t *testing.T) { check(t, tomlValues(written)) })
	// What containerd makes of it, when hack/tools.sh has built it: the
	// table and key names are containerd's, not only ours.
	t.Run("as containerd reads it", func(t *testing.T) {
		containerd := filepath.Join(bin, "containerd", "containerd")
		if _, err := os.Stat(containerd); err != nil {
			t.Skipf("no %s (hack/tools.sh containerd builds it): %v", containerd, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, containerd, "--config", cfgPath, "config", "dump").Output()
		if err != nil {
			t.Fatalf("containerd config dump: %v", err)
		}
		check(t, tomlValues(out))
	})
}
