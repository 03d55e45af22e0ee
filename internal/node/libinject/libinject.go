// Package libinject decides what liburma a container given a URMA device
// gets from the node agent (device plugin or DRA driver), so that an
// unmodified C or C++ program finds a liburma that works there:
//
//   - for a UB device, the host's own liburma.so* and its provider
//     directory, mounted read-only: UMDK's layouts change between releases
//     without a version bump, and only the host's copy is known to match
//     the host's kernel driver (as NVIDIA's toolkit injects the host's
//     driver libraries);
//   - for a software device, this project's liburma.so.0 over the software
//     provider (cmd/liburma-soft), which the agent's image carries and
//     copies at start into a host directory of its own, from where it is
//     mounted.
//
// Either way the libraries go into one directory of the container,
// ContainerLibDir, which LD_LIBRARY_PATH names (unless the configuration
// says not to): the loader searches it before the image's ld.so.cache and
// system directories, so the injected copy wins over one the image
// carries. The provider directory is mounted where liburma looks for it,
// the same path as on the host (UMDK compiles it in: /usr/lib64/urma).
package libinject

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Defaults: where UMDK's runtime package installs liburma (umdk.spec's
// urma-lib: %{_libdir}/liburma.so.*, liburma_common.so.*, urma/).
const (
	DefaultHostLibDir      = "/usr/lib64"
	DefaultHostProviderDir = "/usr/lib64/urma"
	// DefaultSoftLib is where the agents' images carry liburma-soft.
	DefaultSoftLib = "/usr/lib/urma-k8s/liburma.so.0"
	// DefaultSoftHostDir is the host directory the agent copies it to.
	DefaultSoftHostDir = "/var/lib/urma-k8s/liburma"
	// ContainerLibDir is where a container finds the injected libraries.
	ContainerLibDir = "/opt/urma-k8s/lib"
	// EnvLibraryPath is the loader's search path variable.
	EnvLibraryPath = "LD_LIBRARY_PATH"
	// SoftLibName is the file name of liburma, its SONAME.
	SoftLibName = "liburma.so.0"
)

// HostLibPatterns name the host's libraries a container needs: liburma,
// the common library it and the providers link, and libummu, which the
// udma provider links (UMDK's urma-lib package requires libummu for it).
// liburma.so.0 must be there; the others are taken when they are.
var HostLibPatterns = []string{"liburma.so*", "liburma_common.so*", "libummu.so*"}

// maxHostLibs bounds the files taken from the host's library directory.
const maxHostLibs = 64

// Config says what to inject and where the agent finds it.
type Config struct {
	// Enabled turns injection on; off, containers get no library.
	Enabled bool
	// HostRoot is where this process sees the host's filesystem for
	// HostLibDir and HostProviderDir ("" or "/": as they are).
	HostRoot string
	// HostLibDir is the host directory holding liburma.so*.
	HostLibDir string
	// HostProviderDir is the host directory liburma loads providers from.
	HostProviderDir string
	// SoftLib is this process's copy of liburma-soft; "" injects none for
	// software devices.
	SoftLib string
	// SoftHostDir is a host directory of the agent's own, seen at the same
	// path by this process, where SoftLib is copied for containers.
	SoftHostDir string
	// SetLibraryPath sets LD_LIBRARY_PATH to ContainerLibDir in the
	// container; off, the libraries are only mounted, and the image names
	// the directory itself.
	SetLibraryPath bool
}

// Default is injection on, at UMDK's paths, with LD_LIBRARY_PATH set.
func Default() Config {
	return Config{
		Enabled: true, HostLibDir: DefaultHostLibDir, HostProviderDir: DefaultHostProviderDir,
		SoftLib: DefaultSoftLib, SoftHostDir: DefaultSoftHostDir, SetLibraryPath: true,
	}
}

// AddFlags registers the flags of injection (both agents have them).
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "inject-liburma", c.Enabled, "mount a liburma into every container given a device, for C and C++ programs: the host's (and its provider directory) with a UB device, urma-k8s's liburma over the software provider with software devices")
	fs.StringVar(&c.HostRoot, "liburma-host-root", c.HostRoot, "where this process sees the host's filesystem for --liburma-host-dir and --liburma-provider-dir (containers are always given the host's paths); empty is /")
	fs.StringVar(&c.HostLibDir, "liburma-host-dir", c.HostLibDir, "host directory holding liburma.so*, liburma_common.so* (UMDK's runtime package) and libummu.so* (which the udma provider links)")
	fs.StringVar(&c.HostProviderDir, "liburma-provider-dir", c.HostProviderDir, "host directory liburma loads its providers from (UMDK compiles in /usr/lib64/urma); mounted at the same path")
	fs.StringVar(&c.SoftLib, "liburma-soft", c.SoftLib, "urma-k8s's liburma.so.0 over the software provider, in this image; copied into --liburma-soft-dir for containers given a software device; empty injects none")
	fs.StringVar(&c.SoftHostDir, "liburma-soft-dir", c.SoftHostDir, "host directory of this agent's own (mounted at the same path) that --liburma-soft is copied into")
	fs.BoolVar(&c.SetLibraryPath, "liburma-library-path", c.SetLibraryPath, "set LD_LIBRARY_PATH="+ContainerLibDir+" in the container (it replaces the image's value); off, the libraries are only mounted there")
}

// Validate checks the paths: every host path is clean and absolute.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	for _, p := range []struct{ name, v string }{
		{"host library directory", c.HostLibDir}, {"host provider directory", c.HostProviderDir},
	} {
		if !clean(p.v) {
			errs = append(errs, fmt.Errorf("%s %q: want a clean absolute path", p.name, p.v))
		}
	}
	if c.HostRoot != "" && !clean(c.HostRoot) {
		errs = append(errs, fmt.Errorf("host root %q: want a clean absolute path", c.HostRoot))
	}
	if c.SoftLib != "" && (!clean(c.SoftHostDir) || c.SoftHostDir == "/") {
		errs = append(errs, fmt.Errorf("host directory for the software liburma %q: want a clean absolute path other than /", c.SoftHostDir))
	}
	return errors.Join(errs...)
}

func clean(p string) bool { return filepath.IsAbs(p) && filepath.Clean(p) == p }

// Mount is a bind mount of a host path, read-only, into containers.
type Mount struct {
	HostPath      string
	ContainerPath string
}

// Injection is what a container gets. The zero value injects nothing.
type Injection struct {
	Mounts []Mount
	// Env is LD_LIBRARY_PATH=ContainerLibDir, or empty.
	Env []string
}

// Empty reports whether the injection gives nothing.
func (i Injection) Empty() bool { return len(i.Mounts) == 0 }

// Host finds the host's liburma: the files of HostLibDir matching
// HostLibPatterns, liburma.so.0 among them, and HostProviderDir. The
// error says what is missing; the agent then injects nothing for UB
// devices and says so.
func Host(c Config) (Injection, error) {
	if !c.Enabled {
		return Injection{}, errors.New("injection is off")
	}
	root := c.HostRoot
	if root == "" {
		root = "/"
	}
	local := func(p string) string { return filepath.Join(root, p) }
	entries, err := os.ReadDir(local(c.HostLibDir))
	if err != nil {
		return Injection{}, fmt.Errorf("no liburma on the host: read %s: %w", c.HostLibDir, err)
	}
	var names []string
	for _, e := range entries {
		if !matches(e.Name()) {
			continue
		}
		// A symbolic link (liburma.so.0 -> liburma.so.0.0.1) is mounted
		// as what it names; anything else but a file is not a library.
		if t := e.Type(); t != 0 && t != fs.ModeSymlink {
			continue
		}
		if !regularFile(root, path.Join(c.HostLibDir, e.Name())) {
			continue // a dangling link
		}
		names = append(names, e.Name())
	}
	if !slices.Contains(names, SoftLibName) {
		return Injection{}, fmt.Errorf("no liburma on the host: %s has no %s", c.HostLibDir, SoftLibName)
	}
	if len(names) > maxHostLibs {
		return Injection{}, fmt.Errorf("%s has %d files named like liburma's, more than %d: not UMDK's layout", c.HostLibDir, len(names), maxHostLibs)
	}
	fi, err := os.Stat(local(c.HostProviderDir))
	if err != nil || !fi.IsDir() {
		return Injection{}, fmt.Errorf("liburma is on the host but its provider directory %s is not (%v): it would find no device", c.HostProviderDir, errOr(err, "not a directory"))
	}
	var inj Injection
	slices.Sort(names)
	for _, n := range names {
		inj.Mounts = append(inj.Mounts, Mount{HostPath: path.Join(c.HostLibDir, n), ContainerPath: path.Join(ContainerLibDir, n)})
	}
	inj.Mounts = append(inj.Mounts, Mount{HostPath: c.HostProviderDir, ContainerPath: c.HostProviderDir})
	inj.Env = c.env()
	return inj, nil
}

// regularFile reports whether the host path p (seen under root) is a
// regular file or a link to one, resolving links as the host does: an
// absolute target is the host's path, not this process's.
func regularFile(root, p string) bool {
	for range 8 {
		fi, err := os.Lstat(filepath.Join(root, p))
		switch {
		case err != nil:
			return false
		case fi.Mode().IsRegular():
			return true
		case fi.Mode()&fs.ModeSymlink == 0:
			return false
		}
		target, err := os.Readlink(filepath.Join(root, p))
		if err != nil {
			return false
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = path.Clean(target)
	}
	return false // a loop, or links too deep for a library
}

func (c Config) env() []string {
	if !c.SetLibraryPath {
		return nil
	}
	return []string{EnvLibraryPath + "=" + ContainerLibDir}
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}

func matches(name string) bool {
	for _, p := range HostLibPatterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// Soft copies SoftLib into SoftHostDir (atomically: a container never
// mounts half a library) unless an identical copy is there, and returns
// the injection for software devices.
func Soft(c Config) (Injection, error) {
	if !c.Enabled {
		return Injection{}, errors.New("injection is off")
	}
	if c.SoftLib == "" {
		return Injection{}, errors.New("no software liburma configured")
	}
	want, err := os.ReadFile(c.SoftLib)
	if err != nil {
		return Injection{}, fmt.Errorf("read the software liburma this image carries: %w", err)
	}
	if err := os.MkdirAll(c.SoftHostDir, 0o755); err != nil {
		return Injection{}, fmt.Errorf("create %s: %w", c.SoftHostDir, err)
	}
	dst := filepath.Join(c.SoftHostDir, SoftLibName)
	if have, err := os.ReadFile(dst); err != nil || !bytes.Equal(have, want) {
		if err := writeAtomically(dst, want); err != nil {
			return Injection{}, err
		}
	}
	return Injection{
		Mounts: []Mount{{HostPath: dst, ContainerPath: path.Join(ContainerLibDir, SoftLibName)}},
		Env:    c.env(),
	}, nil
}

// writeAtomically replaces dst with data: a temporary file beside it,
// renamed over it. A container mounting dst meanwhile gets the old file or
// the new one, whole.
func writeAtomically(dst string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return fmt.Errorf("copy the software liburma to %s: %w", dst, err)
	}
	tmp := f.Name()
	_, err = io.Copy(f, bytes.NewReader(data))
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("copy the software liburma to %s: %w", dst, err)
	}
	return nil
}

// Set is the node's injections: one for UB devices, one for software
// devices, each empty when nothing is injected, with the reason.
type Set struct {
	Host, Soft       Injection
	HostWhy, SoftWhy string // why the injection is empty
}

// For is what a container gets whose devices are hardware ones when
// hardware is true (any UB device: the host's stack drives it, the
// software liburma cannot), software ones otherwise.
func (s Set) For(hardware bool) Injection {
	if hardware {
		return s.Host
	}
	return s.Soft
}

// Describe is a short account of the set for the agent's log.
func (s Set) Describe() []any {
	say := func(i Injection, why string) string {
		if i.Empty() {
			return "none: " + why
		}
		var from []string
		for _, m := range i.Mounts {
			from = append(from, m.HostPath)
		}
		return strings.Join(from, ",")
	}
	return []any{"ubDevices", say(s.Host, s.HostWhy), "softwareDevices", say(s.Soft, s.SoftWhy), "containerDir", ContainerLibDir}
}

// Prepare finds the host's libraries and, when the node has software
// devices, publishes the software one, and logs what containers will get.
// A node without the host's libraries advertises its devices all the
// same: their containers' images must then carry liburma.
func Prepare(c Config, softDevices bool, log logr.Logger) Set {
	var s Set
	var err error
	if s.Host, err = Host(c); err != nil {
		s.HostWhy = err.Error()
	}
	if !softDevices {
		s.SoftWhy = "the node has no software device"
	} else if s.Soft, err = Soft(c); err != nil {
		s.SoftWhy = err.Error()
	}
	log.Info("liburma for C programs in containers", s.Describe()...)
	if c.Enabled && s.Host.Empty() {
		log.Info("containers given a UB device get no liburma: their image must carry one matching this host's UB driver", "why", s.HostWhy)
	}
	if c.Enabled && softDevices && s.Soft.Empty() {
		log.Error(errors.New(s.SoftWhy), "containers given a software device get no liburma")
	}
	return s
}

// CDIEdits are an injection as CDI container edits: read-only bind mounts,
// and the environment, which the runtime applies over the image's and the
// pod spec's.
func CDIEdits(inj Injection) ([]*specs.Mount, []string) {
	var mounts []*specs.Mount
	for _, m := range inj.Mounts {
		mounts = append(mounts, &specs.Mount{
			HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind",
			Options: []string{"rbind", "ro", "nosuid", "nodev"},
		})
	}
	return mounts, slices.Clone(inj.Env)
}
