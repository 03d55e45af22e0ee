package soft

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

func TestDefaultDevice(t *testing.T) {
	for _, fabric := range []string{"inproc", "socket"} {
		t.Run(fabric, func(t *testing.T) {
			opts := Options{}
			if fabric == "inproc" {
				opts.Fabric = NewFabric()
			}
			p := newProvider(t, opts)
			if p.Name() != "soft-"+fabric {
				t.Errorf("provider name %q", p.Name())
			}
			devs, err := p.Devices()
			mustOK(t, err, "devices")
			if len(devs) != 1 {
				t.Fatalf("want one default device, got %d", len(devs))
			}
			d := devs[0]
			want := DefaultCaps()
			want.PortCount = 1
			if d.Name != DefaultDevice || d.Driver != Driver || d.TransportType != urma.TransportUB || d.Caps != want {
				t.Errorf("default device %+v, want soft0/soft/UB with %+v", d, want)
			}
			if len(d.Ports) != 1 || d.Ports[0].State != urma.PortActive || len(d.EIDs) != 1 || d.ReservedJetty.Len() != 0 {
				t.Errorf("ports %+v, EIDs %+v, reserved %+v", d.Ports, d.EIDs, d.ReservedJetty)
			}
			ap, isSocket := SocketAddr(d.EIDs[0].EID)
			if isSocket != (fabric == "socket") {
				t.Errorf("EID %s: socket encoding %v on the %s fabric", d.EIDs[0].EID, isSocket, fabric)
			}
			if isSocket && (ap.Addr() != netip.MustParseAddr("127.0.0.1") || ap.Port() == 0) {
				t.Errorf("EID %s encodes %s, want 127.0.0.1:<port>", d.EIDs[0].EID, ap)
			}
			// Devices returns copies.
			devs[0].Ports[0].State = urma.PortDown
			again, _ := p.Devices()
			if again[0].Ports[0].State != urma.PortActive {
				t.Error("Devices hands out the provider's own slices")
			}
		})
	}
}

func TestDeviceSpecs(t *testing.T) {
	eid1, _ := urma.ParseEID("fd00::1")
	eid2, _ := urma.ParseEID("fd00::2")
	good := []struct {
		name  string
		opts  Options
		check func(t *testing.T, p *Provider)
	}{
		{"custom caps", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Name: "small", Caps: urma.DeviceCaps{MaxJFSDepth: 8, MaxMsgSize: 4096}}}},
			func(t *testing.T, p *Provider) {
				ctx, err := p.Open("small", 0)
				mustOK(t, err, "open")
				defer ctx.Close()
				if c := ctx.Device().Caps; c.MaxJFSDepth != 8 || c.MaxMsgSize != 4096 || c.MaxJFRDepth != DefaultCaps().MaxJFRDepth {
					t.Errorf("caps %+v: want the given fields and defaults for the rest", c)
				}
			}},
		{"two devices with EIDs", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{EIDs: []urma.EID{eid1, eid2}}, {}}},
			func(t *testing.T, p *Provider) {
				devs, _ := p.Devices()
				if len(devs) != 2 || devs[0].Name != "soft0" || devs[1].Name != "soft1" {
					t.Fatalf("devices %+v", devs)
				}
				ctx, err := p.Open("soft0", 1)
				mustOK(t, err, "open EID index 1")
				defer ctx.Close()
				if ctx.EID() != eid2 {
					t.Errorf("EID %s, want %s", ctx.EID(), eid2)
				}
			}},
		{"ports and unordered RM", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{UnorderedRM: true, TransportType: urma.TransportIP,
			Ports: []urma.Port{{Index: 0, State: urma.PortDown}, {Index: 1, State: urma.PortActive}}}}},
			func(t *testing.T, p *Provider) {
				d, _ := p.Devices()
				if d[0].Caps.OrderedRM || d[0].Caps.PortCount != 2 || d[0].TransportType != urma.TransportIP {
					t.Errorf("device %+v", d[0])
				}
			}},
		{"socket advertise", Options{Devices: []DeviceSpec{{Listen: "127.0.0.1:0", Advertise: "10.1.2.3:4567"}}},
			func(t *testing.T, p *Provider) {
				d, _ := p.Devices()
				ap, ok := SocketAddr(d[0].EIDs[0].EID)
				if !ok || ap.String() != "10.1.2.3:4567" {
					t.Errorf("EID %s encodes %v, want 10.1.2.3:4567", d[0].EIDs[0].EID, ap)
				}
			}},
	}
	for _, c := range good {
		t.Run(c.name, func(t *testing.T) { c.check(t, newProvider(t, c.opts)) })
	}
	fab := NewFabric()
	newProvider(t, Options{Fabric: fab, Devices: []DeviceSpec{{EIDs: []urma.EID{eid1}}}})
	bad := []struct {
		name string
		opts Options
		want string
	}{
		{"duplicate names", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Name: "x"}, {Name: "x"}}}, "listed twice"},
		{"EID taken on the fabric", Options{Fabric: fab, Devices: []DeviceSpec{{EIDs: []urma.EID{eid1}}}}, "already in use"},
		{"EID listed twice", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{EIDs: []urma.EID{eid2, eid2}}}}, "listed twice"},
		{"zero EID", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{EIDs: []urma.EID{{}}}}}, "zero"},
		{"too many SGEs", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{MaxJFSSge: 17}}}}, "max SGE"},
		{"too many receive SGEs", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{MaxJFRSge: MaxSGE + 1}}}}, "max SGE"},
		{"message too large", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{MaxMsgSize: 2 << 30}}}}, "max message size"},
		{"neither RC nor RM", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{TransMode: urma.TransModeUM}}}}, "neither RC nor RM"},
		{"too many jetties", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{MaxJetty: 1<<20 + 1}}}}, "more than 1048576 jetties"},
		{"too many JFRs", Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{MaxJFR: 1<<20 + 1}}}}, "more than 1048576 jetties or JFRs"},
		{"socket with two EIDs", Options{Devices: []DeviceSpec{{EIDs: []urma.EID{eid1, eid2}}}}, "one EID"},
		{"socket unspecified listen", Options{Listen: "0.0.0.0:0"}, "Advertise"},
		{"socket bad listen", Options{Listen: "256.0.0.1:0"}, "listen"},
		{"socket IPv6 advertise", Options{Devices: []DeviceSpec{{Advertise: "[::1]:80"}}}, "IPv4"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			p, err := New(c.opts)
			if err == nil {
				p.Close()
				t.Fatalf("New accepted %s", c.name)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
		})
	}
}

func TestEIDEncoding(t *testing.T) {
	for _, s := range []string{"127.0.0.1:1", "10.0.0.7:4000", "255.255.255.254:65535"} {
		ap := netip.MustParseAddrPort(s)
		e, err := SocketEID(ap)
		mustOK(t, err, "encode "+s)
		if !strings.HasPrefix(e.String(), "fd75:726d:6173:100:") {
			t.Errorf("EID %s lacks the soft prefix", e)
		}
		back, ok := SocketAddr(e)
		if !ok || back != ap {
			t.Errorf("%s -> %s -> %v, %v", ap, e, back, ok)
		}
	}
	if e, _ := SocketEID(netip.MustParseAddrPort("127.0.0.1:4000")); e.String() != "fd75:726d:6173:100:0:fa0:7f00:1" {
		t.Errorf("127.0.0.1:4000 encodes as %s", e)
	}
	for _, s := range []string{"[::1]:80", "0.0.0.0:80", "127.0.0.1:0"} {
		if _, err := SocketEID(netip.MustParseAddrPort(s)); err == nil {
			t.Errorf("SocketEID(%s) succeeded", s)
		}
	}
	mapped, _ := urma.ParseEID("10.0.0.1")
	inproc := inprocEID(3)
	for _, e := range []urma.EID{{}, mapped, inproc} {
		if ap, ok := SocketAddr(e); ok {
			t.Errorf("SocketAddr(%s) = %s, want no address", e, ap)
		}
	}
}

func FuzzSocketAddr(f *testing.F) {
	e, _ := SocketEID(netip.MustParseAddrPort("127.0.0.1:80"))
	f.Add(e[:])
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) != 16 {
			return
		}
		ap, ok := SocketAddr(urma.EID(b))
		if !ok {
			return
		}
		again, err := SocketEID(ap)
		if err != nil || again != urma.EID(b) {
			t.Fatalf("%x decodes to %s which encodes to %s, %v", b, ap, again, err)
		}
	})
}

// The JFC keeps completions past its depth, in order, and logs the overflow.
func TestJFCOverflowKeepsCompletions(t *testing.T) {
	var mu sync.Mutex
	var logged []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		logged = append(logged, args)
		mu.Unlock()
	}, funcr.Options{})
	fab := NewFabric()
	p := newProvider(t, Options{Fabric: fab, Logger: log})
	a := newSide(t, p, urma.JettyConfig{}, 2)
	b := newSide(t, p, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	for i := 0; i < 5; i++ {
		b.postRecv(uint64(i), i*64, 64)
		mustOK(t, a.send(target, uint64(i), 0, 64, 0), "send")
	}
	cs := pollN(t, a.sjfc, 5, time.Second)
	for i, c := range cs {
		if c.UserCtx != uint64(i) || c.Status != urma.StatusSuccess {
			t.Errorf("completion %d: %+v", i, c)
		}
	}
	if n := a.sjfc.(*jfc).overflowCount(); n != 3 {
		t.Errorf("overflow count %d, want 3", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) != 1 || !strings.Contains(logged[0], "JFC overflow") {
		t.Errorf("want one overflow log line, got %q", logged)
	}
}

// A segment referenced by a posted receive cannot be unregistered; once the
// receive is gone it can.
func TestSegmentBusyWhileReferenced(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric()})
	s := newSide(t, p, urma.JettyConfig{}, 64)
	seg2, err := s.ctx.RegisterSegment(s.mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	mustOK(t, err, "register")
	mustOK(t, s.jfr.PostRecv(&urma.RecvWR{SGEs: []urma.SGE{{Segment: seg2, Len: 8}}}), "post")
	if err := seg2.Close(); !errors.Is(err, urma.ErrBusy) {
		t.Fatalf("unregister a segment under a posted receive: want ErrBusy, got %v", err)
	}
	if seg2.Bytes() == nil {
		t.Error("a busy segment lost its bytes")
	}
	mustOK(t, s.jetty.Close(), "close jetty")
	mustOK(t, s.jfr.Close(), "close JFR")
	mustOK(t, seg2.Close(), "unregister after the JFR is gone")
	if seg2.Bytes() != nil {
		t.Error("unregistered segment still exposes memory")
	}
}

// Mode mismatches are refused: an RM jetty cannot send through an RC
// import, and a jetty cannot be imported in a mode it does not have.
func TestModeMismatch(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric()})
	b := newSide(t, p, urma.JettyConfig{}, 64)
	rc := newSide(t, p, urma.JettyConfig{}, 64)
	rm := newSide(t, p, urma.JettyConfig{Mode: urma.RM}, 64)
	tb := rc.importJetty(b)
	if err := rm.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend, Target: tb}); !errors.Is(err, urma.ErrInval) {
		t.Fatalf("RM jetty through a foreign RC import: want ErrInval, got %v", err)
	}
	if err := rm.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend}); !errors.Is(err, urma.ErrInval) {
		t.Fatalf("RM send without a target: want ErrInval, got %v", err)
	}
	_, err := rc.ctx.ImportJetty(t.Context(), b.jetty.ID(), urma.RM, 7)
	if !errors.Is(err, urma.ErrInval) {
		t.Fatalf("import an RC jetty as RM: want ErrInval, got %v", err)
	}
	if err := rc.jetty.PostSend(&urma.SendWR{Opcode: urma.OpSend}); !errors.Is(err, urma.ErrInval) {
		t.Fatalf("first RC send without a target: want ErrInval, got %v", err)
	}
}

// An inline send copies its bytes at post: the buffer may change at once.
func TestInlineSendCopiesAtPost(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric()})
	a := newSide(t, p, urma.JettyConfig{MaxInline: 64, RNRRetry: 7}, 64)
	b := newSide(t, p, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	copy(a.mem.Bytes(), "original-bytes")
	mustOK(t, a.send(target, 1, 0, 14, urma.SendInline), "inline send")
	copy(a.mem.Bytes(), "CHANGED-BYTES!")
	b.postRecv(1, 0, 64) // the send waited on RNR until now
	pollN(t, b.rjfc, 1, time.Second)
	if got := string(b.mem.Bytes()[:14]); got != "original-bytes" {
		t.Errorf("received %q, want the bytes at post time", got)
	}
	if err := a.send(target, 2, 0, 65, urma.SendInline); !errors.Is(err, urma.ErrInval) {
		t.Errorf("inline send past MaxInline: want ErrInval, got %v", err)
	}
	if _, err := a.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 4, MaxInline: DefaultCaps().MaxJFSInlineSize + 1, SendJFC: a.sjfc, JFR: a.jfr}); !errors.Is(err, urma.ErrInval) {
		t.Errorf("max inline above caps: want ErrInval, got %v", err)
	}
}

// A message larger than the device's maximum completes with LOC_LEN.
func TestMessageAboveMaxSize(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{MaxMsgSize: 1024}}}})
	a := newSide(t, p, urma.JettyConfig{}, 64)
	b := newSide(t, p, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	b.postRecv(1, 0, 4096)
	mustOK(t, a.send(target, 9, 0, 1025, 0), "post")
	if c := pollN(t, a.sjfc, 1, time.Second)[0]; c.Status != urma.StatusLocLen || c.UserCtx != 9 {
		t.Errorf("oversize send completed as %+v, want LOC_LEN", c)
	}
}

// SetError flushes sends only: receives posted to the (shared) JFR stay.
func TestSetErrorKeepsReceives(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric()})
	a := newSide(t, p, urma.JettyConfig{}, 64)
	b := newSide(t, p, urma.JettyConfig{}, 64)
	b.postRecv(42, 0, 64)
	mustOK(t, b.jetty.SetError(), "set error")
	if c := pollN(t, b.sjfc, 1, time.Second)[0]; c.Status != urma.StatusWRFlushErrDone {
		t.Fatalf("flush record %+v", c)
	}
	// The JFR still takes a message sent to another jetty sharing it.
	j2, err := b.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 4, SendJFC: b.sjfc, JFR: b.jfr})
	mustOK(t, err, "second jetty on the JFR")
	defer j2.Close()
	target, err := a.ctx.ImportJetty(t.Context(), j2.ID(), urma.RC, 7)
	mustOK(t, err, "import")
	defer target.Close()
	mustOK(t, a.send(target, 1, 0, 8, 0), "send")
	if c := pollN(t, b.rjfc, 1, time.Second)[0]; c.UserCtx != 42 || c.Status != urma.StatusSuccess || c.LocalID != j2.ID().ID {
		t.Errorf("receive %+v, want the receive posted before SetError, for jetty %d", c, j2.ID().ID)
	}
}

// Provider.Close destroys everything, stops every goroutine and leaves each
// object answering ErrClosed; peers see error completions.
func TestProviderClose(t *testing.T) {
	for _, fabric := range []string{"inproc", "socket"} {
		t.Run(fabric, func(t *testing.T) {
			noLeaks(t)
			opts := Options{PeerTimeout: 300 * time.Millisecond, DialTimeout: 500 * time.Millisecond, Logger: logr.Discard()}
			if fabric == "inproc" {
				opts.Fabric = NewFabric()
			}
			pa, err := New(opts)
			mustOK(t, err, "new A")
			defer pa.Close()
			pb, err := New(opts)
			mustOK(t, err, "new B")
			a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
			b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
			ta := a.importJetty(b)
			tb := b.importJetty(a)
			mustOK(t, a.send(ta, 1, 0, 64, 0), "send waiting on RNR")
			mustOK(t, b.send(tb, 2, 0, 64, 0), "send waiting on RNR")
			mustOK(t, pb.Close(), "close provider B")
			mustOK(t, pb.Close(), "close provider B twice")
			if c := pollN(t, a.sjfc, 1, 3*time.Second)[0]; c.Status != urma.StatusAckTimeout {
				t.Errorf("A's send after B closed: %+v, want ACK_TIMEOUT", c)
			}
			if _, err := pb.Devices(); !errors.Is(err, urma.ErrClosed) {
				t.Errorf("Devices after Close: %v", err)
			}
			if _, err := pb.Open("", 0); !errors.Is(err, urma.ErrClosed) {
				t.Errorf("Open after Close: %v", err)
			}
			if _, err := b.sjfc.Poll(make([]urma.Completion, 1)); !errors.Is(err, urma.ErrClosed) {
				t.Errorf("Poll after provider Close: %v", err)
			}
			if err := b.send(tb, 3, 0, 8, 0); !errors.Is(err, urma.ErrClosed) {
				t.Errorf("PostSend after provider Close: %v", err)
			}
			if err := b.ctx.Close(); err != nil {
				t.Errorf("context Close after provider Close: %v", err)
			}
		})
	}
}

func TestOpenArguments(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric()})
	if _, err := p.Open("nope", 0); !errors.Is(err, urma.ErrNoDev) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("open unknown device: %v", err)
	}
	if _, err := p.Open("soft0", -1); !errors.Is(err, urma.ErrInval) {
		t.Errorf("open EID index -1: %v", err)
	}
	c, err := p.Open("", 0)
	mustOK(t, err, "open the first device")
	defer c.Close()
	if c.Device().Name != "soft0" || c.UASID() == 0 {
		t.Errorf("context on %s uasid %d", c.Device().Name, c.UASID())
	}
	c2, err := p.Open("", 0)
	mustOK(t, err, "open again")
	defer c2.Close()
	if c2.UASID() == c.UASID() {
		t.Error("two contexts share a UASID")
	}
	_, err = c.ImportJetty(t.Context(), urma.JettyID{EID: inprocEID(999), ID: 1}, urma.RC, 0)
	if !errors.Is(err, urma.ErrUnreachable) {
		t.Errorf("import from an EID not on the fabric: %v", err)
	}
	_, err = c.ImportJetty(t.Context(), urma.JettyID{EID: c.EID(), ID: 999}, urma.RC, 0)
	if !errors.Is(err, urma.ErrNoEnt) {
		t.Errorf("import a jetty that does not exist: %v", err)
	}
}

// The JFCE fd works with epoll (and so with any poller): it reports ready
// after an armed JFC gets a completion, and not before.
func TestJFCEWithEpoll(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric()})
	a := newSide(t, p, urma.JettyConfig{}, 64)
	ctx, err := p.Open("", 0)
	mustOK(t, err, "open")
	defer ctx.Close()
	ce, err := ctx.CreateJFCE()
	mustOK(t, err, "create JFCE")
	defer ce.Close()
	q, err := ctx.CreateJFC(urma.JFCConfig{Depth: 16, JFCE: ce})
	mustOK(t, err, "create JFC")
	defer q.Close()
	r, err := ctx.CreateJFR(urma.JFRConfig{Mode: urma.RC, Depth: 4, JFC: q})
	mustOK(t, err, "create JFR")
	defer r.Close()
	j, err := ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 4, SendJFC: q, JFR: r})
	mustOK(t, err, "create jetty")
	defer j.Close()
	mem, err := urma.AllocMemory(4096)
	mustOK(t, err, "alloc")
	defer mem.Free()
	seg, err := ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessLocalOnly})
	mustOK(t, err, "register")
	defer seg.Close()

	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	mustOK(t, err, "epoll_create")
	defer unix.Close(ep)
	mustOK(t, unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ce.Fd(), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ce.Fd())}), "epoll_ctl")
	events := make([]unix.EpollEvent, 1)
	wait := func(ms int) int {
		var n int
		mustOK(t, ignoringEINTR(func() (err error) {
			n, err = unix.EpollWait(ep, events, ms)
			return err
		}), "epoll_wait")
		return n
	}
	if wait(0) != 0 {
		t.Fatal("epoll reports an idle JFCE ready")
	}
	mustOK(t, q.Rearm(false), "rearm")
	mustOK(t, r.PostRecv(&urma.RecvWR{UserCtx: 1, SGEs: []urma.SGE{{Segment: seg, Len: 64}}}), "post receive")
	target := a.importJettyID(j.ID())
	mustOK(t, a.send(target, 1, 0, 64, 0), "send")
	if n := wait(5000); n != 1 || events[0].Fd != int32(ce.Fd()) {
		t.Fatalf("epoll_wait: %d events", n)
	}
	out := make([]urma.JFC, 1)
	if k, err := ce.Wait(out, 0); k != 1 || err != nil || out[0] != q {
		t.Fatalf("wait: %d, %v", k, err)
	}
	q.Ack(1)
	if wait(0) != 0 {
		t.Fatal("epoll still reports the JFCE ready after its event was taken")
	}
}

// A socket device reaches its own jetties without a connection.
func TestSocketDeviceSendsToItself(t *testing.T) {
	p := newProvider(t, socketOpts())
	a := newSide(t, p, urma.JettyConfig{}, 64)
	b := newSide(t, p, urma.JettyConfig{}, 64)
	target := a.importJetty(b)
	b.postRecv(5, 0, 64)
	copy(a.mem.Bytes(), "to myself")
	mustOK(t, a.send(target, 1, 0, 9, 0), "send")
	if c := pollN(t, b.rjfc, 1, 2*time.Second)[0]; c.Status != urma.StatusSuccess || string(b.mem.Bytes()[:9]) != "to myself" {
		t.Fatalf("receive %+v, bytes %q", c, b.mem.Bytes()[:9])
	}
	if n := len(p.conns()); n != 0 {
		t.Errorf("%d connections for traffic within one device", n)
	}
}

// Importing a jetty id the device never had, just past its table or far
// beyond, fails with ErrNoEnt; so does id 0, which no jetty gets.
func TestImportJettyIDOutOfRange(t *testing.T) {
	const maxJetty = 4
	p := newProvider(t, Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{MaxJetty: maxJetty}}}})
	a := newSide(t, p, urma.JettyConfig{}, 64)
	for _, id := range []uint32{0, maxJetty + 1, maxJetty + 1000, 1<<32 - 1} {
		_, err := a.ctx.ImportJetty(t.Context(), urma.JettyID{EID: a.jetty.ID().EID, UASID: a.jetty.ID().UASID, ID: id}, urma.RC, 7)
		if !errors.Is(err, urma.ErrNoEnt) {
			t.Errorf("import of jetty %d on a device of %d jetties: %v, want ErrNoEnt", id, maxJetty, err)
		}
	}
}

// A device takes at most MaxJFC JFCs, MaxJFR JFRs and MaxJetty jetties at
// once; past that creation fails with ErrNoMem, and closing one makes room
// again. (The device here takes limit JFCs besides the JFRs' own, and limit
// JFRs besides the jetties' own.)
func TestDeviceQueueLimits(t *testing.T) {
	const limit = 2
	p := newProvider(t, Options{Fabric: NewFabric(), Devices: []DeviceSpec{{Caps: urma.DeviceCaps{MaxJFC: limit + 1, MaxJFR: limit + 1, MaxJetty: limit}}}})
	ctx, err := p.Open("", 0)
	mustOK(t, err, "open")
	defer ctx.Close()
	recvJFC, err := ctx.CreateJFC(urma.JFCConfig{Depth: 16}) // the JFRs' JFC, the (limit+1)-th
	mustOK(t, err, "create the JFRs' JFC")
	defer recvJFC.Close()
	jettyJFR, err := ctx.CreateJFR(urma.JFRConfig{Mode: urma.RC, Depth: 4, JFC: recvJFC, TokenPolicy: urma.TokenPlainText, Token: 7})
	mustOK(t, err, "create the jetties' JFR")
	defer jettyJFR.Close()
	cases := []struct {
		name   string
		create func() (interface{ Close() error }, error)
	}{
		{"JFC", func() (interface{ Close() error }, error) { return ctx.CreateJFC(urma.JFCConfig{Depth: 16}) }},
		{"JFR", func() (interface{ Close() error }, error) {
			return ctx.CreateJFR(urma.JFRConfig{Mode: urma.RC, Depth: 4, JFC: recvJFC, TokenPolicy: urma.TokenPlainText, Token: 7})
		}},
		{"jetty", func() (interface{ Close() error }, error) {
			return ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 4, SendJFC: recvJFC, JFR: jettyJFR})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := limit
			var made []interface{ Close() error }
			defer func() {
				for _, m := range made {
					_ = m.Close()
				}
			}()
			for i := range n {
				m, err := c.create()
				mustOK(t, err, fmt.Sprintf("create %s %d of %d", c.name, i+1, n))
				made = append(made, m)
			}
			if _, err := c.create(); !errors.Is(err, urma.ErrNoMem) {
				t.Fatalf("%s past the limit: %v, want ErrNoMem", c.name, err)
			}
			mustOK(t, made[0].Close(), "close one")
			m, err := c.create()
			mustOK(t, err, fmt.Sprintf("create a %s after closing one", c.name))
			made[0] = m
		})
	}
}

// Closing a provider takes only its own device off an in-process fabric:
// the others still reach each other.
func TestFabricDetachesOnlyTheClosedDevice(t *testing.T) {
	fab := NewFabric()
	pa, pb := newProvider(t, Options{Fabric: fab}), newProvider(t, Options{Fabric: fab})
	pc, err := New(Options{Fabric: fab, Logger: quiet()})
	mustOK(t, err, "new")
	c := newSide(t, pc, urma.JettyConfig{}, 64)
	cID := c.jetty.ID()
	a := newSide(t, pa, urma.JettyConfig{}, 64)
	b := newSide(t, pb, urma.JettyConfig{}, 64)
	mustOK(t, pc.Close(), "close the third provider")
	if _, err := a.ctx.ImportJetty(t.Context(), cID, urma.RC, 7); err == nil {
		t.Error("import from a closed provider's device succeeded")
	}
	target := a.importJetty(b)
	b.postRecv(1, 0, 64)
	mustOK(t, a.send(target, 1, 0, 64, 0), "send")
	if got := pollN(t, a.sjfc, 1, 10*time.Second)[0]; got.Status != urma.StatusSuccess {
		t.Fatalf("send between the remaining devices: %+v", got)
	}
}

// Options left zero take the documented defaults: a peer timeout and a dial
// timeout of three seconds.
func TestZeroTimeoutsTakeDefaults(t *testing.T) {
	p := newProvider(t, Options{Listen: "127.0.0.1:0"})
	sd := p.devices[0].side
	if sd.peerTO != 3*time.Second || sd.dialTO != 3*time.Second {
		t.Fatalf("peer timeout %v, dial timeout %v; want 3s each", sd.peerTO, sd.dialTO)
	}
}

// A device takes as many EIDs as its MaxEIDCnt, not one more.
func TestDeviceEIDCount(t *testing.T) {
	eids := func(n int) []urma.EID {
		out := make([]urma.EID, n)
		for i := range out {
			out[i] = inprocEID(uint64(1000 + i))
		}
		return out
	}
	for _, c := range []struct {
		n  int
		ok bool
	}{{2, true}, {3, false}} {
		p, err := New(Options{Fabric: NewFabric(), Devices: []DeviceSpec{{EIDs: eids(c.n), Caps: urma.DeviceCaps{MaxEIDCnt: 2}}}})
		if err == nil {
			mustOK(t, p.Close(), "close")
		}
		if (err == nil) != c.ok {
			t.Errorf("%d EIDs on a device of MaxEIDCnt 2: %v, want accepted %v", c.n, err, c.ok)
		}
	}
}

// A segment registers under every token policy the API knows, the last
// included.
func TestSegmentTokenPolicies(t *testing.T) {
	p := newProvider(t, Options{Fabric: NewFabric()})
	a := newSide(t, p, urma.JettyConfig{}, 64)
	for _, policy := range []urma.TokenPolicy{urma.TokenNone, urma.TokenPlainText, urma.TokenSigned, urma.TokenAllEncrypted} {
		seg, err := a.ctx.RegisterSegment(a.mem, urma.SegmentConfig{Access: urma.AccessRead, TokenPolicy: policy, Token: 5})
		mustOK(t, err, fmt.Sprintf("register under token policy %d", policy))
		mustOK(t, seg.Close(), "unregister")
	}
	if _, err := a.ctx.RegisterSegment(a.mem, urma.SegmentConfig{Access: urma.AccessRead, TokenPolicy: urma.TokenAllEncrypted + 1}); !errors.Is(err, urma.ErrInval) {
		t.Fatalf("unknown token policy: %v, want ErrInval", err)
	}
}

// An SGE may end exactly at its segment's end, even an empty one starting
// there; one byte past the end fails the work request with LOC_ACCESS.
func TestSGEAtSegmentEnd(t *testing.T) {
	const size = 1 << 20 // newSide's segment
	cases := []struct {
		off, n int
		want   urma.Status
	}{
		{size - 64, 64, urma.StatusSuccess},
		{size, 0, urma.StatusSuccess},
		{size - 63, 64, urma.StatusLocAccess},
		{size + 1, 0, urma.StatusLocAccess},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d+%d", c.off, c.n), func(t *testing.T) {
			p := newProvider(t, Options{Fabric: NewFabric()})
			a := newSide(t, p, urma.JettyConfig{RNRRetry: 7}, 64)
			b := newSide(t, p, urma.JettyConfig{}, 64)
			target := a.importJetty(b)
			b.postRecv(1, 0, 64)
			mustOK(t, a.send(target, 1, c.off, c.n, 0), "send")
			if got := pollN(t, a.sjfc, 1, 10*time.Second)[0]; got.Status != c.want {
				t.Fatalf("send of %d bytes at %d of a %d-byte segment: %+v, want %v", c.n, c.off, size, got, c.want)
			}
		})
	}
}

// A jetty is named before it is published in the device's table: a
// connection's reader that finds it there (a peer's late answer to the
// previous jetty of a reused id) reads its id and instance without a lock.
// -race catches a jetty published first; the id check can too.
func TestJettyNamedBeforePublished(t *testing.T) {
	p := newProvider(t, Options{})
	s := newSide(t, p, urma.JettyConfig{}, 64)
	dev := p.devices[0]
	const reused = 2 // s.jetty holds 1
	stop, done := make(chan struct{}), make(chan struct{})
	var misnamed atomic.Int64
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if j := dev.jetty(reused); j != nil {
				if j.id.ID != reused {
					misnamed.Add(1)
				}
				j.onAnswer(nil, 0, urma.StatusSuccess, 0) // no such send: ignored
			}
			runtime.Gosched()
		}
	}()
	for i := 0; i < 200; i++ {
		j, err := s.ctx.CreateJetty(urma.JettyConfig{Mode: urma.RC, SQDepth: 16, SendJFC: s.sjfc, JFR: s.jfr})
		mustOK(t, err, "create jetty")
		if j.ID().ID != reused {
			t.Fatalf("jetty id %d, want %d", j.ID().ID, reused)
		}
		mustOK(t, j.Close(), "close jetty")
	}
	close(stop)
	<-done
	if n := misnamed.Load(); n > 0 {
		t.Fatalf("a reader found a jetty in the table before its id was set (%d times)", n)
	}
}
