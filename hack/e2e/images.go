//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/openeuler/urma-k8s/hack/internal/imagespec"
	"github.com/openeuler/urma-k8s/internal/ociimage"
)

// pauseImage is the sandbox image make e2e packs beside the project's
// images (imagespec.Project, built static by hack/e2e.sh into <bin>/e2e/).
var pauseImage = imagespec.Spec{Name: "pause", Description: "pod sandbox holder for make e2e"}

// projectImages are the images make e2e packs: the chart's three, urma-perf
// for the test pods, and the sandbox image.
func projectImages() []imagespec.Spec {
	return append(slices.Clone(imagespec.Project), pauseImage)
}

// liburmaFile is liburma over the software provider, which hack/e2e.sh
// builds beside the binaries and the node agents' images carry.
var liburmaFile = filepath.Join("e2e", "liburma.so.0")

func projectBinaries() []string {
	out := []string{liburmaFile, cperfBinary}
	for _, img := range projectImages() {
		out = append(out, filepath.Join("e2e", img.Name))
	}
	return out
}

// imageNames are the names of projectImages.
func imageNames() []string {
	var out []string
	for _, spec := range projectImages() {
		out = append(out, spec.Name)
	}
	return out
}

// imageName is the name an image is imported under; the chart is pointed
// at these names, with pullPolicy Never so nothing is ever pulled.
func imageName(name string) string { return imageRepo + name + ":" + imageTag }

// buildImage is the image of one binary, as its Dockerfile would build it
// (imagespec: a node agent's with liburma), the pause program at /pause
// running as 65535.
func buildImage(spec imagespec.Spec, binary, liburma []byte) ociimage.Image {
	img := spec.Image(imageName(spec.Name), imageTag, runtime.GOARCH, binary)
	if spec.Liburma {
		imagespec.AddLiburma(&img, liburma)
	}
	if spec.Name == pauseImage.Name {
		img.Files = append(imagespec.BaseFiles(), ociimage.File{Path: "/pause", Mode: 0o755, Data: binary})
		img.Config.Entrypoint = []string{"/pause"}
		img.Config.User = "65535:65535"
	}
	return img
}

// packImages writes one OCI archive holding every project image.
func (r *run) packImages() (string, error) {
	var imgs []ociimage.Image
	liburma, err := os.ReadFile(r.bin(liburmaFile))
	if err != nil {
		return "", fmt.Errorf("read liburma.so.0 (hack/e2e.sh builds it): %w", err)
	}
	for _, spec := range projectImages() {
		bin, err := os.ReadFile(r.bin(filepath.Join("e2e", spec.Name)))
		if err != nil {
			return "", fmt.Errorf("read the %s binary: %w", spec.Name, err)
		}
		imgs = append(imgs, buildImage(spec, bin, liburma))
	}
	cperf, err := cperfImage(r.bin(cperfBinary))
	if err != nil {
		return "", err
	}
	imgs = append(imgs, cperf)
	var buf bytes.Buffer
	if err := ociimage.WriteArchive(&buf, imgs...); err != nil {
		return "", err
	}
	path := filepath.Join(r.paths.images, "urma-k8s-e2e.oci.tar")
	if err := writeFile(path, buf.Bytes()); err != nil {
		return "", err
	}
	return path, nil
}

// ctr runs containerd's ctr against this run's containerd, in the CRI's
// namespace, and returns its stdout. Its stderr is only for errors: ctr
// logs warnings there (containerd 2.x's cgroup v1 deprecation) that must not
// be read as output, e.g. as image names.
func (r *run) ctr(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"--address", r.paths.containerdSock, "--namespace", "k8s.io"}, args...)
	cmd := exec.CommandContext(ctx, r.bin("containerd/ctr"), full...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()+string(out)))
	}
	return out, nil
}

func (r *run) startRuntime(ctx context.Context) error {
	containerd, err := r.start("containerd", r.bin("containerd/containerd"), "--config", filepath.Join(r.paths.config, "containerd.toml"))
	if err != nil {
		return err
	}
	err = r.poll(ctx, time.Minute, "containerd to answer on "+r.paths.containerdSock, func(ctx context.Context) (bool, error) {
		if containerd.Exited() {
			return false, fmt.Errorf("containerd exited (%s)%s", containerd.ExitStatus(), containerd.LogTail())
		}
		_, err := r.ctr(ctx, "version")
		return err == nil, nil
	})
	if err != nil {
		return err
	}
	start := time.Now()
	archive, err := r.packImages()
	if err != nil {
		return err
	}
	st, err := os.Stat(archive)
	if err != nil {
		return fmt.Errorf("stat %s: %w", archive, err)
	}
	r.say("packed %d images into %s (%.1f MiB) in %s", len(projectImages())+1, archive, float64(st.Size())/(1<<20), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if _, err := r.ctr(ctx, "images", "import", archive); err != nil {
		return err
	}
	list, err := r.ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return err
	}
	for _, name := range append(imageNames(), cperfImageName) {
		if !strings.Contains(string(list), imageName(name)+"\n") {
			return fmt.Errorf("ctr images import did not create %s; images now: %s", imageName(name), strings.Fields(string(list)))
		}
	}
	var names []string
	for _, n := range strings.Fields(string(list)) {
		if !strings.HasPrefix(n, "sha256:") {
			names = append(names, n)
		}
	}
	r.say("imported into containerd (namespace k8s.io) in %s: %s", time.Since(start).Round(time.Millisecond), strings.Join(names, ", "))
	return nil
}
