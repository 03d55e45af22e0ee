// Package repo finds the repository the hack/ programs (make demo, make e2e)
// run from, so they find bin/, charts/ and config/ without being told.
package repo

import (
	"fmt"
	"os"
	"path/filepath"
)

// Root walks up from dir to the directory holding go.mod.
func Root(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod in %s or above: run from the repository (or pass -root)", dir)
		}
	}
}

// RootFromWorkingDir is Root of the working directory.
func RootFromWorkingDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the repository root: %w", err)
	}
	return Root(wd)
}
