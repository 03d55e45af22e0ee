package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// section is one heading of a Markdown page and what its body holds, up to
// the next heading: the structure a translation must keep.
type section struct {
	level   int
	heading string
	rows    int      // table rows, the header and separator included
	code    []string // fenced code blocks, verbatim
}

// sections splits a page at its headings; the text before the first heading
// is a section of level 0. Headings inside code fences are code.
func sections(text string) []section {
	out := []section{{}}
	cur := &out[0]
	var block []string
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			if inFence {
				cur.code = append(cur.code, strings.Join(block, "\n"))
				block = nil
			}
			inFence = !inFence
			continue
		}
		if inFence {
			block = append(block, line)
			continue
		}
		if h := strings.TrimLeft(line, "#"); len(h) < len(line) && strings.HasPrefix(h, " ") {
			out = append(out, section{level: len(line) - len(h), heading: strings.TrimSpace(h)})
			cur = &out[len(out)-1]
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(line), "|") {
			cur.rows++
		}
	}
	return out
}

// structureDiff says how a translation's structure differs from its
// original's, or "" when it keeps every section, table row and code block.
func structureDiff(original, translation string) string {
	en, zh := sections(original), sections(translation)
	var diffs []string
	if len(en) != len(zh) {
		diffs = append(diffs, fmt.Sprintf("%d sections, the original %d", len(zh)-1, len(en)-1))
	}
	for i := 0; i < len(en) && i < len(zh); i++ {
		e, z := en[i], zh[i]
		name := fmt.Sprintf("section %d (%q)", i, e.heading)
		if i == 0 {
			name = "the text before the first heading"
		}
		switch {
		case e.level != z.level:
			diffs = append(diffs, fmt.Sprintf("%s: a level-%d heading where the original has level %d", name, z.level, e.level))
		case e.rows != z.rows:
			diffs = append(diffs, fmt.Sprintf("%s: %d table rows, the original %d", name, z.rows, e.rows))
		case len(e.code) != len(z.code):
			diffs = append(diffs, fmt.Sprintf("%s: %d code blocks, the original %d", name, len(z.code), len(e.code)))
		default:
			for j := range e.code {
				if e.code[j] != z.code[j] {
					diffs = append(diffs, fmt.Sprintf("%s: code block %d differs from the original's (code blocks are kept as they are)", name, j+1))
				}
			}
		}
		if len(diffs) >= 5 {
			break
		}
	}
	return strings.Join(diffs, "; ")
}

// TestTranslationsKeepTheStructure fails a translation that drops or adds a
// section, a table row or a code block of its English page, or changes a
// code block: a summary passes the hash check, not this one.
func TestTranslationsKeepTheStructure(t *testing.T) {
	t.Parallel()
	for _, path := range translations(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Parallel()
			zh, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			marks := translationMarker.FindStringSubmatch(string(zh))
			if marks == nil {
				t.Fatalf("%s has no translation marker", path)
			}
			en, err := os.ReadFile(filepath.Join(filepath.Dir(path), marks[1]))
			if err != nil {
				t.Fatal(err)
			}
			if d := structureDiff(string(en), string(zh)); d != "" {
				t.Errorf("docs/zh/%s is not a full translation of %s: %s", filepath.Base(path), marks[1], d)
			}
		})
	}
}

func TestStructureDiff(t *testing.T) {
	t.Parallel()
	const en = "intro\n# A\n| a | b |\n|---|---|\n| 1 | 2 |\n## B\n```sh\nmake test\n```\ntext\n"
	for _, tc := range []struct {
		name, zh, want string
	}{
		{"a full translation", "引言\n# 甲\n| 甲 | 乙 |\n|---|---|\n| 1 | 2 |\n## 乙\n```sh\nmake test\n```\n正文\n", ""},
		{"a dropped section", "引言\n# 甲\n| 甲 | 乙 |\n|---|---|\n| 1 | 2 |\n```sh\nmake test\n```\n", "1 sections, the original 2"},
		{"a dropped table row", "引言\n# 甲\n| 甲 | 乙 |\n|---|---|\n## 乙\n```sh\nmake test\n```\n", `section 1 ("A"): 2 table rows, the original 3`},
		{"a dropped code block", "引言\n# 甲\n| 甲 | 乙 |\n|---|---|\n| 1 | 2 |\n## 乙\n正文\n", `section 2 ("B"): 0 code blocks, the original 1`},
		{"a changed code block", "引言\n# 甲\n| 甲 | 乙 |\n|---|---|\n| 1 | 2 |\n## 乙\n```sh\nmake tests\n```\n", "code block 1 differs"},
		{"another heading level", "引言\n# 甲\n| 甲 | 乙 |\n|---|---|\n| 1 | 2 |\n### 乙\n```sh\nmake test\n```\n", "a level-3 heading where the original has level 2"},
		{"a heading inside code is code", "引言\n# 甲\n| 甲 | 乙 |\n|---|---|\n| 1 | 2 |\n## 乙\n```sh\nmake test\n```\n```sh\n# 注释\n```\n", `section 2 ("B"): 2 code blocks, the original 1`},
	} {
		got := structureDiff(en, tc.zh)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: structureDiff = %q, want %q", tc.name, got, tc.want)
		}
	}
}
