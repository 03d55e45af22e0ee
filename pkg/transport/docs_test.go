package transport

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// TestDocsAreCurrent keeps docs/transport.md in step with the code: every
// flag with its default and range, every fallback reason, every variable.
func TestDocsAreCurrent(t *testing.T) {
	b, err := os.ReadFile("../../docs/transport.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, s := range append(flags.Specs(), flags.TransportSpecs()...) {
		row := fmt.Sprintf("| `--%s` | `%s` | %s |", s.Name, s.Default, s.Range())
		if !strings.Contains(doc, row) {
			t.Errorf("docs/transport.md lacks the flag row %q", row)
		}
	}
	for _, r := range []Reason{
		ReasonDisabled, ReasonProviderUnavailable, ReasonDeviceMissing, ReasonDeviceUnsuitable,
		ReasonBudgetExhausted, ReasonResources, ReasonPeerNotURMA, ReasonPeerSilent,
		ReasonPeerDeclined, ReasonInvalidHello, ReasonImportFailed, ReasonNoFastPath, ReasonTokenMismatch,
		ReasonWindowTooSmall,
	} {
		if !strings.Contains(doc, "| `"+string(r)+"` |") {
			t.Errorf("docs/transport.md does not explain the fallback reason %s", r)
		}
	}
	for _, v := range []string{EnvFlagsFile, EnvDevice, EnvDevices, EnvEID, EnvJettyBudget, EnvProvider, EnvLibrary, EnvSoftFabric, EnvShmDir, EnvRequireToken} {
		if !strings.Contains(doc, "| `"+v+"` |") {
			t.Errorf("docs/transport.md does not describe %s", v)
		}
	}
}
