// Command imagearchives builds the project's container images without a
// container engine (`make image-archives`): each binary of
// hack/internal/imagespec.Project built static for the target architecture,
// packed as its images/<name>.Dockerfile would (internal/ociimage), one OCI
// image layout archive per image:
//
//	<out>/<name>.oci.tar   holding <registry>/<name>:<tag>
//
// `kind load image-archive`, `minikube image load` and `ctr images import`
// (containerd) read them; skopeo or crane push them to a registry.
//
// Usage: go run ./hack/imagearchives [-out bin/images] [-registry R] [-tag T] [-arch A] [NAME...]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"github.com/openeuler/urma-k8s/hack/internal/imagespec"
	"github.com/openeuler/urma-k8s/hack/internal/repo"
	"github.com/openeuler/urma-k8s/internal/ociimage"
)

// options are the command line.
type options struct {
	root, out, registry, tag, arch string
	names                          []string
}

// defaultRegistry is the chart's global.imageRegistry default, so that the
// archives hold the names the chart asks for.
const defaultRegistry = "ghcr.io/openeuler"

var (
	registryRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$`)
	tagRE      = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	archRE     = regexp.MustCompile(`^[a-z0-9]+$`)
	appVersion = regexp.MustCompile(`(?m)^appVersion: "([^"]+)"$`)
)

func parseOptions(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("imagearchives", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.root, "root", "", "repository root (default: the directory holding go.mod, from the working directory up)")
	fs.StringVar(&o.out, "out", "", "directory of the archives (default <root>/bin/images)")
	fs.StringVar(&o.registry, "registry", defaultRegistry, "registry (host and path) of the image names, as the chart's global.imageRegistry")
	fs.StringVar(&o.tag, "tag", "", "image tag (default: the appVersion of charts/urma-k8s/Chart.yaml, as the chart)")
	fs.StringVar(&o.arch, "arch", runtime.GOARCH, "GOARCH of the images: the nodes' architecture (amd64, arm64)")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	o.names = fs.Args()
	o.registry = strings.TrimSuffix(o.registry, "/")
	if !registryRE.MatchString(o.registry) {
		return options{}, fmt.Errorf("-registry %q is not a registry host and path (lower case, e.g. registry.example.com:5000/urma)", o.registry)
	}
	if o.tag != "" && !tagRE.MatchString(o.tag) {
		return options{}, fmt.Errorf("-tag %q is not an image tag (letters, digits, '_', '.', '-', at most 128)", o.tag)
	}
	if !archRE.MatchString(o.arch) {
		return options{}, fmt.Errorf("-arch %q is not a GOARCH such as amd64 or arm64", o.arch)
	}
	var known []string
	for _, s := range imagespec.Project {
		known = append(known, s.Name)
	}
	for _, n := range o.names {
		if !slices.Contains(known, n) {
			return options{}, fmt.Errorf("unknown image %q; the images are %s", n, strings.Join(known, ", "))
		}
	}
	return o, nil
}

// chartAppVersion reads the chart's appVersion, the tag the chart's images
// default to.
func chartAppVersion(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "charts", "urma-k8s", "Chart.yaml"))
	if err != nil {
		return "", fmt.Errorf("read the chart's appVersion: %w", err)
	}
	m := appVersion.FindSubmatch(b)
	if m == nil {
		return "", errors.New("charts/urma-k8s/Chart.yaml has no appVersion: \"X.Y.Z\" line")
	}
	return string(m[1]), nil
}

// specs are the images named, or every image.
func specs(names []string) []imagespec.Spec {
	if len(names) == 0 {
		return imagespec.Project
	}
	var out []imagespec.Spec
	for _, s := range imagespec.Project {
		if slices.Contains(names, s.Name) {
			out = append(out, s)
		}
	}
	return out
}

// writeArchive packs binary (and, for a node agent's image, liburma) as
// spec's image named ref into path, through a temporary file, so that a
// failed run leaves no half archive behind.
func writeArchive(path string, spec imagespec.Spec, ref, version, arch string, binary, liburma []byte) error {
	img := spec.Image(ref, version, arch, binary)
	if spec.Liburma {
		if len(liburma) == 0 {
			return fmt.Errorf("pack %s: the image carries liburma.so.0 and none was built", ref)
		}
		imagespec.AddLiburma(&img, liburma)
	}
	var buf bytes.Buffer
	if err := ociimage.WriteArchive(&buf, img); err != nil {
		return fmt.Errorf("pack %s: %w", ref, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// build compiles spec's package as its Dockerfile does: static, trimmed,
// for linux/arch.
func build(ctx context.Context, root, dir string, spec imagespec.Spec, arch string, stderr io.Writer) ([]byte, error) {
	out := filepath.Join(dir, spec.Name)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", out, spec.Package)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=-buildvcs=false")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("build %s (%s) for linux/%s: %w", spec.Name, spec.Package, arch, err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("read the %s binary: %w", spec.Name, err)
	}
	return b, nil
}

// buildLiburma builds liburma.so.0 over the software provider as the agents'
// Dockerfiles do (hack/build-liburma-soft.sh), for linux/arch: a cgo
// build, so another architecture than this one's needs a cross compiler in
// CC.
func buildLiburma(ctx context.Context, root, dir, arch string, stderr io.Writer) ([]byte, error) {
	if arch != runtime.GOARCH && os.Getenv("CC") == "" {
		return nil, fmt.Errorf("liburma.so.0 for linux/%s (in the node agents' images) is a cgo build: set CC to a C compiler for linux/%s, e.g. CC=aarch64-linux-gnu-gcc", arch, arch)
	}
	out := filepath.Join(dir, "liburma.so.0")
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "build-liburma-soft.sh"), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=-buildvcs=false")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("build liburma.so.0 for linux/%s: %w", arch, err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("read liburma.so.0: %w", err)
	}
	return b, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	if o.root == "" {
		if o.root, err = repo.RootFromWorkingDir(); err != nil {
			return err
		}
	}
	if o.out == "" {
		o.out = filepath.Join(o.root, "bin", "images")
	}
	if o.tag == "" {
		if o.tag, err = chartAppVersion(o.root); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", o.out, err)
	}
	tmp, err := os.MkdirTemp("", "urma-image-archives-")
	if err != nil {
		return fmt.Errorf("create a build directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	var liburma []byte
	for _, spec := range specs(o.names) {
		if spec.Liburma && liburma == nil {
			if liburma, err = buildLiburma(ctx, o.root, tmp, o.arch, stderr); err != nil {
				return err
			}
		}
		bin, err := build(ctx, o.root, tmp, spec, o.arch, stderr)
		if err != nil {
			return err
		}
		ref := o.registry + "/" + spec.Name + ":" + o.tag
		path := filepath.Join(o.out, spec.Name+".oci.tar")
		if err := writeArchive(path, spec, ref, o.tag, o.arch, bin, liburma); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\t%s\n", path, ref)
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "imagearchives: %v\n", err)
		}
		os.Exit(1)
	}
}
