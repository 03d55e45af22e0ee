package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"
)

// readArchive returns the archive's entries by name.
func readArchive(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read the archive: %v", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read %s: %v", h.Name, err)
		}
		out[h.Name] = data
	}
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// blobOf returns the blob d points at and checks its digest and size.
func blobOf(t *testing.T, entries map[string][]byte, d Descriptor) []byte {
	t.Helper()
	b, ok := entries["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
	if !ok {
		t.Fatalf("blob %s is not in the archive", d.Digest)
	}
	if digestOf(b) != d.Digest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: content has digest %s and size %d, descriptor says size %d", d.Digest, digestOf(b), len(b), d.Size)
	}
	return b
}

type layerEntry struct {
	typ      byte
	mode     int64
	uid, gid int
	data     string
}

func readLayer(t *testing.T, gz []byte) ([]string, map[string]layerEntry, string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("layer is not gzip: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("decompress the layer: %v", err)
	}
	var order []string
	m := map[string]layerEntry{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read the layer: %v", err)
		}
		data, _ := io.ReadAll(tr)
		order = append(order, h.Name)
		m[h.Name] = layerEntry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, data: string(data)}
	}
	return order, m, digestOf(raw)
}

func testImages() []Image {
	return []Image{
		{
			Name: "ghcr.io/openeuler/urma-perf:0.1.0", Arch: "amd64",
			Files: []File{
				{Path: "/usr/local/bin/urma-perf", Mode: 0o755, Data: []byte("\x7fELF binary")},
				{Path: "/etc/passwd", Data: []byte("nonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n")},
				{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
				{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: 65532, GID: 65532},
			},
			Config: Config{User: "65532:65532", Entrypoint: []string{"/usr/local/bin/urma-perf"}, Labels: map[string]string{"org.opencontainers.image.title": "urma-perf"}},
		},
		{Name: "e2e.local/pause:1", Arch: "arm64", Files: []File{{Path: "/pause", Mode: 0o755, Data: []byte("pause")}}, Config: Config{Entrypoint: []string{"/pause"}}},
	}
}

func TestWriteArchiveRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteArchive(&buf, testImages()...); err != nil {
		t.Fatal(err)
	}
	entries := readArchive(t, buf.Bytes())
	if got := string(entries["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", got)
	}
	var idx Index
	if err := json.Unmarshal(entries["index.json"], &idx); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if idx.SchemaVersion != 2 || idx.MediaType != MediaTypeIndex || len(idx.Manifests) != 2 {
		t.Fatalf("index = %+v, want schema 2, OCI index media type, 2 manifests", idx)
	}
	want := testImages()
	for i, md := range idx.Manifests {
		img := want[i]
		if md.Annotations[AnnotationContainerdName] != img.Name {
			t.Errorf("manifest %d is named %q for containerd, want %q", i, md.Annotations[AnnotationContainerdName], img.Name)
		}
		if md.Platform == nil || md.Platform.Architecture != img.Arch || md.Platform.OS != "linux" {
			t.Errorf("manifest %d platform = %+v, want linux/%s", i, md.Platform, img.Arch)
		}
		var m Manifest
		if err := json.Unmarshal(blobOf(t, entries, md), &m); err != nil {
			t.Fatalf("manifest %d: %v", i, err)
		}
		if m.MediaType != MediaTypeManifest || m.Config.MediaType != MediaTypeConfig || len(m.Layers) != 1 || m.Layers[0].MediaType != MediaTypeLayer {
			t.Fatalf("manifest %d = %+v", i, m)
		}
		var cfg ImageConfig
		if err := json.Unmarshal(blobOf(t, entries, m.Config), &cfg); err != nil {
			t.Fatalf("config %d: %v", i, err)
		}
		if cfg.Architecture != img.Arch || cfg.OS != "linux" || cfg.Config.User != img.Config.User ||
			strings.Join(cfg.Config.Entrypoint, " ") != strings.Join(img.Config.Entrypoint, " ") {
			t.Errorf("config %d = %+v, want the image's", i, cfg)
		}
		order, files, diffID := readLayer(t, blobOf(t, entries, m.Layers[0]))
		if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != diffID {
			t.Errorf("config %d diff_ids = %v, want the uncompressed layer's digest %s", i, cfg.RootFS.DiffIDs, diffID)
		}
		for _, f := range img.Files {
			name := strings.TrimPrefix(f.Path, "/")
			if f.Mode.IsDir() {
				name += "/"
			}
			e, ok := files[name]
			if !ok {
				t.Errorf("image %d: %s missing from the layer (has %v)", i, name, order)
				continue
			}
			wantMode := int64(f.Mode.Perm())
			if f.Mode&fs.ModeSticky != 0 {
				wantMode |= 0o1000
			}
			if f.Mode == 0 {
				wantMode = 0o644
			}
			if e.data != string(f.Data) || e.mode != wantMode || e.uid != f.UID || e.gid != f.GID {
				t.Errorf("image %d: %s = %+v, want data %q mode %o owner %d:%d", i, name, e, f.Data, wantMode, f.UID, f.GID)
			}
		}
		for j := 1; j < len(order); j++ {
			if order[j-1] >= order[j] {
				t.Errorf("image %d: layer entries not sorted: %v", i, order)
			}
		}
	}
	// Parents are created when not listed.
	_, files, _ := readLayer(t, blobOfIndex(t, entries, idx, 0))
	for _, dir := range []string{"usr/", "usr/local/", "usr/local/bin/", "etc/", "home/"} {
		if e, ok := files[dir]; !ok || e.typ != tar.TypeDir || e.mode != 0o755 {
			t.Errorf("parent directory %s = %+v (present %v), want a 0755 directory", dir, e, ok)
		}
	}
	if e := files["tmp/"]; e.mode != 0o1777 {
		t.Errorf("tmp/ mode = %o, want 1777 (sticky)", e.mode)
	}
}

func blobOfIndex(t *testing.T, entries map[string][]byte, idx Index, i int) []byte {
	t.Helper()
	var m Manifest
	if err := json.Unmarshal(blobOf(t, entries, idx.Manifests[i]), &m); err != nil {
		t.Fatal(err)
	}
	return blobOf(t, entries, m.Layers[0])
}

func TestWriteArchiveIsReproducible(t *testing.T) {
	var a, b bytes.Buffer
	imgs := testImages()
	if err := WriteArchive(&a, imgs...); err != nil {
		t.Fatal(err)
	}
	// Same files in another order: same bytes.
	imgs[0].Files[0], imgs[0].Files[3] = imgs[0].Files[3], imgs[0].Files[0]
	if err := WriteArchive(&b, imgs...); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two writes of the same images differ")
	}
}

func TestRefName(t *testing.T) {
	for name, want := range map[string]string{
		"ghcr.io/openeuler/urma-perf:0.1.0": "0.1.0",
		"localhost:5000/pause:3.10":         "3.10",
		"e2e.local/pause:1":                 "1",
	} {
		if got := refName(name); got != want {
			t.Errorf("refName(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestWriteArchiveRejects(t *testing.T) {
	ok := func() Image {
		return Image{Name: "e2e.local/x:1", Arch: "amd64", Files: []File{{Path: "/x", Mode: 0o755, Data: []byte("x")}}}
	}
	tests := []struct {
		name   string
		images func() []Image
		want   string
	}{
		{"none", func() []Image { return nil }, "no image"},
		{"no name", func() []Image { i := ok(); i.Name = ""; return []Image{i} }, "no image name"},
		{"no tag", func() []Image { i := ok(); i.Name = "localhost:5000/x"; return []Image{i} }, "no tag"},
		{"empty tag", func() []Image { i := ok(); i.Name = "e2e.local/x:"; return []Image{i} }, "no tag"},
		{"upper case", func() []Image { i := ok(); i.Name = "e2e.local/X:1"; return []Image{i} }, "not a valid image name"},
		{"digest", func() []Image { i := ok(); i.Name = "e2e.local/x@sha256:00"; return []Image{i} }, "not a valid image name"},
		{"no arch", func() []Image { i := ok(); i.Arch = ""; return []Image{i} }, "no architecture"},
		{"twice", func() []Image { return []Image{ok(), ok()} }, "listed twice"},
		{"relative path", func() []Image { i := ok(); i.Files[0].Path = "x"; return []Image{i} }, "must be absolute"},
		{"dot dot", func() []Image { i := ok(); i.Files[0].Path = "/a/../x"; return []Image{i} }, "without '..'"},
		{"root", func() []Image { i := ok(); i.Files[0].Path = "/"; return []Image{i} }, "below /"},
		{"dir with data", func() []Image { i := ok(); i.Files[0].Mode = fs.ModeDir | 0o755; return []Image{i} }, "has contents"},
		{"symlink", func() []Image { i := ok(); i.Files[0].Mode = fs.ModeSymlink | 0o777; return []Image{i} }, "only regular files"},
		{"duplicate file", func() []Image { i := ok(); i.Files = append(i.Files, i.Files[0]); return []Image{i} }, "listed twice"},
		{"file as parent", func() []Image {
			i := ok()
			i.Files = append(i.Files, File{Path: "/x/y", Data: []byte("y")})
			return []Image{i}
		}, "is a file but"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := WriteArchive(&buf, tc.images()...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("WriteArchive error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
