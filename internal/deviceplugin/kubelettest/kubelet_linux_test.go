package kubelettest

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fsImmutableFL is the inode flag FS_IMMUTABLE_FL of <linux/fs.h>, which
// golang.org/x/sys/unix does not name.
const fsImmutableFL = 0x10

// setImmutable sets or clears a directory's immutable attribute, under
// which unlinking an entry fails with EPERM even for root.
func setImmutable(dir string, on bool) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags)
}

// A socket that cannot be removed is an error naming it, not a silent
// success: a restart test would otherwise run against a directory that
// still holds the old plugin's socket.
func TestCleanupSocketsReportsWhatItCannotRemove(t *testing.T) {
	dir, cleanup, err := SocketDir()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	sock := filepath.Join(dir, "plugin.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	defer lis.Close()
	if err := setImmutable(dir, true); err != nil {
		t.Skipf("cannot make %s immutable (needs CAP_LINUX_IMMUTABLE and a filesystem with the attribute): %v", dir, err)
	}
	defer func() {
		if err := setImmutable(dir, false); err != nil {
			t.Errorf("clearing the immutable attribute of %s: %v", dir, err)
		}
	}()
	err = CleanupSockets(dir)
	if err == nil || !strings.Contains(err.Error(), sock) {
		t.Fatalf("CleanupSockets = %v, want an error naming %s", err, sock)
	}
	if _, serr := os.Stat(sock); serr != nil {
		t.Errorf("socket after a failed removal: %v", serr)
	}
}
