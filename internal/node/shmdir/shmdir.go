// Package shmdir prepares the host directory where the software provider
// of pods on one node meets for shared memory (URMA_SHM_DIR), which the
// node agent (device plugin or DRA driver) mounts into every container it
// gives a device.
package shmdir

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// DefaultDir is the host directory both node drivers default to (the
// device plugin's and the DRA driver's --shm-dir), so that pods of one node
// meet there whichever driver gave them their device.
const DefaultDir = "/var/run/urma-k8s/shm"

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
// It opens only a directory of its own: one holding nothing but the shm
// fabric's sockets (those of running pods when the agent restarts), so a
// mistyped path never makes a system directory such as /etc writable by
// every pod user. One already world-writable and sticky is left as it is.
func Prepare(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create shm directory %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("check shm directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("shm directory %s is a symbolic link or not a directory; name the directory itself", dir)
	}
	if fi.Mode().Perm() == 0o777 && fi.Mode()&os.ModeSticky != 0 {
		return nil
	}
	if err := onlySockets(dir); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("open shm directory %s to pods: %w", dir, err)
	}
	return nil
}

// onlySockets checks that dir holds unix sockets only.
func onlySockets(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list shm directory %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.Type()&fs.ModeSocket == 0 {
			return fmt.Errorf("shm directory %s holds %s, which is not a socket: it looks like a directory of other use, "+
				"and making it world-writable would let every pod user create files there; name a directory of its own", dir, e.Name())
		}
	}
	return nil
}
