// Package imagespec describes the project's container images as
// images/<name>.Dockerfile builds them (the binary at /usr/local/bin/<name>
// on a distroless-like base, user 65532, the OCI labels), for the programs
// that build them without a container engine through internal/ociimage:
// make e2e and make image-archives. Its test holds it to the Dockerfiles.
package imagespec

import (
	"io/fs"

	"github.com/openeuler/urma-k8s/internal/ociimage"
)

// License is the SPDX identifier of the project's license (LICENSE), the
// value of every image's org.opencontainers.image.licenses label.
const License = "Apache-2.0"

// Source is every image's org.opencontainers.image.source label.
const Source = "https://github.com/openeuler/urma-k8s"

// Spec is one image: its name (the binary's and the Dockerfile's), the Go
// package of its binary, and its description label. Liburma marks a node
// agent's image, which also carries liburma.so.0 over the software
// provider at LiburmaPath (AddLiburma).
type Spec struct {
	Name, Package, Description string
	Liburma                    bool
}

// Project is every image with a Dockerfile under images/.
var Project = []Spec{
	{"urma-device-plugin", "./cmd/deviceplugin", "URMA device plugin, advertises UB jetty budgets to kubelet", true},
	{"urma-dra-driver", "./cmd/dra-driver", "URMA DRA driver, publishes UB jetty budgets as ResourceSlices", true},
	{"urma-operator", "./cmd/operator", "URMA operator, reconciles UrmaEndpoint resources into tuned urma_* flags", false},
	{"urma-perf", "./cmd/urma-perf", "URMA transport benchmark, server and client", false},
}

// LiburmaPath is where a node agent's image carries liburma-soft (the
// agents' --liburma-soft default).
const LiburmaPath = "/usr/lib/urma-k8s/liburma.so.0"

// AddLiburma puts lib, liburma.so.0 built by hack/build-liburma-soft.sh
// for the image's architecture, at LiburmaPath.
func AddLiburma(img *ociimage.Image, lib []byte) {
	img.Files = append(img.Files, ociimage.File{Path: LiburmaPath, Mode: 0o644, Data: lib})
}

// User is the user the images run as, distroless's nonroot.
const User = "65532:65532"

// BaseFiles is what gcr.io/distroless/static:nonroot gives a static binary
// and the Dockerfiles build on: the users, a writable /tmp, the nonroot home.
func BaseFiles() []ociimage.File {
	return []ociimage.File{
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: 65532, GID: 65532},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
	}
}

// Labels are the OCI labels of an image, as its Dockerfile sets them.
func Labels(title, description, version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.licenses":    License,
		"org.opencontainers.image.version":     version,
	}
}

// Image is the image of s named ref (repository:tag) for GOARCH arch, with
// binary (a static build of s.Package) at /usr/local/bin/<name>, labelled
// with version.
func (s Spec) Image(ref, version, arch string, binary []byte) ociimage.Image {
	path := "/usr/local/bin/" + s.Name
	return ociimage.Image{
		Name: ref, Arch: arch,
		Files: append(BaseFiles(), ociimage.File{Path: path, Mode: 0o755, Data: binary}),
		Config: ociimage.Config{
			User:       User,
			Entrypoint: []string{path},
			Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
			Labels:     Labels(s.Name, s.Description, version),
		},
	}
}
