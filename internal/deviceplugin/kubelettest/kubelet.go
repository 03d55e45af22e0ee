// Package kubelettest is a fake kubelet for device plugin tests: a
// Registration gRPC server on <dir>/kubelet.sock that, like kubelet's
// device manager, dials a registering plugin back on its endpoint, asks for
// its options and follows its ListAndWatch stream. Restart reproduces what a
// real kubelet restart does to the socket directory.
package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// SocketName is kubelet's registration socket name.
const SocketName = "kubelet.sock"

// Plugin is what the fake kubelet knows about one registered resource.
type Plugin struct {
	Request *pluginapi.RegisterRequest
	Options *pluginapi.DevicePluginOptions
	// Devices is the last list received on ListAndWatch; Updates counts the
	// lists received on the current stream.
	Devices []*pluginapi.Device
	Updates int
	// FirstDevices is the first list received on the current stream: what a
	// restarted kubelet would base its allocatable count on.
	FirstDevices []*pluginapi.Device
	// Streaming is true while the ListAndWatch stream is open.
	Streaming bool

	client pluginapi.DevicePluginClient
	conn   *grpc.ClientConn
	cancel context.CancelFunc
}

// State is a copy of everything the fake kubelet has seen.
type State struct {
	// Registrations counts successful Register calls per resource.
	Registrations map[string]int
	// Plugins holds the latest registration per resource.
	Plugins map[string]Plugin
}

// Kubelet is the fake. Create it with Start.
type Kubelet struct {
	dir string
	srv *grpc.Server
	wg  sync.WaitGroup

	mu      sync.Mutex
	regs    map[string]int
	plugins map[string]*Plugin
	changed chan struct{}
	stopped bool

	pluginapi.UnimplementedRegistrationServer
}

// Start serves the Registration service on <dir>/kubelet.sock, creating
// dir if needed.
func Start(dir string) (*Kubelet, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("fake kubelet: %w", err)
	}
	sock := filepath.Join(dir, SocketName)
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("fake kubelet: listen on %s: %w", sock, err)
	}
	k := &Kubelet{
		dir: dir, srv: grpc.NewServer(),
		regs: map[string]int{}, plugins: map[string]*Plugin{}, changed: make(chan struct{}),
	}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		_ = k.srv.Serve(lis)
	}()
	return k, nil
}

// Dir is the socket directory.
func (k *Kubelet) Dir() string { return k.dir }

// Register implements the Registration service the way kubelet does:
// check the version and resource name, dial the plugin back, read its
// options and start following ListAndWatch.
func (k *Kubelet) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported version %q", req.Version)
	}
	if !isExtendedResourceName(req.ResourceName) {
		return nil, fmt.Errorf("invalid resource name %q", req.ResourceName)
	}
	if req.Endpoint == "" || strings.Contains(req.Endpoint, "/") {
		return nil, fmt.Errorf("invalid endpoint %q: want a file name in the socket directory", req.Endpoint)
	}
	sock := filepath.Join(k.dir, req.Endpoint)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial plugin at %s: %w", sock, err)
	}
	client := pluginapi.NewDevicePluginClient(conn)
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts, err := client.GetDevicePluginOptions(octx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("plugin at %s did not answer: %w", sock, err)
	}

	sctx, scancel := context.WithCancel(context.Background())
	p := &Plugin{Request: req, Options: opts, client: client, conn: conn, cancel: scancel}
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		scancel()
		conn.Close()
		return nil, errors.New("kubelet stopping")
	}
	if old := k.plugins[req.ResourceName]; old != nil {
		if old.Streaming && old.Request.Endpoint == req.Endpoint {
			// Kubelet's device manager refuses a plugin on an endpoint it
			// still follows ("device plugin already connected") until that
			// stream ends, and then loses track of the old connection: a
			// plugin must end its stream (stop serving) before registering
			// again on the same socket.
			k.mu.Unlock()
			scancel()
			conn.Close()
			return nil, fmt.Errorf("device plugin already connected: %s", sock)
		}
		old.cancel()
		old.conn.Close()
	}
	k.plugins[req.ResourceName] = p
	k.regs[req.ResourceName]++
	k.notifyLocked()
	k.wg.Add(1)
	k.mu.Unlock()

	go func() {
		defer k.wg.Done()
		k.follow(sctx, p)
	}()
	return &pluginapi.Empty{}, nil
}

// follow reads the plugin's ListAndWatch stream; when it ends, kubelet
// disconnects from the plugin, and so does the fake.
func (k *Kubelet) follow(ctx context.Context, p *Plugin) {
	defer p.conn.Close()
	stream, err := p.client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return
	}
	k.mu.Lock()
	p.Streaming = true
	k.notifyLocked()
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		p.Streaming = false
		k.notifyLocked()
		k.mu.Unlock()
	}()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		k.mu.Lock()
		p.Devices = resp.Devices
		if p.Updates == 0 {
			p.FirstDevices = resp.Devices
		}
		p.Updates++
		k.notifyLocked()
		k.mu.Unlock()
	}
}

func (k *Kubelet) notifyLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// State returns a copy of what the fake has seen, and a channel closed at
// the next change.
func (k *Kubelet) State() (State, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := State{Registrations: map[string]int{}, Plugins: map[string]Plugin{}}
	for r, n := range k.regs {
		s.Registrations[r] = n
	}
	for r, p := range k.plugins {
		cp := *p
		cp.Devices = append([]*pluginapi.Device(nil), p.Devices...)
		cp.FirstDevices = append([]*pluginapi.Device(nil), p.FirstDevices...)
		s.Plugins[r] = cp
	}
	return s, k.changed
}

// WaitFor blocks until cond holds for the fake's state, or ctx ends.
func (k *Kubelet) WaitFor(ctx context.Context, cond func(State) bool) (State, error) {
	for {
		s, changed := k.State()
		if cond(s) {
			return s, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return s, fmt.Errorf("fake kubelet: condition not met: %w", ctx.Err())
		}
	}
}

// Client returns a DevicePlugin client on the resource's registered plugin,
// as kubelet uses for Allocate; nil if not registered.
func (k *Kubelet) Client(resource string) pluginapi.DevicePluginClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p := k.plugins[resource]; p != nil {
		return p.client
	}
	return nil
}

// Stop shuts the fake down: the registration server stops, plugin
// connections close, kubelet.sock is removed, and every goroutine ends.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	k.stopped = true
	for _, p := range k.plugins {
		p.cancel()
		p.conn.Close()
	}
	k.mu.Unlock()
	k.srv.Stop()
	k.wg.Wait()
	_ = os.Remove(filepath.Join(k.dir, SocketName))
}

// Restart does what a kubelet restart does: the old kubelet goes away, the
// new one deletes every socket in the directory (plugins' included) and
// then serves a fresh kubelet.sock. Registrations start from zero.
func (k *Kubelet) Restart() (*Kubelet, error) {
	k.Stop()
	if err := CleanupSockets(k.dir); err != nil {
		return nil, err
	}
	return Start(k.dir)
}

// CleanupSockets removes every unix socket in dir, as kubelet's device
// manager does when it starts.
func CleanupSockets(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("clean up %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isExtendedResourceName approximates kubelet's check: a domain-qualified
// name outside kubernetes.io.
func isExtendedResourceName(name string) bool {
	domain, rest, ok := strings.Cut(name, "/")
	if !ok || domain == "" || rest == "" || strings.Contains(rest, "/") {
		return false
	}
	return domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io") && strings.Contains(domain, ".")
}

// SocketDir makes a short temporary directory for sockets (unix socket
// paths must stay under 108 bytes, which t.TempDir paths can exceed) and
// returns it with a function that removes it.
func SocketDir() (string, func(), error) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		return "", nil, fmt.Errorf("socket dir: %w", err)
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}
