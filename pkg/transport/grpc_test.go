package transport

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestGRPC: gRPC runs over the transport unchanged, with the dialer in
// grpc.WithContextDialer and the listener given to grpc.Server.Serve, on
// URMA and on the TCP fallback.
func TestGRPC(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range []struct {
		name     string
		disabled bool
		want     Mode
	}{{"urma", false, ModeURMA}, {"tcp fallback", true, ModeTCP}} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := fabricPair(t)
			scfg := cfgWith(pa, smallFlags())
			scfg.DisableURMA = tc.disabled
			ln, err := ListenTransport("tcp", "127.0.0.1:0", scfg)
			if err != nil {
				t.Fatal(err)
			}
			modes := make(chan net.Conn, 4)
			srv := grpc.NewServer()
			hs := health.NewServer()
			healthpb.RegisterHealthServer(srv, hs)
			served := make(chan error, 1)
			go func() { served <- srv.Serve(&recordingListener{Listener: ln, conns: modes}) }()
			defer func() {
				srv.Stop()
				if err := <-served; err != nil {
					t.Errorf("Serve: %v", err)
				}
			}()

			d, err := NewDialer(cfgWith(pb, smallFlags()))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
				grpc.WithContextDialer(d.DialContext),
				grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			client := healthpb.NewHealthClient(cc)
			for i := 0; i < 20; i++ {
				resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
				if err != nil {
					t.Fatalf("Check %d: %v", i, err)
				}
				if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("status %s", resp.GetStatus())
				}
			}
			// A streaming call: watch, then flip the status.
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := stream.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("watch: %v, %v", r, err)
			}
			hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
			if r, err := stream.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Fatalf("watch after the flip: %v, %v", r, err)
			}
			select {
			case c := <-modes:
				if m, _ := ModeOf(c); m != tc.want {
					t.Fatalf("server conn mode %s, want %s", m, tc.want)
				}
			default:
				t.Fatal("the server accepted no connection")
			}
		})
	}
}

// recordingListener hands accepted conns to the test as well.
type recordingListener struct {
	net.Listener
	conns chan net.Conn
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		select {
		case l.conns <- c:
		default:
		}
	}
	return c, err
}
