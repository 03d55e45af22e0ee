package soft

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

// socketSideOf returns s's jetty and segment IDs under the device's
// socket-fabric EID (index 1 of a device on both fabrics): the names a
// peer on another host imports them by.
func socketSideOf(t *testing.T, p *Provider, s *side) (urma.JettyID, urma.SegmentID) {
	t.Helper()
	devs, err := p.Devices()
	mustOK(t, err, "devices")
	if len(devs[0].EIDs) != 2 {
		t.Fatalf("a device on both fabrics lists %d EIDs, want 2: %+v", len(devs[0].EIDs), devs[0].EIDs)
	}
	eid := devs[0].EIDs[1].EID
	id, seg := s.jetty.ID(), s.seg.ID()
	id.EID, seg.EID = eid, eid
	return id, seg
}

// A device on both fabrics is one device under two EIDs: a peer that meets
// it in its shm directory reaches it over shared memory, a peer elsewhere
// (another directory here, another host in a cluster) reaches the same
// jetty and segment over TCP at its socket EID; bytes arrive whole both
// ways and each pair of devices holds one connection on the fabric of the
// EID imported.
func TestAlsoSocketReachesOneDeviceOverEitherFabric(t *testing.T) {
	noLeaks(t)
	for _, tc := range []struct {
		name       string
		sameDir    bool
		viaSocket  bool
		wantShm    int
		wantSocket int
	}{
		{name: "same shm directory, shm EID", sameDir: true, wantShm: 1},
		{name: "same shm directory, socket EID", sameDir: true, viaSocket: true, wantSocket: 1},
		{name: "other shm directory, socket EID", viaSocket: true, wantSocket: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			optsA := shmOpts(t)
			optsA.AlsoSocket = true
			optsB := optsA
			if !tc.sameDir {
				optsB = shmOpts(t)
				optsB.AlsoSocket = true
			}
			pa, pb := newProvider(t, optsA), newProvider(t, optsB)
			if pa.Name() != "soft-shm+socket" {
				t.Fatalf("provider name %q, want soft-shm+socket", pa.Name())
			}
			a := newSide(t, pa, urma.JettyConfig{RNRRetry: 7}, 64)
			b := newSide(t, pb, urma.JettyConfig{RNRRetry: 7}, 64)
			if !IsShmEID(a.ctx.EID()) {
				t.Fatalf("index 0 of a device on both fabrics is %s, not an shm EID", a.ctx.EID())
			}
			// A segment peers may import (the sides' own are local only).
			mem, err := urma.AllocMemory(4096)
			mustOK(t, err, "alloc")
			t.Cleanup(func() { _ = mem.Free() })
			shared, err := a.ctx.RegisterSegment(mem, urma.SegmentConfig{Access: urma.AccessRead, TokenPolicy: urma.TokenPlainText, Token: 7})
			mustOK(t, err, "register a readable segment")
			t.Cleanup(func() { _ = shared.Close() })
			idA, segA := a.jetty.ID(), shared.ID()
			idB := b.jetty.ID()
			if tc.viaSocket {
				idA, _ = socketSideOf(t, pa, a)
				idB, _ = socketSideOf(t, pb, b)
				segA.EID = idA.EID
				if _, ok := SocketAddr(idA.EID); !ok {
					t.Fatalf("index 1 of a device on both fabrics is %s, not a socket EID", idA.EID)
				}
			}
			importJetty := func(s *side, id urma.JettyID) urma.RemoteJetty {
				rj, err := s.ctx.ImportJetty(t.Context(), id, urma.RC, 7)
				mustOK(t, err, "import jetty "+id.EID.String())
				t.Cleanup(func() { _ = rj.Close() })
				return rj
			}
			ta, tb := importJetty(a, idB), importJetty(b, idA)
			rs, err := b.ctx.ImportSegment(segA, 7)
			mustOK(t, err, "import a's segment")
			t.Cleanup(func() { _ = rs.Close() })

			for _, dir := range []struct {
				from, to *side
				target   urma.RemoteJetty
			}{{a, b, ta}, {b, a, tb}} {
				msg := []byte("one device, " + tc.name)
				copy(dir.from.mem.Bytes()[4096:], msg)
				dir.to.postRecv(1, 0, 4096)
				mustOK(t, dir.from.send(dir.target, 1, 4096, len(msg), 0), "send")
				if c := pollN(t, dir.from.sjfc, 1, 10*time.Second)[0]; c.Status != urma.StatusSuccess {
					t.Fatalf("send: %+v", c)
				}
				c := pollN(t, dir.to.rjfc, 1, 10*time.Second)[0]
				if c.Status != urma.StatusSuccess || !bytes.Equal(dir.to.mem.Bytes()[:c.CompletionLen], msg) {
					t.Fatalf("receive: %+v, %q", c, dir.to.mem.Bytes()[:c.CompletionLen])
				}
			}
			shmA, sockA := connsOf(pa)
			shmB, sockB := connsOf(pb)
			if shmA != tc.wantShm || sockA != tc.wantSocket || shmB != tc.wantShm || sockB != tc.wantSocket {
				t.Fatalf("connections shm/socket: a %d/%d, b %d/%d; want %d/%d on both", shmA, sockA, shmB, sockB, tc.wantShm, tc.wantSocket)
			}
		})
	}
}

// Across shm directories the shm EID stays unreachable: AlsoSocket adds a
// fabric, it does not turn an shm EID into a TCP address.
func TestAlsoSocketShmEIDElsewhereIsUnreachable(t *testing.T) {
	noLeaks(t)
	optsA, optsB := shmOpts(t), shmOpts(t)
	optsA.AlsoSocket, optsB.AlsoSocket = true, true
	a := newSide(t, newProvider(t, optsA), urma.JettyConfig{}, 64)
	b := newSide(t, newProvider(t, optsB), urma.JettyConfig{}, 64)
	_, err := a.ctx.ImportJetty(t.Context(), b.jetty.ID(), urma.RC, 7)
	if err == nil || !strings.Contains(err.Error(), b.jetty.ID().EID.String()) {
		t.Fatalf("import of an shm EID of another directory: %v", err)
	}
}

// AlsoSocket without ShmDir is a configuration error that names both.
func TestAlsoSocketNeedsShmDir(t *testing.T) {
	_, err := New(Options{AlsoSocket: true})
	if err == nil || !strings.Contains(err.Error(), "AlsoSocket") || !strings.Contains(err.Error(), "ShmDir") {
		t.Fatalf("New(AlsoSocket without ShmDir) = %v", err)
	}
}

// A device whose socket side cannot listen is not created, and its shm
// side is released with it (the directory keeps no socket).
func TestAlsoSocketListenFailureReleasesTheShmSide(t *testing.T) {
	noLeaks(t)
	opts := shmOpts(t)
	opts.AlsoSocket = true
	opts.Listen = "192.0.2.1:0" // TEST-NET-1: not an address of this host
	_, err := New(opts)
	if err == nil || !strings.Contains(err.Error(), "listen on 192.0.2.1:0") {
		t.Fatalf("New with an unlistenable socket side = %v", err)
	}
	entries, rerr := os.ReadDir(opts.ShmDir)
	mustOK(t, rerr, "read the shm directory")
	if len(entries) != 0 {
		t.Fatalf("the shm directory keeps %v after the failed New", entries)
	}
}
