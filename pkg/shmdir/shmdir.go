// Package shmdir prepares the host directory where the software provider
// of pods on one node meets for shared memory (URMA_SHM_DIR), which the
// node agent (device plugin or DRA driver) mounts into every container it
// gives a device.
package shmdir

import (
	"fmt"
	"os"
	"path/filepath"
)

// Check refuses a directory Prepare must not touch: one that is not a clean
// absolute path (a trailing slash, "//", "." or ".." parts), which the
// mount into containers and the agents' checks would read differently, or
// the root, which Prepare would open to every user.
func Check(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || dir == "/" {
		return fmt.Errorf("shm directory %q: want a clean absolute path other than /", dir)
	}
	return nil
}

// Prepare creates dir and opens it to every user, sticky as /tmp is: pods
// of any user create their sockets there, and none can remove another's.
func Prepare(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create shm directory %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("open shm directory %s to pods: %w", dir, err)
	}
	return nil
}
