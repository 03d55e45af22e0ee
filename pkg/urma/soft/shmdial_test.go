package soft

import (
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// testShmIdentity draws a key for a fake peer.
func testShmIdentity(t testing.TB) *shmIdentity {
	t.Helper()
	id, err := newShmIdentity()
	mustOK(t, err, "draw a key")
	return id
}

// testShmDialer plays an shm dialer one step at a time, so that a test can
// misbehave at any of them.
type testShmDialer struct {
	t                testing.TB
	uc               *net.UnixConn
	id               *shmIdentity
	hello            shmHelloMsg
	ack              shmHelloMsg
	helloMsg, ackMsg []byte
	ino              uint64 // the acceptor's end of the socket, from sock_diag
}

// shmGreetAs sends a HELLO from id to the device dst over uc and reads the
// answer, which it does not check.
func shmGreetAs(t testing.TB, uc *net.UnixConn, id *shmIdentity, dst urma.EID, boot [bootIDLen]byte, ring int) *testShmDialer {
	t.Helper()
	h := shmHelloMsg{typ: shmMsgHello, session: 1, src: id.eid, dst: dst, maxMsg: 1 << 20, bootID: boot, ringSize: uint32(ring), pid: uint32(os.Getpid())}
	copy(h.pub[:], id.pub)
	_, _ = rand.Read(h.nonce[:])
	return shmGreetWith(t, uc, id, h)
}

// shmGreetWith sends the HELLO h, as id, and reads the answer.
func shmGreetWith(t testing.TB, uc *net.UnixConn, id *shmIdentity, h shmHelloMsg) *testShmDialer {
	t.Helper()
	d := &testShmDialer{t: t, uc: uc, id: id, hello: h}
	d.helloMsg = append([]byte(nil), encodeShmHello(make([]byte, shmMaxMsgLen), &h)...)
	_, err := uc.Write(d.helloMsg)
	mustOK(t, err, "send HELLO")
	buf := make([]byte, shmMaxMsgLen+1)
	n, _, err := readShmMsg(uc, buf, 0)
	mustOK(t, err, "read HELLO_ACK")
	d.ack, err = decodeShmHello(buf[:n])
	mustOK(t, err, "decode HELLO_ACK")
	d.ackMsg = unsignedShmHello(buf[:n])
	own, err := connInode(uc)
	mustOK(t, err, "own inode")
	d.ino, err = unixPeerInode(own)
	mustOK(t, err, "peer inode")
	return d
}

// sign is the dialer's signature of the transcript, as an honest dialer
// makes it.
func (d *testShmDialer) sign() []byte {
	return ed25519.Sign(d.id.key, shmTranscript(shmSignDialer, d.helloMsg, d.ackMsg, d.ino))
}

// prove sends a PROOF with sig and fds and reads the READY: its status and
// descriptors.
func (d *testShmDialer) prove(sig []byte, fds []int) (uint8, []int, error) {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := d.uc.WriteMsgUnix(encodeShmProof(make([]byte, shmProofLen), sig), oob, nil); err != nil {
		return 0, nil, err
	}
	buf := make([]byte, shmMaxMsgLen+1)
	n, got, err := readShmMsg(d.uc, buf, shmHelloFds)
	if err != nil {
		return 0, nil, err
	}
	status, err := decodeShmReady(buf[:n])
	if err != nil {
		closeAll(got)
	}
	return status, got, err
}
