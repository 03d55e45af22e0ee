// Package ociimage packs files into single-layer container images and writes
// them as an OCI image layout archive (a tar of oci-layout, index.json and
// blobs/sha256/...), which `ctr images import` (containerd) and
// `podman load` read. It lets `make e2e` run the project's binaries in a real
// container runtime with no registry and no image builder.
//
// It is a small writer of its own rather than go-containerregistry: that
// library would add Docker's client and newer golang.org/x modules to the
// project's go.mod for what is a few JSON documents and two tar streams.
//
// The output is reproducible: the same images give the same bytes (fixed
// timestamps, sorted entries, no gzip name or time), so digests are stable
// across runs and machines.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
)

// Media types and annotations of the OCI image spec (v1.1) and containerd.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"

	// AnnotationRefName is the OCI annotation naming a manifest in an index.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationContainerdName is the full image name `ctr images import`
	// gives the manifest it annotates.
	AnnotationContainerdName = "io.containerd.image.name"
)

// epoch is every timestamp in the archive, for reproducible digests.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of an image's filesystem.
type File struct {
	// Path is absolute, e.g. /usr/local/bin/urma-operator. Parent
	// directories are added (mode 0755, owned by root) when not listed.
	Path string
	// Mode holds the permission bits, fs.ModeDir for a directory and
	// fs.ModeSticky (e.g. for /tmp). Zero means 0644 for a file.
	Mode     fs.FileMode
	Data     []byte // contents of a file; must be empty for a directory
	UID, GID int
}

// Config is the runtime configuration of an image (the OCI config's
// "config" object).
type Config struct {
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

// Image is one image to write: its full name (e.g.
// ghcr.io/openeuler/urma-operator:0.1.0), its files (one layer) and config.
type Image struct {
	Name   string
	Files  []File
	Config Config
	OS     string // "linux" when empty
	Arch   string // GOARCH naming, e.g. amd64, arm64; required
}

// Descriptor points at a blob (OCI image spec).
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform is the os/architecture of a manifest in an index.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Index is index.json.
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is an image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// ImageConfig is an image's configuration blob.
type ImageConfig struct {
	Created      string  `json:"created"`
	Architecture string  `json:"architecture"`
	OS           string  `json:"os"`
	Config       Config  `json:"config"`
	RootFS       RootFS  `json:"rootfs"`
	History      []Entry `json:"history,omitempty"`
}

// RootFS lists the uncompressed digests of an image's layers.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// Entry is one history entry of an image config.
type Entry struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// blob is a content-addressed file of the layout.
type blob struct {
	digest string
	data   []byte
}

func newBlob(data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), data: data}
}

func (b blob) descriptor(mediaType string) Descriptor {
	return Descriptor{MediaType: mediaType, Digest: b.digest, Size: int64(len(b.data))}
}

// WriteArchive writes imgs as one OCI image layout tar to w. Each image's
// manifest is listed in index.json under its full name, so that containerd
// imports it as that name.
func WriteArchive(w io.Writer, imgs ...Image) error {
	if len(imgs) == 0 {
		return errors.New("ociimage: no image to write")
	}
	var blobs []blob
	idx := Index{SchemaVersion: 2, MediaType: MediaTypeIndex}
	names := map[string]bool{}
	for _, img := range imgs {
		if names[img.Name] {
			return fmt.Errorf("ociimage: image %q is listed twice", img.Name)
		}
		names[img.Name] = true
		manifest, bs, err := build(img)
		if err != nil {
			return fmt.Errorf("ociimage: image %q: %w", img.Name, err)
		}
		blobs = append(blobs, bs...)
		d := manifest.descriptor(MediaTypeManifest)
		d.Annotations = map[string]string{AnnotationContainerdName: img.Name, AnnotationRefName: refName(img.Name)}
		d.Platform = &Platform{Architecture: img.Arch, OS: osOf(img)}
		idx.Manifests = append(idx.Manifests, d)
		blobs = append(blobs, manifest)
	}
	index, err := json.Marshal(idx)
	if err != nil {
		return fmt.Errorf("ociimage: encode index.json: %w", err)
	}
	tw := tar.NewWriter(w)
	if err := writeEntry(tw, "oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := writeEntry(tw, "index.json", index); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return fmt.Errorf("ociimage: write %s: %w", dir, err)
		}
	}
	for _, b := range blobs {
		if seen[b.digest] {
			continue // two images may share a blob (an identical layer)
		}
		seen[b.digest] = true
		if err := writeEntry(tw, "blobs/sha256/"+strings.TrimPrefix(b.digest, "sha256:"), b.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("ociimage: finish the archive: %w", err)
	}
	return nil
}

func writeEntry(tw *tar.Writer, name string, data []byte) error {
	h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("ociimage: write %s: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("ociimage: write %s: %w", name, err)
	}
	return nil
}

// refName is the part of a full image name that the OCI ref.name
// annotation holds: the tag (or digest) when there is one.
func refName(name string) string {
	last := name[strings.LastIndex(name, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		return last[i+1:]
	}
	return "latest"
}

func osOf(img Image) string {
	if img.OS == "" {
		return "linux"
	}
	return img.OS
}

// build returns an image's manifest blob, and its config and layer blobs.
func build(img Image) (blob, []blob, error) {
	if err := validName(img.Name); err != nil {
		return blob{}, nil, err
	}
	if img.Arch == "" {
		return blob{}, nil, errors.New("no architecture given")
	}
	layerTar, err := layer(img.Files)
	if err != nil {
		return blob{}, nil, err
	}
	diffID := newBlob(layerTar).digest
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if err != nil {
		return blob{}, nil, fmt.Errorf("compress the layer: %w", err)
	}
	// gzip's header has no name and a zero time unless set: reproducible.
	if _, err := zw.Write(layerTar); err != nil {
		return blob{}, nil, fmt.Errorf("compress the layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return blob{}, nil, fmt.Errorf("compress the layer: %w", err)
	}
	layerBlob := newBlob(gz.Bytes())
	created := epoch.Format(time.RFC3339)
	cfg, err := json.Marshal(ImageConfig{
		Created: created, Architecture: img.Arch, OS: osOf(img), Config: img.Config,
		RootFS:  RootFS{Type: "layers", DiffIDs: []string{diffID}},
		History: []Entry{{Created: created, CreatedBy: "github.com/openeuler/urma-k8s/internal/ociimage"}},
	})
	if err != nil {
		return blob{}, nil, fmt.Errorf("encode the config: %w", err)
	}
	cfgBlob := newBlob(cfg)
	m, err := json.Marshal(Manifest{
		SchemaVersion: 2, MediaType: MediaTypeManifest,
		Config: cfgBlob.descriptor(MediaTypeConfig),
		Layers: []Descriptor{layerBlob.descriptor(MediaTypeLayer)},
	})
	if err != nil {
		return blob{}, nil, fmt.Errorf("encode the manifest: %w", err)
	}
	return newBlob(m), []blob{cfgBlob, layerBlob}, nil
}

// validName checks the shape of a full image name: a lower-case
// repository and a tag, e.g. ghcr.io/openeuler/urma-perf:0.1.0.
func validName(name string) error {
	if name == "" {
		return errors.New("no image name given")
	}
	slash := strings.LastIndex(name, "/")
	colon := strings.LastIndex(name, ":")
	if colon <= slash+1 || colon == len(name)-1 {
		return fmt.Errorf("image name %q has no tag (want repository:tag)", name)
	}
	repo := name[:colon]
	if strings.ContainsAny(name, " \t\n@") || strings.ToLower(repo) != repo || strings.HasPrefix(repo, "/") || strings.HasSuffix(repo, "/") {
		return fmt.Errorf("%q is not a valid image name (want a lower-case repository:tag, no digest)", name)
	}
	return nil
}

// layer returns the uncompressed tar of files, parents first, sorted.
func layer(files []File) ([]byte, error) {
	entries := map[string]File{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !path.IsAbs(f.Path) || p == "/" || strings.Contains(f.Path, "/../") || strings.HasSuffix(f.Path, "/..") {
			return nil, fmt.Errorf("file path %q must be absolute, below /, and without '..'", f.Path)
		}
		if f.Mode.IsDir() && len(f.Data) > 0 {
			return nil, fmt.Errorf("directory %s has contents", p)
		}
		if f.Mode&^(fs.ModeDir|fs.ModeSticky|fs.ModePerm) != 0 {
			return nil, fmt.Errorf("%s: only regular files and directories are supported (mode %v)", p, f.Mode)
		}
		if prev, ok := entries[p]; ok && (!prev.Mode.IsDir() || !f.Mode.IsDir()) {
			return nil, fmt.Errorf("%s is listed twice", p)
		}
		f.Path = p
		entries[p] = f
	}
	// Parent directories, unless given.
	for p := range entries {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if e, ok := entries[d]; ok {
				if !e.Mode.IsDir() {
					return nil, fmt.Errorf("%s is a file but %s is below it", d, p)
				}
				continue
			}
			entries[d] = File{Path: d, Mode: fs.ModeDir | 0o755}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths) // a parent sorts before its children
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := entries[p]
		h := &tar.Header{Name: strings.TrimPrefix(p, "/"), Uid: f.UID, Gid: f.GID, ModTime: epoch, Format: tar.FormatPAX}
		if f.Mode.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", int64(f.Mode.Perm())
			if f.Mode&fs.ModeSticky != 0 {
				h.Mode |= 0o1000 // tar's c_ISVTX
			}
		} else {
			perm := f.Mode.Perm()
			if f.Mode == 0 {
				perm = 0o644
			}
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, int64(perm), int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("write %s into the layer: %w", p, err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, fmt.Errorf("write %s into the layer: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("finish the layer: %w", err)
	}
	return buf.Bytes(), nil
}
