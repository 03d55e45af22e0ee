package deps

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/openeuler/urma-k8s/"

// A tree is a set of the module's packages with one job. A package may
// import any package of its own tree and of a tree of a lower layer; any
// other import of the module is upward (a higher layer) or sideways (another
// tree of its layer), and fails the test.
type tree struct {
	name  string
	layer int
	// paths are module-relative package paths; "x/..." is x and everything
	// under it.
	paths []string
}

// trees is every package of the module, by layer, lowest first. A new
// package must be placed here (and in docs/architecture.md, which shows
// this table).
var trees = []tree{
	{"contracts", 0, []string{"internal/podenv", "internal/nodefacts/..."}},
	{"helpers", 0, []string{"internal/memcopy", "internal/flagvar", "internal/kubeclient", "internal/stopsignal/...", "internal/logtest", "internal/eventually", "internal/ociimage"}},
	{"URMA", 1, []string{"pkg/urma/..."}},
	{"API types", 1, []string{"api/..."}},
	{"transport", 2, []string{"pkg/transport/..."}},
	{"node core", 2, []string{"internal/node/..."}},
	{"benchmark baselines", 2, []string{"internal/benchbase"}},
	{"liburma over the software provider", 2, []string{"internal/liburmasoft"}},
	{"device plugin", 3, []string{"internal/deviceplugin/..."}},
	{"DRA driver", 3, []string{"internal/dra/..."}},
	{"operator", 3, []string{"controllers/...", "internal/operator/..."}},
	{"commands and examples", 4, []string{"cmd/...", "examples/..."}},
	{"tools and repository tests", 5, []string{"hack/...", "test/..."}},
}

// A binaryRule says what a binary (or a library, for everything that links
// it) must not link.
type binaryRule struct {
	pkg string
	// not are module-relative paths ("x/..." for a subtree), paths of
	// other modules ending in "/" ("k8s.io/"), or "*": anything outside the
	// standard library.
	not []string
	// except are allowed although under a path of not.
	except []string
	why    string
}

var kubernetes = []string{"k8s.io/", "sigs.k8s.io/"}

var dataPlane = []string{"pkg/urma/soft/...", "pkg/urma/liburma/...", "internal/memcopy", "pkg/transport/..."}

var binaryRules = []binaryRule{
	{pkg: "cmd/operator", not: append(slices.Clone(dataPlane), "pkg/urma/sysfs/...", "internal/node/...", "internal/deviceplugin/...", "internal/dra/..."),
		except: []string{"pkg/transport/flags"},
		why:    "the operator links no data plane and no node agent; of pkg/transport only the flag table it writes"},
	{pkg: "cmd/deviceplugin", not: append(slices.Clone(dataPlane), "internal/dra/...", "internal/operator/...", "controllers/...", "api/..."),
		why: "the device plugin links no data plane, DRA driver or operator"},
	{pkg: "cmd/dra-driver", not: append(slices.Clone(dataPlane), "internal/deviceplugin/...", "internal/operator/...", "controllers/...", "api/..."),
		why: "the DRA driver links no data plane, device plugin or operator"},
	{pkg: "pkg/urma", not: kubernetes, why: "pkg/urma knows nothing of Kubernetes"},
	{pkg: "pkg/urma/soft", not: append(slices.Clone(kubernetes), "pkg/transport/..."), why: "the software provider knows nothing of Kubernetes or transports"},
	{pkg: "pkg/urma/liburma", not: append(slices.Clone(kubernetes), "pkg/transport/..."), why: "the liburma provider knows nothing of Kubernetes or transports"},
	{pkg: "pkg/transport", not: kubernetes, why: "pkg/transport knows nothing of Kubernetes"},
	{pkg: "cmd/liburma-soft", not: append(slices.Clone(kubernetes), "pkg/transport/..."), why: "the C library over the software provider knows nothing of Kubernetes or transports"},
	{pkg: "internal/podenv", not: []string{"*"}, why: "the container environment's contract imports only the standard library"},
	{pkg: "internal/nodefacts", not: []string{"*"}, why: "the node facts' contract imports only the standard library"},
}

type pkgInfo struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Standard   bool
	Error      *struct{ Err string }
}

// list runs go list on the whole module once.
func list(t *testing.T) map[string]*pkgInfo {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command("go", "list", "-e", "-deps", "-json=ImportPath,Imports,Deps,Standard,Error", "./...")
	c.Dir = root
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	pkgs := map[string]*pkgInfo{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkgInfo
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		if p.Error != nil && strings.HasPrefix(p.ImportPath, module) {
			t.Fatalf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs[p.ImportPath] = &p
	}
	return pkgs
}

// rel is a module package's path relative to the module, "" for others.
func rel(importPath string) string {
	r, ok := strings.CutPrefix(importPath, module)
	if !ok {
		return ""
	}
	return r
}

// under reports whether a package matches a pattern: "x/..." matches the
// module's x and everything under it, "host/" every package of another
// module under that path, "*" every package, anything else the module's
// package of that path.
func under(importPath, pattern string) bool {
	r := rel(importPath)
	switch {
	case pattern == "*":
		return true
	case strings.HasSuffix(pattern, "/..."):
		base := strings.TrimSuffix(pattern, "/...")
		return r == base || strings.HasPrefix(r, base+"/")
	case strings.HasSuffix(pattern, "/"):
		return r == "" && strings.HasPrefix(importPath, pattern)
	default:
		return r == pattern
	}
}

func treeOf(importPath string) (tree, bool) {
	for _, tr := range trees {
		for _, p := range tr.paths {
			if under(importPath, p) {
				return tr, true
			}
		}
	}
	return tree{}, false
}

func TestNothingImportsUpward(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list on the module")
	}
	pkgs := list(t)
	for path, p := range pkgs {
		if rel(path) == "" {
			continue
		}
		from, ok := treeOf(path)
		if !ok {
			t.Errorf("%s is in no tree: place it in test/deps's trees and in docs/architecture.md", rel(path))
			continue
		}
		for _, imp := range p.Imports {
			if rel(imp) == "" {
				continue
			}
			to, ok := treeOf(imp)
			switch {
			case !ok:
				// reported as a package of its own
			case to.name == from.name:
			case to.layer < from.layer:
			case to.layer > from.layer:
				t.Errorf("%s (%s, layer %d) imports %s (%s, layer %d): upward", rel(path), from.name, from.layer, rel(imp), to.name, to.layer)
			default:
				t.Errorf("%s (%s) imports %s (%s): sideways, two trees of layer %d", rel(path), from.name, rel(imp), to.name, from.layer)
			}
		}
	}
}

func TestEachBinaryLinksOnlyWhatItRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list on the module")
	}
	pkgs := list(t)
	for _, r := range binaryRules {
		p, ok := pkgs[module+r.pkg]
		if !ok {
			t.Errorf("rule for %s: no such package", r.pkg)
			continue
		}
		for _, d := range p.Deps {
			if pkgs[d] != nil && pkgs[d].Standard {
				continue
			}
			if slices.ContainsFunc(r.except, func(e string) bool { return under(d, e) }) {
				continue
			}
			for _, not := range r.not {
				if under(d, not) {
					t.Errorf("%s links %s (%s): %s", r.pkg, d, whoImports(pkgs, p, d), r.why)
					break
				}
			}
		}
	}
}

// whoImports names one chain from p to dep, for a message that says where
// to cut.
func whoImports(pkgs map[string]*pkgInfo, p *pkgInfo, dep string) string {
	prev := map[string]string{p.ImportPath: ""}
	queue := []string{p.ImportPath}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == dep {
			var chain []string
			for c := cur; c != ""; c = prev[c] {
				chain = append(chain, strings.TrimPrefix(c, module))
			}
			slices.Reverse(chain)
			return "via " + strings.Join(chain, " -> ")
		}
		if q := pkgs[cur]; q != nil {
			for _, imp := range q.Imports {
				if _, seen := prev[imp]; !seen {
					prev[imp] = cur
					queue = append(queue, imp)
				}
			}
		}
	}
	return "chain not found"
}

// TestArchitectureDocShowsTheRules keeps docs/architecture.md's tables the
// ones this test checks.
func TestArchitectureDocShowsTheRules(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{treesTable(), rulesTable()} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/architecture.md does not show the table test/deps checks; put this in it:\n\n%s", want)
		}
	}
}

func code(paths []string) string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = "`" + p + "`"
	}
	return strings.Join(out, ", ")
}

func treesTable() string {
	var b strings.Builder
	b.WriteString("| layer | tree | packages |\n|---|---|---|\n")
	for _, tr := range trees {
		fmt.Fprintf(&b, "| %d | %s | %s |\n", tr.layer, tr.name, code(tr.paths))
	}
	return b.String()
}

func rulesTable() string {
	var b strings.Builder
	b.WriteString("| package | links nothing of | except | because |\n|---|---|---|---|\n")
	for _, r := range binaryRules {
		not := code(r.not)
		if slices.Equal(r.not, []string{"*"}) {
			not = "anything outside the standard library"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.pkg, not, code(r.except), r.why)
	}
	return b.String()
}
