package chart_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestHelmLint lints the chart with default values, strictly, and with every
// ci/*-values.yaml.
func TestHelmLint(t *testing.T) {
	t.Parallel()
	type lintCase struct {
		name string
		args []string
	}
	cases := []lintCase{
		{name: "default", args: []string{"lint", chartRelPath}},
		{name: "strict", args: []string{"lint", "--strict", chartRelPath}},
	}
	for _, f := range ciValuesFiles(t) {
		cases = append(cases, lintCase{
			name: "strict " + filepath.Base(f),
			args: []string{"lint", "--strict", chartRelPath, "-f", f},
		})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runHelm(t, tc.args...)
			if res.err != nil {
				t.Fatalf("helm %s: %v\n%s%s", strings.Join(tc.args, " "), res.err, res.stdout, res.stderr)
			}
			if !strings.Contains(res.stdout, "0 chart(s) failed") {
				t.Errorf("helm %s did not report a clean lint:\n%s", strings.Join(tc.args, " "), res.stdout)
			}
		})
	}
}
