package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/internal/deviceplugin"
	"github.com/openeuler/urma-k8s/pkg/urma/sysfs/sysfstest"
)

func noEnv(string) string { return "" }

func TestDiscoverCommand(t *testing.T) {
	tree := sysfstest.New(t)
	tree.Add(t, sysfstest.DefaultDevice("udma0"))
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"discover", "--sysfs-root", tree.SysfsRoot, "--dev-root", tree.DevRoot, "--jetties-per-unit=32"}, noEnv, &out, &errb, deviceplugin.Run)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var devs []struct {
		Name   string `json:"name"`
		Budget struct {
			Jetties, Units uint32
		} `json:"budget"`
	}
	if err := json.Unmarshal(out.Bytes(), &devs); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, out.String())
	}
	// DefaultDevice: max_jetty 1024, reserved 0-15 -> 1008 / 32 = 31 units.
	if len(devs) != 1 || devs[0].Name != "udma0" || devs[0].Budget.Units != 31 || devs[0].Budget.Jetties != 992 {
		t.Fatalf("report %+v", devs)
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"discover", "--jetties-per-unit=-1"}, 2, "unsigned 32-bit"},
		{[]string{"discover", "--jetties-per-unit=0"}, 1, "jetties per unit"},
		{[]string{"discover", "--bonding=sometimes"}, 1, "bonding policy"},
		{[]string{"discover", "--transports=roce"}, 2, "transport type"},
		{[]string{"discover", "extra"}, 2, "unexpected arguments"},
		{[]string{"serve", "--socket-dir=relative"}, 1, "absolute"},
		{[]string{"serve", "--resource-name=jetty"}, 1, "not an extended resource name"},
		{[]string{"--include=udma["}, 1, "udma["},
		{[]string{"help"}, 0, ""},
		// discover does not log: a verbosity would be ignored.
		{[]string{"discover", "-v=2"}, 2, "flag provided but not defined: -v"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := run(context.Background(), tt.args, noEnv, &out, &errb, deviceplugin.Run)
		if code != tt.code || !strings.Contains(errb.String(), tt.want) {
			t.Errorf("run(%q) = %d, stderr %q; want %d containing %q", tt.args, code, errb.String(), tt.code, tt.want)
		}
	}
}

// "-h" or "--help" before any command used to be meant to print the
// command overview, but such arguments select the default command (serve)
// and reach its flag set: the overview never showed, so -h did not tell
// that discover exists. Every -h now shows the overview and the command's
// flags.
func TestHelpShowsCommandsAndFlags(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"serve", "-h"}, {"discover", "--help"}} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, noEnv, &out, &errb, deviceplugin.Run)
		help := errb.String()
		if code != 0 || !strings.Contains(help, "urma-device-plugin discover [flags]") || !strings.Contains(help, "-jetties-per-unit") {
			t.Errorf("run(%q) = %d, stderr begins %q; want 0 with the commands and the flags", args, code, help[:min(len(help), 120)])
		}
	}
}
