package docs_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// translationMarker ends every translation: the English page it was made
// from and that page's SHA-256 at the time. A change to the English page
// then fails TestTranslationsFollowTheirSource until someone carries it over
// and records the new hash, instead of the translation drifting silently.
var translationMarker = regexp.MustCompile(`<!-- translation-of: (\S+) sha256=([0-9a-f]{64}) -->`)

// codeSpan is one inline code span (`...`) of Markdown.
var codeSpan = regexp.MustCompile("`([^`\n]+)`")

func docsDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "docs"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func mustRel(t *testing.T, base, target string) string {
	t.Helper()
	rel, err := filepath.Rel(base, target)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

func translations(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(docsDir(t), "zh", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no translations under docs/zh: did they move?")
	}
	return paths
}

func TestTranslationsFollowTheirSource(t *testing.T) {
	t.Parallel()
	for _, path := range translations(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			marks := translationMarker.FindAllStringSubmatch(string(data), -1)
			if len(marks) != 1 {
				t.Fatalf("%s has %d translation markers, want one: end it with <!-- translation-of: ../PAGE.md sha256=HASH -->", path, len(marks))
			}
			source := filepath.Join(filepath.Dir(path), marks[0][1])
			original, err := os.ReadFile(source)
			if err != nil {
				t.Fatalf("%s translates %s: %v", path, marks[0][1], err)
			}
			sum := sha256.Sum256(original)
			if got := hex.EncodeToString(sum[:]); got != marks[0][2] {
				rel := "docs/" + filepath.ToSlash(mustRel(t, docsDir(t), source))
				t.Errorf("%s changed since docs/zh/%s was translated from it: carry the change over (git log -p %s), then set sha256=%s",
					rel, filepath.Base(path), rel, got)
			}
		})
	}
}

// TestTranslationsNameOnlyWhatTheOriginalsName catches a translation that
// keeps a flag, field or value the English pages renamed or dropped. Spans
// holding Chinese text are translated prose, not names, and are skipped.
func TestTranslationsNameOnlyWhatTheOriginalsName(t *testing.T) {
	t.Parallel()
	english, err := filepath.Glob(filepath.Join(docsDir(t), "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	english = append(english, filepath.Join(docsDir(t), "..", "charts", "urma-k8s", "README.md"), filepath.Join(docsDir(t), "..", "README.md"))
	// English pages wrap long spans over lines, translations seldom do:
	// compare with runs of white space as one space.
	var corpus strings.Builder
	for _, p := range english {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		corpus.WriteString(strings.Join(strings.Fields(string(data)), " "))
		corpus.WriteString("\n")
	}
	for _, path := range translations(t) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range codeSpan.FindAllStringSubmatch(string(data), -1) {
			span := m[1]
			if strings.IndexFunc(span, func(r rune) bool { return unicode.Is(unicode.Han, r) }) >= 0 {
				continue
			}
			if !strings.Contains(corpus.String(), strings.Join(strings.Fields(span), " ")) {
				t.Errorf("%s names `%s`, which no English page does", filepath.Base(path), span)
			}
		}
	}
}
