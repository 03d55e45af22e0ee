//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/openeuler/urma-k8s/internal/ociimage"
)

// projectImages are the images make e2e packs: the chart's three, urma-perf
// for the test pods, and the sandbox image. The binaries are built static
// by hack/e2e.sh into <bin>/e2e/.
var projectImages = []struct {
	name, title string
	user        string
}{
	{"urma-device-plugin", "URMA device plugin, advertises UB jetty budgets to kubelet", "65532:65532"},
	{"urma-dra-driver", "URMA DRA driver, publishes UB devices as ResourceSlices with jetty capacity", "65532:65532"},
	{"urma-operator", "URMA operator, reconciles UrmaEndpoint resources into tuned urma_* flags", "65532:65532"},
	{"urma-perf", "URMA transport benchmark, server and client", "65532:65532"},
	{"pause", "pod sandbox holder for make e2e", "65535:65535"},
}

func projectBinaries() []string {
	out := make([]string, len(projectImages))
	for i, img := range projectImages {
		out[i] = filepath.Join("e2e", img.name)
	}
	return out
}

// imageName is the name an image is imported under; the chart is pointed
// at these names, with pullPolicy Never so nothing is ever pulled.
func imageName(name string) string { return imageRepo + name + ":" + imageTag }

// baseFiles is what distroless/static:nonroot gives a static binary, and the
// images/*.Dockerfile build on: users, a writable /tmp, the nonroot home.
func baseFiles() []ociimage.File {
	return []ociimage.File{
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: 65532, GID: 65532},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
	}
}

// buildImage is the image of one project binary, as its Dockerfile would
// build it: the binary at /usr/local/bin/<name> (the pause program at
// /pause), run as the given user.
func buildImage(name, title, user string, binary []byte) ociimage.Image {
	path := "/usr/local/bin/" + name
	if name == "pause" {
		path = "/pause"
	}
	files := append(baseFiles(), ociimage.File{Path: path, Mode: 0o755, Data: binary})
	return ociimage.Image{
		Name: imageName(name), Arch: runtime.GOARCH, Files: files,
		Config: ociimage.Config{
			User:       user,
			Entrypoint: []string{path},
			Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
			Labels: map[string]string{
				"org.opencontainers.image.title":       name,
				"org.opencontainers.image.description": title,
				"org.opencontainers.image.source":      "https://github.com/openeuler/urma-k8s",
				"org.opencontainers.image.version":     imageTag,
			},
		},
	}
}

// packImages writes one OCI archive holding every project image.
func (r *run) packImages() (string, error) {
	var imgs []ociimage.Image
	for _, pi := range projectImages {
		bin, err := os.ReadFile(r.bin(filepath.Join("e2e", pi.name)))
		if err != nil {
			return "", fmt.Errorf("read the %s binary: %w", pi.name, err)
		}
		imgs = append(imgs, buildImage(pi.name, pi.title, pi.user, bin))
	}
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
	r.say("packed %d images into %s (%.1f MiB) in %s", len(projectImages), archive, float64(st.Size())/(1<<20), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if _, err := r.ctr(ctx, "images", "import", archive); err != nil {
		return err
	}
	list, err := r.ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return err
	}
	for _, pi := range projectImages {
		if !strings.Contains(string(list), imageName(pi.name)+"\n") {
			return fmt.Errorf("ctr images import did not create %s; images now: %s", imageName(pi.name), strings.Fields(string(list)))
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
