package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseEquivalents(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []equivalent
		wantErr string
	}{
		{
			name: "entries with reasons over several lines",
			in: `# comment

pkg/a/a.go CONDITIONALS_BOUNDARY   if  n > max {
	n == max takes the same branch:
	both return max.
pkg/a/b.go INCREMENT_DECREMENT i++
  only counts retries in a log line.
`,
			want: []equivalent{
				{file: "pkg/a/a.go", kind: "CONDITIONALS_BOUNDARY", code: "if n > max {", reason: "n == max takes the same branch: both return max.", at: 3},
				{file: "pkg/a/b.go", kind: "INCREMENT_DECREMENT", code: "i++", reason: "only counts retries in a log line.", at: 6},
			},
		},
		{
			name: "the Nth mutant of a kind",
			in:   "pkg/a/a.go CONDITIONALS_BOUNDARY#2 if a > 0 && b > 0 {\n\twhy\n",
			want: []equivalent{{file: "pkg/a/a.go", kind: "CONDITIONALS_BOUNDARY", nth: 2, code: "if a > 0 && b > 0 {", reason: "why", at: 1}},
		},
		{name: "N not a number from 1", in: "pkg/a/a.go CONDITIONALS_BOUNDARY#0 x\n\twhy\n", wantErr: `line 1: "CONDITIONALS_BOUNDARY#0": the N of TYPE#N must be a number from 1`},
		{name: "entry without a reason", in: "pkg/a/a.go ARITHMETIC_BASE a + b\n", wantErr: "line 1: entry for pkg/a/a.go ARITHMETIC_BASE says no reason"},
		{name: "reason before any entry", in: "\tbecause\n", wantErr: "line 1: reason \"because\" before any entry"},
		{name: "entry without code", in: "pkg/a/a.go ARITHMETIC_BASE\n\twhy\n", wantErr: "line 1: want"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseEquivalents(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d entries, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if *got[i] != tt.want[i] {
					t.Errorf("entry %d = %+v, want %+v", i, *got[i], tt.want[i])
				}
			}
		})
	}
}

// writeModule lays out a package with one source file and gremlins' result
// for it, and returns the module root and the result file.
func writeModule(t *testing.T, source, result string) (root, resultFile string) {
	t.Helper()
	root = t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "pkg", "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "pkg", "a", "a.go"), []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	resultFile = filepath.Join(root, "a.json")
	if err := os.WriteFile(resultFile, []byte(result), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, resultFile
}

const source = `package a

func clamp(n, max int) int {
	if n > max {
		return max
	}
	return n + 1
}
`

func TestRunReportsEfficacyAndExplainsSurvivors(t *testing.T) {
	result := `{"files":[{"file_name":"a.go","mutations":[
		{"type":"CONDITIONALS_BOUNDARY","status":"LIVED","line":4,"column":7},
		{"type":"ARITHMETIC_BASE","status":"KILLED","line":7,"column":11},
		{"type":"CONDITIONALS_NEGATION","status":"KILLED","line":4,"column":7},
		{"type":"INCREMENT_DECREMENT","status":"NOT COVERED","line":7,"column":11},
		{"type":"INVERT_NEGATIVES","status":"TIMED OUT","line":7,"column":11}]}]}`
	root, res := writeModule(t, source, result)

	tests := []struct {
		name       string
		equivalent string
		goal       string
		wantOK     bool
		wantLines  []string
	}{
		{
			name:      "unexplained survivor",
			goal:      "60",
			wantOK:    false,
			wantLines: []string{"pkg/a  2  1  0  1  1  66.7%  66.7%  75.0%  60%  1 unexplained", "pkg/a/a.go:4:7 CONDITIONALS_BOUNDARY", "if n > max {"},
		},
		{
			name:       "listed survivor leaves the efficacy",
			equivalent: "pkg/a/a.go CONDITIONALS_BOUNDARY if n > max {\n\tn == max returns max either way.\n",
			goal:       "90",
			wantOK:     true,
			wantLines:  []string{"pkg/a  2  1  1  1  1  100.0%  66.7%  75.0%  90%  ok", "equivalent: n == max returns max either way."},
		},
		{
			name:      "below goal",
			goal:      "90",
			wantOK:    false,
			wantLines: []string{"pkg/a  2  1  0  1  1  66.7%  66.7%  75.0%  90%  BELOW GOAL"},
		},
		{
			name:       "stale entry of a measured package",
			equivalent: "pkg/a/a.go CONDITIONALS_BOUNDARY if n > max {\n\twhy\npkg/a/a.go ARITHMETIC_BASE return n + 1\n\tgone\npkg/b/b.go ARITHMETIC_BASE x + y\n\tnot measured\n",
			goal:       "60",
			wantOK:     true,
			wantLines:  []string{"line 3: pkg/a/a.go ARITHMETIC_BASE return n + 1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"-goal", tt.goal, "-root", root}
			if tt.equivalent != "" {
				list := filepath.Join(t.TempDir(), "equivalent.txt")
				if err := os.WriteFile(list, []byte(tt.equivalent), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "-equivalent", list)
			}
			var out strings.Builder
			ok, err := run(append(args, "./pkg/a="+res), &out)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tt.wantOK {
				t.Errorf("goal met = %v, want %v", ok, tt.wantOK)
			}
			// Compare with runs of spaces collapsed: tabwriter pads columns.
			got := strings.Join(strings.Fields(out.String()), " ")
			for _, want := range tt.wantLines {
				if !strings.Contains(got, strings.Join(strings.Fields(want), " ")) {
					t.Errorf("report lacks %q:\n%s", want, out.String())
				}
			}
			if strings.Contains(got, "pkg/b/b.go") {
				t.Errorf("an entry of an unmeasured package was reported stale:\n%s", out.String())
			}
		})
	}
}

// With two mutants of a kind on a line, TYPE#N names one of them.
func TestEquivalentNamesTheNthMutantOfALine(t *testing.T) {
	src := "package a\n\nfunc both(a, b int) bool {\n\tif a > 0 && b > 0 {\n\t\treturn true\n\t}\n\treturn false\n}\n"
	result := `{"files":[{"file_name":"a.go","mutations":[
		{"type":"CONDITIONALS_BOUNDARY","status":"KILLED","line":4,"column":7},
		{"type":"CONDITIONALS_BOUNDARY","status":"LIVED","line":4,"column":18}]}]}`
	root, res := writeModule(t, src, result)
	for _, tc := range []struct {
		entry     string
		explained bool
	}{
		{"pkg/a/a.go CONDITIONALS_BOUNDARY#1 if a > 0 && b > 0 {\n\tthe first\n", false},
		{"pkg/a/a.go CONDITIONALS_BOUNDARY#2 if a > 0 && b > 0 {\n\tthe second\n", true},
		{"pkg/a/a.go CONDITIONALS_BOUNDARY if a > 0 && b > 0 {\n\tall of them\n", true},
	} {
		list := filepath.Join(t.TempDir(), "equivalent.txt")
		if err := os.WriteFile(list, []byte(tc.entry), 0o644); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		ok, err := run([]string{"-root", root, "-equivalent", list, "pkg/a=" + res}, &out)
		if err != nil {
			t.Fatal(err)
		}
		if ok != tc.explained {
			t.Errorf("entry %q: survivor explained = %v, want %v:\n%s", tc.entry, ok, tc.explained, out.String())
		}
		if !strings.Contains(out.String(), "pkg/a/a.go:4:18 CONDITIONALS_BOUNDARY#2") {
			t.Errorf("the survivor is not named as the second of its line:\n%s", out.String())
		}
	}
}

// A run over the files changed since a commit mutates only some files of a
// package: the entries of its other files are not stale, but those of a
// file that is gone are.
func TestStaleOnlyForMutatedOrMissingFiles(t *testing.T) {
	result := `{"files":[{"file_name":"a.go","mutations":[{"type":"CONDITIONALS_BOUNDARY","status":"KILLED","line":4,"column":7}]}]}`
	root, res := writeModule(t, source, result)
	if err := os.WriteFile(filepath.Join(root, "pkg", "a", "other.go"), []byte("package a\n\nvar x = 1 + 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(t.TempDir(), "equivalent.txt")
	entries := "pkg/a/a.go ARITHMETIC_BASE return n + 1\n\tmutated, no survivor\n" +
		"pkg/a/other.go ARITHMETIC_BASE var x = 1 + 2\n\tnot mutated this run\n" +
		"pkg/a/gone.go ARITHMETIC_BASE x + y\n\tthe file was deleted\n"
	if err := os.WriteFile(list, []byte(entries), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if _, err := run([]string{"-root", root, "-equivalent", list, "pkg/a=" + res}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"pkg/a/a.go ARITHMETIC_BASE", "pkg/a/gone.go ARITHMETIC_BASE"} {
		if !strings.Contains(got, want) {
			t.Errorf("report does not call %q stale:\n%s", want, got)
		}
	}
	if strings.Contains(got, "pkg/a/other.go") {
		t.Errorf("an entry of a file this run did not mutate was called stale:\n%s", got)
	}
}

func TestRunPackageWithoutMutants(t *testing.T) {
	root, res := writeModule(t, "package a\n", `{"files":[]}`)
	var out strings.Builder
	ok, err := run([]string{"-root", root, "pkg/a=" + res}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || !strings.Contains(out.String(), "no mutants") {
		t.Errorf("goal met = %v, report:\n%s\nwant met and \"no mutants\"", ok, out.String())
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	root, res := writeModule(t, source, `{"files":[{"file_name":"a.go","mutations":[{"type":"ARITHMETIC_BASE","status":"LIVED","line":99,"column":1}]}]}`)
	bad := filepath.Join(root, "bad.json")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no results", []string{"-root", root}, "no results given"},
		{"argument without result", []string{"-root", root, "pkg/a"}, `argument "pkg/a": want PKGDIR=RESULT.json`},
		{"missing result", []string{"-root", root, "pkg/a=" + filepath.Join(root, "none.json")}, "read gremlins result of pkg/a"},
		{"corrupt result", []string{"-root", root, "pkg/a=" + bad}, "parse gremlins result"},
		{"survivor outside the file", []string{"-root", root, "pkg/a=" + res}, "pkg/a/a.go has no line 99"},
		{"missing list", []string{"-root", root, "-equivalent", filepath.Join(root, "none.txt"), "pkg/a=" + res}, "open equivalent-mutant list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := run(tt.args, &strings.Builder{})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}
