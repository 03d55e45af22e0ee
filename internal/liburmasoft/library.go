package liburmasoft

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/go-logr/logr"

	"github.com/openeuler/urma-k8s/pkg/urma"
	"github.com/openeuler/urma-k8s/pkg/urma/soft"
)

// NewProviderFunc creates the provider urma_init sets up; tests give one
// on the in-process fabric.
type NewProviderFunc func(Config, logr.Logger) (urma.Provider, error)

// Library is liburma's process-wide state: the software provider that
// urma_init creates and urma_uninit closes. It is safe for concurrent use.
type Library struct {
	newProvider NewProviderFunc
	log         logr.Logger

	mu   sync.Mutex
	prov urma.Provider // nil while not initialised
}

// NewLibrary returns an uninitialised library whose urma_init creates its
// provider with newProvider (nil: NewSoftProvider).
func NewLibrary(newProvider NewProviderFunc, log logr.Logger) *Library {
	if newProvider == nil {
		newProvider = NewSoftProvider
	}
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	return &Library{newProvider: newProvider, log: log}
}

// NewSoftProvider creates the software provider a Config describes: one
// device per name, on the shm fabric in cfg.ShmDir, on the socket fabric
// at cfg.ListenIP, or (auto) on both.
func NewSoftProvider(cfg Config, log logr.Logger) (urma.Provider, error) {
	opts := soft.Options{Logger: log.WithName("soft")}
	for _, name := range cfg.Devices {
		opts.Devices = append(opts.Devices, soft.DeviceSpec{Name: name})
	}
	listen := net.JoinHostPort(cfg.ListenIP.String(), "0")
	switch cfg.Fabric {
	case FabricAuto:
		opts.ShmDir, opts.ShmSocketDir, opts.AlsoSocket, opts.Listen = cfg.ShmDir, cfg.ShmSocketDir, true, listen
	case FabricShm:
		opts.ShmDir, opts.ShmSocketDir = cfg.ShmDir, cfg.ShmSocketDir
	case FabricSocket:
		opts.Listen = listen
	default:
		return nil, fmt.Errorf("fabric %q: want %s, %s or %s", cfg.Fabric, FabricAuto, FabricShm, FabricSocket)
	}
	p, err := soft.New(opts)
	if err != nil {
		return nil, fmt.Errorf("create the software provider on the %s fabric: %w", cfg.Fabric, err)
	}
	return p, nil
}

// Init is urma_init: it creates the provider. A library initialised
// already fails with EEXIST, as liburma does (core/urma_main.c).
func (l *Library) Init(cfg Config) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.prov != nil {
		return urma.Errorf("init", urma.CodeExist, "urma_init was called before")
	}
	p, err := l.newProvider(cfg, l.log)
	if err != nil {
		return urma.Errorf("init", urma.CodeFail, "%w", err)
	}
	l.prov = p
	l.log.V(1).Info("initialised", "provider", p.Name(), "devices", cfg.Devices)
	return nil
}

// Uninit is urma_uninit: it closes the provider and with it every object
// still open; their handles fail from then on. Uninitialised, it does
// nothing, as liburma does.
func (l *Library) Uninit() error {
	l.mu.Lock()
	p := l.prov
	l.prov = nil
	l.mu.Unlock()
	if p == nil {
		return nil
	}
	if err := p.Close(); err != nil {
		return urma.Errorf("uninit", urma.CodeFail, "close the software provider: %w", err)
	}
	return nil
}

func (l *Library) provider() urma.Provider {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.prov
}

// Devices lists the provider's devices; uninitialised, none (ENODEV).
func (l *Library) Devices() ([]urma.DeviceInfo, error) {
	p := l.provider()
	if p == nil {
		return nil, urma.Errorf("get_device_list", urma.CodeNoDev, "urma_init was not called")
	}
	devs, err := p.Devices()
	if err == nil && len(devs) == 0 {
		err = urma.Errorf("get_device_list", urma.CodeNoDev, "no device")
	}
	return devs, err
}

// Device is the named device.
func (l *Library) Device(name string) (urma.DeviceInfo, error) {
	devs, err := l.Devices()
	if err != nil {
		return urma.DeviceInfo{}, err
	}
	for _, d := range devs {
		if d.Name == name {
			return d, nil
		}
	}
	return urma.DeviceInfo{}, urma.Errorf("get_device_by_name", urma.CodeNoDev, "no device named %q", name)
}

// Open is urma_create_context.
func (l *Library) Open(device string, eidIndex uint32) (*Context, error) {
	const op = "create_context"
	p := l.provider()
	if p == nil {
		return nil, urma.Errorf(op, urma.CodeInval, "urma_init was not called")
	}
	if eidIndex > 1<<20 {
		return nil, urma.Errorf(op, urma.CodeInval, "EID index %d is out of range", eidIndex)
	}
	uc, err := p.Open(device, int(eidIndex))
	if err != nil {
		return nil, err
	}
	return &Context{ctx: uc, info: uc.Device(), jetties: map[uint32]*Jetty{}}, nil
}

// Status is the liburma status of err: 0 for nil, URMA_FAIL for a failure
// with no errno, an object already closed (by urma_uninit) as EINVAL, and
// the errno of every other urma error.
func Status(err error) int {
	if err == nil {
		return 0
	}
	var e *urma.Error
	if !errors.As(err, &e) {
		return int(urma.CodeFail)
	}
	if errors.Is(err, urma.ErrClosed) {
		return int(urma.CodeInval)
	}
	return int(e.Code)
}
