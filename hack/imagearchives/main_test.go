package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/hack/internal/imagespec"
	"github.com/openeuler/urma-k8s/internal/ociimage"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    options
		wantErr string
	}{
		{name: "defaults", want: options{registry: defaultRegistry, arch: runtime.GOARCH}},
		{name: "a registry with a port and a trailing slash", args: []string{"-registry", "localhost:5000/urma/", "-tag", "1.2.3-rc.1", "-arch", "arm64", "urma-perf"},
			want: options{registry: "localhost:5000/urma", tag: "1.2.3-rc.1", arch: "arm64", names: []string{"urma-perf"}}},
		{name: "an upper-case registry", args: []string{"-registry", "Registry.example.com"}, wantErr: `-registry "Registry.example.com" is not a registry`},
		{name: "a registry with a scheme", args: []string{"-registry", "https://registry.example.com"}, wantErr: "is not a registry"},
		{name: "a tag with a slash", args: []string{"-tag", "v1/x"}, wantErr: `-tag "v1/x" is not an image tag`},
		{name: "an architecture that is no GOARCH", args: []string{"-arch", "linux/arm64"}, wantErr: `-arch "linux/arm64"`},
		{name: "an unknown image", args: []string{"urma-nothing"}, wantErr: `unknown image "urma-nothing"; the images are urma-device-plugin`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseOptions(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseOptions(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.registry != tc.want.registry || got.tag != tc.want.tag || got.arch != tc.want.arch || strings.Join(got.names, ",") != strings.Join(tc.want.names, ",") {
				t.Errorf("parseOptions(%q) = %+v, want %+v", tc.args, got, tc.want)
			}
		})
	}
}

func TestChartAppVersion(t *testing.T) {
	root := t.TempDir()
	if _, err := chartAppVersion(root); err == nil {
		t.Error("no Chart.yaml: no error")
	}
	dir := filepath.Join(root, "charts", "urma-k8s")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Chart.yaml"), []byte("version: 0.2.0\nappVersion: \"0.2.1\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := chartAppVersion(root); err != nil || v != "0.2.1" {
		t.Errorf("chartAppVersion = %q, %v; want 0.2.1", v, err)
	}
}

// TestWriteArchive packs a stand-in binary and reads the archive back as a
// runtime would: index.json names the image, its manifest's config runs the
// binary as the Dockerfile does, with the license label, and the layer holds
// the binary, executable, at /usr/local/bin/<name>.
func TestWriteArchive(t *testing.T) {
	spec := imagespec.Project[0]
	path := filepath.Join(t.TempDir(), spec.Name+".oci.tar")
	ref := "registry.example.com/urma/" + spec.Name + ":1.2.3"
	if err := writeArchive(path, spec, ref, "1.2.3", "arm64", []byte("the binary"), []byte("the library")); err != nil {
		t.Fatal(err)
	}
	files := untar(t, mustRead(t, path))
	var index ociimage.Index
	mustJSON(t, files["index.json"], &index)
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations[ociimage.AnnotationContainerdName] != ref ||
		index.Manifests[0].Platform == nil || index.Manifests[0].Platform.Architecture != "arm64" {
		t.Fatalf("index.json = %+v, want one linux/arm64 manifest named %s", index, ref)
	}
	var manifest ociimage.Manifest
	mustJSON(t, blob(t, files, index.Manifests[0].Digest), &manifest)
	var config ociimage.ImageConfig
	mustJSON(t, blob(t, files, manifest.Config.Digest), &config)
	bin := "/usr/local/bin/" + spec.Name
	if config.Config.User != "65532:65532" || len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != bin {
		t.Errorf("config runs %v as %q, want %s as 65532:65532", config.Config.Entrypoint, config.Config.User, bin)
	}
	if l := config.Config.Labels; l["org.opencontainers.image.licenses"] != imagespec.License || l["org.opencontainers.image.version"] != "1.2.3" {
		t.Errorf("labels = %v, want licenses %s and version 1.2.3", l, imagespec.License)
	}
	if len(manifest.Layers) != 1 {
		t.Fatalf("manifest has %d layers, want 1", len(manifest.Layers))
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(t, files, manifest.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(layer))
	found, lib := false, false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == strings.TrimPrefix(bin, "/") {
			data, _ := io.ReadAll(tr)
			found = string(data) == "the binary" && h.Mode&0o111 != 0
		}
		if h.Name == strings.TrimPrefix(imagespec.LiburmaPath, "/") {
			data, _ := io.ReadAll(tr)
			lib = string(data) == "the library"
		}
	}
	if !found {
		t.Errorf("the layer does not hold the binary at %s, executable", bin)
	}
	if !lib {
		t.Errorf("the layer of %s does not hold liburma.so.0 at %s", spec.Name, imagespec.LiburmaPath)
	}
	// No temporary file is left beside the archive.
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("the output directory holds %d entries, want only the archive", len(entries))
	}
}

func TestWriteArchiveRefusesABadName(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.oci.tar")
	if err := writeArchive(path, imagespec.Project[0], "no-tag", "1", "amd64", []byte("b"), []byte("l")); err == nil {
		t.Fatal("an image name without a tag was packed")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a failed pack left %s behind (%v)", path, err)
	}
}

func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = data
	}
}

func blob(t *testing.T, files map[string][]byte, digest string) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("the archive has no blob %s", digest)
	}
	return b
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustJSON(t *testing.T, b []byte, into any) {
	t.Helper()
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("decode %T: %v", into, err)
	}
}

// A node agent's image carries liburma.so.0: packing one without it fails,
// and building it for another architecture needs a cross compiler, which
// the error names.
func TestAgentImagesNeedLiburma(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.oci.tar")
	if err := writeArchive(path, imagespec.Project[0], "r/x:1", "1", "amd64", []byte("b"), nil); err == nil || !strings.Contains(err.Error(), "liburma.so.0") {
		t.Errorf("an agent image without liburma: %v, want an error naming liburma.so.0", err)
	}
	other := "arm64"
	if runtime.GOARCH == other {
		other = "amd64"
	}
	t.Setenv("CC", "")
	if _, err := buildLiburma(t.Context(), t.TempDir(), t.TempDir(), other, io.Discard); err == nil || !strings.Contains(err.Error(), "CC") {
		t.Errorf("liburma for %s without a cross compiler: %v, want an error naming CC", other, err)
	}
}
