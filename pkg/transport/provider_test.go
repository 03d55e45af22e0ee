package transport

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/internal/eventually"
	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// TestProviderChoice: urma_provider picks liburma or soft, auto probes
// liburma for a usable UB device, Config.ProviderName beats URMA_PROVIDER
// beats --urma_provider, and the log says which, from where and why.
func TestProviderChoice(t *testing.T) {
	ub := []urma.Port{{Index: 1, State: urma.PortActive}}
	tests := []struct {
		name      string
		choice    string            // Config.ProviderName
		env       map[string]string // the environment
		flag      string            // --urma_provider; "" keeps the default
		lib       *soft.DeviceSpec  // liburma's device; nil: the library does not load
		wantLib   bool              // liburma carries the connections
		wantFB    Reason            // the engine is unusable for this reason
		wantWhy   string            // in the "URMA provider chosen" line
		wantFrom  string            // where the choice came from, in that line
		wantProbe bool              // liburma was loaded (and closed unless chosen)
	}{
		{name: "auto with a UB device", choice: ProviderAuto, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub},
			wantLib: true, wantProbe: true, wantWhy: "lists UB device udma0 with an active port"},
		{name: "auto by default", lib: &soft.DeviceSpec{Name: "udma0", Ports: ub},
			wantLib: true, wantProbe: true, wantWhy: "auto: liburma", wantFrom: "--urma_provider"},
		{name: "auto without the library", choice: ProviderAuto,
			wantWhy: "auto: liburma is not usable, so the software provider: dlopen liburma.so.0: no such file"},
		{name: "auto with only an IP device", choice: ProviderAuto, lib: &soft.DeviceSpec{Name: "udma0", TransportType: urma.TransportIP, Ports: ub},
			wantProbe: true, wantWhy: "lists no UB device with an active port among 1, so the software provider"},
		{name: "auto with the port down", choice: ProviderAuto, lib: &soft.DeviceSpec{Name: "udma0", Ports: []urma.Port{{Index: 1, State: urma.PortDown}}},
			wantProbe: true, wantWhy: "no UB device with an active port"},
		{name: "auto with another device named", choice: ProviderAuto, env: map[string]string{EnvDevice: "udma7"}, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub},
			wantProbe: true, wantWhy: "no UB device with an active port named udma7"},
		{name: "liburma asked for", choice: ProviderLiburma, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub},
			wantLib: true, wantProbe: true, wantWhy: "urma_provider=liburma"},
		{name: "liburma asked for but missing", choice: ProviderLiburma, wantFB: ReasonProviderUnavailable},
		{name: "soft asked for", choice: ProviderSoft, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub}, wantWhy: "urma_provider=soft"},
		{name: "soft from the environment", env: map[string]string{EnvProvider: "soft"}, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub}, wantWhy: "urma_provider=soft", wantFrom: EnvProvider},
		{name: "soft from the flag", flag: ProviderSoft, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub}, wantWhy: "urma_provider=soft", wantFrom: "--urma_provider"},
		{name: "the environment over the flag", flag: ProviderSoft, env: map[string]string{EnvProvider: "liburma"}, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub},
			wantLib: true, wantProbe: true, wantWhy: "urma_provider=liburma", wantFrom: EnvProvider},
		{name: "Config over the environment", choice: ProviderSoft, env: map[string]string{EnvProvider: "liburma"}, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub},
			wantWhy: "urma_provider=soft", wantFrom: "Config.ProviderName"},
		{name: "library from the environment", env: map[string]string{EnvLibrary: "/opt/umdk/liburma.so.0"}, lib: &soft.DeviceSpec{Name: "udma0", Ports: ub},
			wantLib: true, wantProbe: true, wantWhy: "auto: liburma (/opt/umdk/liburma.so.0)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stub *stubLiburma
			var loads int
			open := func(library string, _ logr.Logger) (urma.Provider, error) {
				loads++
				if tc.lib == nil {
					return nil, errors.New("dlopen liburma.so.0: no such file")
				}
				p, err := soft.New(soft.Options{Fabric: soft.NewFabric(), Devices: []soft.DeviceSpec{*tc.lib}})
				if err != nil {
					t.Fatal(err)
				}
				stub = &stubLiburma{Provider: p, library: library}
				return stub, nil
			}
			var logs logLines
			f := smallFlags()
			if tc.flag != "" {
				f.Provider = tc.flag
			}
			cfg := Config{ProviderName: tc.choice, Flags: &f, LookupEnv: envOf(tc.env), Logger: logs.logger(), openLiburma: open}
			ln, err := ListenTransport("tcp", "127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			fb := ln.e.unavailable()
			switch {
			case tc.wantFB == "" && fb != nil:
				t.Fatalf("URMA unavailable: %s: %s", fb.reason, fb.detail)
			case tc.wantFB != "" && (fb == nil || fb.reason != tc.wantFB):
				t.Fatalf("fallback %+v, want %s", fb, tc.wantFB)
			case fb == nil:
				gotLib := ln.e.prov == urma.Provider(stub)
				if gotLib != tc.wantLib {
					t.Errorf("provider %s chosen, want liburma: %v", ln.e.prov.Name(), tc.wantLib)
				}
			}
			if tc.wantWhy != "" {
				if line := logs.find("URMA provider chosen"); !strings.Contains(line, tc.wantWhy) {
					t.Errorf("log line %q does not say %q", line, tc.wantWhy)
				}
			}
			if tc.wantFrom != "" {
				if line, want := logs.find("URMA provider chosen"), fmt.Sprintf("%q=%q", "from", tc.wantFrom); !strings.Contains(line, want) {
					t.Errorf("log line %q does not say %s", line, want)
				}
			}
			if (loads > 0) != tc.wantProbe && tc.lib != nil {
				t.Errorf("liburma loaded %d times, want a load: %v", loads, tc.wantProbe)
			}
			if stub != nil && tc.env[EnvLibrary] != "" && stub.library != tc.env[EnvLibrary] {
				t.Errorf("liburma loaded from %q, want %q", stub.library, tc.env[EnvLibrary])
			}
			if stub != nil && stub.library == "" {
				t.Error("liburma loaded without a library name")
			}
			if err := ln.Close(); err != nil {
				t.Fatal(err)
			}
			if stub != nil {
				// Probed and set aside, or chosen and owned: closed either way.
				eventually.Holds(t, "liburma to be closed", 5*time.Second, stub.isClosed)
			}
			// Closing it went well: nothing to report.
			if line := logs.find("closing liburma"); line != "" {
				t.Errorf("closing liburma logged: %s", line)
			}
		})
	}
}

// A URMA_PROVIDER or --urma_provider outside auto, liburma and soft is a
// configuration error that names the source and the allowed values.
func TestProviderNameInvalid(t *testing.T) {
	f := smallFlags()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{ProviderName: "hw", Flags: &f, LookupEnv: noEnv}, `Config.ProviderName="hw": want one of auto, liburma, soft`},
		{Config{Flags: &f, LookupEnv: envOf(map[string]string{EnvProvider: "libruma"})}, `URMA_PROVIDER="libruma": want one of auto, liburma, soft`},
	} {
		if _, err := tc.cfg.resolve(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resolve() = %v, want an error containing %q", err, tc.want)
		}
	}
	bad := smallFlags()
	bad.Provider = "hw"
	if _, err := (Config{Flags: &bad, LookupEnv: noEnv}).resolve(); err == nil || !strings.Contains(err.Error(), `urma_provider: "hw" is not allowed`) {
		t.Errorf("resolve() with --urma_provider=hw: %v", err)
	}
}
