package transport

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestURMAEcho: a round trip over URMA, what Debug and the metrics say
// about it, and the end of the session.
func TestURMAEcho(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	reg := prometheus.NewRegistry()
	scfg, ccfg := cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags())
	scfg.Registerer, ccfg.Registerer = reg, reg // one registry, both sides
	p := connect(t, scfg, ccfg)
	if p.client.Mode() != ModeURMA || p.server.Mode() != ModeURMA {
		t.Fatalf("modes %s/%s, want urma; client fallback %q, server %q", p.client.Mode(), p.server.Mode(), p.client.FallbackReason(), p.server.FallbackReason())
	}
	msg := bytes.Repeat([]byte("hello urma "), 500) // several 1 KiB buffers
	exchange(t, p.client, p.server, string(msg))

	d := p.client.Debug()
	checks := []struct {
		name string
		ok   bool
	}{
		{"state", d.State == "ESTABLISHED"},
		{"role", d.Role == "client" && p.server.Debug().Role == "server"},
		{"hello version", d.HandshakeVersion == 2},
		{"device", d.Device == testDevice()},
		{"jetty ids", d.LocalJetty.ID != 0 && d.RemoteJetty.ID != 0 && d.RemoteJetty == p.server.Debug().LocalJetty},
		{"window capacity", d.WindowCapacity == 16-creditWRs},
		{"send window back to full", d.SQWindow == d.WindowCapacity},
		{"credit threshold", d.CreditThreshold == (16-creditWRs)/2},
		{"counters", d.BytesSent == uint64(len(msg)) && d.BytesReceived == uint64(len(msg)) && d.MessagesSent == 6},
		{"text", strings.Contains(d.String(), "mode=urma") && strings.Contains(d.String(), "sq_window=")},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("debug %s wrong: %s", c.name, d)
		}
	}
	if _, err := json.Marshal(d); err != nil {
		t.Errorf("debug info does not marshal: %v", err)
	}

	want := map[string]float64{
		`urma_transport_conns{mode="urma",role="client"}`:                     1,
		`urma_transport_conns{mode="urma",role="server"}`:                     1,
		`urma_transport_bytes_total{direction="sent",mode="urma"}`:            2 * float64(len(msg)),
		`urma_transport_bytes_total{direction="received",mode="urma"}`:        2 * float64(len(msg)),
		`urma_transport_messages_total{direction="sent"}`:                     12,
		`urma_transport_handshake_seconds_count{result="urma",role="client"}`: 1,
		`urma_transport_handshake_seconds_count{result="urma",role="server"}`: 1,
	}
	got := gatherFlat(t, reg)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if got[`urma_transport_pool_buffers{state="in_use"}`] < 2*16 {
		t.Errorf("pool in use %v, want at least both sides' receive buffers", got[`urma_transport_pool_buffers{state="in_use"}`])
	}

	if err := p.client.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := p.server.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read after peer close: %d, %v; want EOF", n, err)
	}
	if s := p.server.Debug().State; s != "PEER_CLOSED" {
		t.Errorf("server state after the client closed: %s", s)
	}
	if s := p.client.Debug().State; s != "CLOSED" {
		t.Errorf("client state after Close: %s", s)
	}
}
