// Package devpath maps device node paths between the host's /dev, which
// kubelet, the container runtime and CDI specs speak, and the dev root the
// plugin sees (e.g. /host/dev when the host's /dev is mounted there).
package devpath

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"
)

// HostDev is the host's device directory.
const HostDev = "/dev"

// ToHost maps a path under devRoot to the host path /dev/...; it returns ""
// for "" or a path outside devRoot. devRoot "" means /dev.
func ToHost(devRoot, local string) string {
	if local == "" {
		return ""
	}
	if devRoot == "" {
		devRoot = HostDev
	}
	rel, err := filepath.Rel(devRoot, local)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return ""
	}
	return filepath.Join(HostDev, rel)
}

// ToLocal maps a host path /dev/... to where the plugin sees it under
// devRoot; it returns "" for a path outside /dev.
func ToLocal(devRoot, host string) string {
	if devRoot == "" {
		devRoot = HostDev
	}
	rel, err := filepath.Rel(HostDev, filepath.Clean(host))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || !filepath.IsAbs(host) {
		return ""
	}
	return filepath.Join(devRoot, rel)
}

// Existing maps host /dev/... paths to paths under devRoot and keeps
// those that exist, logging the others.
func Existing(devRoot string, hostPaths []string, log logr.Logger) []string {
	var out []string
	for _, p := range hostPaths {
		local := ToLocal(devRoot, p)
		if local == "" {
			continue
		}
		if _, err := os.Stat(local); err != nil {
			log.Info("extra device node not found; not giving it to containers", "node", p, "lookedAt", local)
			continue
		}
		out = append(out, local)
	}
	return out
}
