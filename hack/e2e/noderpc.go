//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/openeuler/urma-k8s/internal/nodefacts"
)

// dialUnix opens a gRPC connection to a unix socket.
func dialUnix(path string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", path, err)
	}
	return conn, nil
}

// containerPID asks containerd (over the CRI, as kubelet does) for the host
// PID of a container's main process. id may carry kubelet's
// "containerd://" prefix.
func (r *run) containerPID(ctx context.Context, id string) (int, error) {
	id = strings.TrimPrefix(id, "containerd://")
	conn, err := dialUnix(r.paths.containerdSock)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, fmt.Errorf("CRI ContainerStatus %s: %w", id, err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil {
		return 0, fmt.Errorf("CRI ContainerStatus %s: read its verbose info: %w", id, err)
	}
	if info.Pid <= 0 {
		return 0, fmt.Errorf("CRI ContainerStatus %s: no pid in its verbose info", id)
	}
	return info.Pid, nil
}

// jettyDevices is kubelet's own account of the jetty resource, from its
// pod-resources API: the device IDs it may hand out, and the ones handed
// out, by pod.
type jettyDevices struct {
	allocatable int
	byPod       map[string]int // namespace/name -> device IDs assigned
}

func (j jettyDevices) allocated() int {
	n := 0
	for _, v := range j.byPod {
		n += v
	}
	return n
}

// kubeletJetties asks kubelet's pod-resources socket.
func (r *run) kubeletJetties(ctx context.Context) (jettyDevices, error) {
	sock := filepath.Join(r.paths.kubelet, "pod-resources", "kubelet.sock")
	conn, err := dialUnix(sock)
	if err != nil {
		return jettyDevices{}, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := podresourcesapi.NewPodResourcesListerClient(conn)
	alloc, err := c.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	if err != nil {
		return jettyDevices{}, fmt.Errorf("kubelet pod-resources GetAllocatableResources: %w", err)
	}
	out := jettyDevices{byPod: map[string]int{}}
	for _, d := range alloc.GetDevices() {
		if d.GetResourceName() == nodefacts.ResourceName {
			out.allocatable += len(d.GetDeviceIds())
		}
	}
	list, err := c.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return jettyDevices{}, fmt.Errorf("kubelet pod-resources List: %w", err)
	}
	for _, p := range list.GetPodResources() {
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				if d.GetResourceName() == nodefacts.ResourceName {
					out.byPod[p.GetNamespace()+"/"+p.GetName()] += len(d.GetDeviceIds())
				}
			}
		}
	}
	return out, nil
}
