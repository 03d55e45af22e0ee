package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// firstScreen is how many lines a reader sees of README.md before deciding:
// what it is, who it is for, where it stands, the quick start, and the two
// commands must all be within it.
const firstScreen = 50

// TestREADMEFirstScreen keeps README.md's opening honest and short: it says
// where the project stands (the liburma provider never on UB hardware), links
// the quick start, and its first commands are `make demo` then `make test`,
// the two CI and every reader start from.
func TestREADMEFirstScreen(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(docsDir(t), "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	fence := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			fence = i
			break
		}
	}
	if fence < 0 || fence >= firstScreen {
		t.Fatalf("README.md's first code block starts at line %d, want it within the first %d lines", fence+1, firstScreen)
	}
	var cmds []string
	for _, l := range lines[fence+1:] {
		if strings.HasPrefix(l, "```") {
			break
		}
		if f := strings.Fields(l); len(f) >= 2 && !strings.HasPrefix(f[0], "#") {
			cmds = append(cmds, f[0]+" "+f[1])
		}
	}
	if len(cmds) < 2 || cmds[0] != "make demo" || cmds[1] != "make test" {
		t.Errorf("README.md's first commands are %q, want make demo, then make test", cmds)
	}
	head := strings.Join(lines[:fence], "\n")
	for _, want := range []struct{ what, re string }{
		{"a link to the quick start", `\]\(docs/quick-start\.md\)`},
		{"its status", `(?i)\*\*status`},
		{"that the liburma provider has never met UB hardware", `(?i)never on UB hardware`},
		{"who it is for", `(?i)\*\*for\*\*`},
	} {
		if !regexp.MustCompile(want.re).MatchString(head) {
			t.Errorf("README.md's first screen (before its first command) does not say %s", want.what)
		}
	}
	ci, err := os.ReadFile(filepath.Join(docsDir(t), "..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^make test$`).Match(ci) {
		t.Error(".ci/run no longer runs `make test`, README.md's second command")
	}
}
