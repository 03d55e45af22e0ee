// Package shmdir prepares the host directory where the software provider
// of pods on one node meets for shared memory (URMA_SHM_DIR), which the
// node agent (device plugin or DRA driver) mounts into every container it
// gives a device.
package shmdir

import (
	"fmt"
	"os"
)

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
