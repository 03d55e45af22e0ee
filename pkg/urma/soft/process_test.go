package soft

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// childEnv makes the test binary act as the peer process of
// TestCrossProcessKill.
const childEnv = "URMA_SOFT_TEST_CHILD"

// TestCrossProcessChild is the peer process: it prints its device EID and
// jetty id, imports the jetty the parent names on stdin, echoes one message
// back reversed, and then waits to be killed.
func TestCrossProcessChild(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("helper process for TestCrossProcessKill")
	}
	p, err := New(Options{Logger: logr.Discard()})
	mustOK(t, err, "child provider")
	s := newSide(t, p, urma.JettyConfig{RNRRetry: 7}, 64)
	fmt.Printf("READY %s %d\n", s.ctx.EID(), s.jetty.ID().ID)
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		t.Fatal("no PEER line")
	}
	f := strings.Fields(in.Text())
	if len(f) != 3 || f[0] != "PEER" {
		t.Fatalf("bad PEER line %q", in.Text())
	}
	eid, err := urma.ParseEID(f[1])
	mustOK(t, err, "peer EID")
	id, err := strconv.ParseUint(f[2], 10, 32)
	mustOK(t, err, "peer jetty")
	target, err := s.ctx.ImportJetty(t.Context(), urma.JettyID{EID: eid, ID: uint32(id)}, urma.RC, 7)
	mustOK(t, err, "import parent jetty")
	s.postRecv(1, 0, 4096)
	c := pollN(t, s.rjfc, 1, 10*time.Second)[0]
	msg := s.mem.Bytes()[:c.CompletionLen]
	out := s.mem.Bytes()[8192 : 8192+len(msg)]
	for i := range msg {
		out[i] = msg[len(msg)-1-i]
	}
	mustOK(t, s.send(target, 2, 8192, len(out), 0), "echo")
	pollN(t, s.sjfc, 1, 10*time.Second)
	fmt.Println("ECHOED")
	io.Copy(io.Discard, os.Stdin) // until killed
}

// A peer in another process: bytes cross the process boundary over the
// socket fabric, and when that process is killed with SIGKILL the send
// outstanding to it completes with ACK_TIMEOUT instead of hanging.
func TestCrossProcessKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrossProcessChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	mustOK(t, err, "stdin pipe")
	stdout, err := cmd.StdoutPipe()
	mustOK(t, err, "stdout pipe")
	mustOK(t, cmd.Start(), "start child")
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	lines := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	expect := func(prefix string) string {
		t.Helper()
		timeout := time.After(30 * time.Second) // the child is a fresh (possibly -race) process
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("child exited before saying %s", prefix)
				}
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-timeout:
				t.Fatalf("child did not say %s", prefix)
			}
		}
	}
	f := strings.Fields(expect("READY "))
	eid, err := urma.ParseEID(f[1])
	mustOK(t, err, "child EID")
	id, err := strconv.ParseUint(f[2], 10, 32)
	mustOK(t, err, "child jetty")

	opts := socketOpts()
	opts.PeerTimeout = time.Second
	p := newProvider(t, opts)
	s := newSide(t, p, urma.JettyConfig{RNRRetry: 7}, 64)
	target, err := s.ctx.ImportJetty(t.Context(), urma.JettyID{EID: eid, ID: uint32(id)}, urma.RC, 7)
	mustOK(t, err, "import child jetty")
	defer target.Close()
	fmt.Fprintf(stdin, "PEER %s %d\n", s.ctx.EID(), s.jetty.ID().ID)

	s.postRecv(1, 4096, 4096)
	msg := "bytes that cross a process boundary"
	copy(s.mem.Bytes(), msg)
	mustOK(t, s.send(target, 1, 0, len(msg), 0), "send")
	rc := pollN(t, s.rjfc, 1, 10*time.Second)[0]
	got := string(s.mem.Bytes()[4096 : 4096+rc.CompletionLen])
	want := []byte(msg)
	for i, j := 0, len(want)-1; i < j; i, j = i+1, j-1 {
		want[i], want[j] = want[j], want[i]
	}
	if got != string(want) {
		t.Fatalf("echo %q, want %q", got, want)
	}
	expect("ECHOED")
	if c := pollN(t, s.sjfc, 1, 5*time.Second)[0]; c.Status != urma.StatusSuccess {
		t.Fatalf("first send %+v", c)
	}
	// The child posts no more receives: this send waits on RNR, forever.
	mustOK(t, s.send(target, 2, 0, 64, 0), "send to a peer about to die")
	mustOK(t, cmd.Process.Kill(), "kill -9 the child")
	start := time.Now()
	c := pollN(t, s.sjfc, 1, 10*time.Second)[0]
	if c.Status != urma.StatusAckTimeout || c.UserCtx != 2 {
		t.Errorf("send to a killed process completed as %+v, want ACK_TIMEOUT", c)
	}
	if el := time.Since(start); el > 3*opts.PeerTimeout {
		t.Errorf("error completion took %v", el)
	}
}
