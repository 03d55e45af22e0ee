package main

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// closeNotifyConn says on closed when it is closed.
type closeNotifyConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func newCloseNotifyConn(c net.Conn) *closeNotifyConn {
	return &closeNotifyConn{Conn: c, closed: make(chan struct{})}
}

func (c *closeNotifyConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// lateListener hands out conns; once closed, it still hands out what comes
// on late before it fails, as pkg/transport's Listener returns a connection
// whose handshake finished as it was closed.
type lateListener struct {
	conns, late chan net.Conn
	once        sync.Once
	closed      chan struct{}
}

func (l *lateListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
	}
	if c, ok := <-l.late; ok {
		return c, nil
	}
	return nil, net.ErrClosed
}

func (l *lateListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *lateListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// TestServerShutdownClosesLateConnections: a connection the listener hands
// over while the server shuts down, after the server closed the
// connections it had, is closed too, so that the server does not wait on a
// client that keeps its connection open.
func TestServerShutdownClosesLateConnections(t *testing.T) {
	ln := &lateListener{conns: make(chan net.Conn), late: make(chan net.Conn), closed: make(chan struct{})}
	first, firstPeer := net.Pipe()
	late, latePeer := net.Pipe()
	defer firstPeer.Close()
	defer latePeer.Close()
	c1, c2 := newCloseNotifyConn(first), newCloseNotifyConn(late)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan net.Conn, 2)
	done := make(chan error, 1)
	go func() {
		done <- serveListeners(ctx, []net.Listener{ln}, func(c net.Conn) {
			served <- c
			_, _ = io.Copy(io.Discard, c) // until the client or the server closes it
		})
	}()
	ln.conns <- c1
	<-served
	cancel()
	<-c1.closed // the server closed the connections it had
	ln.late <- c2
	close(ln.late)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serveListeners: %v", err)
		}
	case <-time.After(20 * time.Second):
		_ = latePeer.Close() // let it end
		<-done
		t.Fatal("the server still waits 20s after shutdown on a connection accepted as it shut down")
	}
	select {
	case <-c2.closed:
	default:
		t.Error("the late connection was left open")
	}
}
