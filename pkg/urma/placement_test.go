package urma

import (
	"bytes"
	"testing"
)

// The placement's stages, as a reader and a provider drive them.
func TestPlacement(t *testing.T) {
	msg := []byte("a message")
	tests := []struct {
		name       string
		dst        int
		bindCtx    uint64 // the receive the message takes (armed for 1)
		length     int
		withdraw   bool // the reader takes the offer back before the provider acts
		fail       bool // the copy breaks off
		wantClaim  bool
		wantPlaced bool
	}{
		{name: "placed", dst: 16, bindCtx: 1, length: len(msg), wantClaim: true, wantPlaced: true},
		{name: "exactly fits", dst: len(msg), bindCtx: 1, length: len(msg), wantClaim: true, wantPlaced: true},
		{name: "too long", dst: len(msg) - 1, bindCtx: 1, length: len(msg)},
		{name: "empty", dst: 16, bindCtx: 1, length: 0},
		{name: "another receive", dst: 16, bindCtx: 2, length: len(msg)},
		{name: "withdrawn", dst: 16, bindCtx: 1, length: len(msg), withdraw: true},
		{name: "copy broke off", dst: 16, bindCtx: 1, length: len(msg), fail: true, wantClaim: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPlacement()
			dst := make([]byte, tc.dst)
			p.Arm(dst, 1)
			if !p.Armed() || !p.Pending() {
				t.Fatal("not armed, or not pending, after Arm")
			}
			tk := p.Bind(tc.bindCtx)
			if tc.withdraw {
				if !p.Withdraw() || p.Pending() {
					t.Fatal("Withdraw of an unclaimed offer failed, or left it pending")
				}
				if _, ok := tk.Claim(tc.length, JettyID{}); ok {
					t.Fatal("claimed a withdrawn offer")
				}
				return
			}
			into, claimed := tk.Claim(tc.length, JettyID{})
			if claimed != tc.wantClaim {
				t.Fatalf("claimed %v, want %v", claimed, tc.wantClaim)
			}
			if p.Armed() {
				t.Fatal("still armed once a message was bound to it")
			}
			if claimed {
				if len(into) != tc.length {
					t.Fatalf("claim gave %d bytes to copy into, want %d", len(into), tc.length)
				}
				copy(into, msg)
				tk.Settle(tc.length, !tc.fail)
			}
			tk.Miss() // what the provider does when the receive completes: no effect after a claim
			if p.Withdraw() {
				t.Fatal("withdrew an offer a message was bound to")
			}
			if p.Placed() != tc.wantPlaced {
				t.Fatalf("Placed() = %v, want %v", p.Placed(), tc.wantPlaced)
			}
			n, placed := p.Wait()
			if placed != tc.wantPlaced || (placed && (n != len(msg) || !bytes.Equal(dst[:n], msg))) {
				t.Fatalf("Wait = %d, %v; want placed %v", n, placed, tc.wantPlaced)
			}
			if p.Placed() != tc.wantPlaced || p.Pending() != tc.wantPlaced || p.Armed() || p.Withdraw() {
				t.Fatal("Wait changed the outcome, or left the placement offered")
			}
			p.Arm(dst, 2)
			if p.Placed() || !p.Armed() {
				t.Fatal("a new arming kept the old outcome")
			}
		})
	}
}

// A provider holding the ticket of an old arming cannot claim, or miss, a
// later one: the reader withdrew and armed again for another message.
func TestPlacementStaleTicket(t *testing.T) {
	p := NewPlacement()
	p.Arm(make([]byte, 8), 1)
	old := p.Bind(1)
	if !p.Withdraw() {
		t.Fatal("withdraw failed")
	}
	p.Arm(make([]byte, 8), 1)
	old.Miss()
	if !p.Armed() {
		t.Fatal("an old ticket's Miss passed the new offer by")
	}
	if _, ok := old.Claim(4, JettyID{}); ok {
		t.Fatal("an old ticket claimed the new offer")
	}
	if _, ok := p.Bind(1).Claim(4, JettyID{}); !ok {
		t.Fatal("the new offer could not be claimed")
	}
}

// A placement restricted to one jetty (From) takes only that jetty's
// messages: one from another jetty, of another device or of the same
// device, passes it by, so the reader's memory never holds it; the uasid,
// which hardware leaves unfilled, does not count.
func TestPlacementFrom(t *testing.T) {
	peer := JettyID{EID: EID{0xfd, 15: 1}, UASID: 7, ID: 3}
	for _, tc := range []struct {
		name  string
		src   JettyID
		claim bool
	}{
		{"the peer", peer, true},
		{"the peer, uasid unfilled", JettyID{EID: peer.EID, ID: peer.ID}, true},
		{"another jetty of the peer's device", JettyID{EID: peer.EID, UASID: 7, ID: 4}, false},
		{"the same id on another device", JettyID{EID: EID{0xfd, 15: 2}, UASID: 7, ID: 3}, false},
		{"no source", JettyID{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPlacement()
			p.From(peer)
			dst := make([]byte, 8)
			p.Arm(dst, 1)
			tk := p.Bind(1)
			into, ok := tk.Claim(4, tc.src)
			if ok != tc.claim {
				t.Fatalf("claimed %v for a message from %+v, want %v", ok, tc.src, tc.claim)
			}
			if !ok {
				if p.Armed() || p.Pending() || p.Placed() {
					t.Fatal("a message passed by left the offer armed, pending or placed")
				}
				return
			}
			copy(into, "data")
			tk.Settle(4, true)
			if n, placed := p.Wait(); !placed || n != 4 || string(dst[:4]) != "data" {
				t.Fatalf("Wait: %d, %v, %q", n, placed, dst[:4])
			}
		})
	}
}

// Binding an offer that is not armed (idle, or already bound) gives a
// ticket that claims nothing.
func TestPlacementBindUnarmed(t *testing.T) {
	p := NewPlacement()
	if _, ok := p.Bind(0).Claim(1, JettyID{}); ok {
		t.Fatal("claimed an idle placement")
	}
	p.Arm(make([]byte, 8), 3)
	p.Bind(4) // passed by
	if _, ok := p.Bind(3).Claim(1, JettyID{}); ok {
		t.Fatal("claimed a placement another message passed by")
	}
	var zero PlacementTicket
	if zero.Offered() {
		t.Fatal("the zero ticket holds an offer")
	}
	p.Arm(make([]byte, 8), 5)
	if !p.Bind(5).Offered() {
		t.Fatal("a ticket bound to an armed offer holds none")
	}
	zero.Miss() // the zero ticket is inert
	if _, ok := zero.Claim(1, JettyID{}); ok {
		t.Fatal("the zero ticket claimed")
	}
}

// A reader that waits without offering idles its placement: a placed (or
// passed by) outcome stops counting as pending, so a provider waits for no
// offer from it. An offer out, or claimed, is the provider's and stays.
func TestPlacementIdle(t *testing.T) {
	tests := []struct {
		name     string
		bindCtx  uint64 // the receive a message takes (armed for 1); 0: none yet
		claim    bool   // the message claims the placement
		settle   bool   // and its copy ends
		placed   bool   // whole
		wantIdle bool
	}{
		{name: "placed", bindCtx: 1, claim: true, settle: true, placed: true, wantIdle: true},
		{name: "copy broke off", bindCtx: 1, claim: true, settle: true, wantIdle: true},
		{name: "passed by", bindCtx: 2, wantIdle: true},
		{name: "armed"},
		{name: "claimed", bindCtx: 1, claim: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPlacement()
			p.Arm(make([]byte, 8), 1)
			if tc.bindCtx != 0 {
				tk := p.Bind(tc.bindCtx)
				if tc.claim {
					if _, ok := tk.Claim(4, JettyID{}); !ok {
						t.Fatal("claim failed")
					}
				}
				if tc.settle {
					tk.Settle(4, tc.placed)
				}
			}
			armed, claimed := p.Armed(), p.stage() == placeClaimed
			if got := p.Idle(); got != tc.wantIdle {
				t.Fatalf("Idle() = %v, want %v", got, tc.wantIdle)
			}
			if tc.wantIdle {
				if p.Pending() || p.Placed() || p.Settled() || p.Armed() {
					t.Fatal("an idled placement still reports an outcome or an offer")
				}
				p.Arm(make([]byte, 8), 3)
				if _, ok := p.Bind(3).Claim(4, JettyID{}); !ok {
					t.Fatal("an idled placement could not be armed and claimed again")
				}
				return
			}
			if p.Armed() != armed || (p.stage() == placeClaimed) != claimed || !p.Pending() {
				t.Fatal("Idle changed an offer that was out")
			}
		})
	}
}
