// Package registrar serves the device plugin on its unix socket and keeps
// it registered with kubelet through kubelet restarts.
//
// Kubelet deletes every socket in its device-plugin directory when it
// starts, then creates kubelet.sock afresh, and forgets every plugin. So the
// registrar watches the directory (fsnotify, plus a periodic stat as a
// backstop): when its own socket disappears it serves again on a new one,
// and when kubelet.sock is created again (a new inode) it registers again.
// Registration is retried with exponential backoff; nothing but
// cancellation ends Run. On shutdown the socket is removed.
package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openeuler/urma-k8s/pkg/deviceplugin/metrics"
)

// Defaults.
const (
	DefaultSocketDir       = "/var/lib/kubelet/device-plugins"
	DefaultSocketName      = "urma-jetty.sock"
	DefaultCheckInterval   = 5 * time.Second
	DefaultBackoffInitial  = 100 * time.Millisecond
	DefaultBackoffMax      = 5 * time.Second
	DefaultRegisterTimeout = 15 * time.Second // kubelet dials back within 10 s
	kubeletSocketName      = "kubelet.sock"
	maxUnixPath            = 107 // sun_path is 108 bytes with the NUL
)

// Config configures the registrar.
type Config struct {
	// SocketDir is kubelet's device-plugin directory.
	SocketDir string
	// SocketName is this plugin's socket file name inside SocketDir.
	SocketName string
	// ResourceName is the extended resource, e.g. urma.openeuler.org/jetty.
	ResourceName string
	// Options are sent with the registration.
	Options *pluginapi.DevicePluginOptions
	// CheckInterval is how often both sockets are stat'ed in case an
	// fsnotify event was missed.
	CheckInterval time.Duration
	// BackoffInitial and BackoffMax bound the delay between failed attempts.
	BackoffInitial, BackoffMax time.Duration
	// RegisterTimeout bounds one Register call.
	RegisterTimeout time.Duration

	// pollOnly disables fsnotify, for tests of the periodic check.
	pollOnly bool
}

func (c *Config) defaults() {
	if c.SocketDir == "" {
		c.SocketDir = DefaultSocketDir
	}
	if c.SocketName == "" {
		c.SocketName = DefaultSocketName
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = DefaultCheckInterval
	}
	if c.BackoffInitial <= 0 {
		c.BackoffInitial = DefaultBackoffInitial
	}
	if c.BackoffMax < c.BackoffInitial {
		c.BackoffMax = max(DefaultBackoffMax, c.BackoffInitial)
	}
	if c.RegisterTimeout <= 0 {
		c.RegisterTimeout = DefaultRegisterTimeout
	}
}

// Validate rejects configurations that can never work.
func (c Config) Validate() error {
	c.defaults()
	if !filepath.IsAbs(c.SocketDir) {
		return fmt.Errorf("socket directory %q must be absolute", c.SocketDir)
	}
	if c.SocketName == kubeletSocketName || filepath.Base(c.SocketName) != c.SocketName {
		return fmt.Errorf("socket name %q must be a plain file name other than %s", c.SocketName, kubeletSocketName)
	}
	for _, p := range []string{filepath.Join(c.SocketDir, c.SocketName), filepath.Join(c.SocketDir, kubeletSocketName)} {
		if len(p) > maxUnixPath {
			return fmt.Errorf("socket path %s is %d bytes; unix sockets allow %d", p, len(p), maxUnixPath)
		}
	}
	if c.ResourceName == "" {
		return errors.New("resource name is empty")
	}
	return nil
}

// Registrar serves and registers one device plugin.
type Registrar struct {
	cfg     Config
	plugin  pluginapi.DevicePluginServer
	log     logr.Logger
	metrics *metrics.Metrics

	mu         sync.Mutex
	serving    bool
	registered bool
}

// New returns a registrar for the plugin service; metrics may be nil.
func New(cfg Config, plugin pluginapi.DevicePluginServer, log logr.Logger, m *metrics.Metrics) *Registrar {
	cfg.defaults()
	return &Registrar{cfg: cfg, plugin: plugin, log: log, metrics: m}
}

// SocketPath is the plugin's socket.
func (r *Registrar) SocketPath() string { return filepath.Join(r.cfg.SocketDir, r.cfg.SocketName) }

func (r *Registrar) kubeletSocket() string { return filepath.Join(r.cfg.SocketDir, kubeletSocketName) }

// Serving reports whether the plugin's gRPC server is up.
func (r *Registrar) Serving() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.serving
}

// Registered reports whether the last registration succeeded and nothing
// since suggests kubelet forgot it.
func (r *Registrar) Registered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered
}

func (r *Registrar) setState(serving, registered bool) {
	r.mu.Lock()
	r.serving, r.registered = serving, registered
	r.mu.Unlock()
	if !registered {
		r.metrics.SetUnregistered()
	}
}

// served is one incarnation of the gRPC server.
type served struct {
	srv  *grpc.Server
	ino  fileID
	done chan struct{} // closed when Serve returns
}

// Run serves and registers until ctx is cancelled, then stops the server,
// removes the socket and returns nil.
func (r *Registrar) Run(ctx context.Context) error {
	var cur *served
	var kubeletIno fileID // identity of kubelet.sock at our last registration
	needServe, needRegister := true, true
	backoff := r.cfg.BackoffInitial
	failures := 0 // consecutive failed registrations
	retry := time.NewTimer(0)
	defer retry.Stop()
	check := time.NewTicker(r.cfg.CheckInterval)
	defer check.Stop()

	var fsw *fsnotify.Watcher
	var events <-chan fsnotify.Event
	var fsErrs <-chan error
	defer func() {
		if fsw != nil {
			fsw.Close()
		}
	}()
	ensureWatch := func() {
		if fsw != nil || r.cfg.pollOnly {
			return
		}
		w, err := fsnotify.NewWatcher()
		if err != nil {
			r.log.Error(err, "fsnotify unavailable; checking the socket directory by polling only")
			return
		}
		if err := w.Add(r.cfg.SocketDir); err != nil {
			w.Close()
			r.log.V(1).Info("cannot watch the socket directory yet", "dir", r.cfg.SocketDir, "error", err.Error())
			return
		}
		fsw, events, fsErrs = w, w.Events, w.Errors
	}

	stop := func() {
		if cur == nil {
			return
		}
		cur.srv.Stop()
		<-cur.done
		cur = nil
	}
	defer func() {
		stop()
		r.setState(false, false)
	}()

	for {
		ensureWatch()
		var serveDone <-chan struct{}
		if cur != nil {
			serveDone = cur.done
		}
		select {
		case <-ctx.Done():
			if cur != nil {
				ino := cur.ino
				stop()
				r.removeOwnSocket(ino)
				r.log.Info("device plugin stopped and its socket removed", "socket", r.SocketPath())
			}
			return nil

		case <-retry.C:
			if cur != nil && inode(r.SocketPath()) != cur.ino {
				// Removed under us, and the event is still queued: kubelet
				// would dial a socket that is gone and hang for its 10 s.
				needServe = true
			}
			if needServe {
				stop()
				s, err := r.serve()
				if err != nil {
					r.log.Error(err, "cannot serve the device plugin socket; retrying", "in", backoff)
					retry.Reset(backoff)
					backoff = min(backoff*2, r.cfg.BackoffMax)
					continue
				}
				cur, needServe, needRegister = s, false, true
				r.setState(true, false)
				r.log.Info("serving the device plugin", "socket", r.SocketPath())
			}
			if needRegister {
				// The identity of the kubelet.sock we are about to dial, taken
				// before the call: if kubelet restarts during it, the
				// periodic check sees a different socket and registers again.
				target := inode(r.kubeletSocket())
				err := r.register(ctx)
				r.metrics.ObserveRegistration(err)
				if err != nil {
					// While kubelet is down this repeats every BackoffMax: say
					// it loudly the first time and then once a minute or so.
					failures++
					lg := r.log.V(1)
					if failures == 1 || failures%12 == 0 {
						lg = r.log
					}
					lg.Info("registration with kubelet failed; retrying", "error", err.Error(), "in", backoff, "attempt", failures)
					retry.Reset(backoff)
					backoff = min(backoff*2, r.cfg.BackoffMax)
					continue
				}
				needRegister, backoff, failures = false, r.cfg.BackoffInitial, 0
				kubeletIno = target
				r.setState(true, true)
				r.log.Info("registered with kubelet", "resource", r.cfg.ResourceName, "kubeletSocket", r.kubeletSocket())
			}

		case <-serveDone:
			r.log.Info("device plugin gRPC server ended unexpectedly; serving again")
			cur, needServe = nil, true
			r.setState(false, false)
			r.kick(retry, &backoff)

		case ev, ok := <-events:
			if !ok {
				fsw, events, fsErrs = nil, nil, nil
				continue
			}
			switch {
			case ev.Name == r.cfg.SocketDir && ev.Has(fsnotify.Remove|fsnotify.Rename):
				// The directory itself went away: watch it again once it is
				// back; the periodic check notices our socket is gone.
				fsw.Close()
				fsw, events, fsErrs = nil, nil, nil
			case ev.Name == r.kubeletSocket() && ev.Has(fsnotify.Create):
				if !needRegister && inode(r.kubeletSocket()) == kubeletIno {
					continue // the kubelet we already registered with
				}
				r.log.Info("kubelet.sock created: kubelet (re)started; registering again")
				needRegister = true
				r.setState(cur != nil, false)
				r.kick(retry, &backoff)
			case ev.Name == r.SocketPath() && ev.Has(fsnotify.Remove|fsnotify.Rename):
				if cur != nil && inode(r.SocketPath()) == cur.ino {
					continue // our own re-creation raced the event
				}
				r.log.Info("our socket was removed (kubelet restart?); serving again and re-registering", "socket", r.SocketPath())
				needServe = true
				r.setState(false, false)
				r.kick(retry, &backoff)
			}

		case err, ok := <-fsErrs:
			if !ok {
				fsErrs = nil
				continue
			}
			r.log.Error(err, "fsnotify error on the socket directory; relying on the periodic check")

		case <-check.C:
			if cur != nil && inode(r.SocketPath()) != cur.ino {
				r.log.Info("our socket is gone or replaced; serving again", "socket", r.SocketPath())
				needServe = true
				r.setState(false, false)
				r.kick(retry, &backoff)
				continue
			}
			if !needRegister && !needServe {
				if ino := inode(r.kubeletSocket()); ino != (fileID{}) && ino != kubeletIno {
					r.log.Info("kubelet.sock replaced since we registered; registering again")
					needRegister = true
					r.setState(cur != nil, false)
					r.kick(retry, &backoff)
				}
			}
		}
	}
}

// kick makes the next attempt immediate with a fresh backoff.
func (r *Registrar) kick(retry *time.Timer, backoff *time.Duration) {
	*backoff = r.cfg.BackoffInitial
	retry.Reset(0)
}

// serve listens on the socket (replacing a stale file) and starts serving.
func (r *Registrar) serve() (*served, error) {
	if err := os.MkdirAll(r.cfg.SocketDir, 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	path := r.SocketPath()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Closing must not unlink the path: by then it may be a newer socket
	// (ours, re-served, or another instance's). removeOwnSocket checks.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, r.plugin)
	s := &served{srv: srv, ino: inode(path), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			r.log.Error(err, "device plugin gRPC server failed")
		}
	}()
	return s, nil
}

// register calls kubelet's Register once.
func (r *Registrar) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RegisterTimeout)
	defer cancel()
	if _, err := os.Stat(r.kubeletSocket()); err != nil {
		return fmt.Errorf("kubelet socket: %w", err)
	}
	conn, err := grpc.NewClient("unix://"+r.kubeletSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet: %w", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     r.cfg.SocketName,
		ResourceName: r.cfg.ResourceName,
		Options:      r.cfg.Options,
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet: %w", r.cfg.ResourceName, err)
	}
	return nil
}

// removeOwnSocket removes the socket file if it is still ours (inode ino).
func (r *Registrar) removeOwnSocket(ino fileID) {
	path := r.SocketPath()
	if got := inode(path); got == (fileID{}) || got != ino {
		return
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		r.log.Error(err, "cannot remove our socket", "socket", path)
	}
}

// fileID identifies one incarnation of a file. The inode alone is not
// enough: filesystems hand a freed inode number to the next file created,
// so a re-created socket often has its predecessor's; the change time tells
// them apart.
type fileID struct {
	dev, ino uint64
	ctime    syscall.Timespec
}

// inode returns a file's identity, the zero fileID when it does not exist.
func inode(path string) fileID {
	fi, err := os.Lstat(path)
	if err != nil {
		return fileID{}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim}
	}
	return fileID{}
}
