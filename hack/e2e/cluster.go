//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/openeuler/urma-k8s/hack/internal/proc"
)

// ports are the TCP ports of the components, picked free at configure time
// so that a run does not collide with envtest instances of other tests.
type ports struct {
	etcdClient, etcdPeer, apiserver, kcm, scheduler     int
	kubelet, kubeletHealthz, proxyHealthz, proxyMetrics int
}

// Kubernetes binaries and containerd, relative to -bin-dir (hack/tools.sh
// builds them).
var kubeBinaries = []string{"k8s/etcd", "k8s/kube-apiserver", "k8s/kube-controller-manager", "k8s/kube-scheduler",
	"k8s/kube-proxy", "k8s/kubelet", "k8s/kubectl", "helm", "cni/bridge", "cni/host-local", "cni/loopback",
	"containerd/containerd", "containerd/containerd-shim-runc-v2", "containerd/ctr"}

// Host programs, from Debian's packages (hack/e2e.sh installs them).
var hostPrograms = []struct{ name, pkg string }{
	{"runc", "runc"}, {"nft", "nftables"}, {"iptables", "iptables"}, {"ip", "iproute2"},
}

func (r *run) preflight(context.Context) error {
	var missing []string
	for _, b := range append(append([]string{}, kubeBinaries...), projectBinaries()...) {
		// A program must be executable; a library (liburma.so.0) need not.
		if st, err := os.Stat(r.bin(b)); err != nil || !st.Mode().IsRegular() || (b != liburmaFile && st.Mode()&0o111 == 0) {
			missing = append(missing, r.bin(b))
		}
	}
	for _, p := range hostPrograms {
		if _, err := exec.LookPath(p.name); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", p.name, p.pkg))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing (hack/e2e.sh builds and installs them; run make e2e):\n      %s", strings.Join(missing, "\n      "))
	}
	if out, err := exec.Command(r.bin("containerd/containerd"), "--version").Output(); err == nil {
		r.say("%s", strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("runc", "--version").Output(); err == nil {
		r.say("%s", strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0])
	}
	layout, err := cgroupLayout()
	if err != nil {
		return err
	}
	r.say("cgroups: %s", layout)
	if _, err := os.Stat(r.o.work); err == nil {
		r.say("%s exists: tearing down what an earlier run left there first", r.o.work)
		if err := r.teardown(); err != nil {
			return fmt.Errorf("clean up the earlier run: %w", err)
		}
	}
	for _, d := range []string{r.o.work, r.paths.pki, r.paths.config, r.paths.images, r.paths.podLogs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := recordNetns(filepath.Join(r.o.work, "netns-before")); err != nil {
		return err
	}
	if err := recordHostDirs(r.hostDirsFile()); err != nil {
		return err
	}
	ip, err := pickNodeIP(r.o.nodeIP)
	if err != nil {
		return err
	}
	r.nodeIP = ip
	r.say("node %s at %s (pods reach the API server there)", nodeName, ip)
	return nil
}

// cgroupLayout describes the host's cgroup mounts: v1, v2 or hybrid.
func cgroupLayout() (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	v1, v2 := 0, false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.Contains(l, " - cgroup2 "):
			v2 = true
		case strings.Contains(l, " - cgroup "):
			v1++
		}
	}
	switch {
	case v1 > 0 && v2:
		return fmt.Sprintf("hybrid (%d v1 hierarchies and a v2 mount): kubelet runs with failCgroupV1: false, cgroupDriver: cgroupfs", v1), nil
	case v1 > 0:
		return "v1: kubelet runs with failCgroupV1: false, cgroupDriver: cgroupfs", nil
	case v2:
		return "v2", nil
	}
	return "", errors.New("no cgroup filesystem is mounted: kubelet cannot run here")
}

// pickNodeIP returns want, or the first global unicast IPv4 address of an
// interface that is up.
func pickNodeIP(want string) (string, error) {
	if want != "" {
		ip := net.ParseIP(want)
		if ip == nil || ip.To4() == nil || ip.IsLoopback() {
			return "", fmt.Errorf("-node-ip %q: want a non-loopback IPv4 address", want)
		}
		return ip.String(), nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list network interfaces: %w", err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 || ifc.Name == bridgeName {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", errors.New("no up interface has a global IPv4 address; pass -node-ip")
}

// freePort asks the kernel for a free TCP port on the loopback address.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// kubeconfig files written by configure, by component.
func (r *run) kubeconfigPath(user string) string {
	return filepath.Join(r.paths.config, user+".kubeconfig")
}

// configure writes the PKI, the kubeconfigs, and the configuration files
// of containerd, the CNI, kube-proxy and kubelet.
func (r *run) configure(context.Context) error {
	for _, p := range []*int{&r.ports.etcdClient, &r.ports.etcdPeer, &r.ports.apiserver, &r.ports.kcm, &r.ports.scheduler,
		&r.ports.kubelet, &r.ports.kubeletHealthz, &r.ports.proxyHealthz, &r.ports.proxyMetrics} {
		port, err := freePort()
		if err != nil {
			return err
		}
		*p = port
	}
	ca, err := newPKI(r.paths.pki)
	if err != nil {
		return err
	}
	serviceIP, err := firstServiceIP()
	if err != nil {
		return err
	}
	if _, _, err := ca.issue(certRequest{name: "apiserver", commonName: "kube-apiserver", server: true,
		dnsNames: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
		ips:      []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(r.nodeIP), serviceIP}}); err != nil {
		return err
	}
	// The API server's identity towards kubelet (logs, exec).
	// In system:masters, as kubeadm once did, so kubelet's webhook
	// authorizer lets it use nodes/proxy without a binding of its own.
	if _, _, err := ca.issue(certRequest{name: "apiserver-kubelet-client", commonName: "kube-apiserver-kubelet-client", organization: []string{"system:masters"}, client: true}); err != nil {
		return err
	}
	if _, _, err := ca.serviceAccountKey(); err != nil {
		return err
	}
	users := []struct{ file, user string }{
		{"admin", "kubernetes-admin"},
		{"controller-manager", "system:kube-controller-manager"},
		{"scheduler", "system:kube-scheduler"},
		{"kube-proxy", "system:kube-proxy"},
		{"kubelet", "system:node:" + nodeName},
	}
	for _, u := range users {
		var groups []string
		switch u.file {
		case "admin":
			groups = []string{"system:masters"}
		case "kubelet":
			groups = []string{"system:nodes"}
		}
		cert, key, err := ca.issue(certRequest{name: u.file, commonName: u.user, organization: groups, client: true})
		if err != nil {
			return err
		}
		if err := writeKubeconfig(r.kubeconfigPath(u.file), r.apiserverURL(), ca.CAFile, cert, key); err != nil {
			return err
		}
	}
	r.adminKubeconfig = r.kubeconfigPath("admin")
	if err := r.writeContainerdConfig(); err != nil {
		return err
	}
	if err := r.writeCNIConfig(); err != nil {
		return err
	}
	if err := r.writeKubeProxyConfig(); err != nil {
		return err
	}
	if err := r.writeKubeletConfig(); err != nil {
		return err
	}
	r.say("CA, component certificates and kubeconfigs in %s; admin kubeconfig %s", r.paths.pki, r.adminKubeconfig)
	return nil
}

// firstServiceIP is the kubernetes Service's ClusterIP: the first address
// of the Service range.
func firstServiceIP() (net.IP, error) {
	ip, _, err := net.ParseCIDR(serviceCIDR)
	if err != nil {
		return nil, fmt.Errorf("service range %s: %w", serviceCIDR, err)
	}
	ip = ip.To4()
	out := make(net.IP, len(ip))
	copy(out, ip)
	out[3]++
	return out, nil
}

func (r *run) apiserverURL() string {
	return "https://" + net.JoinHostPort(r.nodeIP, strconv.Itoa(r.ports.apiserver))
}

func writeKubeconfig(path, server, caFile, certFile, keyFile string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func (r *run) startControlPlane(ctx context.Context) error {
	p := r.paths
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", r.ports.etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", r.ports.etcdPeer)
	if _, err := r.start("etcd", r.bin("k8s/etcd"),
		"--name=e2e", "--data-dir="+p.etcd,
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=e2e="+peerURL,
		// One throwaway node on a shared disk: fsync buys nothing here.
		"--unsafe-no-fsync=true", "--log-level=warn"); err != nil {
		return err
	}
	pki := func(f string) string { return filepath.Join(p.pki, f) }
	apiserver, err := r.start("kube-apiserver", r.bin("k8s/kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=0.0.0.0", "--secure-port="+strconv.Itoa(r.ports.apiserver), "--advertise-address="+r.nodeIP,
		"--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"),
		"--client-ca-file="+pki("ca.crt"),
		"--kubelet-client-certificate="+pki("apiserver-kubelet-client.crt"), "--kubelet-client-key="+pki("apiserver-kubelet-client.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pki("sa.pub"), "--service-account-signing-key-file="+pki("sa.key"),
		"--service-cluster-ip-range="+serviceCIDR,
		"--authorization-mode=Node,RBAC", "--allow-privileged=true",
		// Webhooks and aggregated APIs are called on their endpoints' pod IPs,
		// so the API server needs no route to Service IPs of its own.
		"--enable-aggregator-routing=true",
		// Reach kubelet (exec, logs) on the node's address: the node's
		// name is not in any DNS here.
		"--kubelet-preferred-address-types=InternalIP",
		"--v=1")
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", r.adminKubeconfig)
	if err != nil {
		return fmt.Errorf("load %s: %w", r.adminKubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client for the API server: %w", err)
	}
	r.rest, r.cs = cfg, cs
	err = r.poll(ctx, 3*time.Minute, "kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		if apiserver.Exited() {
			return false, fmt.Errorf("kube-apiserver exited (%s)%s", apiserver.ExitStatus(), apiserver.LogTail())
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok", nil
	})
	if err != nil {
		return err
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("read the API server's version: %w", err)
	}
	r.say("kube-apiserver %s ready at %s (etcd at %s)", v.GitVersion, r.apiserverURL(), etcdURL)
	return nil
}

// poll calls cond until it returns true or an error, every 250ms, for at
// most timeout: the way to wait on cluster state that has no event we can
// subscribe to cheaply.
func (r *run) poll(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, cond)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		}
		if wait.Interrupted(err) {
			return fmt.Errorf("%s: not reached within %s", what, timeout)
		}
		return err
	}
	return nil
}

func (r *run) startNode(ctx context.Context) error {
	p := r.paths
	pki := func(f string) string { return filepath.Join(p.pki, f) }
	kcm := r.kubeconfigPath("controller-manager")
	if _, err := r.start("kube-controller-manager", r.bin("k8s/kube-controller-manager"),
		"--kubeconfig="+kcm, "--authentication-kubeconfig="+kcm, "--authorization-kubeconfig="+kcm,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(r.ports.kcm),
		"--service-account-private-key-file="+pki("sa.key"), "--root-ca-file="+pki("ca.crt"),
		"--cluster-signing-cert-file="+pki("ca.crt"), "--cluster-signing-key-file="+pki("ca.key"),
		"--use-service-account-credentials=true", "--leader-elect=false",
		"--service-cluster-ip-range="+serviceCIDR, "--v=1"); err != nil {
		return err
	}
	sched := r.kubeconfigPath("scheduler")
	if _, err := r.start("kube-scheduler", r.bin("k8s/kube-scheduler"),
		"--kubeconfig="+sched, "--authentication-kubeconfig="+sched, "--authorization-kubeconfig="+sched,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(r.ports.scheduler),
		"--leader-elect=false", "--v=1"); err != nil {
		return err
	}
	// A guard first: Service addresses that kube-proxy has not (yet)
	// translated are unreachable instead of going out the default route.
	if out, err := exec.Command("ip", "route", "replace", "unreachable", serviceCIDR).CombinedOutput(); err != nil {
		return fmt.Errorf("ip route replace unreachable %s: %w: %s", serviceCIDR, err, out)
	}
	if _, err := r.start("kube-proxy", r.bin("k8s/kube-proxy"), "--config="+filepath.Join(p.config, "kube-proxy.yaml"), "--v=1"); err != nil {
		return err
	}
	kubelet, err := r.startKubelet("kubelet")
	if err != nil {
		return err
	}
	err = r.poll(ctx, 3*time.Minute, "node "+nodeName+" Ready", func(ctx context.Context) (bool, error) {
		if kubelet.Exited() {
			return false, fmt.Errorf("kubelet exited (%s)%s", kubelet.ExitStatus(), kubelet.LogTail())
		}
		n, err := r.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return nodeReady(n), nil
	})
	if err != nil {
		return err
	}
	n, err := r.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", nodeName, err)
	}
	r.say("node %s Ready: kubelet %s, %s, kernel %s", nodeName, n.Status.NodeInfo.KubeletVersion, n.Status.NodeInfo.ContainerRuntimeVersion, n.Status.NodeInfo.KernelVersion)
	// The pods below need a service account in the default namespaces;
	// the controller manager creates them.
	return r.poll(ctx, 2*time.Minute, "the default service account", func(ctx context.Context) (bool, error) {
		_, err := r.cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

func (r *run) startKubelet(name string) (*proc.Child, error) {
	return r.start(name, r.bin("k8s/kubelet"),
		"--config="+filepath.Join(r.paths.config, "kubelet.yaml"),
		"--kubeconfig="+r.kubeconfigPath("kubelet"),
		"--root-dir="+r.paths.kubelet, "--cert-dir="+filepath.Join(r.paths.kubelet, "pki"),
		"--hostname-override="+nodeName, "--node-ip="+r.nodeIP,
		"--v=2")
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
