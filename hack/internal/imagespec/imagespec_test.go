package imagespec

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/hack/internal/repo"
	"github.com/openeuler/urma-k8s/internal/node/libinject"
)

func root(t *testing.T) string {
	t.Helper()
	dir, err := repo.RootFromWorkingDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// labelRE finds one label of a Dockerfile's LABEL instruction.
var labelRE = regexp.MustCompile(`(org\.opencontainers\.image\.[a-z]+)="([^"]*)"`)

// TestSpecsAreTheDockerfiles holds the images the OCI writer builds to what
// images/*.Dockerfile build: the same images, binaries, user, entrypoint and
// labels, so an image from make image-archives is the one make images would
// give, bar the base's files.
func TestSpecsAreTheDockerfiles(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root(t), "images", "*.Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var names, specNames []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".Dockerfile"))
	}
	for _, s := range Project {
		specNames = append(specNames, s.Name)
	}
	slices.Sort(names)
	slices.Sort(specNames)
	if !slices.Equal(names, specNames) {
		t.Fatalf("images/*.Dockerfile are %v, imagespec.Project has %v", names, specNames)
	}
	for _, s := range Project {
		t.Run(s.Name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(root(t), "images", s.Name+".Dockerfile"))
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			if !regexp.MustCompile(`go build [^\n]*-o /out/` + regexp.QuoteMeta(s.Name) + ` ` + regexp.QuoteMeta(s.Package) + `\n`).MatchString(text) {
				t.Errorf("the Dockerfile does not build %s into /out/%s", s.Package, s.Name)
			}
			img := s.Image("registry.test/x/"+s.Name+":1.0.0", "1.0.0", "amd64", []byte("binary"))
			got := map[string]string{}
			for _, m := range labelRE.FindAllStringSubmatch(text, -1) {
				got[m[1]] = m[2]
			}
			for k, v := range img.Config.Labels {
				if k == "org.opencontainers.image.version" {
					if got[k] != "${VERSION}" {
						t.Errorf("Dockerfile label %s = %q, want ${VERSION}", k, got[k])
					}
					continue
				}
				if got[k] != v {
					t.Errorf("label %s: the Dockerfile says %q, imagespec %q", k, got[k], v)
				}
			}
			if len(got) != len(img.Config.Labels) {
				t.Errorf("the Dockerfile has labels %v, imagespec %v", got, img.Config.Labels)
			}
			if !strings.Contains(text, "\nUSER "+img.Config.User+"\n") {
				t.Errorf("the Dockerfile does not run as %s", img.Config.User)
			}
			if want := `ENTRYPOINT ["` + img.Config.Entrypoint[0] + `"]`; !strings.Contains(text, want) {
				t.Errorf("the Dockerfile has no %s", want)
			}
			var bin bool
			for _, f := range img.Files {
				bin = bin || (f.Path == img.Config.Entrypoint[0] && f.Mode == 0o755 && string(f.Data) == "binary")
			}
			if !bin {
				t.Errorf("the image has no executable %s holding the binary", img.Config.Entrypoint[0])
			}
			copyLib := "\nCOPY --from=liburma /out/liburma.so.0 " + LiburmaPath + "\n"
			buildLib := regexp.MustCompile(`(?s)FROM [^\n]* AS liburma\n.*hack/build-liburma-soft\.sh /out/liburma\.so\.0\n`)
			if has := strings.Contains(text, copyLib) && buildLib.MatchString(text); has != s.Liburma {
				t.Errorf("the Dockerfile builds liburma-soft with hack/build-liburma-soft.sh and copies it to %s: %v; imagespec says %v", LiburmaPath, has, s.Liburma)
			}
		})
	}
}

// TestLicenseIsTheLicenseFile checks that the label names the license the
// repository's LICENSE file holds.
func TestLicenseIsTheLicenseFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root(t), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	heads := map[string][]string{
		"Apache-2.0": {"Apache License", "Version 2.0, January 2004", "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION"},
	}
	want, ok := heads[License]
	if !ok {
		t.Fatalf("License %q: the test knows no text for it", License)
	}
	for _, w := range want {
		if !strings.Contains(string(data), w) {
			t.Errorf("LICENSE does not contain %q, which the %s text has", w, License)
		}
	}
}

// The agents look for liburma-soft where the images put it.
func TestLiburmaPathIsTheAgentsDefault(t *testing.T) {
	if LiburmaPath != libinject.DefaultSoftLib {
		t.Errorf("images carry liburma-soft at %s, the agents look for it at %s", LiburmaPath, libinject.DefaultSoftLib)
	}
	img := Project[0].Image("r/x:1", "1", "amd64", []byte("binary"))
	AddLiburma(&img, []byte("lib"))
	last := img.Files[len(img.Files)-1]
	if last.Path != LiburmaPath || string(last.Data) != "lib" || last.Mode != 0o644 {
		t.Errorf("AddLiburma added %+v", last)
	}
}
