package images_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const modulePath = "github.com/openeuler/urma-k8s"

// wantImages maps each image to the command it packages.
var wantImages = map[string]string{
	"urma-device-plugin": "./cmd/deviceplugin",
	"urma-dra-driver":    "./cmd/dra-driver",
	"urma-operator":      "./cmd/operator",
	"urma-perf":          "./cmd/urma-perf",
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module "+modulePath+"\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of %s above the test directory", modulePath)
		}
		dir = parent
	}
}

// TestDockerfiles checks each Dockerfile: one per binary, a builder stage that
// compiles the right package with CGO_ENABLED=0, and a final stage on a
// distroless static base as user 65532 that runs the binary.
func TestDockerfiles(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "images", "*.Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, strings.TrimSuffix(filepath.Base(f), ".Dockerfile"))
	}
	var want []string
	for name := range wantImages {
		want = append(want, name)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("images/*.Dockerfile = %v, want %v", got, want)
	}

	for name, pkg := range wantImages {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(root, "images", name+".Dockerfile"))
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			stages := regexp.MustCompile(`(?m)^FROM\s+(.*)$`).FindAllStringSubmatch(text, -1)
			if len(stages) < 2 {
				t.Fatalf("want a multi-stage build, found %d FROM lines", len(stages))
			}
			final := text[strings.LastIndex(text, "\nFROM "):]
			checks := []struct {
				what string
				ok   bool
			}{
				{"the builder compiles " + pkg, regexp.MustCompile(`go build [^\n]*-o /out/` + regexp.QuoteMeta(name) + ` ` + regexp.QuoteMeta(pkg) + `\s*$`).MatchString(firstLineWith(text, "go build"))},
				{"a static build (CGO_ENABLED=0)", strings.Contains(text, "CGO_ENABLED=0")},
				{"the final stage uses BASE_IMAGE", strings.Contains(stages[len(stages)-1][1], "${BASE_IMAGE}")},
				{"BASE_IMAGE defaults to distroless static nonroot", regexp.MustCompile(`(?m)^ARG BASE_IMAGE=gcr\.io/distroless/static(-debian\d+)?:nonroot$`).MatchString(text)},
				{"the final stage runs as 65532", regexp.MustCompile(`(?m)^USER 65532(:65532)?$`).MatchString(final)},
				{"the final stage copies only the binary", strings.Contains(final, "COPY --from=build /out/"+name+" /usr/local/bin/"+name)},
				{"the entrypoint is the binary", strings.Contains(final, `ENTRYPOINT ["/usr/local/bin/`+name+`"]`)},
			}
			for _, c := range checks {
				if !c.ok {
					t.Errorf("%s.Dockerfile: want %s", name, c.what)
				}
			}
			// The Go version of the builder must be able to build the module.
			goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(readFile(t, filepath.Join(root, "go.mod")))
			argLine := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindStringSubmatch(text)
			if goLine == nil || argLine == nil || goLine[1] != argLine[1] {
				t.Errorf("%s.Dockerfile GO_VERSION %v differs from go.mod's go line %v", name, argLine, goLine)
			}
		})
	}
}

// TestImagePackagesBuildStatically checks that every packaged command, with
// all its dependencies, builds with CGO_ENABLED=0 as the Dockerfiles build it:
// `go list` reports a package that needs cgo (or is missing) as an error. It
// does not compile (make build and the other tests do); compiling everything a
// second time with another cgo setting would take minutes on a small machine.
func TestImagePackagesBuildStatically(t *testing.T) {
	root := repoRoot(t)
	for name, pkg := range wantImages {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command("go", "list", "-deps", "-e",
				"-f", "{{if .Error}}{{.ImportPath}}: {{.Error}}\n{{end}}{{if .DepsErrors}}{{.ImportPath}}: {{.DepsErrors}}\n{{end}}", pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			var stdout, stderr bytes.Buffer
			cmd.Stdout = &stdout
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("CGO_ENABLED=0 go list -deps %s: %v\n%s", pkg, err, stderr.String())
			}
			if problems := strings.TrimSpace(stdout.String()); problems != "" {
				t.Errorf("%s (image %s) does not build with CGO_ENABLED=0:\n%s", pkg, name, problems)
			}
		})
	}
}

// fakeEngine writes an engine script to dir that answers `info` with
// infoStatus and records every other call, with a listing of its build
// context, in log.
func fakeEngine(t *testing.T, dir, name string, infoStatus int, log string) string {
	t.Helper()
	script := `#!/usr/bin/env bash
if [[ $1 == info ]]; then exit ` + strconv.Itoa(infoStatus) + `; fi
printf '%s\n' "$*" >>` + shellQuote(log) + `
if [[ $1 == build ]]; then
	ctx=${@: -1}
	for f in go.mod go.sum pkg images/urma-operator.Dockerfile bin; do
		if [[ -e $ctx/$f ]]; then echo "context has $f" >>` + shellQuote(log) + `; fi
	done
fi
`
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

type scriptResult struct {
	stdout, stderr string
	code           int
}

func runImages(t *testing.T, env []string, args ...string) scriptResult {
	t.Helper()
	root := repoRoot(t)
	cmd := exec.Command("bash", append([]string{filepath.Join(root, "hack", "images.sh")}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running hack/images.sh: %v", err)
	}
	return scriptResult{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// TestImagesScript runs hack/images.sh against fake engines.
func TestImagesScript(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	working := fakeEngine(t, dir, "working-engine", 0, log)
	broken := fakeEngine(t, dir, "broken-engine", 1, log)
	missing := filepath.Join(dir, "not-installed")

	t.Run("no usable engine fails and says why", func(t *testing.T) {
		res := runImages(t, []string{"CONTAINER_ENGINES=" + missing + " " + broken})
		if res.code != 1 {
			t.Errorf("exit code %d, want 1", res.code)
		}
		for _, want := range []string{"no usable container engine", missing + ": not installed", broken + ": installed, but"} {
			if !strings.Contains(res.stderr, want) {
				t.Errorf("stderr does not say %q:\n%s", want, res.stderr)
			}
		}
		if _, err := os.Stat(log); err == nil {
			t.Errorf("a broken engine was asked to build:\n%s", readFile(t, log))
		}
	})

	t.Run("ALLOW_NO_ENGINE turns it into a skip", func(t *testing.T) {
		res := runImages(t, []string{"CONTAINER_ENGINES=" + missing, "ALLOW_NO_ENGINE=1"})
		if res.code != 0 {
			t.Errorf("exit code %d, want 0", res.code)
		}
		if !strings.Contains(res.stderr, "no usable container engine") || !strings.Contains(res.stderr, "skipping") {
			t.Errorf("stderr does not explain the skip:\n%s", res.stderr)
		}
	})

	t.Run("builds every image with the first usable engine", func(t *testing.T) {
		res := runImages(t, []string{"CONTAINER_ENGINES=" + broken + " " + working, "REGISTRY=registry.test/urma/", "TAG=1.2.3"}, "--push")
		if res.code != 0 {
			t.Fatalf("exit code %d:\n%s", res.code, res.stderr)
		}
		calls := readFile(t, log)
		for name := range wantImages {
			ref := "registry.test/urma/" + name + ":1.2.3"
			if !regexp.MustCompile(`(?m)^build -f \S+/images/` + regexp.QuoteMeta(name) + `\.Dockerfile -t ` + regexp.QuoteMeta(ref) + ` --build-arg VERSION=1\.2\.3 \S+$`).MatchString(calls) {
				t.Errorf("no build of %s in the engine's calls:\n%s", ref, calls)
			}
			if !strings.Contains(calls, "push "+ref+"\n") {
				t.Errorf("%s was not pushed:\n%s", ref, calls)
			}
		}
		for _, want := range []string{"context has go.mod", "context has go.sum", "context has pkg", "context has images/urma-operator.Dockerfile"} {
			if !strings.Contains(calls, want+"\n") {
				t.Errorf("the build context lacks what the Dockerfiles copy (%s):\n%s", want, calls)
			}
		}
		if strings.Contains(calls, "context has bin") {
			t.Errorf("the build context contains bin/, which git ignores")
		}
	})

	t.Run("unknown image is a usage error", func(t *testing.T) {
		res := runImages(t, []string{"CONTAINER_ENGINES=" + working}, "urma-nothing")
		if res.code != 2 || !strings.Contains(res.stderr, "unknown image: urma-nothing") {
			t.Errorf("exit %d, stderr:\n%s", res.code, res.stderr)
		}
	})

	t.Run("print needs no engine", func(t *testing.T) {
		res := runImages(t, []string{"CONTAINER_ENGINES=" + missing, "TAG=9.9.9"}, "--print", "urma-operator")
		if res.code != 0 {
			t.Fatalf("exit code %d:\n%s", res.code, res.stderr)
		}
		want := missing + " build -f ./images/urma-operator.Dockerfile -t ghcr.io/openeuler/urma-operator:9.9.9 --build-arg VERSION=9.9.9 .\n"
		if res.stdout != want {
			t.Errorf("--print printed %q, want %q", res.stdout, want)
		}
	})
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func firstLineWith(text, substr string) string {
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, substr) {
			return line
		}
	}
	return ""
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestExampleDockerfiles checks the Dockerfiles of the examples: the Go
// version of go.mod, a package of this module that exists, the license
// label; and the hardware recipe (examples/liburma) builds with cgo and
// puts UMDK's liburma runtime into the image it runs.
func TestExampleDockerfiles(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "examples", "*", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"grpc-over-urma": false, "liburma": false}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(readFile(t, filepath.Join(root, "go.mod")))
	for _, f := range files {
		example := filepath.Base(filepath.Dir(f))
		want[example] = true
		t.Run(example, func(t *testing.T) {
			text := readFile(t, f)
			if arg := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindStringSubmatch(text); goLine == nil || arg == nil || arg[1] != goLine[1] {
				t.Errorf("GO_VERSION %v differs from go.mod's go line %v", arg, goLine)
			}
			if !strings.Contains(text, `org.opencontainers.image.licenses="Apache-2.0"`) {
				t.Error("no org.opencontainers.image.licenses=\"Apache-2.0\" label")
			}
			pkgs := regexp.MustCompile(`(?m)(?:go build [^\n]* |ARG PACKAGE=)(\./\S+)\s*$`).FindAllStringSubmatch(text, -1)
			if len(pkgs) == 0 {
				t.Fatal("builds no package of this module")
			}
			for _, p := range pkgs {
				if _, err := os.Stat(filepath.Join(root, p[1], "main.go")); err != nil {
					t.Errorf("builds %s, which has no main.go: %v", p[1], err)
				}
			}
			if example != "liburma" {
				return
			}
			final := text[strings.LastIndex(text, "\nFROM "):]
			for _, c := range []struct{ what, re string }{
				{"a cgo build", `(?m)CGO_ENABLED=1 `},
				{"a C compiler in the builder", `(?m)^RUN dnf install -y gcc `},
				{"the UMDK runtime package, umdk-urma-lib", `(?m)^ARG UMDK_PACKAGE=umdk-urma-lib$`},
			} {
				if !regexp.MustCompile(c.re).MatchString(text) {
					t.Errorf("want %s", c.what)
				}
			}
			for _, c := range []string{"dnf install -y ${UMDK_PACKAGE}", "liburma\\.so\\.0", "ENV URMA_PROVIDER=liburma"} {
				if !strings.Contains(final, c) {
					t.Errorf("the final stage lacks %q: the image must carry liburma and refuse to run on the software provider unseen", c)
				}
			}
		})
	}
	for example, found := range want {
		if !found {
			t.Errorf("examples/%s/Dockerfile is missing", example)
		}
	}
}
