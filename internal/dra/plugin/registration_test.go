package plugin_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/openeuler/urma-k8s/internal/dra/plugin"
)

// kubeletCall is one call kubelet makes on a socket of the driver, and
// the readiness the driver must report after it.
type kubeletCall struct {
	name       string
	method     string
	req        any
	handlerErr error
	ready      bool
	why        string
}

func TestRegistrationFollowsKubelet(t *testing.T) {
	getInfo := registerapi.Registration_GetInfo_FullMethodName
	notify := registerapi.Registration_NotifyRegistrationStatus_FullMethodName
	registered := &registerapi.RegistrationStatus{PluginRegistered: true}
	refused := &registerapi.RegistrationStatus{Error: "no supported version"}
	// One kubelet's life and the next's, in order.
	calls := []kubeletCall{
		{name: "GetInfo", method: getInfo, req: &registerapi.InfoRequest{}, why: plugin.RegistrationPending},
		{name: "refused", method: notify, req: refused, handlerErr: errors.New("failed registration"), why: plugin.RegistrationRefused + "no supported version"},
		{name: "GetInfo again", method: getInfo, req: &registerapi.InfoRequest{}, why: plugin.RegistrationPending},
		{name: "registered", method: notify, req: registered, ready: true},
		{name: "prepare", method: "/v1.DRAPlugin/NodePrepareResources", req: nil, ready: true},
		{name: "restarted kubelet's GetInfo", method: getInfo, req: &registerapi.InfoRequest{}, why: plugin.RegistrationPending},
		{name: "not registered, no error", method: notify, req: &registerapi.RegistrationStatus{}, handlerErr: errors.New("failed registration"), why: plugin.NotRegisteredYet},
		{name: "handler fails", method: notify, req: registered, handlerErr: errors.New("injected"), why: plugin.NotRegisteredYet},
		{name: "registered again", method: notify, req: registered, ready: true},
	}
	r := plugin.NewRegistration()
	if ready, why := r.Ready(); ready || why != plugin.NotRegisteredYet {
		t.Fatalf("Ready() at start = %v %q, want false %q", ready, why, plugin.NotRegisteredYet)
	}
	icept := r.Interceptor()
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			wantResp := &struct{ method string }{c.method}
			resp, err := icept(context.Background(), c.req, &grpc.UnaryServerInfo{FullMethod: c.method}, func(context.Context, any) (any, error) {
				return wantResp, c.handlerErr
			})
			if resp != wantResp || !errors.Is(err, c.handlerErr) {
				t.Errorf("interceptor returned %v, %v; want the handler's %v, %v", resp, err, wantResp, c.handlerErr)
			}
			if ready, why := r.Ready(); ready != c.ready || why != c.why {
				t.Errorf("Ready() = %v %q, want %v %q", ready, why, c.ready, c.why)
			}
		})
	}
}
