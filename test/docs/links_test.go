package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdLink is a Markdown link or image: ](target) with an optional title.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// pages are the Markdown files readers navigate: README, CHANGELOG, docs/,
// docs/zh/, the chart's README and the examples' READMEs.
func pages(t *testing.T) []string {
	t.Helper()
	root := filepath.Dir(docsDir(t))
	var out []string
	for _, pattern := range []string{"*.md", "docs/*.md", "docs/zh/*.md", "charts/*/README.md", "examples/*/*.md", "examples/*/*/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) < 10 {
		t.Fatalf("found only %d Markdown pages: did they move?", len(out))
	}
	return out
}

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped (letters of any script, digits, '-' and '_' kept), spaces as '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the heading anchors of a Markdown page, with GitHub's -1,
// -2 suffixes for repeated headings; headings inside code fences are none.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestLinksResolve checks every relative link of the pages: the file it
// names exists, and the heading its #anchor names is on that page.
func TestLinksResolve(t *testing.T) {
	t.Parallel()
	cache := map[string]map[string]bool{}
	for _, page := range pages(t) {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel := mustRel(t, filepath.Dir(docsDir(t)), page)
		inFence := false
		for n, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d links to %s, which does not exist", rel, n+1, target)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				a, ok := cache[dest]
				if !ok {
					b, err := os.ReadFile(dest)
					if err != nil {
						t.Fatal(err)
					}
					a = anchors(string(b))
					cache[dest] = a
				}
				if !a[anchor] {
					t.Errorf("%s:%d links to %s, but %s has no heading #%s", rel, n+1, target, filepath.Base(dest), anchor)
				}
			}
		}
	}
}

func TestSlug(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		" The net.Conn contract":                   "the-netconn-contract",
		" Choosing the software provider's fabric": "choosing-the-software-providers-fabric",
		" `Config`": "config",
		" 9. Where the liburma hardware provider stands": "9-where-the-liburma-hardware-provider-stands",
		" 安装 urma-k8s": "安装-urma-k8s",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
