// Package shmring is the shared memory under a connection of the software
// provider's shm fabric: a byte stream each way over two rings, the
// eventfds their readers and writers sleep on, and the memfd sealing that
// keeps a peer from changing what this side maps.
//
// Each side of a connection owns one region, a sealed memfd: a control
// page, then the ring it writes its frames into, a byte stream like a
// socket's. The peer maps it read-only. Every word a side writes lives in
// its own region, and whatever the peer's region says is checked before it
// is used. The peer gets a read-only descriptor, and the region is sealed
// against new writable mappings and write(2) (F_SEAL_FUTURE_WRITE) once its
// owner mapped it, since a read-only descriptor alone does not stop the
// peer from reopening the file read-write through /proc/self/fd. A peer's
// region is mapped only once it is a sealed memfd, not on hugetlbfs, of
// exactly the size it announced (SealedSize), and a peer's descriptors are
// written to only once they are eventfds made non-blocking: nothing the
// peer does can crash this process or block it.
//
// Control page words (8 bytes, each on its own cache line):
//
//	magic     "URMASHM1", then version u32 and ring size u32
//	tail      bytes written into this side's ring, ever
//	head      bytes this side consumed from the peer's ring, ever
//	rsleep    odd while this side's reader sleeps and wants a data wake-up
//	wsleep    odd while this side's writer sleeps and wants a space wake-up
//	pulled    bytes this side copied out of the peer's shared memory, ever
//	          (one-copy receives, AddPulled): the progress of a long pull,
//	          which moves neither tail nor head, for the peer's watchdog;
//	          a peer that never moves it (an older one) is watched as before
//
// Wake-ups cost a syscall only for a side that sleeps. A writer stores tail
// and then loads the peer's rsleep; a reader stores an odd rsleep and then
// loads the peer's tail before it blocks. Go's atomics are sequentially
// consistent, so at least one of the two sees the other's store: no wake-up
// is lost. The same pair guards space with head and wsleep.
//
// A Stream knows nothing of frames beyond where one starts (BeginFrame) and
// how long a peer may take over its rest (framebound); its caller, the
// link, decodes them, and learns of a peer's faults through the errors the
// Stream returns (FaultError, framebound.ErrStalled) and of its progress
// through its counters and WatchWords.
package shmring
