package transport

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/transport/flags"
)

// TestDocsAreCurrent keeps docs/transport.md in step with the code: every
// flag with its default and range, every fallback reason, every variable.
// The reasons and variables are read from the package's source, so one
// added without a line in the docs fails here; a row for one the code no
// longer has fails too.
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

	src := parseSources(t, ".")
	reasons := src.reasons(t)
	if !slices.Contains(reasons, string(ReasonDisabled)) || !slices.Contains(reasons, string(ReasonWindowTooSmall)) {
		t.Fatalf("fallback reasons read from the source %q lack %s or %s: the reader is broken", reasons, ReasonDisabled, ReasonWindowTooSmall)
	}
	for _, r := range reasons {
		if !strings.Contains(doc, "| `"+r+"` |") {
			t.Errorf("docs/transport.md does not explain the fallback reason %s", r)
		}
	}
	for _, r := range tableKeys(doc, "## Troubleshooting fallbacks") {
		if !slices.Contains(reasons, r) {
			t.Errorf("docs/transport.md explains the fallback reason %s, which the code does not have", r)
		}
	}

	vars := src.envVars(t)
	if !slices.Contains(vars, EnvFlagsFile) || !slices.Contains(vars, EnvLibrary) {
		t.Fatalf("variables read from the source %q lack %s or %s: the reader is broken", vars, EnvFlagsFile, EnvLibrary)
	}
	for _, v := range vars {
		if !strings.Contains(doc, "| `"+v+"` |") {
			t.Errorf("docs/transport.md does not describe the environment variable %s", v)
		}
	}
	for _, v := range tableKeys(doc, "### Environment") {
		if !slices.Contains(vars, v) {
			t.Errorf("docs/transport.md describes the environment variable %s, which the code does not read", v)
		}
	}
}

// tableKeys are the first cells (`quoted`) of the table under heading.
func tableKeys(doc, heading string) []string {
	_, section, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		return nil
	}
	if i := strings.Index(section, "\n#"); i >= 0 {
		section = section[:i]
	}
	var keys []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|").FindAllStringSubmatch(section, -1) {
		keys = append(keys, m[1])
	}
	return keys
}

// sources is the parsed non-test Go source of a package directory and the
// directories below it (pkg/transport and its subpackages).
type sources struct {
	fset   *token.FileSet
	module string
	root   string // the module's directory
	// pkgs by directory, each file with its package's constants: the
	// scanned ones and those whose constants they use.
	pkgs map[string]*srcPackage
	// scanned are the directories parseSources walked, sorted.
	scanned []string
}

type srcPackage struct {
	files  []*ast.File
	consts map[string]ast.Expr // name -> value (nil: implicit, iota-style)
}

func parseSources(t *testing.T, dir string) *sources {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod names no module")
	}
	s := &sources{fset: token.NewFileSet(), module: string(m[1]), root: root, pkgs: map[string]*srcPackage{}}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() {
			abs, err := filepath.Abs(path)
			if err != nil {
				return err
			}
			s.scanned = append(s.scanned, abs)
			_, err = s.pkg(abs)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("parse %s: %v", dir, err)
	}
	return s
}

// pkg parses the non-test Go files of dir once.
func (s *sources) pkg(dir string) (*srcPackage, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", dir, err)
	}
	if p, ok := s.pkgs[abs]; ok {
		return p, nil
	}
	names, err := filepath.Glob(filepath.Join(abs, "*.go"))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", dir, err)
	}
	p := &srcPackage{consts: map[string]ast.Expr{}}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(s.fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", name, err)
		}
		p.files = append(p.files, f)
		for _, spec := range constSpecs(f) {
			for i, n := range spec.Names {
				var v ast.Expr
				if i < len(spec.Values) {
					v = spec.Values[i]
				}
				p.consts[n.Name] = v
			}
		}
	}
	s.pkgs[abs] = p
	return p, nil
}

func constSpecs(f *ast.File) []*ast.ValueSpec {
	var out []*ast.ValueSpec
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
			for _, sp := range g.Specs {
				out = append(out, sp.(*ast.ValueSpec))
			}
		}
	}
	return out
}

// value is the string a constant expression of file f in package dir
// stands for: a literal, a constant of the package, one of another
// package of the module, or a conversion of one.
func (s *sources) value(dir string, f *ast.File, e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			return strconv.Unquote(e.Value)
		}
	case *ast.ParenExpr:
		return s.value(dir, f, e.X)
	case *ast.CallExpr: // a conversion, Reason("x")
		if len(e.Args) == 1 {
			return s.value(dir, f, e.Args[0])
		}
	case *ast.Ident:
		p, err := s.pkg(dir)
		if err != nil {
			return "", err
		}
		if v, ok := p.consts[e.Name]; ok && v != nil {
			return s.value(dir, s.fileOf(p, v), v)
		}
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			if path, ok := importPath(f, x.Name); ok && strings.HasPrefix(path, s.module+"/") {
				other := filepath.Join(s.root, filepath.FromSlash(strings.TrimPrefix(path, s.module+"/")))
				return s.value(other, f, ast.NewIdent(e.Sel.Name))
			}
		}
	}
	return "", fmt.Errorf("%s: not a string constant this test can read", s.fset.Position(e.Pos()))
}

// fileOf is the file of p that holds node n.
func (s *sources) fileOf(p *srcPackage, n ast.Node) *ast.File {
	for _, f := range p.files {
		if f.FileStart <= n.Pos() && n.Pos() < f.FileEnd {
			return f
		}
	}
	return nil
}

// importPath is the path file f imports under name.
func importPath(f *ast.File, name string) (string, bool) {
	for _, imp := range f.Imports {
		path, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			continue
		}
		local := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			local = imp.Name.Name
		}
		if local == name {
			return path, true
		}
	}
	return "", false
}

// reasons are the values of every constant of type Reason (declared so,
// inherited in a const block, or converted with Reason(...)) in this
// package, sorted.
func (s *sources) reasons(t *testing.T) []string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range s.pkgs[dir].files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			var typ ast.Expr
			for _, sp := range g.Specs {
				spec := sp.(*ast.ValueSpec)
				if spec.Type != nil || len(spec.Values) > 0 {
					typ = spec.Type // a spec with neither repeats the one before
				}
				for i, n := range spec.Names {
					isReason := isIdent(typ, "Reason")
					if i < len(spec.Values) {
						if c, ok := spec.Values[i].(*ast.CallExpr); ok && isIdent(c.Fun, "Reason") {
							isReason = true
						}
					}
					if !isReason {
						continue
					}
					if i >= len(spec.Values) {
						t.Errorf("%s: reason %s has no value of its own this test can read", s.fset.Position(n.Pos()), n.Name)
						continue
					}
					v, err := s.value(dir, f, spec.Values[i])
					if err != nil {
						t.Errorf("reason %s: %v", n.Name, err)
						continue
					}
					out = append(out, v)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// envVars are the environment variables the package and its subpackages
// read, sorted: the values of their constants named Env*, and the argument
// of every call to a function whose name ends in "env" (os.Getenv,
// os.LookupEnv, Config.LookupEnv and the variables holding it).
func (s *sources) envVars(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, dir := range s.scanned {
		for _, f := range s.pkgs[dir].files {
			for _, spec := range constSpecs(f) {
				for i, n := range spec.Names {
					if !regexp.MustCompile(`^Env[A-Z]`).MatchString(n.Name) || i >= len(spec.Values) {
						continue
					}
					v, err := s.value(dir, f, spec.Values[i])
					if err != nil {
						t.Errorf("variable constant %s: %v", n.Name, err)
						continue
					}
					out = append(out, v)
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				var name string
				switch fun := call.Fun.(type) {
				case *ast.Ident:
					name = fun.Name
				case *ast.SelectorExpr:
					name = fun.Sel.Name
				}
				if !strings.HasSuffix(strings.ToLower(name), "env") {
					return true
				}
				v, err := s.value(dir, f, call.Args[0])
				if err != nil {
					t.Errorf("%s reads a variable this test cannot name (give it a constant Env*): %v", name, err)
					return true
				}
				out = append(out, v)
				return true
			})
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
