package chart_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestValuesDocumented checks that every value in values.yaml has a "# --"
// comment, and that the chart's README lists it.
func TestValuesDocumented(t *testing.T) {
	t.Parallel()
	dir := chartDir(t)
	data, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("parsing values.yaml: %v", err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		t.Fatal("values.yaml is not a mapping")
	}
	var documented []string
	var walk func(prefix string, m *yaml.Node)
	walk = func(prefix string, m *yaml.Node) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			key, val := m.Content[i], m.Content[i+1]
			path := prefix + key.Value
			if strings.HasPrefix(strings.TrimSpace(key.HeadComment), "# --") {
				documented = append(documented, path)
				continue
			}
			// A key without its own description must be a group of values.
			if val.Kind != yaml.MappingNode || val.Style == yaml.FlowStyle {
				t.Errorf("values.yaml: %s (line %d) has no \"# --\" comment describing it", path, key.Line)
				continue
			}
			walk(path+".", val)
		}
	}
	walk("", doc.Content[0])
	if len(documented) < 20 {
		t.Fatalf("found only %d documented values: is the comment format still \"# -- ...\"?", len(documented))
	}
	for _, path := range documented {
		if !strings.Contains(string(readme), "| `"+path+"` |") {
			t.Errorf("charts/urma-k8s/README.md does not list value %s", path)
		}
	}
}
