package transport

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// memlockLimit reads the RLIMIT_MEMLOCK soft limit.
func memlockLimit() (limit int64, unlimited bool, err error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, false, fmt.Errorf("getrlimit(RLIMIT_MEMLOCK): %w", err)
	}
	if r.Cur == unix.RLIM_INFINITY {
		return 0, true, nil
	}
	return int64(r.Cur), false, nil
}

// reservedFDs are file descriptors kept for TCP sockets and everything
// else when capping prepared jetties (brpc keeps the same 64).
const reservedFDs = 64

// preparedCap caps prepared jetties by RLIMIT_NOFILE the way brpc does: each
// event-mode connection uses descriptors for its TCP socket and completion
// channel, so at most (limit - 64) / 2 are prepared.
func preparedCap(nofile uint64) int {
	if nofile <= reservedFDs {
		return 0
	}
	return int((nofile - reservedFDs) / 2)
}

// nofileLimit reads the RLIMIT_NOFILE soft limit; ok is false when it is
// infinite or unreadable.
func nofileLimit() (limit uint64, ok bool) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return 0, false
	}
	return r.Cur, true
}
