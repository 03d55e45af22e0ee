package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// A remote provider is a urma.Provider whose objects live in another
// process: every verb is a call over a unix socket, and the descriptors the
// API exposes cross with SCM_RIGHTS. Registered memory is a memfd (see
// urma.AllocMemory) that both processes map, so bytes the child's provider
// writes into a receive buffer are the bytes this process reads. It lets
// the conformance suite, which drives both providers of a pair, run with
// them in two processes.

// RemoteReq is one verb: Op on the object H, with what the verb takes.
type RemoteReq struct {
	Op     string
	H      uint64
	Name   string // device, or options
	Index  int
	Depth  uint32
	MaxSGE uint32
	H2, H3 uint64 // other objects: JFCE, JFC, JFR, target
	U64    uint64
	U8     [4]uint8
	Token  urma.Token
	Mode   urma.TransportMode
	Policy urma.TokenPolicy
	Access urma.Access
	FdTag  uint64
	SegID  urma.SegmentID
	Jetty  urma.JettyID
	Dur    time.Duration
	Flag   bool
	SGEs   []RemoteSGE
	Opcode urma.Opcode
	Flags  urma.SendFlags
	Imm    uint64
}

// RemoteSGE names a segment by handle; 0 is a segment the child does not
// know (another context's), which the child replaces by one of another
// context so the verb sees a foreign segment too.
type RemoteSGE struct {
	Seg    uint64
	Offset uint64
	Len    uint32
}

type RemoteResp struct {
	H       uint64
	Err     *RemoteErr
	Devices []urma.DeviceInfo
	Info    urma.DeviceInfo
	EID     urma.EID
	U32     uint32
	Jetty   urma.JettyID
	SegID   urma.SegmentID
	CRs     []urma.Completion
	Hs      []uint64
	N       int
	FdTag   uint64
	State   urma.JettyState
	Name    string
}

// RemoteErr carries a urma.Error (or any error, Code 0) across.
type RemoteErr struct {
	Op     string
	Code   urma.Code
	Detail string
}

func toRemoteErr(err error) *RemoteErr {
	if err == nil {
		return nil
	}
	var ue *urma.Error
	if errors.As(err, &ue) {
		return &RemoteErr{Op: ue.Op, Code: ue.Code, Detail: ue.Detail}
	}
	return &RemoteErr{Detail: err.Error()}
}

func (e *RemoteErr) err() error {
	if e == nil {
		return nil
	}
	if e.Code == 0 {
		return errors.New(e.Detail)
	}
	return &urma.Error{Op: e.Op, Code: e.Code, Detail: e.Detail}
}

// fdMailbox moves descriptors over a SOCK_SEQPACKET socket, each under a
// tag the verb names, whatever order they arrive in.
type fdMailbox struct {
	fd   int
	mu   sync.Mutex
	cond *sync.Cond
	got  map[uint64]int
	next uint64
	dead bool
}

func newFdMailbox(fd int) *fdMailbox {
	m := &fdMailbox{fd: fd, got: make(map[uint64]int)}
	m.cond = sync.NewCond(&m.mu)
	go m.receive()
	return m
}

func (m *fdMailbox) receive() {
	buf := make([]byte, 8)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(m.fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		var fds []int
		if err == nil && n == 8 {
			fds, err = parseRights(oob[:oobn])
		}
		m.mu.Lock()
		if err != nil || n != 8 || len(fds) != 1 {
			closeAll(fds)
			m.dead = true
			m.cond.Broadcast()
			m.mu.Unlock()
			return
		}
		m.got[binary.LittleEndian.Uint64(buf)] = fds[0]
		m.cond.Broadcast()
		m.mu.Unlock()
	}
}

// send passes a duplicate of fd under a fresh tag.
func (m *fdMailbox) send(fd int) (uint64, error) {
	m.mu.Lock()
	m.next++
	tag := m.next
	m.mu.Unlock()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], tag)
	return tag, unix.Sendmsg(m.fd, b[:], unix.UnixRights(fd), nil, 0)
}

// take waits for the descriptor sent under tag.
func (m *fdMailbox) take(tag uint64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		if fd, ok := m.got[tag]; ok {
			delete(m.got, tag)
			return fd, nil
		}
		if m.dead {
			return -1, errors.New("descriptor channel closed")
		}
		m.cond.Wait()
	}
}

// ---- the child: a provider served to the parent ----

// remoteServer holds the child's objects by handle.
type remoteServer struct {
	mail *fdMailbox
	mu   sync.Mutex
	objs map[uint64]any
	mems map[uint64]*urma.Memory // memory mapped for a segment handle
	next uint64
	// foreign is a segment of a context the parent never sees, standing in
	// for the parent's segments that are not the child's.
	foreign map[urma.Context]urma.Segment
}

func (s *remoteServer) put(o any) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.objs[s.next] = o
	return s.next
}

func (s *remoteServer) get(h uint64) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objs[h]
}

func (s *remoteServer) drop(h uint64) {
	s.mu.Lock()
	delete(s.objs, h)
	s.mu.Unlock()
}

// Remote is the RPC service.
type Remote struct{ s *remoteServer }

// Do performs one verb.
func (r *Remote) Do(q *RemoteReq, resp *RemoteResp) error {
	err := r.s.do(q, resp)
	resp.Err = toRemoteErr(err)
	return nil
}

func (s *remoteServer) sges(c urma.Context, in []RemoteSGE) []urma.SGE {
	out := make([]urma.SGE, len(in))
	for i, g := range in {
		out[i] = urma.SGE{Offset: g.Offset, Len: g.Len}
		if seg, ok := s.get(g.Seg).(urma.Segment); ok && g.Seg != 0 {
			out[i].Segment = seg
		} else {
			out[i].Segment = s.foreignSeg(c)
		}
	}
	return out
}

// foreignSeg is a segment of another context than c.
func (s *remoteServer) foreignSeg(c urma.Context) urma.Segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ctx, seg := range s.foreign {
		if ctx != c {
			return seg
		}
	}
	return nil
}

func (s *remoteServer) do(q *RemoteReq, resp *RemoteResp) error {
	if q.Op == "new" { // on the shm fabric in directory Name, or the socket fabric
		// A kill -9 closes the sockets at once; the peer timeout only
		// guards against a process that hangs, so it can be generous for
		// a busy machine.
		// Index, when set, is Options.MaxConnsPerProcess.
		p, err := New(Options{ShmDir: q.Name, PeerTimeout: twoProcessPeerTimeout, DialTimeout: 5 * time.Second, MaxConnsPerProcess: q.Index, Logger: quiet()})
		if err != nil {
			return err
		}
		// A second context with a segment of its own: the foreign segment.
		fc, err := p.Open("", 0)
		if err != nil {
			return err
		}
		fm, err := urma.AllocMemory(4096)
		if err != nil {
			return err
		}
		fs, err := fc.RegisterSegment(fm, urma.SegmentConfig{Access: urma.AccessLocalOnly})
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.foreign[fc] = fs
		s.mu.Unlock()
		resp.H, resp.Name = s.put(p), p.Name()
		return nil
	}
	switch o := s.get(q.H).(type) {
	case *Provider:
		switch q.Op {
		case "devices":
			var err error
			resp.Devices, err = o.Devices()
			return err
		case "open":
			c, err := o.Open(q.Name, q.Index)
			if err != nil {
				return err
			}
			resp.H, resp.Info, resp.EID, resp.U32 = s.put(c), c.Device(), c.EID(), c.UASID()
			return nil
		case "close":
			s.drop(q.H)
			return o.Close()
		}
	case urma.Context:
		return s.doContext(o, q, resp)
	case urma.JFCE:
		switch q.Op {
		case "wait":
			out := make([]urma.JFC, q.Index)
			n, err := o.Wait(out, q.Dur)
			for _, j := range out[:n] {
				resp.Hs = append(resp.Hs, s.handleOf(j))
			}
			return err
		case "close":
			return s.closeObj(q.H, o)
		}
	case urma.JFC:
		switch q.Op {
		case "poll":
			out := make([]urma.Completion, q.Index)
			n, err := o.Poll(out)
			resp.CRs = out[:n]
			return err
		case "rearm":
			return o.Rearm(q.Flag)
		case "ack":
			o.Ack(uint32(q.U64))
			return nil
		case "close":
			return s.closeObj(q.H, o)
		}
	case urma.JFR:
		switch q.Op {
		case "post":
			return o.PostRecv(&urma.RecvWR{UserCtx: q.U64, SGEs: s.sges(s.ctxOf(q.H2), q.SGEs)})
		case "close":
			return s.closeObj(q.H, o)
		}
	case urma.Jetty:
		switch q.Op {
		case "post":
			wr := &urma.SendWR{Opcode: q.Opcode, Flags: q.Flags, UserCtx: q.U64, Imm: q.Imm, SGEs: s.sges(s.ctxOf(q.H2), q.SGEs)}
			if t, ok := s.get(q.H3).(urma.RemoteJetty); ok {
				wr.Target = t
			}
			return o.PostSend(wr)
		case "seterror":
			return o.SetError()
		case "state":
			resp.State = o.State()
			return nil
		case "close":
			return s.closeObj(q.H, o)
		}
	case urma.Segment:
		if q.Op == "close" {
			if err := s.closeObj(q.H, o); err != nil {
				return err
			}
			s.mu.Lock()
			m := s.mems[q.H]
			delete(s.mems, q.H)
			s.mu.Unlock()
			if m == nil {
				return nil
			}
			return m.Free()
		}
	case urma.RemoteJetty:
		if q.Op == "close" {
			return s.closeObj(q.H, o)
		}
	case urma.RemoteSegment:
		if q.Op == "close" {
			return s.closeObj(q.H, o)
		}
	case nil:
		return urma.Errorf(q.Op, urma.ErrClosed.Code, "no object %d in the child", q.H)
	}
	return fmt.Errorf("child: verb %q unknown for object %d", q.Op, q.H)
}

// closeObj closes o and forgets its handle once it is closed.
func (s *remoteServer) closeObj(h uint64, o interface{ Close() error }) error {
	err := o.Close()
	if err == nil {
		s.drop(h)
	}
	return err
}

func (s *remoteServer) handleOf(o any) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, x := range s.objs {
		if x == o {
			return h
		}
	}
	return 0
}

func (s *remoteServer) ctxOf(h uint64) urma.Context {
	c, _ := s.get(h).(urma.Context)
	return c
}

func (s *remoteServer) doContext(c urma.Context, q *RemoteReq, resp *RemoteResp) error {
	switch q.Op {
	case "jfce":
		e, err := c.CreateJFCE()
		if err != nil {
			return err
		}
		resp.H = s.put(e)
		resp.FdTag, err = s.mail.send(e.Fd())
		return err
	case "jfc":
		cfg := urma.JFCConfig{Depth: q.Depth, UserCtx: q.U64}
		if e, ok := s.get(q.H2).(urma.JFCE); ok {
			cfg.JFCE = e
		}
		j, err := c.CreateJFC(cfg)
		if err != nil {
			return err
		}
		resp.H, resp.U32 = s.put(j), j.ID()
		return nil
	case "jfr":
		jfc, _ := s.get(q.H2).(urma.JFC)
		r, err := c.CreateJFR(urma.JFRConfig{Mode: q.Mode, Depth: q.Depth, MaxSGE: q.MaxSGE, JFC: jfc, MinRNRTimer: q.U8[0], TokenPolicy: q.Policy, Token: q.Token})
		if err != nil {
			return err
		}
		resp.H, resp.Jetty = s.put(r), r.ID()
		return nil
	case "jetty":
		sjfc, _ := s.get(q.H2).(urma.JFC)
		jfr, _ := s.get(q.H3).(urma.JFR)
		j, err := c.CreateJetty(urma.JettyConfig{Mode: q.Mode, SQDepth: q.Depth, MaxSGE: q.MaxSGE, MaxInline: uint32(q.U64),
			SendJFC: sjfc, JFR: jfr, RNRRetry: q.U8[0], ErrTimeout: q.U8[1], Priority: q.U8[2]})
		if err != nil {
			return err
		}
		resp.H, resp.Jetty = s.put(j), j.ID()
		return nil
	case "register":
		var mem *urma.Memory
		if q.FdTag != 0 {
			fd, err := s.mail.take(q.FdTag)
			if err != nil {
				return err
			}
			if mem, err = urma.OpenMemory(fd); err != nil {
				return err
			}
		}
		seg, err := c.RegisterSegment(mem, urma.SegmentConfig{Access: q.Access, TokenPolicy: q.Policy, Token: q.Token})
		if err != nil {
			if mem != nil {
				_ = mem.Free()
			}
			return err
		}
		resp.H, resp.SegID = s.put(seg), seg.ID()
		s.mu.Lock()
		s.mems[resp.H] = mem
		s.mu.Unlock()
		return nil
	case "importseg":
		r, err := c.ImportSegment(q.SegID, q.Token)
		if err != nil {
			return err
		}
		resp.H, resp.SegID = s.put(r), r.ID()
		return nil
	case "importjetty":
		ctx, cancel := context.WithTimeout(context.Background(), q.Dur)
		defer cancel()
		r, err := c.ImportJetty(ctx, q.Jetty, q.Mode, q.Token)
		if err != nil {
			return err
		}
		resp.H, resp.Jetty = s.put(r), r.ID()
		return nil
	case "close":
		return s.closeObj(q.H, c)
	}
	return fmt.Errorf("child: context verb %q unknown", q.Op)
}

// TestRemoteProviderChild serves providers to a parent test over the
// descriptors it inherits: 3 carries the calls, 4 the descriptors.
func TestRemoteProviderChild(t *testing.T) {
	if !isChild("remote") {
		t.Skip("helper process for the two-process conformance tests")
	}
	s := &remoteServer{mail: newFdMailbox(4), objs: make(map[uint64]any), mems: make(map[uint64]*urma.Memory), foreign: make(map[urma.Context]urma.Segment)}
	srv := rpc.NewServer()
	mustOK(t, srv.Register(&Remote{s: s}), "register service")
	f := os.NewFile(3, "calls")
	srv.ServeConn(f) // until the parent goes
}

// ---- the parent: the proxy objects ----

// remoteProc is a child process that serves providers.
type remoteProc struct {
	cmd  *exec.Cmd
	cl   *rpc.Client
	mail *fdMailbox
	dead chan struct{}
}

func startRemoteProc(t testing.TB) *remoteProc {
	t.Helper()
	return startRemoteProcIn(t, 0)
}

// startRemoteProcIn starts the child in the namespaces cloneflags makes
// (syscall.CLONE_NEWPID: a pid namespace of its own).
func startRemoteProcIn(t testing.TB, cloneflags uintptr) *remoteProc {
	t.Helper()
	calls, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	mustOK(t, err, "socketpair")
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	mustOK(t, err, "socketpair")
	cmd := exec.Command(os.Args[0], "-test.run=^TestRemoteProviderChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childRoleEnv+"=remote")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(calls[1]), "calls"), os.NewFile(uintptr(fds[1]), "fds")}
	if cloneflags != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneflags}
	}
	if err := cmd.Start(); err != nil {
		_ = cmd.ExtraFiles[0].Close()
		_ = cmd.ExtraFiles[1].Close()
		closeAll([]int{calls[0], fds[0]})
		if cloneflags != 0 {
			t.Skipf("cannot start a child in namespaces of its own here (CAP_SYS_ADMIN): %v", err)
		}
		t.Fatalf("start child: %v", err)
	}
	_ = cmd.ExtraFiles[0].Close()
	_ = cmd.ExtraFiles[1].Close()
	// FileConn dups the descriptor. Close the File, not the number: a File
	// left to the garbage collector closes its number again in a finalizer,
	// by then another descriptor's (a listener's, a memfd's).
	callsFile := os.NewFile(uintptr(calls[0]), "calls")
	conn, err := net.FileConn(callsFile)
	_ = callsFile.Close()
	mustOK(t, err, "call socket")
	rp := &remoteProc{cmd: cmd, cl: rpc.NewClient(conn), mail: newFdMailbox(fds[0]), dead: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(rp.dead)
	}()
	return rp
}

func (rp *remoteProc) alive() bool {
	select {
	case <-rp.dead:
		return false
	default:
		return true
	}
}

// kill is kill -9: the child vanishes as a crashed process does.
func (rp *remoteProc) kill() {
	_ = rp.cmd.Process.Signal(syscall.SIGKILL)
	<-rp.dead
	_ = rp.cl.Close()
	_ = unix.Close(rp.mail.fd)
}

// call performs a verb; a child that is gone makes every verb fail with
// ErrClosed, as a destroyed object does.
func (rp *remoteProc) call(op string, q RemoteReq) (RemoteResp, error) {
	q.Op = op
	var resp RemoteResp
	if err := rp.cl.Call("Remote.Do", &q, &resp); err != nil {
		return resp, urma.Errorf(op, urma.ErrClosed.Code, "child process gone: %v", err)
	}
	return resp, resp.Err.err()
}

type remoteProvider struct {
	rp   *remoteProc
	h    uint64
	name string
	objs sync.Map // handle -> proxy, for JFCE.Wait
}

// newRemoteProvider creates a provider in the child: on the shm fabric in
// shmDir, or on the socket fabric when it is "".
func newRemoteProvider(t testing.TB, rp *remoteProc, shmDir string) *remoteProvider {
	t.Helper()
	return newRemoteProviderBounded(t, rp, shmDir, 0)
}

// newRemoteProviderBounded is newRemoteProvider with the child's
// Options.MaxConnsPerProcess (0: the default).
func newRemoteProviderBounded(t testing.TB, rp *remoteProc, shmDir string, maxPerProc int) *remoteProvider {
	t.Helper()
	resp, err := rp.call("new", RemoteReq{Name: shmDir, Index: maxPerProc})
	mustOK(t, err, "create the child's provider")
	p := &remoteProvider{rp: rp, h: resp.H, name: resp.Name + "@child"}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (p *remoteProvider) Name() string { return p.name }

func (p *remoteProvider) Devices() ([]urma.DeviceInfo, error) {
	resp, err := p.rp.call("devices", RemoteReq{H: p.h})
	return resp.Devices, err
}

func (p *remoteProvider) Open(dev string, i int) (urma.Context, error) {
	resp, err := p.rp.call("open", RemoteReq{H: p.h, Name: dev, Index: i})
	if err != nil {
		return nil, err
	}
	return &remoteContext{p: p, h: resp.H, info: resp.Info, eid: resp.EID, uasid: resp.U32}, nil
}

func (p *remoteProvider) Close() error {
	_, err := p.rp.call("close", RemoteReq{H: p.h})
	if errors.Is(err, urma.ErrClosed) {
		return nil
	}
	return err
}

// remoteObj is what every proxy object has: its provider and handle.
type remoteObj struct {
	p *remoteProvider
	h uint64
}

func (o *remoteObj) close() error {
	_, err := o.p.rp.call("close", RemoteReq{H: o.h})
	return err
}

type remoteContext struct {
	p     *remoteProvider
	h     uint64
	info  urma.DeviceInfo
	eid   urma.EID
	uasid uint32
}

func (c *remoteContext) Device() urma.DeviceInfo { return c.info }
func (c *remoteContext) EID() urma.EID           { return c.eid }
func (c *remoteContext) UASID() uint32           { return c.uasid }
func (c *remoteContext) Close() error            { return (&remoteObj{c.p, c.h}).close() }

func handle(o any) uint64 {
	switch x := o.(type) {
	case *remoteJFCE:
		return x.h
	case *remoteJFC:
		return x.h
	case *remoteJFR:
		return x.h
	case *remoteSegmentProxy:
		return x.h
	case *remoteRJ:
		return x.h
	}
	return 0
}

func (c *remoteContext) CreateJFCE() (urma.JFCE, error) {
	resp, err := c.p.rp.call("jfce", RemoteReq{H: c.h})
	if err != nil {
		return nil, err
	}
	fd, err := c.p.rp.mail.take(resp.FdTag)
	if err != nil {
		return nil, err
	}
	return &remoteJFCE{remoteObj{c.p, resp.H}, fd}, nil
}

func (c *remoteContext) CreateJFC(cfg urma.JFCConfig) (urma.JFC, error) {
	resp, err := c.p.rp.call("jfc", RemoteReq{H: c.h, Depth: cfg.Depth, H2: handle(cfg.JFCE), U64: cfg.UserCtx})
	if err != nil {
		return nil, err
	}
	q := &remoteJFC{remoteObj{c.p, resp.H}, resp.U32}
	c.p.objs.Store(resp.H, q)
	return q, nil
}

func (c *remoteContext) CreateJFR(cfg urma.JFRConfig) (urma.JFR, error) {
	resp, err := c.p.rp.call("jfr", RemoteReq{H: c.h, Mode: cfg.Mode, Depth: cfg.Depth, MaxSGE: cfg.MaxSGE, H2: handle(cfg.JFC),
		U8: [4]uint8{cfg.MinRNRTimer}, Policy: cfg.TokenPolicy, Token: cfg.Token})
	if err != nil {
		return nil, err
	}
	return &remoteJFR{remoteObj{c.p, resp.H}, resp.Jetty, c.h}, nil
}

func (c *remoteContext) CreateJetty(cfg urma.JettyConfig) (urma.Jetty, error) {
	resp, err := c.p.rp.call("jetty", RemoteReq{H: c.h, Mode: cfg.Mode, Depth: cfg.SQDepth, MaxSGE: cfg.MaxSGE, U64: uint64(cfg.MaxInline),
		H2: handle(cfg.SendJFC), H3: handle(cfg.JFR), U8: [4]uint8{cfg.RNRRetry, cfg.ErrTimeout, cfg.Priority}})
	if err != nil {
		return nil, err
	}
	return &remoteJettyProxy{remoteObj{c.p, resp.H}, resp.Jetty, c.h}, nil
}

func (c *remoteContext) RegisterSegment(mem *urma.Memory, cfg urma.SegmentConfig) (urma.Segment, error) {
	q := RemoteReq{H: c.h, Access: cfg.Access, Policy: cfg.TokenPolicy, Token: cfg.Token}
	if mem != nil && mem.Fd() >= 0 {
		tag, err := c.p.rp.mail.send(mem.Fd())
		if err != nil {
			return nil, err
		}
		q.FdTag = tag
	}
	resp, err := c.p.rp.call("register", q)
	if err != nil {
		return nil, err
	}
	return &remoteSegmentProxy{remoteObj: remoteObj{c.p, resp.H}, id: resp.SegID, mem: mem}, nil
}

func (c *remoteContext) ImportSegment(id urma.SegmentID, token urma.Token) (urma.RemoteSegment, error) {
	resp, err := c.p.rp.call("importseg", RemoteReq{H: c.h, SegID: id, Token: token})
	if err != nil {
		return nil, err
	}
	return &remoteRS{remoteObj{c.p, resp.H}, resp.SegID}, nil
}

func (c *remoteContext) ImportJetty(ctx context.Context, id urma.JettyID, mode urma.TransportMode, token urma.Token) (urma.RemoteJetty, error) {
	d := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	resp, err := c.p.rp.call("importjetty", RemoteReq{H: c.h, Jetty: id, Mode: mode, Token: token, Dur: d})
	if err != nil {
		return nil, err
	}
	return &remoteRJ{remoteObj{c.p, resp.H}, resp.Jetty}, nil
}

type remoteJFCE struct {
	remoteObj
	fd int
}

func (e *remoteJFCE) Fd() int { return e.fd }

func (e *remoteJFCE) Wait(out []urma.JFC, timeout time.Duration) (int, error) {
	if len(out) == 0 {
		return 0, urma.Errorf("wait_jfc", urma.CodeInval, "output slice is empty")
	}
	resp, err := e.p.rp.call("wait", RemoteReq{H: e.h, Index: len(out), Dur: timeout})
	for i, h := range resp.Hs {
		if q, ok := e.p.objs.Load(h); ok {
			out[i] = q.(*remoteJFC)
		}
	}
	return len(resp.Hs), err
}

func (e *remoteJFCE) Close() error {
	err := e.close()
	if err == nil || errors.Is(err, urma.ErrClosed) {
		if e.fd >= 0 {
			_ = unix.Close(e.fd)
			e.fd = -1
		}
	}
	return err
}

type remoteJFC struct {
	remoteObj
	id uint32
}

func (q *remoteJFC) ID() uint32 { return q.id }

func (q *remoteJFC) Poll(out []urma.Completion) (int, error) {
	resp, err := q.p.rp.call("poll", RemoteReq{H: q.h, Index: len(out)})
	return copy(out, resp.CRs), err
}

func (q *remoteJFC) Rearm(solicitedOnly bool) error {
	_, err := q.p.rp.call("rearm", RemoteReq{H: q.h, Flag: solicitedOnly})
	return err
}

func (q *remoteJFC) Ack(n uint32) { _, _ = q.p.rp.call("ack", RemoteReq{H: q.h, U64: uint64(n)}) }
func (q *remoteJFC) Close() error { return q.close() }

type remoteJFR struct {
	remoteObj
	id  urma.JettyID
	ctx uint64
}

func (r *remoteJFR) ID() urma.JettyID { return r.id }
func (r *remoteJFR) Close() error     { return r.close() }

func toRemoteSGEs(in []urma.SGE) []RemoteSGE {
	out := make([]RemoteSGE, len(in))
	for i, g := range in {
		out[i] = RemoteSGE{Seg: handle(g.Segment), Offset: g.Offset, Len: g.Len}
	}
	return out
}

func (r *remoteJFR) PostRecv(wr *urma.RecvWR) error {
	if wr == nil {
		return urma.Errorf("post_jfr_wr", urma.CodeInval, "work request is nil")
	}
	_, err := r.p.rp.call("post", RemoteReq{H: r.h, H2: r.ctx, U64: wr.UserCtx, SGEs: toRemoteSGEs(wr.SGEs)})
	return err
}

type remoteJettyProxy struct {
	remoteObj
	id  urma.JettyID
	ctx uint64
}

func (j *remoteJettyProxy) ID() urma.JettyID { return j.id }
func (j *remoteJettyProxy) Close() error     { return j.close() }

func (j *remoteJettyProxy) PostSend(wr *urma.SendWR) error {
	if wr == nil {
		return urma.Errorf("post_jetty_send_wr", urma.CodeInval, "work request is nil")
	}
	_, err := j.p.rp.call("post", RemoteReq{H: j.h, H2: j.ctx, H3: handle(wr.Target), Opcode: wr.Opcode, Flags: wr.Flags,
		U64: wr.UserCtx, Imm: wr.Imm, SGEs: toRemoteSGEs(wr.SGEs)})
	return err
}

func (j *remoteJettyProxy) SetError() error {
	_, err := j.p.rp.call("seterror", RemoteReq{H: j.h})
	return err
}

func (j *remoteJettyProxy) State() urma.JettyState {
	resp, _ := j.p.rp.call("state", RemoteReq{H: j.h})
	return resp.State
}

type remoteSegmentProxy struct {
	remoteObj
	id     urma.SegmentID
	mem    *urma.Memory
	closed bool
}

func (s *remoteSegmentProxy) ID() urma.SegmentID { return s.id }

func (s *remoteSegmentProxy) Bytes() []byte {
	if s.closed || s.mem == nil {
		return nil
	}
	return s.mem.Bytes()
}

func (s *remoteSegmentProxy) Close() error {
	err := s.close()
	if err == nil {
		s.closed = true
	}
	return err
}

type remoteRJ struct {
	remoteObj
	id urma.JettyID
}

func (r *remoteRJ) ID() urma.JettyID { return r.id }
func (r *remoteRJ) Close() error     { return r.close() }

type remoteRS struct {
	remoteObj
	id urma.SegmentID
}

func (r *remoteRS) ID() urma.SegmentID { return r.id }
func (r *remoteRS) Close() error       { return r.close() }

var (
	_ urma.Provider      = (*remoteProvider)(nil)
	_ urma.Context       = (*remoteContext)(nil)
	_ urma.JFCE          = (*remoteJFCE)(nil)
	_ urma.JFC           = (*remoteJFC)(nil)
	_ urma.JFR           = (*remoteJFR)(nil)
	_ urma.Jetty         = (*remoteJettyProxy)(nil)
	_ urma.Segment       = (*remoteSegmentProxy)(nil)
	_ urma.RemoteJetty   = (*remoteRJ)(nil)
	_ urma.RemoteSegment = (*remoteRS)(nil)
)
