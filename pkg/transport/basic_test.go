package transport

import (
	"bytes"
	"io"
	"testing"
)

func TestURMAEcho(t *testing.T) {
	checkNoLeaks(t)
	pa, pb := fabricPair(t)
	p := connect(t, cfgWith(pa, smallFlags()), cfgWith(pb, smallFlags()))
	if p.client.Mode() != ModeURMA || p.server.Mode() != ModeURMA {
		t.Fatalf("modes %s/%s, want urma; client fallback %q, server %q", p.client.Mode(), p.server.Mode(), p.client.FallbackReason(), p.server.FallbackReason())
	}
	msg := bytes.Repeat([]byte("hello urma "), 500) // several buffers
	go func() {
		_, _ = p.client.Write(msg)
	}()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(p.server, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("data differs")
	}
	t.Log(p.client.Debug())
	t.Log(p.server.Debug())
	if err := p.client.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := p.server.Read(got); err != io.EOF {
		t.Fatalf("read after peer close: %d, %v; want EOF", n, err)
	}
}
