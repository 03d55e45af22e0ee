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
//
// Ready tells when kubelet has the plugin: registered, and following the
// ListAndWatch stream of the socket it registered. Each served socket
// counts the streams that have received a list, so a stream of a socket
// served before a kubelet restart never counts for the next one.
package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/validation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/openeuler/urma-k8s/internal/node/metrics"
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
	if err := checkExtendedResourceName(c.ResourceName); err != nil {
		return err
	}
	return nil
}

// checkExtendedResourceName applies kubelet's test of a registration's
// resource name (IsExtendedResourceName): kubelet refuses any other, and
// the registrar would retry that refusal forever.
func checkExtendedResourceName(name string) error {
	const want = "want domain/name outside kubernetes.io, e.g. example.com/jetty"
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return fmt.Errorf("resource name %q is not an extended resource name: %s", name, want)
	}
	// Kubelet checks the name as the quota name it would become.
	if errs := validation.IsQualifiedName("requests." + name); len(errs) > 0 {
		return fmt.Errorf("resource name %q is not an extended resource name: %s", name, strings.Join(errs, "; "))
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
	cur        *served // the socket being served; nil when none
	registered bool

	retryIn func(time.Duration) // test hook: a retry was scheduled after this delay
	// listen is a test hook replacing net.Listen("unix", path): it makes a
	// serve fail at a chosen moment, which no file-system state can do
	// without also changing our socket (and so the path the loop takes).
	listen func(path string) (net.Listener, error)
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
	return r.cur != nil
}

// Registered reports whether the last registration succeeded and nothing
// since suggests kubelet forgot it.
func (r *Registrar) Registered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered
}

// Ready reports whether kubelet has the plugin: the last registration
// succeeded, nothing since suggests kubelet forgot it, and kubelet follows
// the ListAndWatch stream of the socket it registered (a list was sent on
// it and the stream is open). Kubelet dials a plugin back during Register,
// so a registration alone may precede kubelet's first list by a moment;
// only with the list does the Node's capacity follow.
func (r *Registrar) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered && r.cur != nil && r.cur.followed.Load() > 0
}

// setState records the socket being served (nil: none) and whether it is
// registered.
func (r *Registrar) setState(cur *served, registered bool) {
	r.mu.Lock()
	r.cur, r.registered = cur, registered
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
	// followed counts this incarnation's ListAndWatch streams that have
	// sent a list and are still open.
	followed atomic.Int32
}

// followedPlugin is the plugin as one incarnation serves it: its
// ListAndWatch streams count in the incarnation's followed.
type followedPlugin struct {
	pluginapi.DevicePluginServer
	s *served
}

func (p followedPlugin) ListAndWatch(e *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	fs := &followedStream{DevicePlugin_ListAndWatchServer: stream, s: p.s}
	defer func() {
		if fs.counted {
			p.s.followed.Add(-1)
		}
	}()
	return p.DevicePluginServer.ListAndWatch(e, fs)
}

// followedStream counts its stream once its first list is sent.
type followedStream struct {
	pluginapi.DevicePlugin_ListAndWatchServer
	s       *served
	counted bool // only the stream's handler goroutine touches it
}

func (fs *followedStream) Send(resp *pluginapi.ListAndWatchResponse) error {
	if err := fs.DevicePlugin_ListAndWatchServer.Send(resp); err != nil {
		return err
	}
	if !fs.counted {
		fs.counted = true
		fs.s.followed.Add(1)
	}
	return nil
}

// Run serves and registers until ctx is canceled, then stops the server,
// removes the socket and returns nil.
func (r *Registrar) Run(ctx context.Context) error {
	l := &loop{r: r, needServe: true, needRegister: true, backoff: r.cfg.BackoffInitial, retry: time.NewTimer(0)}
	defer l.retry.Stop()
	check := time.NewTicker(r.cfg.CheckInterval)
	defer check.Stop()
	defer l.closeWatch()
	defer func() {
		l.stop()
		r.setState(nil, false)
	}()

	for {
		l.ensureWatch()
		var serveDone <-chan struct{}
		if l.cur != nil {
			serveDone = l.cur.done
		}
		select {
		case <-ctx.Done():
			if l.cur != nil {
				ino := l.cur.ino
				l.stop()
				r.removeOwnSocket(ino)
				r.log.Info("device plugin stopped and its socket removed", "socket", r.SocketPath())
			}
			return nil
		case <-l.retry.C:
			l.attempt(ctx)
		case <-serveDone:
			r.log.Info("device plugin gRPC server ended unexpectedly; serving again")
			l.cur = nil
			l.reserve()
		case ev, ok := <-l.events:
			if !ok {
				l.closeWatch()
				continue
			}
			l.onEvent(ev)
		case err, ok := <-l.fsErrs:
			if !ok {
				l.fsErrs = nil
				continue
			}
			r.log.Error(err, "fsnotify error on the socket directory; relying on the periodic check")
		case <-check.C:
			l.onCheck()
		}
	}
}

// loop is Run's state; only Run's goroutine touches it.
type loop struct {
	r            *Registrar
	cur          *served // nil when not serving
	kubeletIno   fileID  // identity of kubelet.sock at our last registration
	needServe    bool
	needRegister bool
	backoff      time.Duration
	failures     int // consecutive failed registrations
	retry        *time.Timer

	fsw        *fsnotify.Watcher
	events     <-chan fsnotify.Event
	fsErrs     <-chan error
	noFsnotify bool // inotify is unavailable (said once)
}

// attempt serves and registers as needed, scheduling a retry on failure.
func (l *loop) attempt(ctx context.Context) {
	r := l.r
	if l.cur != nil && inode(r.SocketPath()) != l.cur.ino {
		// Removed under us, and the event is still queued: kubelet would
		// dial a socket that is gone and hang for its 10 s.
		l.needServe = true
	}
	if l.needServe {
		l.stop()
		s, err := r.serve()
		if err != nil {
			r.log.Error(err, "cannot serve the device plugin socket; retrying", "in", l.backoff)
			l.again()
			return
		}
		l.cur, l.needServe, l.needRegister = s, false, true
		r.setState(s, false)
		r.log.Info("serving the device plugin", "socket", r.SocketPath())
	}
	if !l.needRegister {
		return
	}
	// The identity of the kubelet.sock about to be dialed, taken before the
	// call: if kubelet restarts during it, the periodic check sees a
	// different socket and registers again.
	target := inode(r.kubeletSocket())
	err := r.register(ctx)
	r.metrics.ObserveRegistration(err)
	if err != nil {
		// While kubelet is down this repeats every BackoffMax: say it loudly
		// the first time and then about once a minute.
		l.failures++
		lg := r.log.V(1)
		if l.failures == 1 || l.failures%12 == 0 {
			lg = r.log
		}
		lg.Info("registration with kubelet failed; retrying", "error", err.Error(), "in", l.backoff, "attempt", l.failures)
		l.again()
		return
	}
	if target == (fileID{}) {
		// kubelet.sock appeared between the look and the call (kubelet
		// starting as we retried): we registered with the one there now.
		// Left zero, its Create event would register us a second time.
		target = inode(r.kubeletSocket())
	}
	l.needRegister, l.backoff, l.failures = false, r.cfg.BackoffInitial, 0
	l.kubeletIno = target
	r.setState(l.cur, true)
	r.log.Info("registered with kubelet", "resource", r.cfg.ResourceName, "kubeletSocket", r.kubeletSocket())
}

// onEvent reacts to a change in the socket directory.
func (l *loop) onEvent(ev fsnotify.Event) {
	r := l.r
	switch {
	case ev.Name == r.cfg.SocketDir && ev.Has(fsnotify.Remove|fsnotify.Rename):
		// The directory itself went away: watch it again once it is back;
		// the periodic check notices our socket is gone.
		l.closeWatch()
	case ev.Name == r.kubeletSocket() && ev.Has(fsnotify.Create):
		if !l.needRegister && inode(r.kubeletSocket()) == l.kubeletIno {
			return // the kubelet we already registered with
		}
		r.log.Info("kubelet.sock created: kubelet (re)started; registering again")
		l.reregister()
	case ev.Name == r.SocketPath() && ev.Has(fsnotify.Remove|fsnotify.Rename):
		if l.cur != nil && inode(r.SocketPath()) == l.cur.ino {
			return // our own re-creation raced the event
		}
		r.log.Info("our socket was removed (kubelet restart?); serving again and re-registering", "socket", r.SocketPath())
		l.reserve()
	}
}

// onCheck is the periodic backstop for missed events.
func (l *loop) onCheck() {
	r := l.r
	if l.cur != nil && inode(r.SocketPath()) != l.cur.ino {
		r.log.Info("our socket is gone or replaced; serving again", "socket", r.SocketPath())
		l.reserve()
		return
	}
	if l.needRegister || l.needServe {
		return
	}
	if ino := inode(r.kubeletSocket()); ino != (fileID{}) && ino != l.kubeletIno {
		r.log.Info("kubelet.sock replaced since we registered; registering again")
		l.reregister()
	}
}

// reserve schedules serving again (and so registering again) at once.
func (l *loop) reserve() {
	l.needServe = true
	l.r.setState(nil, false)
	l.kick()
}

// reregister schedules a registration at once. While serving, it serves
// afresh first: a kubelet that did not really restart (kubelet.sock only
// relabeled or chmod'ed, which changes its ctime) still follows our
// ListAndWatch stream and refuses a second registration on the same socket
// ("device plugin already connected"), and then loses track of the live
// one. Stopping the server ends that stream, so kubelet lets the old
// connection go before we register again; after a real restart the stream
// is dead anyway. While not serving (a failed serve is being retried) it
// still serves first: registering a socket nobody serves fails, and
// nothing would try serving again.
func (l *loop) reregister() {
	l.needServe = l.needServe || l.cur != nil
	l.needRegister = true
	l.r.setState(l.cur, false)
	l.kick()
}

// kick makes the next attempt immediate with a fresh backoff.
func (l *loop) kick() {
	l.backoff = l.r.cfg.BackoffInitial
	l.retry.Reset(0)
}

// again schedules the next attempt after the backoff, and doubles it.
func (l *loop) again() {
	l.retry.Reset(l.backoff)
	if l.r.retryIn != nil {
		l.r.retryIn(l.backoff)
	}
	l.backoff = min(l.backoff*2, l.r.cfg.BackoffMax)
}

// stop stops the server, if any. From then on the plugin is neither
// serving nor registered (kubelet's stream ends with the server), whatever
// comes next: a serve meant to replace it may fail and be retried, and
// until one succeeds /healthz must not answer 200.
func (l *loop) stop() {
	if l.cur == nil {
		return
	}
	l.r.setState(nil, false)
	l.cur.srv.Stop()
	<-l.cur.done
	l.cur = nil
}

func (l *loop) ensureWatch() {
	if l.fsw != nil || l.r.cfg.pollOnly || l.noFsnotify {
		return
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		l.noFsnotify = true
		l.r.log.Error(err, "fsnotify unavailable; checking the socket directory by polling only")
		return
	}
	if err := w.Add(l.r.cfg.SocketDir); err != nil {
		w.Close()
		l.r.log.V(1).Info("cannot watch the socket directory yet", "dir", l.r.cfg.SocketDir, "error", err.Error())
		return
	}
	l.fsw, l.events, l.fsErrs = w, w.Events, w.Errors
}

func (l *loop) closeWatch() {
	if l.fsw != nil {
		l.fsw.Close()
	}
	l.fsw, l.events, l.fsErrs = nil, nil, nil
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
	listen := r.listen
	if listen == nil {
		listen = func(path string) (net.Listener, error) { return net.Listen("unix", path) }
	}
	lis, err := listen(path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Closing must not unlink the path: by then it may be a newer socket
	// (ours, re-served, or another instance's). removeOwnSocket checks.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	s := &served{srv: srv, ino: inode(path), done: make(chan struct{})}
	pluginapi.RegisterDevicePluginServer(srv, followedPlugin{DevicePluginServer: r.plugin, s: s})
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
		return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim} //nolint:unconvert // Stat_t.Dev is narrower on some architectures
	}
	return fileID{}
}
