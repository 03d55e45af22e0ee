package plugin

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Registration follows kubelet's registration of the driver, for the
// driver's readiness: a pod whose claims kubelet meets before it has
// registered the driver fails to start ("DRA driver ... is not
// registered") and waits for kubelet's next sync, about a minute later.
//
// Kubelet's plugin watcher registers a plugin in three steps on the
// registration socket the kubeletplugin helper serves: GetInfo, then
// (in kubelet) adding the driver to the plugins it calls, then
// NotifyRegistrationStatus with the outcome. Registration sees both calls
// through a gRPC interceptor given to the helper: ready from a
// notification that the driver is registered until the next GetInfo,
// which is a kubelet (a restarted one, usually) registering it anew.
// The helper keeps the outcome too (Helper.RegistrationStatus), but
// without synchronisation and from the first kubelet on: a restarted
// kubelet that has not registered the driver yet would find it ready.
type Registration struct {
	mu         sync.Mutex
	registered bool
	why        string // why not registered
}

// Answers of Ready while the driver is not registered.
const (
	NotRegisteredYet    = "kubelet has not registered the driver yet"
	RegistrationPending = "kubelet is registering the driver"
	// RegistrationRefused precedes kubelet's error.
	RegistrationRefused = "kubelet refused to register the driver: "
)

// NewRegistration returns a Registration that is not registered.
func NewRegistration() *Registration {
	return &Registration{why: NotRegisteredYet}
}

// Ready reports whether kubelet has registered the driver, and if not,
// why.
func (r *Registration) Ready() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered, r.why
}

func (r *Registration) set(registered bool, why string) {
	r.mu.Lock()
	r.registered, r.why = registered, why
	r.mu.Unlock()
}

// Interceptor is the unary interceptor to give the kubeletplugin helper
// (kubeletplugin.GRPCInterceptor); it passes every call on unchanged.
func (r *Registration) Interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == registerapi.Registration_GetInfo_FullMethodName {
			r.set(false, RegistrationPending)
		}
		resp, err := handler(ctx, req)
		if info.FullMethod == registerapi.Registration_NotifyRegistrationStatus_FullMethodName {
			st, _ := req.(*registerapi.RegistrationStatus)
			switch {
			case err == nil && st != nil && st.PluginRegistered:
				r.set(true, "")
			case st != nil && st.Error != "":
				r.set(false, RegistrationRefused+st.Error)
			default:
				r.set(false, NotRegisteredYet)
			}
		}
		return resp, err
	}
}
